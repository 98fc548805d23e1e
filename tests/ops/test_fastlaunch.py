"""The cached direct launch (liger_core.ops._fastlaunch) must give what Triton's own launch gives, also when
arguments change what Triton specialises on (pointer alignment, ints equal to 1 or divisible by 16)."""

from __future__ import annotations

import pytest
import torch

from liger_core import reference
from liger_core.ops import _fastlaunch, rms_norm
from tests.helpers import devices

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("device", devices())
def test_specialisation_changes_select_another_kernel(device):
    kernel = __import__("liger_core.ops.rms_norm", fromlist=["x"])._rms_norm_fwd_kernel
    cases = []
    # aligned rows of 256, rows of 1 (an int == 1), then a view whose data pointer is 2 bytes off alignment
    base = torch.randn(9, 257, device=device, dtype=torch.bfloat16)
    cases.append(base[:, :256])
    cases.append(base[:1, :256])
    cases.append(base[:, 1:])
    w = torch.randn(256, device=device, dtype=torch.bfloat16)
    for x in cases:
        for enabled in (True, False):
            _fastlaunch.ENABLED = enabled
            try:
                y = rms_norm(x, w, 1e-6)
            finally:
                _fastlaunch.ENABLED = True
            expected = reference.rms_norm(x.double(), w.double(), 1e-6)
            torch.testing.assert_close(y.double(), expected, atol=0.02, rtol=0.02)
    if device == "cuda":
        assert len(kernel._cache) >= 2  # at least the aligned and the misaligned specialisations
    else:
        assert kernel._cache == {}  # the interpreter always takes Triton's own path


def test_fast_launch_rejects_plain_functions():
    with pytest.raises(TypeError, match="triton.jit"):
        _fastlaunch.fast_launch(lambda x: x)

"""The cached direct launch (liger_core.ops._fastlaunch) must give what Triton's own launch gives, also when
arguments change what Triton specialises on (pointer alignment, ints equal to 1 or divisible by 16)."""

from __future__ import annotations

import pytest
import torch

from liger_core import reference, tuning
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
            with tuning.override(fast_launch=enabled):
                y = rms_norm(x, w, 1e-6)
            expected = reference.rms_norm(x.double(), w.double(), 1e-6)
            torch.testing.assert_close(y.double(), expected, atol=0.02, rtol=0.02)
    if device == "cuda":
        assert len(kernel._cache) >= 2  # at least the aligned and the misaligned specialisations
    else:
        assert kernel._cache == {}  # the interpreter always takes Triton's own path


def test_fast_launch_rejects_plain_functions():
    with pytest.raises(TypeError, match="triton.jit"):
        _fastlaunch.fast_launch(lambda x: x)


def test_specialisation_key_separates_what_triton_specialises_on():
    """The cache key: every property Triton compiles differently for gives a different key; equal properties
    give equal keys (CPU-testable part of the fast path; the launch itself is checked on CUDA above)."""
    key = _fastlaunch._specialisation_key
    base = torch.randn(64, dtype=torch.bfloat16)

    def k(*args):
        return key(args)[0]

    assert k(base, 7) == k(torch.randn(64, dtype=torch.bfloat16), 9)  # same dtype and alignment, odd ints
    assert k(base) != k(base[1:])  # 16-byte aligned data pointer or not
    assert k(base) != k(base.float())  # dtype
    assert k(7) != k(1) and k(7) != k(32) and k(7) != k(2**31)  # == 1, divisible by 16, beyond int32
    assert k(True) != k(1) and k(False) != k(0) and k(True) != k(False)  # bools are not ints
    assert k(1.0) != k(1) and k(None) != k(0.0)
    assert k(base, 1) != k(1, base)  # position matters
    assert key((base, 3))[1] == base.device and key((3,))[1] is None
    with pytest.raises(TypeError):
        key(((1, 2),))

"""Test setup. On a machine without an NVIDIA GPU the Triton kernels run in the interpreter on CPU tensors.

TRITON_INTERPRET must be set before `triton` is imported anywhere, so it is set here, at conftest import.
On the GPU machine run `pytest -m gpu` (TRITON_INTERPRET unset): the CUDA-parametrised cases run there.
"""

import contextlib
import os
import sys
from pathlib import Path

if not (Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()):
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))  # so test files can `import helpers`

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import HAS_CUDA, use_reference_path  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_seed():
    """Fresh random inputs every run (the seed is printed on failure so a case can be replayed)."""
    seed = (
        int.from_bytes(os.urandom(4), "little")
        if "LIGER_TEST_SEED" not in os.environ
        else int(os.environ["LIGER_TEST_SEED"])
    )
    torch.manual_seed(seed)
    yield seed


@pytest.fixture
def tune():
    """``tune(knob=value, ...)`` sets tuning knobs (``liger_core.tuning.override``) until the test ends; later
    calls nest over earlier ones."""
    from liger_core import tuning

    with contextlib.ExitStack() as stack:
        yield lambda **values: stack.enter_context(tuning.override(**values))


@pytest.fixture
def poison_empty(monkeypatch):
    """Make torch.empty / empty_like return NaN-filled (float) or huge (int) tensors, so any output element a
    kernel forgets to write shows up as NaN or a wrong value instead of a lucky zero."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def _poison(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype in (torch.int32, torch.int64):
            t.fill_(torch.iinfo(t.dtype).max // 3)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: _poison(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: _poison(real_empty_like(*a, **k)))
    yield


# The paths an op takes: the Triton kernels (in Triton's interpreter on CPU, or on the GPU) and the
# pure-PyTorch reference path that CPU tensors take where Triton is missing.
PATHS = [
    pytest.param("interpreter", id="interpreter"),
    pytest.param("reference", id="reference"),
    pytest.param(
        "cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")]
    ),
]


@pytest.fixture(params=PATHS)
def path_device(request, monkeypatch):
    """The device of a test's tensors, with the path the op takes there selected: 'reference' routes CPU
    tensors to the pure-PyTorch path, 'interpreter' runs the Triton kernels in Triton's interpreter."""
    from liger_core import dispatch

    if request.param == "reference":
        use_reference_path(monkeypatch)
    elif request.param == "interpreter" and dispatch.triton_status() != "interpreted":
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1 on a machine without a GPU)")
    return "cuda" if request.param == "cuda" else "cpu"


@pytest.fixture(params=["triton", "reference"])
def path(request, monkeypatch):
    """Run the test on the Triton kernels (the interpreter on CPU) and on the pure-PyTorch path, which CPU
    tensors take where Triton is missing."""
    if request.param == "reference":
        use_reference_path(monkeypatch)
    return request.param

"""Triton's interpreter for the CPU check: turning it on before triton is imported, and quieting the
numpy warnings it raises on masked-off lanes."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def quiet_interpreter() -> Iterator[None]:
    """Hide the numpy RuntimeWarnings that Triton's interpreter raises while it runs a kernel on CPU
    (divide by zero, invalid value, overflow): the interpreter evaluates every lane, also the masked-off lanes
    of a block and the side of a ``tl.where`` that is then discarded (``log(0)`` where a target is 0), and
    the checks feed +-inf and nan on purpose. A GPU raises nothing for any of it, and whether the results are
    right is what the check's table says. Other warnings still show."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
        yield


def prepare_triton(cuda: bool | None = None) -> str | None:
    """On a machine without a CUDA GPU, set ``TRITON_INTERPRET=1`` so the Triton kernels run in the
    interpreter on CPU tensors. Triton reads the variable when a kernel is decorated, so this only works
    before ``triton`` is imported; returns a sentence saying what was done (None if nothing was needed)."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return None
    if "triton" in sys.modules:
        return (
            "no CUDA GPU and triton is already imported without TRITON_INTERPRET=1: CPU tensors take the "
            "pure-PyTorch reference path, not the Triton kernels"
        )
    os.environ["TRITON_INTERPRET"] = "1"
    return "no CUDA GPU: set TRITON_INTERPRET=1, so the Triton kernels run in Triton's interpreter on CPU"

"""Functional entry points: one file per op, each with its Triton kernels and autograd Function."""

from __future__ import annotations

import importlib
import importlib.util

from liger_core.dispatch import triton_status

triton_status()  # decide compiled/interpreted once, before any kernel is traced by torch.compile

_OPS = (
    "rms_norm",
    "layer_norm",
    "rope",
    "swiglu",
    "geglu",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "kl_div",
    "jsd",
    "fused_linear_jsd",
)

# Each op lives in the submodule of its own name; bind the function over the submodule attribute so that
# `from liger_core.ops import swiglu` gives the function. (Ops still being written are skipped until their file
# exists; TODO(bootstrap): replace this loop with explicit imports once every op has landed.)
__all__ = []
for _name in _OPS:
    if importlib.util.find_spec(f"{__name__}.{_name}") is not None:
        globals()[_name] = getattr(importlib.import_module(f"{__name__}.{_name}"), _name)
        __all__.append(_name)

"""Reference residual add + RMSNorm: what a decoder layer does between its blocks, in the input dtype::

    s = x + residual                          (the new residual stream, rounded to the input dtype)
    y = rms_norm(s, weight, eps, offset, casting_mode)

``rms_norm`` is ``liger_core.reference.rms_norm`` (HF's roundings, by ``casting_mode``). Returns ``(y, s)``.
"""

from __future__ import annotations

import torch

from liger_core.reference.rms_norm import CASTING_MODES, rms_norm

__all__ = ["CASTING_MODES", "fused_add_rms_norm", "output_dtype"]


def output_dtype(x_dtype: torch.dtype, w_dtype: torch.dtype, casting_mode: str) -> torch.dtype:
    """y's dtype, as HF gives it: the input dtype for "gemma", ``promote_types(x, w)`` otherwise."""
    return x_dtype if casting_mode == "gemma" else torch.promote_types(x_dtype, w_dtype)


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + residual
    return rms_norm(s, weight, eps, offset, casting_mode), s

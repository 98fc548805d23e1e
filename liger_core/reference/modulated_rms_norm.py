"""Reference modulated RMSNorm (AdaLN, Diffusion-Transformer style), in the input dtypes::

    y = rms_norm(x, weight) * (1 + scale) + shift          (rms_norm_no_weight when weight is None)

``scale`` and ``shift`` hold R_m rows of the hidden size H that divide the N = x.numel() / H rows of x into
consecutive blocks of N / R_m rows: shape (H,) or (1, H) for one row shared by all, (B, H) for x of shape
(B, T, H) (one per sample), or x's own shape (one per token). ``rms_norm`` is
``liger_core.reference.rms_norm`` (HF's roundings, by ``casting_mode``).
"""

from __future__ import annotations

import torch

from liger_core.reference.rms_norm import rms_norm
from liger_core.reference.rms_norm_no_weight import rms_norm_no_weight


def modulated_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor | None = None,
    eps: float = 1e-6,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> torch.Tensor:
    h = x.shape[-1]
    normed = rms_norm_no_weight(x, eps) if weight is None else rms_norm(x, weight, eps, offset, casting_mode)
    groups = scale.numel() // h
    rows = normed.reshape(groups, -1, h)  # consecutive blocks of rows, one per modulation row
    y = rows * (1 + scale.reshape(groups, 1, h))
    if shift is not None:
        y = y + shift.reshape(groups, 1, h)
    return y.reshape(x.shape)

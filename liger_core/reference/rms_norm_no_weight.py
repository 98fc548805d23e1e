"""Reference RMSNorm without a weight (Gemma4's ``with_scale=False``, HF norms without elementwise affine)::

    y = (x.float() * rsqrt(mean(x.float()**2, -1) + eps)).to(x.dtype)

"float()" means "at least fp32" (float64 inputs stay float64: the ground truth of the tests).
"""

from __future__ import annotations

import torch


def rms_norm_no_weight(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x_up = x.to(torch.promote_types(x.dtype, torch.float32))
    return (x_up * torch.rsqrt(x_up.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

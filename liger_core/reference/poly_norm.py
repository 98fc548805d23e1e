"""Reference PolyNorm (PolyCom, Motif models), in the input dtype as the PyTorch module computes it::

    norm(u) = u * rsqrt(mean(u**2, -1) + eps)
    y       = weight[0] * norm(x**3) + weight[1] * norm(x**2) + weight[2] * norm(x) + bias

``weight``: (3,); ``bias``: a 0-dim tensor (liger-kernel's module) or of shape (1,) (PolyCom's); indexing
``weight`` gives 0-dim tensors, so y has x's dtype unless ``bias`` has a dimension (type promotion).
"""

from __future__ import annotations

import torch


def _norm(u: torch.Tensor, eps: float) -> torch.Tensor:
    return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)


def poly_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return weight[0] * _norm(x**3, eps) + weight[1] * _norm(x**2, eps) + weight[2] * _norm(x, eps) + bias

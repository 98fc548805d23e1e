"""Reference LayerNorm over the last dimension: exactly ``torch.nn.functional.layer_norm``.

``mean = x.mean(-1)``, ``rstd = rsqrt(x.var(-1, unbiased=False) + eps)``, ``y = (x - mean) * rstd * w + b``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_norm(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)

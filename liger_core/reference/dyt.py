"""Reference Dynamic Tanh (DyT, "Transformers without Normalization"), as its PyTorch module computes it::

    y = gamma * tanh(alpha * x) + beta        (beta optional)

``alpha``: shape (1,) (a scalar parameter); ``gamma``, ``beta``: (C,) over the last dimension. The dtype is
the type promotion of all four (an fp32 ``alpha`` with bf16 ``x`` computes in fp32, as eager does).
"""

from __future__ import annotations

import torch


def dyt(
    x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None = None
) -> torch.Tensor:
    y = gamma * torch.tanh(alpha * x)
    return y if beta is None else y + beta

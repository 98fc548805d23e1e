"""Reference neighborhood attention: the eager composition (scaled Q K^T, the neighborhood mask, softmax,
P V) in the input dtype. A row whose visible scores are all -inf gets zero probabilities (and a zero
gradient) instead of NaN, as ``liger_core.ops.fused_neighborhood_attention``."""

from __future__ import annotations

import math

import torch


def neighborhood_mask(seq_len: int, kernel_size: int, dilation: int, device: torch.device) -> torch.Tensor:
    """(L, L) bool: key j is visible to query i when |j - i| <= (kernel_size // 2) dilation and
    (j - i) mod dilation = 0 (the window is clipped at the sequence ends)."""
    pos = torch.arange(seq_len, device=device)
    d = pos[None, :] - pos[:, None]
    return (d.abs() <= (kernel_size // 2) * dilation) & (d % dilation == 0)


def fused_neighborhood_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kernel_size: int = 7,
    dilation: int = 1,
    scale: float | None = None,
) -> torch.Tensor:
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    hidden = ~neighborhood_mask(query.shape[-2], kernel_size, dilation, query.device)
    masked = scores.masked_fill(hidden, float("-inf"))
    dead = torch.isneginf(masked).all(dim=-1, keepdim=True)
    probs = torch.softmax(masked.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    return torch.matmul(probs, value)

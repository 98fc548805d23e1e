"""Reference multi-token attention: the eager composition (causal mask, softmax or sparsemax, conv2d, causal
zero mask) in the input dtype. Future keys are excluded with -inf; a row whose visible scores are all -inf
gets zero probabilities (and a zero gradient) instead of NaN, as ``liger_core.ops.multi_token_attention``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from liger_core.reference.sparsemax import sparsemax


def _above_diagonal(rows: int, cols: int, device: torch.device) -> torch.Tensor:
    return torch.ones(rows, cols, dtype=torch.bool, device=device).triu(1)


def multi_token_attention(
    scores: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
    sparse: bool = False,
) -> torch.Tensor:
    future = _above_diagonal(scores.shape[-2], scores.shape[-1], scores.device)
    masked = scores.masked_fill(future, float("-inf"))
    dead = torch.isneginf(masked).all(dim=-1, keepdim=True)
    masked = masked.masked_fill(dead, 0.0)  # finite, so the zeroed row's gradient is 0, not NaN
    probs = sparsemax(masked, -1) if sparse else torch.softmax(masked, -1)
    probs = probs.masked_fill(dead, 0.0)
    out = F.conv2d(probs, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return out.masked_fill(_above_diagonal(out.shape[-2], out.shape[-1], out.device), 0.0)

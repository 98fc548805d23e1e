"""Reference total variation distance: the eager composition ``0.5 * |p - q|`` on fp32 inputs (16-bit ones are
upcast, so the loss is fp32 for every input dtype, float64 for float64 inputs; gradients are rounded once to
the inputs' dtype).

Rows (the last dimension is the distribution) whose ``shift_labels`` equal ``ignore_index`` are zeroed
before any math, so nothing they hold reaches the loss or the gradients. Reductions: "none" the elementwise
loss (ignored rows 0), "sum" its sum, "mean" the sum over kept rows / (n_kept * V), "batchmean" / n_kept;
with no kept row the divisor is taken as 1 (the loss is 0), as in ``liger_core.ops.tvd``.
"""

from __future__ import annotations

import torch


def tvd(
    p: torch.Tensor,
    q: torch.Tensor,
    shift_labels: torch.Tensor | None = None,
    reduction: str = "batchmean",
    ignore_index: int = -100,
) -> torch.Tensor:
    vocab = p.shape[-1]
    dtype = torch.promote_types(p.dtype, torch.float32)
    x = p.reshape(-1, vocab).to(dtype)
    y = q.reshape(-1, vocab).to(dtype)
    if shift_labels is None:
        keep = torch.ones(x.shape[0], dtype=torch.bool, device=p.device)
    else:
        keep = shift_labels.reshape(-1) != ignore_index
    drop = ~keep[:, None]
    loss = 0.5 * (x.masked_fill(drop, 0.0) - y.masked_fill(drop, 0.0)).abs()
    if reduction == "none":
        return loss.view(p.shape)
    total = loss.sum()
    if reduction == "sum":
        return total
    n_kept = keep.sum().clamp_min(1)
    return total / (n_kept * vocab if reduction == "mean" else n_kept)

"""Reference cross-entropy: ``torch.nn.functional.cross_entropy`` in the input dtype, plus z-loss and softcap.

Exactly the eager composition it replaces (softcap ``c * tanh(x / c)`` first, as Gemma-2 does), with two
documented departures from torch that the Triton op shares:

- ``reduction="mean"`` with nothing to average over (every target ignored, or every non-ignored target of
  class weight 0) gives a loss of 0 and zero gradients; torch gives NaN (0 / 0).
- z-loss ``lse_square_scale * logsumexp(logits)^2`` is added per non-ignored token, unweighted by the class
  weights; ``mean`` divides its sum by the number of non-ignored tokens.

``denominator`` (with ``reduction="sum"``) divides the returned sum afterwards, as Hugging Face's
``ForCausalLMLoss`` divides by ``num_items_in_batch`` (0 gives 0, as the mean over nothing above).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    return_z_loss: bool = False,
    *,
    inplace_backward: bool = False,  # accepted for signature parity; the reference never writes in place
    denominator: torch.Tensor | float | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    vocab = logits.shape[-1]
    out_shape = target.shape
    logits = logits.reshape(-1, vocab)
    target = target.reshape(-1).long()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if weight is not None:
        weight = weight.to(logits.dtype)
    loss = F.cross_entropy(
        logits,
        target,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
    )
    valid = target != ignore_index
    n_valid = valid.sum()
    zero = logits.narrow(-1, 0, 0).sum()  # 0, connected to the graph (zero gradients)
    if reduction == "mean" and torch.compiler.is_compiling():
        # no host sync (torch.compile cannot trace one): all targets ignored -> 0, not F.cross_entropy's NaN
        # (a zero *weighted* denominator still gives NaN gradients here: nll_loss's backward divides by it)
        denom = (weight[target.masked_fill(~valid, 0)] * valid).sum() if weight is not None else n_valid
        loss = torch.where(denom == 0, zero, loss)
    elif reduction == "mean":
        denom = weight[target[valid]].sum().item() if weight is not None else int(n_valid)
        if denom == 0:
            loss = zero  # not NaN
    if lse_square_scale != 0.0 or return_z_loss:
        z = lse_square_scale * torch.logsumexp(logits, dim=-1).square()
        z = z.masked_fill(~valid, 0.0)
        if reduction == "mean":
            z = z.sum() / n_valid.clamp(min=1)  # all ignored: the masked sum is 0 (no host sync)
        elif reduction == "sum":
            z = z.sum()
        loss = loss + z
    if reduction == "none":
        loss = loss.reshape(out_shape)
    elif denominator is not None:  # HF's ForCausalLMLoss: the sum divided afterwards, in the loss dtype
        loss = _divided(loss, denominator)
        z = _divided(z, denominator) if return_z_loss else None
    if not return_z_loss:
        return loss
    z = z.reshape(out_shape) if reduction == "none" else z
    return loss, z.detach()


def _divided(value: torch.Tensor, denominator: torch.Tensor | float) -> torch.Tensor:
    """``value / denominator``; 0 where the denominator is 0 (as a mean over nothing; a safe divisor keeps
    the gradient finite)."""
    den = torch.as_tensor(denominator, device=value.device).to(value.dtype)
    nonzero = den != 0
    return value / torch.where(nonzero, den, torch.ones_like(den)) * nonzero

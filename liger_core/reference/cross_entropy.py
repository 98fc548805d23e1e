"""Reference cross-entropy: ``torch.nn.functional.cross_entropy`` on fp32 logits, plus z-loss and softcap.

The eager composition it replaces: 16-bit logits are upcast to fp32 first, as Hugging Face's causal-LM loss
does (the loss is fp32, float64 for float64 logits; the gradient is rounded once to the logits' dtype), then
softcap ``c * tanh(x / c)`` (as Gemma-2 does) and torch's cross-entropy, with torch's reductions: ``mean``
over nothing (no rows, every target ignored, or every non-ignored target of class weight 0) is NaN (0 / 0).
Documented departures from torch, shared with the Triton op:

- ignored rows are never read: their logits are replaced by zeros first, so their gradient is 0 even where
  they hold NaN or +inf (torch's log_softmax backward multiplies their zero gradient by exp(NaN) there).
- z-loss ``lse_square_scale * logsumexp(logits)^2`` is added per non-ignored token, unweighted by the class
  weights; ``mean`` divides its sum by the number of non-ignored tokens.
- ``denominator`` (with ``reduction="sum"``) divides the returned sum afterwards, as Hugging Face's
  ``ForCausalLMLoss`` divides by ``num_items_in_batch``, except that 0 gives 0 (the division gives NaN).

Liger-Kernel's options: ``use_token_scaling`` multiplies each token's loss (z-loss included) by
``p_y = softmax(softcapped logits)[target]``, detached, before the reduction (whose denominators do not
change); ``return_token_accuracy`` / ``return_predicted_tokens`` take ``argmax`` of the logits (before the
softcap, which is increasing: its fp32 rounding could tie distinct logits) and return a
``CrossEntropyOutput`` (``liger_core.loss_options.finish_outputs``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from liger_core.loss_options import CrossEntropyOptions, CrossEntropyOutput, finish_outputs
from liger_core.loss_options import resolve as resolve_options


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
    options: CrossEntropyOptions | None = None,
    inplace_backward: bool = False,  # accepted for signature parity; the reference never writes in place
    denominator: torch.Tensor | float | None = None,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    use_token_scaling: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | CrossEntropyOutput:
    """``options``: the loss options as one object, instead of the keywords (``liger_core.loss_options``)."""
    options = resolve_options(
        options, weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss,
        return_token_accuracy, return_predicted_tokens, use_token_scaling,
    )  # fmt: skip
    weight, ignore_index, reduction = options.weight, options.ignore_index, options.reduction
    label_smoothing, lse_square_scale = options.label_smoothing, options.lse_square_scale
    softcap, return_z_loss = options.softcap, options.return_z_loss
    vocab = logits.shape[-1]
    out_shape = target.shape
    target = target.reshape(-1).long()
    valid = target != ignore_index
    logits = logits.reshape(-1, vocab).to(torch.promote_types(logits.dtype, torch.float32))
    logits = logits.masked_fill(~valid[:, None], 0.0)
    argmax = None
    if options.wants_argmax:
        argmax = torch.where(valid, logits.detach().argmax(-1), -1)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if weight is not None:
        weight = weight.to(logits.dtype)
    scale = None
    if options.use_token_scaling:  # p_y, a constant; 0 on ignored rows (whose loss is 0)
        safe = torch.where(valid, target, 0)
        p_y = torch.softmax(logits.detach(), -1).gather(-1, safe[:, None])[:, 0]
        scale = torch.where(valid, p_y, 0.0)
    loss = F.cross_entropy(
        logits,
        target,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction if scale is None else "none",
        label_smoothing=label_smoothing,
    )
    if scale is not None:  # the reduction of the scaled token losses, torch's denominators
        loss = loss * scale
        if reduction == "mean":
            den = valid.sum() if weight is None else weight[target[valid]].sum()
            loss = loss.sum() / den
        elif reduction == "sum":
            loss = loss.sum()
    if lse_square_scale != 0.0 or return_z_loss:
        z = lse_square_scale * torch.logsumexp(logits, dim=-1).square()
        z = z.masked_fill(~valid, 0.0)
        if scale is not None:
            z = z * scale
        if reduction == "mean":
            z = z.sum() / valid.sum()  # every target ignored: 0 / 0, as the cross-entropy's mean
        elif reduction == "sum":
            z = z.sum()
        loss = loss + z
    if reduction == "none":
        loss = loss.reshape(out_shape)
    elif denominator is not None:  # HF's ForCausalLMLoss: the sum divided afterwards
        loss = _divided(loss, denominator)
        z = _divided(z, denominator) if return_z_loss else None
    if return_z_loss:
        z = (z.reshape(out_shape) if reduction == "none" else z).detach()
    else:
        z = None
    return finish_outputs(options, loss, z, argmax, target.reshape(out_shape))


def _divided(value: torch.Tensor, denominator: torch.Tensor | float) -> torch.Tensor:
    """``value / denominator``; 0 where the denominator is 0 (a safe divisor keeps the gradient finite)."""
    den = torch.as_tensor(denominator, device=value.device).to(value.dtype)
    nonzero = den != 0
    return value / torch.where(nonzero, den, torch.ones_like(den)) * nonzero

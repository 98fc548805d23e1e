"""Reference fused linear log-probs: the eager code it replaces, which materialises all the logits.

``logits = hidden @ weight.T (+ bias)`` in the input dtype (as ``lm_head``), then TRL's transform
``z = softcap * tanh(logit_scale * logits / softcap) / temperature`` (no softcap: ``z = logit_scale * logits /
temperature``) also in the input dtype, as the code it replaces does it (the model's forward scales and caps
its logits in the model dtype, e.g. Gemma-2 and Cohere, and TRL's unfused path divides them by the temperature
before ``selective_log_softmax``), then the per-token statistics of ``softmax(z)`` in fp32 (float64 for
float64 inputs):

    log_probs        = log_softmax(z)[target]         (gradient to hidden, weight, bias)
    entropy          = -sum_v p_v log p_v             (gradient to hidden, weight, bias, as TRL's kernel)
    log_sum_sq_probs = log sum_v p_v^2                (detached)
    mean_logits      = mean_v z_v                     (detached)
    is_top1          = argmax_v z_v == target         (first maximum, as torch.argmax; bool)

Every field is 0 (False) where ``target == ignore_index``, whose logits are not read (zeros in their place: no
gradient reaches them whatever they hold, as the Triton op); fields not in ``outputs`` are None
(``log_probs`` is always computed). Non-finite logits give what these formulas give: NaN in every field of a
row with a NaN or +inf logit (``is_top1``: torch.argmax's first NaN), a -inf logit a finite log-prob (of
another target) but a NaN entropy (``p log p = 0 * -inf``, as the eager code it replaces).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


class FusedLogProbs(NamedTuple):
    """Per-token outputs of ``fused_linear_logprobs`` (shape of ``target``; fp32, ``is_top1`` bool)."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    log_sum_sq_probs: torch.Tensor | None = None
    mean_logits: torch.Tensor | None = None
    is_top1: torch.Tensor | None = None


def transform_logits(
    logits: torch.Tensor, temperature: float, softcap: float | None, logit_scale: float
) -> torch.Tensor:
    """TRL's order: scale, softcap, then divide by the temperature."""
    logits = logits * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return logits / temperature


def fused_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    ignore_index: int = -100,
    outputs: tuple[str, ...] = ("log_probs",),
    chunk_size: int | None = None,  # signature parity: the reference does not chunk
    max_chunk_bytes: int | None = None,  # signature parity
    accum_dtype: torch.dtype | None = None,  # signature parity: one GEMM has nothing to accumulate
    check_targets: bool = True,  # signature parity: the functional entry point checks on this path
) -> FusedLogProbs:
    valid = target != ignore_index
    z = transform_logits(F.linear(hidden, weight, bias), temperature, softcap, logit_scale)
    z = z.to(torch.promote_types(z.dtype, torch.float32)).masked_fill(~valid[..., None], 0.0)
    log_p = torch.log_softmax(z, dim=-1)
    safe = target.masked_fill(~valid, 0).long()
    log_probs = log_p.gather(-1, safe.unsqueeze(-1)).squeeze(-1).masked_fill(~valid, 0.0)
    entropy = log_sum_sq_probs = mean_logits = is_top1 = None
    if "entropy" in outputs:
        entropy = -(log_p.exp() * log_p).sum(-1).masked_fill(~valid, 0.0)
    with torch.no_grad():
        if "log_sum_sq_probs" in outputs:
            log_sum_sq_probs = torch.logsumexp(2 * log_p, dim=-1).masked_fill(~valid, 0.0)
        if "mean_logits" in outputs:
            mean_logits = z.mean(-1).masked_fill(~valid, 0.0)
        if "is_top1" in outputs:
            is_top1 = (z.argmax(-1) == target) & valid
    return FusedLogProbs(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)


def fused_linear_scaled_cross_entropy(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    temperature: float = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The eager composition RL trainers run (verl's / liger-kernel's fallback): logits / temperature in the
    input's dtype, then fp32 log_softmax, the target's term and the entropy, 0 at ignored tokens."""
    logits = (input @ weight.t()) / temperature
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    valid = target != ignore_index
    log_probs = z.log_softmax(-1)
    token = log_probs.gather(-1, target.masked_fill(~valid, 0).unsqueeze(-1)).squeeze(-1)
    nll = torch.where(valid, -token, torch.zeros_like(token))
    if not return_entropy:
        return nll
    entropy = torch.logsumexp(z, -1) - (z.softmax(-1) * z).sum(-1)
    return nll, torch.where(valid, entropy, torch.zeros_like(entropy)).to(logits.dtype)

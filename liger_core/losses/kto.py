"""KTO (unpaired preferences) on hidden states, with the logits never materialised.

Re-derived from TRL 1.16's ``KTOTrainer._compute_loss``. Per completion i with label y_i (True: desirable),
sequence log-prob ``l_i = sum_t log p(target_it)`` (policy) and ``l0_i`` (reference), KL estimate ``z``
(detached, clamped at 0: the mean over the batch's mismatched "KL" completions of ``l_KL - l0_KL``, or
given)::

    kto:                desirable    w_d (1 - sig(beta (l - l0 - z)))
                        undesirable  w_u (1 - sig(beta (z - (l - l0))))
    apo_zero_unpaired:  desirable    w_d (1 - sig(beta (l - l0)))
                        undesirable  w_u sig(beta (l - l0))

loss = mean over the B completions of those terms (TRL's ``nanmean`` of the concatenated weighted losses).
Metrics (detached, TRL's names): ``kl``, ``rewards/chosen`` and ``logps/chosen`` (sums over the desirable
completions / their number), ``rewards/rejected``, ``logps/rejected``, ``rewards/margins`` (chosen -
rejected), ``logits/chosen``, ``logits/rejected`` (mean logit over each group's completion tokens),
``entropy`` (mean over all completion tokens). Where TRL logs nothing (no desirable or no undesirable
completion in the batch) the value here is 0, and ``count/chosen``/``count/rejected`` say how many there
were.
"""

from __future__ import annotations

import torch
from torch import nn

from liger_core.dispatch import check_choice, check_shape, check_tensor
from liger_core.losses._logps import (
    LogprobHead,
    check_batch,
    check_sequence_logps,
    masked_mean,
    reference_token_logprobs,
    sequence_logps,
    token_logprobs,
)

KTO_LOSS_TYPES = ("kto", "apo_zero_unpaired")


def kto_kl_estimate(kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """TRL's KL term: mean of the policy - reference log-probs of the mismatched completions, detached,
    clamped at 0."""
    return (kl_logps - ref_kl_logps).mean().detach().clamp(min=0)


def kto_loss_from_logps(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    labels: torch.Tensor,
    kl: torch.Tensor | float = 0.0,
    *,
    beta: float = 0.1,
    loss_type: str = "kto",
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, rewards (B,)) of the module doc from sequence log-probs ``(B,)`` and boolean ``labels (B,)``."""
    check_choice("loss_type", loss_type, KTO_LOSS_TYPES)
    if not beta > 0:
        raise ValueError(f"beta={beta} must be positive")
    logratios = logps - ref_logps
    if loss_type == "kto":
        kl = torch.as_tensor(kl, dtype=logratios.dtype, device=logratios.device).detach()
        desirable = 1 - torch.sigmoid(beta * (logratios - kl))
        undesirable = 1 - torch.sigmoid(beta * (kl - logratios))
    else:
        desirable = 1 - torch.sigmoid(beta * logratios)
        undesirable = torch.sigmoid(beta * logratios)
    losses = torch.where(labels, desirable_weight * desirable, undesirable_weight * undesirable)
    loss = losses.mean() if losses.numel() else losses.sum()
    return loss, beta * logratios.detach()


def fused_linear_kto_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ref_logps: torch.Tensor | None = None,
    ref_hidden: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    ref_bias: torch.Tensor | None = None,
    kl: torch.Tensor | float | None = None,
    kl_hidden: torch.Tensor | None = None,
    kl_target: torch.Tensor | None = None,
    ref_kl_hidden: torch.Tensor | None = None,
    ref_kl_logps: torch.Tensor | None = None,
    beta: float = 0.1,
    loss_type: str = "kto",
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    ignore_index: int = -100,
    compute_metrics: bool = True,
    temperature: float = 1.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    chunk_size: int | None = None,
    accum_dtype: torch.dtype | None = torch.float32,
    average_log_prob: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KTO (module doc) on ``hidden (B, T, H)``, shifted ``target (B, T)``, ``labels (B,)`` (True: desirable).

    Reference: ``ref_hidden`` (+ ``ref_weight``, ``ref_bias``; same op under no_grad) or ``ref_logps (B,)``.
    KL term (loss_type "kto"): ``kl`` given (a number or 0-dim tensor, clamped at 0), or from the mismatched
    completions ``kl_hidden``/``kl_target`` (policy, no gradient, same weight) and ``ref_kl_hidden`` (with
    ``ref_weight``) or ``ref_kl_logps``; default 0. ``average_log_prob`` (Liger-Kernel's option): every
    sequence log-prob (policy, reference, KL completions) is length-normalised, ``sum_t log p_t / n`` over its
    n completion tokens (0 for n = 0); precomputed ``ref_logps``/``ref_kl_logps`` must then be averages too.
    Returns ``(loss, metrics)``."""
    rows = check_batch(hidden, target, paired=False)
    check_tensor("labels", labels, dtypes=None, ndim=1)
    check_shape("labels", labels, (rows,), "one preference label per completion")
    labels = labels.to(device=hidden.device, dtype=torch.bool)
    if not isinstance(average_log_prob, bool):
        raise TypeError(f"average_log_prob must be a bool, got {type(average_log_prob).__name__}")
    head = LogprobHead(ignore_index, temperature, softcap, logit_scale, chunk_size, accum_dtype=accum_dtype)
    outputs = ("entropy", "mean_logits") if compute_metrics else ()
    stats = token_logprobs(hidden, weight, target, bias, head, outputs=outputs)
    mask = target != ignore_index
    logps = sequence_logps(stats.log_probs, mask, average=average_log_prob)

    if (ref_hidden is None) == (ref_logps is None):
        raise ValueError("give exactly one reference: ref_hidden (+ ref_weight) or ref_logps")
    if ref_hidden is not None:
        ref_tokens = reference_token_logprobs(ref_hidden, ref_weight, target, ref_bias, head)
        ref = sequence_logps(ref_tokens, mask, average=average_log_prob)
    else:
        check_sequence_logps("ref_logps", ref_logps, rows, hidden.device)
        ref = ref_logps.detach().to(logps.dtype)

    if kl is not None and kl_hidden is not None:
        raise ValueError("give kl or kl_hidden (with kl_target), not both")
    if kl_hidden is not None:
        kl = _kl_from_hidden(
            kl_hidden, kl_target, weight, bias, ref_kl_hidden, ref_kl_logps, ref_weight, ref_bias, head,
            average_log_prob,
        )  # fmt: skip
    elif kl is None:
        kl = logps.new_zeros(())
    else:
        kl = torch.as_tensor(kl, dtype=logps.dtype, device=logps.device).detach().clamp(min=0)
    if loss_type != "kto":
        kl = logps.new_zeros(())

    loss, rewards = kto_loss_from_logps(
        logps,
        ref,
        labels,
        kl,
        beta=beta,
        loss_type=loss_type,
        desirable_weight=desirable_weight,
        undesirable_weight=undesirable_weight,
    )
    n_chosen = labels.sum()
    n_rejected = labels.numel() - n_chosen
    detached = logps.detach()
    zero = torch.zeros((), dtype=detached.dtype, device=detached.device)

    def group_mean(values, selected, count):
        return torch.where(selected, values, zero).sum() / count.clamp(min=1).to(values.dtype)

    metrics = {
        "kl": kl.detach().reshape(()),
        "rewards/chosen": group_mean(rewards, labels, n_chosen),
        "rewards/rejected": group_mean(rewards, ~labels, n_rejected),
        "logps/chosen": group_mean(detached, labels, n_chosen),
        "logps/rejected": group_mean(detached, ~labels, n_rejected),
        "count/chosen": n_chosen.detach(),
        "count/rejected": n_rejected.detach(),
    }
    metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
    if stats.mean_logits is not None:
        metrics["logits/chosen"] = masked_mean(stats.mean_logits, mask & labels[:, None])
        metrics["logits/rejected"] = masked_mean(stats.mean_logits, mask & ~labels[:, None])
    if stats.entropy is not None:
        metrics["entropy"] = masked_mean(stats.entropy, mask)
    return loss, metrics


def _kl_from_hidden(
    kl_hidden,
    kl_target,
    weight,
    bias,
    ref_kl_hidden,
    ref_kl_logps,
    ref_weight,
    ref_bias,
    head,
    average,
):
    """TRL's KL estimate from the mismatched completions: policy log-probs under no_grad, reference log-probs
    from ``ref_kl_hidden`` or ``ref_kl_logps``."""
    if kl_target is None:
        raise ValueError("kl_hidden needs kl_target (the mismatched completions' shifted targets)")
    rows = check_batch(kl_hidden, kl_target, paired=False)
    kl_mask = kl_target != head.ignore_index
    with torch.no_grad():
        policy = token_logprobs(
            kl_hidden.detach(),
            weight.detach(),
            kl_target,
            bias.detach() if bias is not None else None,
            head,
        ).log_probs
    policy = sequence_logps(policy, kl_mask, average=average)
    if (ref_kl_hidden is None) == (ref_kl_logps is None):
        raise ValueError("kl_hidden needs exactly one of ref_kl_hidden (+ ref_weight) and ref_kl_logps")
    if ref_kl_hidden is not None:
        ref = sequence_logps(
            reference_token_logprobs(ref_kl_hidden, ref_weight, kl_target, ref_bias, head),
            kl_mask,
            average=average,
        )
    else:
        check_sequence_logps("ref_kl_logps", ref_kl_logps, rows, kl_hidden.device)
        ref = ref_kl_logps.to(policy.dtype)
    return kto_kl_estimate(policy, ref)


class LigerFusedLinearKTOLoss(nn.Module):
    """``fused_linear_kto_loss`` as a module: ``forward(hidden, weight, target, labels, bias=None,
    **per_call)`` returns ``(loss, metrics)``."""

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, hidden, weight, target, labels, bias=None, **per_call):
        return fused_linear_kto_loss(hidden, weight, target, labels, bias, **{**self.options, **per_call})

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())

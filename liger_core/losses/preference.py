"""Paired preference losses (DPO, ORPO, CPO, SimPO) on hidden states, with the logits never materialised.

Each fused entry point computes the per-token log-probs of the chosen and rejected completions with
``liger_core.ops.fused_linear_logprobs`` (chunked; gradients to hidden, weight, bias through it), reduces them
to sequence log-probs (``_logps``) and applies the trainer's formula: ``_preference_math`` (its module doc
gives the math; ``dpo_loss_from_logps``, ``orpo_loss_from_logps``, ``cpo_loss_from_logps`` and the options are
re-exported here). DPO's per-pair terms are computed per group of whole pairs inside the chunked pass where
they separate (not the sorted aot losses), so each group's logits are freed after its gradient.

Reference log-probs: from ``ref_hidden``/``ref_weight`` (the reference model's last hidden states and lm_head,
through the same op under no_grad), or precomputed (``ref_chosen_logps``, ``ref_rejected_logps``), or none
(``reference_free=True``: c0 = r0 = 0).

Metrics (detached 0-dim tensors, TRL's logged names): ``rewards/chosen``, ``rewards/rejected``,
``rewards/accuracies``, ``rewards/margins``, ``logps/chosen``, ``logps/rejected``, ``logits/chosen``,
``logits/rejected`` (mean logit over the completion tokens, as DPOTrainer; ORPO/CPO in trl.experimental
average over every position including prompt and padding, which a masked batch does not define), ``entropy``,
``mean_token_accuracy`` (DPO), ``nll_loss`` (ORPO/CPO), ``log_odds_ratio``, ``log_odds_chosen`` (ORPO). This
process's batch only (TRL gathers across processes before logging).

No NaN on a fully masked completion: its sequence log-prob is 0 (average: 0 / max(n, 1)), its token metrics
count nothing, and ORPO's ``log(1 - e^c)`` at c = 0 is replaced by that of the largest float below 0.
"""

from __future__ import annotations

import torch
from torch import nn

from liger_core.losses import _preference_math
from liger_core.losses._logps import (
    LogprobHead,
    check_batch,
    check_sequence_logps,
    detached_mean,
    reference_token_logprobs,
    sequence_logps,
    token_logprobs,
    token_metrics,
)
from liger_core.losses._preference_math import (
    CPOOptions,
    DPOOptions,
    cpo_loss_from_logps,
    cpo_options,
    dpo_loss_from_logps,
    dpo_options,
    orpo_loss_from_logps,
    resolve_options,
    simpo_options,
)
from liger_core.ops.fused_linear_cross_entropy import choose_chunk_tokens, wants_grad
from liger_core.ops.fused_linear_logprob_loss import fused_linear_logprob_loss

# the loss type names are public here too, as the formulas and options
DPO_LOSS_TYPES, F_DIVERGENCES = _preference_math.DPO_LOSS_TYPES, _preference_math.F_DIVERGENCES
CPO_LOSS_TYPES = _preference_math.CPO_LOSS_TYPES


def preference_metrics(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """TRL's reward and log-prob metrics of a paired batch (means over the pairs)."""
    chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
    return {
        "rewards/chosen": detached_mean(chosen_rewards),
        "rewards/rejected": detached_mean(rejected_rewards),
        "rewards/accuracies": detached_mean((chosen_rewards > rejected_rewards).to(chosen_rewards.dtype)),
        "rewards/margins": detached_mean(chosen_rewards - rejected_rewards),
        "logps/chosen": detached_mean(chosen_logps),
        "logps/rejected": detached_mean(rejected_logps),
    }


# One group of the gradient-in-forward path (fused_linear_logprob_loss) holds at least one pair's logits:
# up to this size by default (2 x 2048 tokens x 128256 x bf16 = 1 GiB; Liger-Kernel's chunked losses hold
# one pair's logits in fp32); longer pairs take the recomputing path (fused_linear_logprobs)
GROUP_LOGITS_MAX_BYTES = 2**30


def _pair_groups(n_pairs, hidden, weight, bias, chunk_size):
    """Row ranges of the gradient-in-forward path's groups (a few whole pairs: chosen rows i..j, rejected rows
    B+i..B+j), or None for the recomputing path: no gradient wanted, or one pair's logits above
    ``chunk_size`` tokens (or, by default, above GROUP_LOGITS_MAX_BYTES)."""
    if n_pairs == 0 or not wants_grad(hidden, weight, bias):
        return None
    pair_tokens = 2 * hidden.shape[1]
    if chunk_size is not None:
        per_group = chunk_size // max(pair_tokens, 1)
    else:
        vocab, hidden_size = weight.shape
        if pair_tokens * vocab * hidden.element_size() > GROUP_LOGITS_MAX_BYTES:
            return None
        tokens = choose_chunk_tokens(
            2 * n_pairs * hidden.shape[1], hidden_size, vocab, hidden.dtype, hidden.device
        )
        per_group = max(1, tokens // max(pair_tokens, 1))
    if per_group < 1:
        return None
    return [
        [
            (first, min(first + per_group, n_pairs)),
            (n_pairs + first, n_pairs + min(first + per_group, n_pairs)),
        ]
        for first in range(0, n_pairs, per_group)
    ]


def _paired_logprobs(hidden, weight, target, bias, head, compute_metrics, average):
    """ORPO's and CPO's scoring of the pairs: ``(n_pairs, stats, mask, chosen_logps, rejected_logps)``, the
    per-token stats (with ``mean_logits`` for the metrics) and mask that their NLL term and metrics read, and
    the sequence log-probs (``average``: length-normalised)."""
    rows = check_batch(hidden, target, paired=True)
    outputs = ("mean_logits",) if compute_metrics else ()
    stats = token_logprobs(hidden, weight, target, bias, head, outputs=outputs)
    mask = target != head.ignore_index
    n_pairs = rows // 2
    logps = sequence_logps(stats.log_probs, mask, average=average)
    return n_pairs, stats, mask, logps[:n_pairs], logps[n_pairs:]


def fused_linear_dpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ref_chosen_logps: torch.Tensor | None = None,
    ref_rejected_logps: torch.Tensor | None = None,
    ref_hidden: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    ref_bias: torch.Tensor | None = None,
    reference_free: bool = False,
    options: DPOOptions | None = None,
    use_weighting: bool = False,
    ignore_index: int = -100,
    compute_metrics: bool = True,
    temperature: float = 1.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    chunk_size: int | None = None,
    accum_dtype: torch.dtype | None = torch.float32,
    per_pair: bool = False,
    **hyper,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO (module doc) on ``hidden (2B, T, H)`` (chosen rows first, then rejected), lm_head ``weight (V,
    H)``, shifted ``target (2B, T)``; returns ``(loss, metrics)``.

    Reference: ``ref_hidden (2B, T, H_ref)`` with ``ref_weight``/``ref_bias`` (scored with the same op under
    no_grad), or ``ref_chosen_logps``/``ref_rejected_logps`` ``(B,)`` precomputed (per-token averages with
    ``average_log_prob``), or ``reference_free``. ``average_log_prob`` (in ``options``): length-normalised
    sequence log-probs for the policy, the reference and the ``logps/*`` metrics.
    ``compute_metrics=False`` skips the per-token statistics (one read of each chunk of logits less) and
    returns the reward and log-prob metrics only. ``per_pair``: the metrics also hold the ``(B,)`` tensors
    ``chosen_logps``, ``rejected_logps``, ``chosen_rewards``, ``rejected_rewards`` (detached; for trainers
    that gather them across processes before averaging). ``temperature``, ``softcap``, ``logit_scale``,
    ``chunk_size``, ``accum_dtype``: layer-1 options, also used for the reference. ``hyper`` (the keywords
    of ``dpo_options``: beta, loss_type, loss_weights, label_smoothing, f_divergence_type, ...) or
    ``options``: the DPO hyper-parameters."""
    options = resolve_options(options, dpo_options, hyper)
    beta, names, average = options.beta, options.loss_types, options.average_log_prob
    outputs = ("entropy", "mean_logits", "is_top1") if compute_metrics else ()
    if use_weighting:
        if {"aot", "aot_unpaired"} & set(names):
            raise ValueError("use_weighting (WPO) is not defined for the sorted 'aot' losses")
        outputs = outputs + ("log_sum_sq_probs",)
    head = LogprobHead(ignore_index, temperature, softcap, logit_scale, chunk_size, accum_dtype=accum_dtype)
    n_pairs = check_batch(hidden, target, paired=True) // 2
    mask = target != ignore_index
    counts = mask.sum(-1)
    separable = not {"aot", "aot_unpaired"} & set(names)
    groups = _pair_groups(n_pairs, hidden, weight, bias, chunk_size) if separable else None
    ref_head = head
    if groups is not None and chunk_size is None:  # the reference's chunks as large as a group's logits
        ref_head = head.replace(chunk_size=2 * (groups[0][0][1] - groups[0][0][0]) * hidden.shape[1])
    placeholder = hidden.new_zeros(n_pairs, dtype=torch.float32)
    ref_chosen, ref_rejected = _reference_pair_logps(
        n_pairs, placeholder, target, mask, ref_chosen_logps, ref_rejected_logps, ref_hidden, ref_weight,
        ref_bias, reference_free, ref_head, average=average,
    )  # fmt: skip
    n_chosen_tokens = counts[:n_pairs].sum().clamp(min=1)

    def loss_of(log_probs, log_sum_sq_probs, first, last):
        """The loss terms of pairs [first, last) (their chosen rows, then their rejected rows), as a share of
        the batch's mean over pairs."""
        share = (last - first) / max(n_pairs, 1)
        rows_mask = torch.cat([mask[first:last], mask[n_pairs + first : n_pairs + last]])
        seq = sequence_logps(log_probs, rows_mask, average=average)
        pairs = last - first
        sft_loss = None
        if "sft" in names:  # the mean over every chosen token of the batch, as a share of this group
            chosen_sums = sequence_logps(log_probs[:pairs], rows_mask[:pairs]) if average else seq[:pairs]
            sft_loss = -chosen_sums.sum() / n_chosen_tokens / share
        pair_weights = None
        if use_weighting:
            with torch.no_grad():
                aligned = sequence_logps(log_probs.detach() - log_sum_sq_probs, rows_mask, average=True)
                seq_weights = aligned.exp()
                pair_weights = seq_weights[:pairs] * seq_weights[pairs:]
        loss = dpo_loss_from_logps(
            seq[:pairs],
            seq[pairs:],
            ref_chosen[first:last],
            ref_rejected[first:last],
            options=options,
            chosen_lengths=counts[first:last],
            rejected_lengths=counts[n_pairs + first : n_pairs + last],
            pair_weights=pair_weights,
            sft_loss=sft_loss,
        )
        return loss * share

    if groups is not None:
        loss, stats = fused_linear_logprob_loss(
            hidden, weight, target, bias, groups=groups,
            group_loss=lambda g, st: loss_of(st.log_probs, st.log_sum_sq_probs, *groups[g][0]),
            ignore_index=ignore_index, outputs=outputs, accum_dtype=accum_dtype, **head.transform(),
        )  # fmt: skip
    else:
        stats = token_logprobs(hidden, weight, target, bias, head, outputs=outputs)
        loss = loss_of(stats.log_probs, stats.log_sum_sq_probs, 0, n_pairs)
    logps = sequence_logps(stats.log_probs, mask, average=average)
    chosen_logps, rejected_logps = logps[:n_pairs], logps[n_pairs:]
    chosen_rewards = beta * (chosen_logps - ref_chosen).detach()
    rejected_rewards = beta * (rejected_logps - ref_rejected).detach()
    metrics = preference_metrics(chosen_logps, rejected_logps, chosen_rewards, rejected_rewards)
    metrics.update(token_metrics(stats, mask, n_pairs))
    if per_pair:
        metrics.update(
            chosen_logps=chosen_logps.detach(),
            rejected_logps=rejected_logps.detach(),
            chosen_rewards=chosen_rewards,
            rejected_rewards=rejected_rewards,
        )
    return loss, metrics


def _reference_pair_logps(
    n_pairs, logps, target, mask, ref_chosen_logps, ref_rejected_logps, ref_hidden, ref_weight, ref_bias,
    reference_free, head, *, average,
):  # fmt: skip
    """(ref_chosen, ref_rejected) sequence log-probs (B,) from exactly one of the three sources."""
    given = [
        ref_hidden is not None,
        ref_chosen_logps is not None or ref_rejected_logps is not None,
        reference_free,
    ]
    if sum(given) != 1:
        raise ValueError(
            "give exactly one reference: ref_hidden (+ ref_weight), or ref_chosen_logps and "
            "ref_rejected_logps, or reference_free=True"
        )
    if reference_free:
        zeros = logps.new_zeros(n_pairs)
        return zeros, zeros
    if ref_hidden is not None:
        ref_tokens = reference_token_logprobs(ref_hidden, ref_weight, target, ref_bias, head)
        ref_logps = sequence_logps(ref_tokens, mask, average=average)
        return ref_logps[:n_pairs], ref_logps[n_pairs:]
    if ref_chosen_logps is None or ref_rejected_logps is None:
        raise ValueError("ref_chosen_logps and ref_rejected_logps go together")
    check_sequence_logps("ref_chosen_logps", ref_chosen_logps, n_pairs, logps.device)
    check_sequence_logps("ref_rejected_logps", ref_rejected_logps, n_pairs, logps.device)
    dtype = logps.dtype
    return ref_chosen_logps.detach().to(dtype), ref_rejected_logps.detach().to(dtype)


def _chosen_nll(stats_log_probs, mask, n_pairs, hidden, weight, bias, nll_target, head):
    """Mean token cross-entropy of the chosen completions (0 when they have no token): from the same per-token
    log-probs, or from a second pass over the chosen rows with ``nll_target (B, T)``."""
    if nll_target is None:
        chosen_lp, chosen_mask = stats_log_probs[:n_pairs], mask[:n_pairs]
    else:
        check_batch(hidden[:n_pairs], nll_target, paired=False)
        chosen_lp = token_logprobs(hidden[:n_pairs], weight, nll_target, bias, head).log_probs
        chosen_mask = nll_target != head.ignore_index
    total = sequence_logps(chosen_lp, chosen_mask).sum()
    return -total / chosen_mask.sum().clamp(min=1).to(total.dtype)


def fused_linear_orpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    beta: float = 0.1,
    nll_target: torch.Tensor | None = None,
    ignore_index: int = -100,
    compute_metrics: bool = True,
    temperature: float = 1.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    chunk_size: int | None = None,
    accum_dtype: torch.dtype | None = torch.float32,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """ORPO (module doc) on ``hidden (2B, T, H)`` (chosen rows first) and shifted ``target (2B, T)`` (the
    completion tokens); ``nll_target (B, T)``: the chosen rows' targets of the NLL term where they differ
    (trl.experimental's ORPOTrainer takes the NLL over prompt + completion: a second pass over the chosen
    rows), default: the same completion targets. Returns ``(loss, metrics)``."""
    head = LogprobHead(ignore_index, temperature, softcap, logit_scale, chunk_size, accum_dtype=accum_dtype)
    n_pairs, stats, mask, chosen_logps, rejected_logps = _paired_logprobs(
        hidden, weight, target, bias, head, compute_metrics, average=True
    )
    nll = _chosen_nll(stats.log_probs, mask, n_pairs, hidden, weight, bias, nll_target, head)
    loss, ratio, log_odds = orpo_loss_from_logps(chosen_logps, rejected_logps, nll, beta=beta)
    metrics = preference_metrics(chosen_logps, rejected_logps, beta * chosen_logps, beta * rejected_logps)
    metrics.update(token_metrics(stats, mask, n_pairs))
    metrics["nll_loss"] = nll.detach()
    metrics["log_odds_ratio"] = detached_mean(ratio)
    metrics["log_odds_chosen"] = detached_mean(log_odds)
    return loss, metrics


def fused_linear_cpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    options: CPOOptions | None = None,
    ignore_index: int = -100,
    compute_metrics: bool = True,
    temperature: float = 1.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    chunk_size: int | None = None,
    accum_dtype: torch.dtype | None = torch.float32,
    **hyper,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CPO (module doc; trl.experimental's CPOTrainer: ``loss_type`` sigmoid, hinge, ipo, simpo; AlphaPO
    ``alpha``) on ``hidden (2B, T, H)`` (chosen rows first) and shifted ``target (2B, T)``: mean over pairs +
    ``cpo_alpha`` x the chosen completions' mean token NLL. ``hyper`` (the keywords of ``cpo_options``) or
    ``options``: the hyper-parameters. Returns ``(loss, metrics)``."""
    options = resolve_options(options, cpo_options, hyper)
    head = LogprobHead(ignore_index, temperature, softcap, logit_scale, chunk_size, accum_dtype=accum_dtype)
    n_pairs, stats, mask, chosen_logps, rejected_logps = _paired_logprobs(
        hidden, weight, target, bias, head, compute_metrics, average=options.loss_type in ("ipo", "simpo")
    )
    losses, chosen_rewards, rejected_rewards = cpo_loss_from_logps(
        chosen_logps, rejected_logps, options=options
    )
    if options.cpo_alpha != 0.0:
        nll = _chosen_nll(stats.log_probs, mask, n_pairs, hidden, weight, bias, None, head)
    else:
        nll = losses.new_zeros(())
    loss = losses.mean() + options.cpo_alpha * nll
    metrics = preference_metrics(chosen_logps, rejected_logps, chosen_rewards, rejected_rewards)
    metrics.update(token_metrics(stats, mask, n_pairs))
    metrics["nll_loss"] = nll.detach()
    return loss, metrics


def fused_linear_simpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    options: CPOOptions | None = None,
    **kwargs,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SimPO: ``fused_linear_cpo_loss(loss_type="simpo")`` (average log-probs, target margin ``simpo_gamma``)
    with the SimPO paper's defaults (beta 2, no NLL term, see ``simpo_options``); ``alpha != 0`` is AlphaPO.
    ``kwargs``: the hyper-parameters (or ``options``) and ``fused_linear_cpo_loss``' other keywords."""
    hyper = {name: kwargs.pop(name) for name in CPOOptions._fields if name in kwargs}
    options = resolve_options(options, simpo_options, hyper)
    if options.loss_type != "simpo":
        raise ValueError(f"SimPO takes options with loss_type='simpo', got {options.loss_type!r}")
    return fused_linear_cpo_loss(hidden, weight, target, bias, options=options, **kwargs)


class _FusedLinearPreferenceLoss(nn.Module):
    """Holds the loss's hyper-parameters; ``forward(hidden, weight, target, bias=None, **per_call)`` returns
    ``(loss, metrics)`` (per-call keywords: the reference inputs and any override)."""

    _fn = None

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, hidden, weight, target, bias=None, **per_call):
        return type(self)._fn(hidden, weight, target, bias, **{**self.options, **per_call})

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


class LigerFusedLinearDPOLoss(_FusedLinearPreferenceLoss):
    """``fused_linear_dpo_loss`` as a module: ``LigerFusedLinearDPOLoss(beta=0.1, loss_type="sigmoid")(hidden,
    lm_head.weight, target, ref_hidden=..., ref_weight=...)``."""

    _fn = staticmethod(fused_linear_dpo_loss)


class LigerFusedLinearORPOLoss(_FusedLinearPreferenceLoss):
    """``fused_linear_orpo_loss`` as a module."""

    _fn = staticmethod(fused_linear_orpo_loss)


class LigerFusedLinearCPOLoss(_FusedLinearPreferenceLoss):
    """``fused_linear_cpo_loss`` as a module."""

    _fn = staticmethod(fused_linear_cpo_loss)


class LigerFusedLinearSimPOLoss(_FusedLinearPreferenceLoss):
    """``fused_linear_simpo_loss`` as a module."""

    _fn = staticmethod(fused_linear_simpo_loss)

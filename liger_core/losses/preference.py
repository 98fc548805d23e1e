"""Paired preference losses (DPO, ORPO, CPO, SimPO) on hidden states, with the logits never materialised.

Each fused entry point computes the per-token log-probs of the chosen and rejected completions with
``liger_core.ops.fused_linear_logprobs`` (chunked; gradients to hidden, weight, bias through it), reduces them
to sequence log-probs (``_logps``) and applies the trainer's formula, re-derived from TRL 1.16's
``DPOTrainer._compute_loss`` and ``trl.experimental``'s ``ORPOTrainer.odds_ratio_loss`` /
``CPOTrainer.cpo_loss``. With per-sequence log-probs ``c, r`` (policy, chosen / rejected), ``c0, r0``
(reference), ``beta``, label smoothing ``eps``:

DPO (``dpo_loss_from_logps``): scores ``s_c = f(c - c0)``, ``s_r = f(r - r0)`` (f the f-divergence's
derivative: identity for reverse KL), ``d = s_c - s_r``, per pair::

    sigmoid      -log sig(beta d)                            (eps > 0: conservative DPO, see below)
    hinge        relu(1 - beta d)
    ipo          (s_c / n_c - s_r / n_r - 1 / (2 beta))^2    n: completion tokens (at least 1)
    exo_pair     q log(q / (1 - eps)) + (1 - q) log((1 - q) / eps),  q = sig(beta d)
    nca_pair     -log sig(beta (c - c0)) - 1/2 log sig(-beta (c - c0)) - 1/2 log sig(-beta (r - r0))
    robust       [-(1 - eps) log sig(beta d) + eps log sig(-beta d)] / (1 - 2 eps)
    bco_pair     -log sig(beta (c - c0)) - log sig(-beta (r - r0))
    sppo_hard    (c - c0 - 1 / (2 beta))^2 + (r - r0 + 1 / (2 beta))^2
    aot          -(1 - eps) log sig(beta D) - eps log sig(-beta D),  D = sort(c - r) - sort(c0 - r0)
    aot_unpaired as aot with D = sort(c - c0) - sort(r - r0)
    apo_zero     1 - sig(beta (c - c0)) + sig(beta (r - r0))
    apo_down     sig(beta (c - c0)) + 1 - sig(beta ((c - c0) - (r - r0)))
    discopop     (1 - m) (-log sig(beta d)) + m exp(-beta d),  m = sig(beta d / tau)
    sigmoid_norm -log sig(beta (s_c / n_c - s_r / n_r))
    sft          -mean of the chosen completions' token log-probs

loss = sum_k weight_k * mean_pairs(loss_k) (several loss types: TRL's MPO combination); with WPO weighting
each pair's loss is multiplied first by w_c w_r, w = exp(mean_t (logp_t - log sum_v p_v^2)) (no gradient).
Label smoothing: TRL 1.16 uses ``eps`` in exo_pair, robust and the aot losses only; here ``sigmoid`` with
``eps > 0`` is the conservative DPO of the DPO paper's appendix (TRL before 1.0), ``-(1 - eps) log sig(beta
d) - eps log sig(-beta d)``, which is TRL 1.16's sigmoid at ``eps = 0`` (pass 0 for parity with TRL 1.16).
Reference log-probs: from ``ref_hidden``/``ref_weight`` (the reference model's last hidden states and lm_head,
through the same op under no_grad), or precomputed (``ref_chosen_logps``, ``ref_rejected_logps``), or none
(``reference_free=True``: c0 = r0 = 0).

ORPO: ``c, r`` are *average* token log-probs; ``log_odds = (c - r) - (log(1 - e^c) - log(1 - e^r))``, loss =
``nll - beta * mean(log sig(log_odds))`` with ``nll`` the chosen completions' mean token cross-entropy.

CPO / SimPO: ``d = c - r`` (sums; averages for ipo and simpo; AlphaPO ``alpha != 0``: ``c <- (1 -
e^(-alpha c)) / alpha``), simpo ``d <- d - gamma / beta``; per pair sigmoid/simpo ``-(1 - eps) log sig(beta
d) - eps log sig(-beta d)``, hinge ``relu(1 - beta d)``, ipo ``(d - 1 / (2 beta))^2``; loss = ``mean +
cpo_alpha * nll``.

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

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from liger_core.dispatch import check_choice
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
from liger_core.ops.fused_linear_cross_entropy import choose_chunk_tokens, wants_grad
from liger_core.ops.fused_linear_logprob_loss import fused_linear_logprob_loss

DPO_LOSS_TYPES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sigmoid_norm",
    "sft",
)
F_DIVERGENCES = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")
# TRL: the f-DPO reparameterisation only cancels log Z(x) in the chosen - rejected score difference
_F_DIVERGENCE_LOSS_TYPES = (
    "sigmoid",
    "sigmoid_norm",
    "hinge",
    "ipo",
    "exo_pair",
    "robust",
    "discopop",
    "sft",
)
CPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "simpo")


def _logsig(x: torch.Tensor) -> torch.Tensor:
    return F.logsigmoid(x)


def _f_scores(logratios: torch.Tensor, f_divergence_type: str, alpha: float) -> torch.Tensor:
    """f'(exp(logratio)) up to constants that cancel in the chosen - rejected difference (TRL's f-DPO)."""
    if f_divergence_type == "reverse_kl" or (
        f_divergence_type == "alpha_divergence" and abs(alpha - 1) < 1e-6
    ):
        return logratios
    if f_divergence_type == "forward_kl":  # f'(t) = 1 - 1/t
        return -torch.expm1(-logratios)
    if f_divergence_type == "js_divergence":  # f'(t) = log 2 + log sig(log t)
        return math.log(2) + _logsig(logratios)
    # alpha divergence: f'(t) = (t^(alpha - 1) - 1) / (alpha - 1), exponent clamped as TRL does (fp32: 80)
    t = ((alpha - 1.0) * logratios).clamp(max=80.0)
    return torch.expm1(t) / (alpha - 1.0)


class DPOOptions(NamedTuple):
    """Checked DPO hyper-parameters (see ``dpo_options``)."""

    beta: float
    loss_types: tuple[str, ...]
    loss_weights: tuple[float, ...]
    label_smoothing: float
    f_divergence_type: str
    f_alpha_divergence_coef: float
    discopop_tau: float
    average_log_prob: bool = False


def dpo_options(
    *,
    beta: float = 0.1,
    loss_type: str | Sequence[str] = "sigmoid",
    loss_weights: Sequence[float] | None = None,
    label_smoothing: float = 0.0,
    f_divergence_type: str = "reverse_kl",
    f_alpha_divergence_coef: float = 0.5,
    discopop_tau: float = 0.05,
    average_log_prob: bool = False,
) -> DPOOptions:
    """The DPO hyper-parameters (TRL's DPOConfig names and defaults), checked once: the one place that
    lists them. ``dpo_loss_from_logps`` and ``fused_linear_dpo_loss`` take them as keywords or whole
    (``options=``). ``loss_type``: one name or several (TRL's MPO), each weighted by ``loss_weights``.
    ``average_log_prob`` (Liger-Kernel's option): the sequence log-probs ``c, r, c0, r0`` of every loss type
    are length-normalised, ``sum_t log p_t / n`` over the n completion tokens (0 for n = 0); ipo and
    sigmoid_norm, which normalise by length themselves, then use them as they are (no second division), and
    sft stays the mean over the chosen tokens."""
    loss_types = (loss_type,) if isinstance(loss_type, str) else tuple(loss_type)
    weights = (1.0,) * len(loss_types) if loss_weights is None else tuple(loss_weights)
    if not loss_types or len(weights) != len(loss_types):
        raise ValueError(
            f"loss_weights {list(weights)} must give one weight per loss type {list(loss_types)}"
        )
    for name in loss_types:
        check_choice("loss_type", name, DPO_LOSS_TYPES)
    check_choice("f_divergence_type", f_divergence_type, F_DIVERGENCES)
    if f_divergence_type != "reverse_kl" and not set(loss_types) <= set(_F_DIVERGENCE_LOSS_TYPES):
        raise ValueError(
            f"f_divergence_type={f_divergence_type!r} is only defined for the loss types "
            f"{_F_DIVERGENCE_LOSS_TYPES} (got {list(loss_types)})"
        )
    if not beta > 0:
        raise ValueError(f"beta={beta} must be positive")
    if not 0.0 <= label_smoothing < 1.0 or ("robust" in loss_types and not label_smoothing < 0.5):
        raise ValueError(f"label_smoothing={label_smoothing} must lie in [0, 1) ([0, 0.5) for 'robust')")
    if "exo_pair" in loss_types and label_smoothing == 0.0:
        raise ValueError("loss_type='exo_pair' needs label_smoothing > 0 (the paper's epsilon, e.g. 1e-3)")
    if not isinstance(average_log_prob, bool):
        raise TypeError(f"average_log_prob must be a bool, got {type(average_log_prob).__name__}")
    return DPOOptions(
        beta,
        loss_types,
        weights,
        label_smoothing,
        f_divergence_type,
        f_alpha_divergence_coef,
        discopop_tau,
        average_log_prob,
    )


def _resolve(options, make, hyper: dict):
    """``options`` when given (then no hyper-parameter keyword beside it), else ``make(**hyper)``."""
    if options is None:
        return make(**hyper)
    if hyper:
        raise TypeError(f"pass {', '.join(hyper)} inside options=, not beside it")
    return options


def dpo_loss_from_logps(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    options: DPOOptions | None = None,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
    pair_weights: torch.Tensor | None = None,
    sft_loss: torch.Tensor | None = None,
    **hyper,
) -> torch.Tensor:
    """The DPO loss (module doc) of B pairs of sequence log-probs ``(B,)``: sum over loss types of
    weight * mean over pairs. ``hyper`` (the keywords of ``dpo_options``) or ``options``: the
    hyper-parameters. ``chosen_lengths``/``rejected_lengths``: completion token counts (ipo, sigmoid_norm);
    ``pair_weights``: WPO weights (B,); ``sft_loss``: the scalar for ``loss_type="sft"``. With
    ``average_log_prob`` the log-probs are averages already and the lengths are not used."""
    options = _resolve(options, dpo_options, hyper)
    beta, loss_types, weights = options.beta, options.loss_types, options.loss_weights
    f_divergence_type, f_alpha_divergence_coef = options.f_divergence_type, options.f_alpha_divergence_coef
    label_smoothing, discopop_tau = options.label_smoothing, options.discopop_tau

    chosen_logratios = chosen_logps - ref_chosen_logps
    rejected_logratios = rejected_logps - ref_rejected_logps
    chosen_scores = _f_scores(chosen_logratios, f_divergence_type, f_alpha_divergence_coef)
    rejected_scores = _f_scores(rejected_logratios, f_divergence_type, f_alpha_divergence_coef)
    delta = chosen_scores - rejected_scores
    eps = label_smoothing

    def lengths(counts):
        if options.average_log_prob:  # the log-probs are per-token averages already
            return 1.0
        if counts is None:
            raise ValueError("loss types 'ipo' and 'sigmoid_norm' need chosen_lengths and rejected_lengths")
        return counts.to(delta.dtype).clamp(min=1.0)

    total = delta.new_zeros(())
    for name, weight in zip(loss_types, weights):
        if name == "sigmoid":
            per_pair = -_logsig(beta * delta)
            if eps:
                per_pair = (1 - eps) * per_pair - eps * _logsig(-beta * delta)
        elif name == "hinge":
            per_pair = torch.relu(1 - beta * delta)
        elif name == "ipo":
            avg_delta = chosen_scores / lengths(chosen_lengths) - rejected_scores / lengths(rejected_lengths)
            per_pair = (avg_delta - 1 / (2 * beta)) ** 2
        elif name == "exo_pair":
            q_log = _logsig(beta * delta)
            q_log_not = _logsig(-beta * delta)
            per_pair = q_log.exp() * (q_log - math.log1p(-eps)) + q_log_not.exp() * (
                q_log_not - math.log(eps)
            )
        elif name == "nca_pair":
            chosen_r, rejected_r = beta * chosen_logratios, beta * rejected_logratios
            per_pair = -_logsig(chosen_r) - 0.5 * _logsig(-chosen_r) - 0.5 * _logsig(-rejected_r)
        elif name == "robust":
            per_pair = (-(1 - eps) * _logsig(beta * delta) + eps * _logsig(-beta * delta)) / (1 - 2 * eps)
        elif name == "bco_pair":
            per_pair = -_logsig(beta * chosen_logratios) - _logsig(-beta * rejected_logratios)
        elif name == "sppo_hard":
            per_pair = (chosen_logratios - 0.5 / beta) ** 2 + (rejected_logratios + 0.5 / beta) ** 2
        elif name in ("aot", "aot_unpaired"):
            if name == "aot":
                sorted_delta = (
                    torch.sort(chosen_logps - rejected_logps, dim=0).values
                    - torch.sort(ref_chosen_logps - ref_rejected_logps, dim=0).values
                )
            else:
                sorted_delta = (
                    torch.sort(chosen_logratios, dim=0).values - torch.sort(rejected_logratios, dim=0).values
                )
            per_pair = -(1 - eps) * _logsig(beta * sorted_delta) - eps * _logsig(-beta * sorted_delta)
        elif name == "apo_zero":
            per_pair = 1 - torch.sigmoid(beta * chosen_logratios) + torch.sigmoid(beta * rejected_logratios)
        elif name == "apo_down":
            per_pair = (
                torch.sigmoid(beta * chosen_logratios)
                + 1
                - torch.sigmoid(beta * (chosen_logratios - rejected_logratios))
            )
        elif name == "discopop":
            logits = beta * delta
            mix = torch.sigmoid(logits / discopop_tau)
            per_pair = -_logsig(logits) * (1 - mix) + torch.exp(-logits) * mix
        elif name == "sigmoid_norm":
            avg_delta = chosen_scores / lengths(chosen_lengths) - rejected_scores / lengths(rejected_lengths)
            per_pair = -_logsig(beta * avg_delta)
        else:  # sft
            if sft_loss is None:
                raise ValueError("loss_type='sft' needs sft_loss (the chosen completions' mean token NLL)")
            per_pair = sft_loss.expand(delta.shape)
        if pair_weights is not None:
            per_pair = per_pair * pair_weights
        total = total + per_pair.mean() * weight
    return total


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


def _paired_logprobs(hidden, weight, target, bias, head, outputs):
    rows = check_batch(hidden, target, paired=True)
    stats = token_logprobs(hidden, weight, target, bias, head, outputs=outputs)
    mask = target != head.ignore_index
    return rows // 2, stats, mask


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
    options = _resolve(options, dpo_options, hyper)
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


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^x) for x <= 0, without cancellation (log1p(-e^x) below -ln 2, log(-expm1(x)) above). x = 0
    (a log-prob of 0: an empty or certain completion) is moved to the largest float below 0, so that the loss
    stays finite instead of TRL's -inf / NaN."""
    x = torch.minimum(x, torch.full((), -torch.finfo(x.dtype).tiny, dtype=x.dtype, device=x.device))
    return torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_loss_from_logps(
    chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, nll_loss: torch.Tensor, *, beta: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ORPO (module doc) from average token log-probs (B,): (loss, log_odds_ratio (B,), log_odds (B,))."""
    if not beta > 0:
        raise ValueError(f"beta={beta} must be positive")
    chosen_logps = chosen_logps.to(torch.promote_types(chosen_logps.dtype, torch.float32))
    rejected_logps = rejected_logps.to(chosen_logps.dtype)
    log_odds = (chosen_logps - rejected_logps) - (_log1mexp(chosen_logps) - _log1mexp(rejected_logps))
    ratio = _logsig(log_odds)
    return nll_loss - beta * ratio.mean(), ratio, log_odds


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
    outputs = ("mean_logits",) if compute_metrics else ()
    head = LogprobHead(ignore_index, temperature, softcap, logit_scale, chunk_size, accum_dtype=accum_dtype)
    n_pairs, stats, mask = _paired_logprobs(hidden, weight, target, bias, head, outputs)
    logps = sequence_logps(stats.log_probs, mask, average=True)
    chosen_logps, rejected_logps = logps[:n_pairs], logps[n_pairs:]
    nll = _chosen_nll(stats.log_probs, mask, n_pairs, hidden, weight, bias, nll_target, head)
    loss, ratio, log_odds = orpo_loss_from_logps(chosen_logps, rejected_logps, nll, beta=beta)
    metrics = preference_metrics(chosen_logps, rejected_logps, beta * chosen_logps, beta * rejected_logps)
    metrics.update(token_metrics(stats, mask, n_pairs))
    metrics["nll_loss"] = nll.detach()
    metrics["log_odds_ratio"] = detached_mean(ratio)
    metrics["log_odds_chosen"] = detached_mean(log_odds)
    return loss, metrics


class CPOOptions(NamedTuple):
    """Checked CPO / SimPO / AlphaPO hyper-parameters (see ``cpo_options``)."""

    beta: float
    loss_type: str
    label_smoothing: float
    simpo_gamma: float
    alpha: float
    cpo_alpha: float


def cpo_options(
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    simpo_gamma: float = 0.5,
    alpha: float = 0.0,
    cpo_alpha: float = 1.0,
) -> CPOOptions:
    """The CPO hyper-parameters (trl.experimental's CPOConfig names and defaults), checked once: the one
    place that lists them. ``alpha != 0``: AlphaPO; ``cpo_alpha``: the weight of the chosen completions'
    NLL term (fused loss only)."""
    check_choice("loss_type", loss_type, CPO_LOSS_TYPES)
    if not beta > 0:
        raise ValueError(f"beta={beta} must be positive")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing={label_smoothing} must lie in [0, 1)")
    return CPOOptions(beta, loss_type, label_smoothing, simpo_gamma, alpha, cpo_alpha)


# SimPO: CPO's loss_type "simpo" with the SimPO paper's defaults (beta 2, no NLL term)
_SIMPO_DEFAULTS = {"beta": 2.0, "cpo_alpha": 0.0}


def simpo_options(**hyper) -> CPOOptions:
    """``cpo_options(loss_type="simpo", **hyper)`` with the SimPO paper's defaults."""
    if "loss_type" in hyper:
        raise TypeError("SimPO's loss_type is 'simpo'; use the CPO loss for another")
    return cpo_options(**{**_SIMPO_DEFAULTS, **hyper, "loss_type": "simpo"})


def cpo_loss_from_logps(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    *,
    options: CPOOptions | None = None,
    **hyper,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CPO/SimPO/AlphaPO per-pair losses (B,) and the (chosen, rejected) rewards, from sequence log-probs
    (sums for sigmoid/hinge, averages for ipo/simpo: the caller's choice, as TRL's). ``hyper`` (the
    keywords of ``cpo_options``) or ``options``: the hyper-parameters."""
    options = _resolve(options, cpo_options, hyper)
    beta, loss_type, alpha = options.beta, options.loss_type, options.alpha
    if alpha != 0.0:  # AlphaPO: r = (1 - p^(-alpha)) / alpha
        chosen_r = -torch.expm1(-alpha * chosen_logps) / alpha
        rejected_r = -torch.expm1(-alpha * rejected_logps) / alpha
    else:
        chosen_r, rejected_r = chosen_logps, rejected_logps
    delta = chosen_r - rejected_r
    eps = options.label_smoothing
    if loss_type in ("sigmoid", "simpo"):
        if loss_type == "simpo":
            delta = delta - options.simpo_gamma / beta
        losses = -(1 - eps) * _logsig(beta * delta) - eps * _logsig(-beta * delta)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * delta)
    else:  # ipo
        losses = (delta - 1 / (2 * beta)) ** 2
    return losses, beta * chosen_r.detach(), beta * rejected_r.detach()


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
    options = _resolve(options, cpo_options, hyper)
    outputs = ("mean_logits",) if compute_metrics else ()
    head = LogprobHead(ignore_index, temperature, softcap, logit_scale, chunk_size, accum_dtype=accum_dtype)
    n_pairs, stats, mask = _paired_logprobs(hidden, weight, target, bias, head, outputs)
    logps = sequence_logps(stats.log_probs, mask, average=options.loss_type in ("ipo", "simpo"))
    chosen_logps, rejected_logps = logps[:n_pairs], logps[n_pairs:]
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
    options = _resolve(options, simpo_options, hyper)
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

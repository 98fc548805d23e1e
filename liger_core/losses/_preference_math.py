"""The formulas of the paired preference losses (DPO, ORPO, CPO, SimPO) on sequence log-probs, and their
checked hyper-parameters; ``liger_core.losses.preference`` computes those log-probs from hidden states and
applies them (its ``fused_linear_*_loss``), and re-exports every public name here.

Re-derived from TRL 1.16's ``DPOTrainer._compute_loss`` and ``trl.experimental``'s
``ORPOTrainer.odds_ratio_loss`` / ``CPOTrainer.cpo_loss``. With per-sequence log-probs ``c, r`` (policy,
chosen / rejected), ``c0, r0`` (reference), ``beta``, label smoothing ``eps``:

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

ORPO: ``c, r`` are *average* token log-probs; ``log_odds = (c - r) - (log(1 - e^c) - log(1 - e^r))``, loss =
``nll - beta * mean(log sig(log_odds))`` with ``nll`` the chosen completions' mean token cross-entropy.

CPO / SimPO: ``d = c - r`` (sums; averages for ipo and simpo; AlphaPO ``alpha != 0``: ``c <- (1 -
e^(-alpha c)) / alpha``), simpo ``d <- d - gamma / beta``; per pair sigmoid/simpo ``-(1 - eps) log sig(beta
d) - eps log sig(-beta d)``, hinge ``relu(1 - beta d)``, ipo ``(d - 1 / (2 beta))^2``; loss = ``mean +
cpo_alpha * nll``.

ORPO's ``log(1 - e^c)`` at c = 0 (an empty or certain completion) is replaced by that of the largest float
below 0: the loss stays finite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from liger_core.dispatch import check_choice

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


def resolve_options(options, make, hyper: dict):
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
    options = resolve_options(options, dpo_options, hyper)
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
    options = resolve_options(options, cpo_options, hyper)
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

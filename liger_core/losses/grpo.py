"""GRPO and its variants (DAPO, BNPO, Dr. GRPO, LUSPO, CISPO, SAPO, VESPO) on per-token log-probabilities, and
the fused entry point that computes those log-probabilities from hidden states and the lm_head chunk by chunk.

Math, for completion i, token t, with weights m_it = completion_mask (0 on padding), advantages A_i (or A_it),
current, old and reference log-probs l, l_old, l_ref (exactly TRL 1.16's ``GRPOTrainer._compute_loss``)::

    r_it   = l_it - l_old_it                       (l_old = l.detach() when no old log-probs: on-policy)
    log w  = r_it                                  token level
           = sum_t m_it r_it / max(sum_t m_it, 1)  sequence level (GSPO): one weight per completion
    w      = exp(log w)
    KL_it  = exp(l_ref - l) - (l_ref - l) - 1      (k3 estimator; times w when use_bias_correction_kl)

    per-token objective L_it:
      grpo/bnpo/dr_grpo/dapo/luspo:  -min(w' A, clip(w, 1 - eps_low, 1 + eps_high) A),  w' = min(w, delta)
                                     (w' = w without two-sided clipping, delta None)
      cispo:                         -sg(min(w, eps_high)) A l                      (sg: stop-gradient)
      sapo:                          -(4 / tau) sigmoid(tau (w - 1)) A,  tau = tau_pos if A > 0 else tau_neg
      vespo:                         -sg(phi(W_seq)) A l,  phi(W) = e^lambda W^k e^(-lambda W), W_seq the
                                     clamped sequence ratio prod_t w_it (times vLLM's), k, lambda by sign of A
    then times the off-policy sequence mask and the vLLM importance-sampling ratio when given, plus beta KL.

    reduction (G = gradient_accumulation_steps, S = steps_per_generation, P = num_processes):
      grpo, sapo:          mean_i [sum_t m L / max(sum_t m, 1)] / G
      bnpo:                sum m L / max(sum m, 1) / G                 (tokens of this micro-batch)
      dr_grpo:             sum m L / (B * max_completion_length) / G
      dapo, cispo, vespo:  sum m L / (max(num_items_in_batch, 1) / P * G / S)
                           num_items_in_batch: active tokens of the whole generation batch, all processes
      luspo:               mean_i [sum_t m L] / G

With the defaults (G = S = P = 1, num_items_in_batch = this batch's token count) every loss is the value TRL
computes for a batch that is the whole optimiser step. The metrics use TRL's logged names (kl, entropy,
clip_ratio/low_mean, clip_ratio/high_mean, clip_ratio/region_mean, clip_ratio/low_min, clip_ratio/high_max,
cispo_clip_ratio, vespo/phi_seq_mean): this process's values, as TRL computes them for one process (TRL
all-reduces sums and counts, or gathers per-sequence values, across processes before logging). With
sequence-level importance sampling TRL's clip_ratio/* are means over completions; ``clip_ratio`` (the clipped
loss types) is Liger-Kernel's metric, the one TRL's liger-kernel path logs: the fraction of completion tokens
(weights m) in the clipped region, a completion's clipping counting once per token at sequence level,
``sum_i c_i sum_t m_it / sum m`` (equal to clip_ratio/region_mean at token level).

Masked tokens (weight 0) never reach the loss or the gradient: their log-ratios are replaced by 0 before any
exp, so padding holding -inf, NaN or huge values cannot make a NaN, and a fully masked completion adds 0.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from liger_core.dispatch import (
    INDEX_DTYPES,
    check_choice,
    check_same_device,
    check_shape,
    check_tensor,
)
from liger_core.losses._logps import LOGPS_DTYPES, LogprobHead, reference_token_logprobs
from liger_core.ops.fused_linear_logprobs import fused_linear_logprobs

GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")
# loss types with PPO-style clipping (and TRL's clip_ratio/* metrics)
CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
# VESPO works on log sequence weights clamped to [log 1e-8, 20], as TRL (and the paper's code) do
_VESPO_LOG_W_MIN = math.log(1e-8)
_VESPO_LOG_W_MAX = 20.0
_LOG_RATIO_CLAMP = 20.0


class GRPOOptions(NamedTuple):
    """Validated hyper-parameters (see grpo_loss_from_logps)."""

    beta: float
    epsilon_low: float
    epsilon_high: float
    delta: float | None
    loss_type: str
    importance_sampling_level: str
    use_bias_correction_kl: bool
    max_completion_length: int | None
    num_processes: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    off_policy_mask_threshold: float | None
    sapo_temperature_pos: float
    sapo_temperature_neg: float
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float


def _finite_float(
    name: str, value: object, *, positive: bool = False, allow_none: bool = False
) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ValueError(f"{name}={value!r} must be a finite number")
    if positive and float(value) <= 0.0:
        raise ValueError(f"{name}={value!r} must be positive")
    return float(value)


def _positive_int(name: str, value: object, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")
    return value


def grpo_options(
    *,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    loss_type: str = "dapo",
    importance_sampling_level: str = "token",
    use_bias_correction_kl: bool = True,
    max_completion_length: int | None = None,
    num_processes: int = 1,
    gradient_accumulation_steps: int = 1,
    steps_per_generation: int | None = None,
    off_policy_mask_threshold: float | None = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
) -> GRPOOptions:
    """The GRPO hyper-parameters, checked once (clear errors naming the argument), with TRL's defaults: the
    one place that lists them. ``grpo_loss_from_logps``, ``fused_linear_grpo_loss`` and
    ``LigerFusedLinearGRPOLoss`` take them as keywords or as this object whole (``options=``)."""
    check_choice("loss_type", loss_type, GRPO_LOSS_TYPES)
    check_choice("importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
    epsilon_low = _finite_float("epsilon_low", epsilon_low)
    # TRL: epsilon_high defaults to epsilon (the lower bound)
    epsilon_high = epsilon_low if epsilon_high is None else _finite_float("epsilon_high", epsilon_high)
    if loss_type == "dr_grpo" and max_completion_length is None:
        raise ValueError(
            "loss_type='dr_grpo' normalises by batch size x max_completion_length: pass "
            "max_completion_length (TRL's GRPOConfig.max_completion_length, not this batch's padded length)"
        )
    gradient_accumulation_steps = _positive_int("gradient_accumulation_steps", gradient_accumulation_steps)
    return GRPOOptions(
        beta=_finite_float("beta", beta),
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        delta=_finite_float("delta", delta, allow_none=True),
        loss_type=loss_type,
        importance_sampling_level=importance_sampling_level,
        use_bias_correction_kl=bool(use_bias_correction_kl),
        max_completion_length=_positive_int("max_completion_length", max_completion_length, allow_none=True),
        num_processes=_positive_int("num_processes", num_processes),
        gradient_accumulation_steps=gradient_accumulation_steps,
        # TRL's GRPOConfig: steps_per_generation defaults to gradient_accumulation_steps
        steps_per_generation=gradient_accumulation_steps
        if steps_per_generation is None
        else _positive_int("steps_per_generation", steps_per_generation),
        off_policy_mask_threshold=_finite_float(
            "off_policy_mask_threshold", off_policy_mask_threshold, allow_none=True
        ),
        sapo_temperature_pos=_finite_float("sapo_temperature_pos", sapo_temperature_pos, positive=True),
        sapo_temperature_neg=_finite_float("sapo_temperature_neg", sapo_temperature_neg, positive=True),
        vespo_k_pos=_finite_float("vespo_k_pos", vespo_k_pos),
        vespo_lambda_pos=_finite_float("vespo_lambda_pos", vespo_lambda_pos),
        vespo_k_neg=_finite_float("vespo_k_neg", vespo_k_neg),
        vespo_lambda_neg=_finite_float("vespo_lambda_neg", vespo_lambda_neg),
    )


def resolve_grpo_options(options: GRPOOptions | None, hyper: dict) -> GRPOOptions:
    """``options`` when given (then no hyper-parameter keyword beside it), else ``grpo_options(**hyper)``;
    an unknown keyword is a TypeError naming it, as for any function."""
    if options is None:
        return grpo_options(**hyper)
    if not isinstance(options, GRPOOptions):
        raise TypeError(f"options must be a GRPOOptions (see grpo_options), got {type(options).__name__}")
    if hyper:
        raise TypeError(f"pass {', '.join(hyper)} inside options=, not beside it")
    return options


def _check_logps_inputs(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    ref_per_token_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    importance_sampling_ratio: torch.Tensor | None,
    sampling_per_token_logps: torch.Tensor | None,
    entropies: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | float | None,
    options: GRPOOptions,
) -> None:
    check_tensor("per_token_logps", per_token_logps, dtypes=LOGPS_DTYPES, ndim=2)
    shape = tuple(per_token_logps.shape)
    check_tensor("completion_mask", completion_mask, dtypes=None, ndim=2)
    if completion_mask.is_complex():
        raise TypeError(
            f"completion_mask has dtype {completion_mask.dtype}; expected a bool, int or float mask"
        )
    check_shape("completion_mask", completion_mask, shape, "one weight per completion token")
    check_tensor("advantages", advantages, dtypes=LOGPS_DTYPES)
    if tuple(advantages.shape) not in ((shape[0],), shape):
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)}; expected ({shape[0]},) (one per completion) or "
            f"{shape} (one per token)"
        )
    optional = {
        "old_per_token_logps": old_per_token_logps,
        "ref_per_token_logps": ref_per_token_logps,
        "importance_sampling_ratio": importance_sampling_ratio,
        "sampling_per_token_logps": sampling_per_token_logps,
        "entropies": entropies,
    }
    for name, t in optional.items():
        if t is not None:
            check_tensor(name, t, dtypes=LOGPS_DTYPES, ndim=2)
            check_shape(name, t, shape, "same layout as per_token_logps")
    if options.beta != 0.0 and ref_per_token_logps is None:
        raise ValueError(f"beta={options.beta} needs ref_per_token_logps (the reference model's log-probs)")
    if isinstance(num_items_in_batch, torch.Tensor):
        if num_items_in_batch.numel() != 1:
            raise ValueError(
                f"num_items_in_batch must be a scalar, got shape {tuple(num_items_in_batch.shape)}"
            )
        optional["num_items_in_batch"] = num_items_in_batch
    elif num_items_in_batch is not None:
        _finite_float("num_items_in_batch", num_items_in_batch)
    check_same_device(
        "per_token_logps", per_token_logps, advantages=advantages, completion_mask=completion_mask, **optional
    )


def _vespo_gamma_weights(
    log_ratio: torch.Tensor,
    weights: torch.Tensor,
    advantages: torch.Tensor,
    importance_sampling_ratio: torch.Tensor | None,
    options: GRPOOptions,
) -> torch.Tensor:
    """phi(W) = e^lambda W^k e^(-lambda W) (phi(1) = 1) of the sequence ratio W, in log space, no gradient."""
    with torch.no_grad():
        clamped = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        log_w = (clamped * weights).sum(-1, keepdim=True)
        if importance_sampling_ratio is not None:
            # vLLM's per-token ratios pi_old / pi_sampler, over every position (as TRL sums them)
            log_is = importance_sampling_ratio.to(log_w.dtype).log().clamp(_VESPO_LOG_W_MIN, _VESPO_LOG_W_MAX)
            log_w = log_w + log_is.sum(-1, keepdim=True)
        log_w = log_w.clamp(_VESPO_LOG_W_MIN, _VESPO_LOG_W_MAX)
        non_negative = advantages >= 0
        k = torch.where(non_negative, options.vespo_k_pos, options.vespo_k_neg).to(log_w.dtype)
        lam = torch.where(non_negative, options.vespo_lambda_pos, options.vespo_lambda_neg).to(log_w.dtype)
        lam = lam.clamp(min=1e-4)
        log_phi = lam + k * log_w - lam * log_w.exp()
        return log_phi.exp().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def grpo_loss_from_logps(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    ref_per_token_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    options: GRPOOptions | None = None,
    num_items_in_batch: torch.Tensor | int | float | None = None,
    importance_sampling_ratio: torch.Tensor | None = None,
    sampling_per_token_logps: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    **hyper,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO-family loss (module docstring) of per-token log-probs ``(B, T)``; returns ``(loss, metrics)``.

    per_token_logps: log pi_theta of the completion tokens (carries the gradient). old_per_token_logps: the
    policy that generated the batch (None: on-policy, the detached current log-probs). ref_per_token_logps:
    the reference model's (needed when beta != 0). advantages ``(B,)`` or ``(B, T)``. completion_mask
    ``(B, T)``: 1 for completion tokens, 0 for padding (float weights allowed: completion_mask * tool_mask).
    ``hyper``: the hyper-parameters of ``grpo_options`` (TRL's GRPOConfig fields: beta, epsilon_low
    (GRPOConfig's epsilon), epsilon_high (None: epsilon_low), delta, loss_type, ...), or ``options`` whole;
    num_items_in_batch, num_processes, gradient_accumulation_steps and steps_per_generation reproduce TRL's
    normalisation inside an accumulation window (defaults: this batch is the whole step, one process).
    importance_sampling_ratio: vLLM's per-token correction ratio; off_policy_mask_threshold with
    sampling_per_token_logps: DeepSeek-V3.2's off-policy sequence mask; entropies: only for the metric.
    The math runs in float64 (a few thousand elements per batch: free next to the lm_head), so the loss and
    the gradient are the float64 values rounded once; the loss and the detached metrics are fp32 (float64 for
    float64 log-probs).
    """
    options = resolve_grpo_options(options, hyper)
    _check_logps_inputs(
        per_token_logps,
        old_per_token_logps,
        ref_per_token_logps,
        advantages,
        completion_mask,
        importance_sampling_ratio,
        sampling_per_token_logps,
        entropies,
        num_items_in_batch,
        options,
    )
    return _grpo_loss(
        per_token_logps,
        old_per_token_logps,
        ref_per_token_logps,
        advantages,
        completion_mask,
        options,
        num_items_in_batch=num_items_in_batch,
        importance_sampling_ratio=importance_sampling_ratio,
        sampling_per_token_logps=sampling_per_token_logps,
        entropies=entropies,
    )


def _grpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    ref_per_token_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    options: GRPOOptions,
    *,
    num_items_in_batch: torch.Tensor | int | float | None,
    importance_sampling_ratio: torch.Tensor | None,
    sampling_per_token_logps: torch.Tensor | None,
    entropies: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The formula on validated inputs."""
    out_dtype = torch.promote_types(per_token_logps.dtype, torch.float32)
    # float64 math: TRL's fp32 formula rounds each token's ratio, clip, KL and products several times; here
    # only the final casts round (loss and gradient: the correctly rounded values, up to the sum order)
    dtype = torch.float64
    logps = per_token_logps.to(dtype)
    weights = completion_mask.to(dtype)
    active = completion_mask != 0
    n_seq = logps.shape[0]
    zero = logps.new_zeros(())

    def on_tokens(x: torch.Tensor) -> torch.Tensor:
        """x on completion tokens, 0 on padding (before any exp: padding may hold anything)."""
        return torch.where(active, x, zero)

    old = logps.detach() if old_per_token_logps is None else old_per_token_logps.to(dtype)
    adv = advantages.to(dtype)
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    log_ratio = on_tokens(logps - old)
    tokens_per_seq = weights.sum(-1, keepdim=True)
    if options.importance_sampling_level == "token":
        log_weight = log_ratio
    else:  # one weight per completion: the geometric mean of its token ratios (GSPO)
        log_weight = (log_ratio * weights).sum(-1, keepdim=True) / tokens_per_seq.clamp(min=1.0)
    ratio = log_weight.exp()  # (B, T) or (B, 1)

    if options.beta != 0.0:
        ref_minus_cur = on_tokens(ref_per_token_logps.to(dtype) - logps)
        per_token_kl = ref_minus_cur.exp() - ref_minus_cur - 1.0
        if options.use_bias_correction_kl:  # unbiased reverse-KL gradient off-policy (DeepSeek-V3.2)
            per_token_kl = per_token_kl * ratio

    loss_type = options.loss_type
    phi_seq = None
    if loss_type in CLIPPED_LOSS_TYPES:
        clipped = ratio.clamp(1.0 - options.epsilon_low, 1.0 + options.epsilon_high)
        if options.delta is not None:  # two-sided clipping (INTELLECT-2): cap the unclipped ratio too
            ratio = ratio.clamp(max=options.delta)
        per_token_loss = -torch.minimum(ratio * adv, clipped * adv)
    elif loss_type == "cispo":
        capped = ratio.clamp(max=options.epsilon_high).detach()
        per_token_loss = -capped * adv * on_tokens(logps)
    elif loss_type == "sapo":
        tau = torch.where(adv > 0, options.sapo_temperature_pos, options.sapo_temperature_neg).to(dtype)
        per_token_loss = -(torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau) * adv
    else:  # vespo
        phi_seq = _vespo_gamma_weights(log_ratio, weights, adv, importance_sampling_ratio, options)
        per_token_loss = -phi_seq * adv * on_tokens(logps)

    if options.off_policy_mask_threshold is not None:
        per_token_loss = per_token_loss * _off_policy_mask(
            logps, old, sampling_per_token_logps, adv, weights, active, options.off_policy_mask_threshold
        )
    if importance_sampling_ratio is not None and loss_type != "vespo":
        per_token_loss = per_token_loss * importance_sampling_ratio.to(dtype)
    if options.beta != 0.0:
        per_token_loss = per_token_loss + options.beta * per_token_kl

    loss = _reduce(per_token_loss * weights, weights, n_seq, options, num_items_in_batch)
    metrics = _metrics(
        options,
        weights,
        tokens_per_seq,
        adv,
        ratio,
        per_token_kl if options.beta != 0.0 else None,
        phi_seq,
        entropies,
    )
    return loss.to(out_dtype), {name: value.to(out_dtype) for name, value in metrics.items()}


def _off_policy_mask(
    logps: torch.Tensor,
    old: torch.Tensor,
    sampling_per_token_logps: torch.Tensor | None,
    adv: torch.Tensor,
    weights: torch.Tensor,
    active: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """(B, 1): drop a completion with a negative advantage whose mean KL(sampler || policy) > threshold."""
    with torch.no_grad():
        sampler = old if sampling_per_token_logps is None else sampling_per_token_logps.to(logps.dtype)
        kl = torch.where(active, sampler - logps, 0.0).nan_to_num(nan=0.0)  # NaN: tokens vLLM could not score
        mean_kl = (kl * weights).sum(-1, keepdim=True) / weights.sum(-1, keepdim=True).clamp(min=1.0)
        return ((adv >= 0) | (mean_kl <= threshold)).to(logps.dtype)


def _reduce(
    masked_loss: torch.Tensor,
    weights: torch.Tensor,
    n_seq: int,
    options: GRPOOptions,
    num_items_in_batch: torch.Tensor | int | float | None,
) -> torch.Tensor:
    """TRL's normalisation of sum_t m L per loss type (module docstring)."""
    accumulation = options.gradient_accumulation_steps
    loss_type = options.loss_type
    if loss_type in ("grpo", "sapo"):
        per_seq = masked_loss.sum(-1) / weights.sum(-1).clamp(min=1.0)
        return per_seq.mean() / accumulation
    if loss_type == "bnpo":
        return masked_loss.sum() / weights.sum().clamp(min=1.0) / accumulation
    if loss_type == "dr_grpo":
        return masked_loss.sum() / (n_seq * options.max_completion_length) / accumulation
    if loss_type == "luspo":
        return masked_loss.sum(-1).mean() / accumulation
    # dapo, cispo, vespo: tokens of the whole generation batch, rescaled to one accumulation window
    if num_items_in_batch is None:
        n_items = weights.sum()
    else:
        n_items = torch.as_tensor(num_items_in_batch, device=weights.device).to(weights.dtype).reshape(())
    normalizer = n_items.clamp(min=1.0) / options.num_processes
    normalizer = normalizer * options.gradient_accumulation_steps / options.steps_per_generation
    return masked_loss.sum() / normalizer


def _metrics(
    options: GRPOOptions,
    weights: torch.Tensor,
    tokens_per_seq: torch.Tensor,
    adv: torch.Tensor,
    ratio: torch.Tensor,
    per_token_kl: torch.Tensor | None,
    phi_seq: torch.Tensor | None,
    entropies: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """TRL's logged metrics for this process (means over completion tokens, or over completions for
    one-per-completion values)."""
    seq_len = weights.shape[-1]

    def batch_mean(x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] == 1 and seq_len != 1:  # one value per completion (sequence-level ratio, VESPO's phi)
            return x.sum() / x.shape[0]
        return (x * weights).sum() / weights.sum().clamp(min=1.0)

    def per_seq_mean(x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] == 1 and seq_len != 1:
            return x.squeeze(-1)
        return (x * weights).sum(-1) / tokens_per_seq.squeeze(-1)  # NaN for a fully masked completion

    metrics: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        if per_token_kl is not None:
            metrics["kl"] = batch_mean(per_token_kl)
        if entropies is not None:
            metrics["entropy"] = batch_mean(entropies.to(weights.dtype))
        if options.loss_type in CLIPPED_LOSS_TYPES:
            # the clip ratio, TRL's way: ratio below 1 - eps with A < 0, above 1 + eps with A > 0
            low = ((ratio < 1.0 - options.epsilon_low) & (adv < 0)).to(weights.dtype)
            high = ((ratio > 1.0 + options.epsilon_high) & (adv > 0)).to(weights.dtype)
            region = torch.maximum(low, high)
            metrics["clip_ratio/low_mean"] = batch_mean(low)
            metrics["clip_ratio/high_mean"] = batch_mean(high)
            metrics["clip_ratio/region_mean"] = batch_mean(region)
            # Liger-Kernel's token-weighted clip ratio: a completion's clipping (sequence level) counts once
            # per completion token
            metrics["clip_ratio"] = (region * weights).sum() / weights.sum().clamp(min=1.0)
            metrics["clip_ratio/low_min"] = _nan_reduce(per_seq_mean(low), torch.min)
            metrics["clip_ratio/high_max"] = _nan_reduce(per_seq_mean(high), torch.max)
        elif options.loss_type == "cispo":
            capped = ((ratio > options.epsilon_high) & (adv > 0)).to(weights.dtype)
            metrics["cispo_clip_ratio"] = batch_mean(capped)
        elif options.loss_type == "vespo":
            metrics["vespo/phi_seq_mean"] = batch_mean(phi_seq)
    return metrics


def _nan_reduce(x: torch.Tensor, reduce) -> torch.Tensor:
    """min/max ignoring NaN (fully masked completions); NaN when every value is NaN (no host sync)."""
    is_nan = x.isnan()
    fill = math.inf if reduce is torch.min else -math.inf
    value = reduce(torch.where(is_nan, fill, x)) if x.numel() else x.new_tensor(math.nan)
    return torch.where(is_nan.all(), math.nan, value) if x.numel() else value


def fused_linear_grpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    old_per_token_logps: torch.Tensor | None = None,
    ref_per_token_logps: torch.Tensor | None = None,
    ref_hidden: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    ref_bias: torch.Tensor | None = None,
    options: GRPOOptions | None = None,
    num_items_in_batch: torch.Tensor | int | float | None = None,
    importance_sampling_ratio: torch.Tensor | None = None,
    sampling_per_token_logps: torch.Tensor | None = None,
    temperature: float = 1.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    compute_entropy: bool = True,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    max_chunk_bytes: int | None = None,
    **hyper,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO-family loss (module docstring) of a policy whose completion-token log-probs are
    ``log_softmax(z)[target]``, ``z`` the lm_head logits of ``hidden`` (TRL's transform: logit_scale,
    softcap, then 1 / temperature), computed chunk by chunk by ``liger_core.ops.fused_linear_logprobs``: the
    ``(B, T, V)`` logits never exist. Returns ``(loss, metrics)`` as ``grpo_loss_from_logps``.

    hidden ``(B, T, H)`` (the completion positions, already aligned with target), weight ``(V, H)``, bias
    ``(V,)``, target ``(B, T)`` the completion token ids; tokens where completion_mask is 0 (or target is
    ignore_index) are never scored. Reference log-probs: ``ref_per_token_logps``, or computed here without
    gradient from ``ref_hidden`` with ``ref_weight``/``ref_bias`` (default: the policy's head, as for a PEFT
    reference). ``compute_entropy`` adds TRL's "entropy" metric (mean entropy of the completion tokens).
    ``hyper`` or ``options``: the hyper-parameters, as for ``grpo_loss_from_logps``.
    Gradients flow to hidden, weight and bias; everything else is a constant.
    """
    options = resolve_grpo_options(options, hyper)
    beta = options.beta
    check_tensor("hidden", hidden, ndim=3)
    batch, length = hidden.shape[:2]
    check_tensor("target", target, dtypes=INDEX_DTYPES, ndim=2)
    check_shape("target", target, (batch, length), "one completion token per hidden state")
    check_tensor("completion_mask", completion_mask, dtypes=None, ndim=2)
    check_shape("completion_mask", completion_mask, (batch, length), "one weight per completion token")
    check_same_device("hidden", hidden, target=target, completion_mask=completion_mask)
    if beta != 0.0 and ref_per_token_logps is None and ref_hidden is None:
        raise ValueError(
            f"beta={beta} needs ref_per_token_logps or ref_hidden (the reference model's states)"
        )
    scored = target.masked_fill(completion_mask == 0, ignore_index)
    head = LogprobHead(
        ignore_index, temperature, softcap, logit_scale, chunk_size, max_chunk_bytes=max_chunk_bytes
    )
    # fp64 log-probs: the formula runs in fp64 anyway, and its per-token gradients then reach the kernels
    # unrounded (an fp32 rounding of each sequence's gradient would scale its whole dW contribution)
    policy = fused_linear_logprobs(
        hidden,
        weight,
        scored,
        bias,
        outputs=("log_probs", "entropy") if compute_entropy else ("log_probs",),
        log_probs_dtype=torch.float64,
        **head.op_kwargs(),
    )
    if beta != 0.0 and ref_per_token_logps is None:
        if ref_weight is None:  # the policy's head (a PEFT reference)
            ref_weight, ref_bias = weight, bias
        ref_per_token_logps = reference_token_logprobs(
            ref_hidden, ref_weight, scored, ref_bias, head, shape_hint="one per completion token"
        )
    loss, metrics = grpo_loss_from_logps(
        policy.log_probs,
        old_per_token_logps,
        ref_per_token_logps,
        advantages,
        completion_mask,
        options=options,
        num_items_in_batch=num_items_in_batch,
        importance_sampling_ratio=importance_sampling_ratio,
        sampling_per_token_logps=sampling_per_token_logps,
        entropies=policy.entropy,
    )
    # fp32 as from fp32 log-probs: the fp64 loss rounded once, so is its gradient on the way back
    return loss.float(), {name: value.float() for name, value in metrics.items()}


class LigerFusedLinearGRPOLoss(nn.Module):
    """Module form of ``fused_linear_grpo_loss``: the hyper-parameters (TRL GRPOConfig names; see
    ``grpo_options``), checked at construction into ``self.options``, and the logit transform and chunking
    (``self.head``); the batch in forward. No parameters of its own."""

    def __init__(
        self,
        *,
        options: GRPOOptions | None = None,
        temperature: float = 1.0,
        softcap: float | None = None,
        logit_scale: float = 1.0,
        compute_entropy: bool = True,
        ignore_index: int = -100,
        chunk_size: int | None = None,
        **hyper,
    ) -> None:
        super().__init__()
        self.options = resolve_grpo_options(options, hyper)  # errors at construction, naming the argument
        self.head = {
            "temperature": temperature,
            "softcap": softcap,
            "logit_scale": logit_scale,
            "compute_entropy": compute_entropy,
            "ignore_index": ignore_index,
            "chunk_size": chunk_size,
        }

    def forward(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        target: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        advantages: torch.Tensor,
        completion_mask: torch.Tensor,
        old_per_token_logps: torch.Tensor | None = None,
        ref_per_token_logps: torch.Tensor | None = None,
        ref_hidden: torch.Tensor | None = None,
        ref_weight: torch.Tensor | None = None,
        ref_bias: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | float | None = None,
        importance_sampling_ratio: torch.Tensor | None = None,
        sampling_per_token_logps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return fused_linear_grpo_loss(
            hidden,
            weight,
            target,
            bias,
            advantages=advantages,
            completion_mask=completion_mask,
            old_per_token_logps=old_per_token_logps,
            ref_per_token_logps=ref_per_token_logps,
            ref_hidden=ref_hidden,
            ref_weight=ref_weight,
            ref_bias=ref_bias,
            options=self.options,
            num_items_in_batch=num_items_in_batch,
            importance_sampling_ratio=importance_sampling_ratio,
            sampling_per_token_logps=sampling_per_token_logps,
            **self.head,
        )

    def extra_repr(self) -> str:
        o = self.options
        shown = {
            "loss_type": o.loss_type,
            "beta": o.beta,
            "epsilon_low": o.epsilon_low,
            "epsilon_high": o.epsilon_high,
            "importance_sampling_level": o.importance_sampling_level,
            "temperature": self.head["temperature"],
        }
        return ", ".join(f"{name}={value!r}" for name, value in shown.items())

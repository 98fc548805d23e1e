"""Fused linear + per-token log-probabilities (and entropy, ...) without ever holding all the logits.

For hidden states ``h (N, H)``, lm_head weight ``W (V, H)``, optional bias ``b (V,)`` and targets ``y (N,)``,
with TRL's logit transform (``trl.kernels.ChunkedLogProbFunction``; scale, softcap, then temperature)::

    z = softcap * tanh(logit_scale * (h @ W.T + b) / softcap) / temperature
      = c' * tanh(x / c'),   x = (logit_scale / temperature) * (h @ W.T + b),   c' = softcap / temperature

    log_probs        = z_y - logsumexp(z)             (gradient to h, W, b)
    entropy          = -sum_v p_v log p_v             p = softmax(z)      (gradient too, as TRL's)
                                                      (the next three: detached statistics)
    log_sum_sq_probs = log sum_v p_v^2
    mean_logits      = mean_v z_v
    is_top1          = argmax_v z_v == y              (first maximum)

``log_probs`` is minus ``fused_linear_cross_entropy(reduction="none")`` of the rescaled logits ``x`` with
softcap ``c'``, and is computed by its chunk loop: per chunk of ``C`` tokens the GEMM writes ``x`` (the factor
``logit_scale / temperature`` applied in the GEMM's epilogue for 16-bit logits: one rounding (nearly, with a
bias: see ``linear_into``), no pass over memory; in place after the plain GEMM for fp32, see ``_scaling``)
into one reused ``(C, V)`` buffer, ``_logit_stats_kernel`` reads it once for the requested statistics, and the
cross-entropy kernel gives the per-token losses. Forward computes no gradient (the per-token ``grad_output``
is unknown then); backward runs the chunk loop again with ``-grad_output * logit_scale / temperature`` per
token inside the CE kernel, whose in-place logits gradient feeds the dh/dW GEMMs (see
``fused_linear_cross_entropy``). When the entropy has a gradient too (GRPO's entropy bonus), backward runs
``_logprob_entropy_grad_kernel`` instead, one pass per row from the forward's saved ``logsumexp(z)`` and
entropy: ``dz_v = g_logp ([v == y] - p_v) - g_H p_v (log p_v + H)``. ``dW`` and ``dh`` accumulate in fp32 by
default (as TRL's kernel does: bf16 accumulation per chunk biases training), ``accum_dtype=None`` keeps them
in the weight's dtype.

Statistics kernel, one program per token, streaming its row in column blocks once (online, rescaled as the
running max ``m`` grows)::

    d = sum_v e_v,  e_v = exp(z_v - m)    s = sum_v e_v (z_v - m)    q = sum_v e_v^2    t = sum_v z_v
    entropy = log d - s / d               log_sum_sq_probs = log q - 2 log d          mean = t / V

(``s`` is kept relative to ``m``, so the entropy of huge logits does not cancel). Per-element math in fp32 for
16-bit logits and fp64 for fp32 logits, as the CE kernel. Ignored tokens (``target == ignore_index``) get 0 in
every field (False for ``is_top1``) and no gradient.
"""

from __future__ import annotations

import math

import torch
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import check_same_device, launcher, use_triton
from liger_core.ops._ce_kernel import CE_FP32_MATH, looped_row_settings
from liger_core.ops._ce_math import check_targets_host, split_f64
from liger_core.ops._chunked_linear import (
    LinearLossArgs,
    _accumulate_grads,
    _chunk_logits,
    _chunk_loop,
    _empty,
    _fake_grads,
    _grad_buffers,
    _grads_in_dtypes,
    autocast_linear_inputs,
    check_chunk_options,
    check_linear_inputs,
    choose_chunk_tokens,
    flatten_for_chunks,
    wants_grad,
)
from liger_core.ops._logprob_math import _STATS, _launch_stats, _logprob_entropy_grad_kernel, _scaling
from liger_core.reference.fused_linear_logprobs import OUTPUTS, FusedLogProbs

__all__ = ["OUTPUTS", "FusedLogProbs", "fused_linear_logprobs"]


def _logprob_chunk_loop(
    hidden, weight, target, bias, ignore_index, softcap, needs, accum_dtype, chunk_size, **hooks
):
    """``fused_linear_cross_entropy``'s chunk loop for -log_probs: per-token losses (reduction "none"), no
    class weights, label smoothing or z-loss; ``needs``: (grad_hidden, grad_weight, grad_bias) requested."""
    args = LinearLossArgs(
        hidden, weight, target, bias, None, ignore_index, "none", 0.0, 0.0, softcap, *needs, accum_dtype
    )
    return _chunk_loop(args, chunk_size, **hooks)


def _entropy_backward_loop(
    grad_log_probs, grad_entropy, hidden, weight, target, bias, state, ignore_index, scale, softcap,
    need_hidden, need_weight, need_bias, accum_dtype, chunk_size,
):  # fmt: skip
    """The chunk loop of ``fused_linear_cross_entropy`` with ``_logprob_entropy_grad_kernel`` in place of the
    CE kernel (the entropy's gradient is not a cross-entropy's): logits, in-place gradient, dh/dW/db GEMMs."""
    n_tokens, hidden_size = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    chunk = choose_chunk_tokens(n_tokens, hidden_size, vocab, hidden.dtype, device, chunk_size)
    grads = _grad_buffers(hidden, weight, need_hidden, need_weight, need_bias, accum_dtype)
    fp64_math = hidden.dtype == torch.float32 and CE_FP32_MATH == "fp64"
    # dx = (logit_scale / temperature) dz: the factor folded into the per-token gradients, kept in fp64 for
    # fp64 math (fp64 log-probs get fp64 gradients: no rounding before the kernel's own)
    g_dtype = torch.float64 if fp64_math else torch.float32
    g_h = (grad_entropy.to(g_dtype) * scale).contiguous()
    g_logp = (grad_log_probs.to(g_dtype) * scale).contiguous() if grad_log_probs is not None else None
    block, warps = looped_row_settings(vocab, device, fp64_math)
    gemm_scale, post_scale = _scaling(hidden.dtype, scale)
    for start, end, hidden_c, logits in _chunk_logits(hidden, weight, bias, chunk, gemm_scale):
        if post_scale is not None:
            logits.mul_(post_scale)
        _logprob_entropy_grad_kernel[(end - start,)](
            logits, logits.stride(0), target[start:end], state[start:end],
            g_logp[start:end] if g_logp is not None else g_h, g_h[start:end], vocab, ignore_index,
            *split_f64(softcap if softcap is not None else 1.0),
            HAS_SOFTCAP=softcap is not None, HAS_LOGP_GRAD=g_logp is not None, HAS_ENTROPY_GRAD=True,
            COMPUTE_DTYPE=tl.float64 if fp64_math else tl.float32, BLOCK_SIZE=block, num_warps=warps,
        )  # fmt: skip
        _accumulate_grads(logits, hidden_c, weight, start, end, *grads)
    return grads


def _fwd_impl(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ignore_index: int,
    scale: float,
    softcap: float | None,
    stats_mask: int,
    chunk_size: int | None,
    check_targets: bool = True,
    float64_log_probs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1, state) for 2-D hidden; ``scale`` and
    ``softcap`` are those of the rescaled logits x (``logit_scale / temperature``, ``softcap /
    temperature``); bit i of ``stats_mask`` requests statistic ``_STATS[i]``; ``state`` (N, 2) fp64
    (logsumexp z and the entropy, for the entropy's gradient) comes with the entropy. Fields not requested
    are empty. log_probs are fp32 (one rounding of the fp64 per-token values), or those fp64 values."""
    n = hidden.shape[0]
    device = hidden.device
    stats = {
        name: torch.empty(n, dtype=torch.bool if name == "is_top1" else torch.float32, device=device)
        if stats_mask >> i & 1
        else None
        for i, name in enumerate(_STATS)
    }
    stats["state"] = (
        torch.empty(n, 2, dtype=torch.float64, device=device) if stats["entropy"] is not None else None
    )
    gemm_scale, post_scale = _scaling(hidden.dtype, scale)
    has_stats = any(v is not None for v in stats.values())

    def on_logits(start, end, logits):
        if post_scale is not None:
            logits.mul_(post_scale)
        if not has_stats:
            return
        _launch_stats(
            logits,
            target[start:end],
            *(v[start:end] if v is not None else None for v in stats.values()),
            ignore_index,
            softcap,
        )

    with torch.autocast(device.type, enabled=False):
        loss_rows, *_ = _logprob_chunk_loop(
            hidden,
            weight,
            target,
            bias,
            ignore_index,
            softcap,
            (False, False, False),
            None,
            chunk_size,
            check_targets=check_targets,
            logit_scale=gemm_scale,
            on_logits=on_logits if has_stats or post_scale is not None else None,
        )
    log_probs = loss_rows.neg()
    if not float64_log_probs:
        log_probs = log_probs.to(torch.float32)  # one rounding of the fp64 per-token loss
    state = stats.pop("state")
    return (
        log_probs,
        *(v if v is not None else _empty(log_probs) for v in stats.values()),
        state if state is not None else _empty(log_probs).double(),
    )


_fwd = torch.library.custom_op("liger_core::fused_linear_logprobs_fwd", _fwd_impl, mutates_args=())


@_fwd.register_fake
def _(
    hidden, weight, target, bias, ignore_index, scale, softcap, stats_mask, chunk_size, check_targets=True,
    float64_log_probs=False,
):  # fmt: skip
    n = hidden.shape[0]
    return (
        hidden.new_empty(n, dtype=torch.float64 if float64_log_probs else torch.float32),
        *(
            (hidden.new_empty(n, dtype=torch.bool if name == "is_top1" else torch.float32))
            if stats_mask >> i & 1
            else hidden.new_empty(0, dtype=torch.float32)
            for i, name in enumerate(_STATS)
        ),
        hidden.new_empty((n, 2) if stats_mask & 1 else (0,), dtype=torch.float64),
    )


def _bwd_impl(
    grad_log_probs: torch.Tensor,
    grad_entropy: torch.Tensor,
    state: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ignore_index: int,
    scale: float,
    softcap: float | None,
    need_hidden: bool,
    need_weight: bool,
    need_bias: bool,
    accum_dtype: torch.dtype | None,
    chunk_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunk loop again, with d(-log_probs)/dx scaled per token by ``-grad * scale`` inside the CE kernel
    (dx/d(hW + b) = scale), or, when the entropy has a gradient (``grad_entropy`` not empty), with the
    one-pass kernel of both gradients (``grad_log_probs`` may then be empty: no log-prob gradient); gradients
    in the dtypes of hidden, weight and bias (empty where not requested)."""
    if grad_entropy.numel():
        with torch.autocast(hidden.device.type, enabled=False):
            grads = _entropy_backward_loop(
                grad_log_probs if grad_log_probs.numel() else None, grad_entropy, hidden, weight, target,
                bias, state, ignore_index, scale, softcap, need_hidden, need_weight, need_bias,
                accum_dtype, chunk_size,
            )  # fmt: skip
        return _grads_in_dtypes(grads, hidden, weight, bias)
    row_scale = grad_log_probs.to(torch.float64).mul(-scale).contiguous()
    gemm_scale, post_scale = _scaling(hidden.dtype, scale)
    with torch.autocast(hidden.device.type, enabled=False):
        *_, gh, gw, gb = _logprob_chunk_loop(
            hidden,
            weight,
            target,
            bias,
            ignore_index,
            softcap,
            (need_hidden, need_weight, need_bias),
            accum_dtype,
            chunk_size,
            row_scale=row_scale,
            logit_scale=gemm_scale,
            on_logits=(lambda start, end, logits: logits.mul_(post_scale))
            if post_scale is not None
            else None,
        )
    return _grads_in_dtypes((gh, gw, gb), hidden, weight, bias)


_bwd = torch.library.custom_op("liger_core::fused_linear_logprobs_bwd", _bwd_impl, mutates_args=())


@_bwd.register_fake
def _(
    grad_log_probs,
    grad_entropy,
    state,
    hidden,
    weight,
    target,
    bias,
    ignore_index,
    scale,
    softcap,
    need_hidden,
    need_weight,
    need_bias,
    accum_dtype,
    chunk_size,
):
    return _fake_grads(hidden, weight, bias, need_hidden, need_weight, need_bias)


class FusedLinearLogProbsFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden, weight, target, bias, ignore_index, scale, softcap, stats_mask, accum_dtype, chunk_size,
        check_targets, float64_log_probs,
    ):  # fmt: skip
        need_hidden, need_weight, _, need_bias = ctx.needs_input_grad[:4]
        ctx.needs = (need_hidden, need_weight, need_bias and bias is not None)
        ctx.options = (ignore_index, scale, softcap)
        ctx.accum = (accum_dtype, chunk_size)
        ctx.set_materialize_grads(False)
        *out, state = launcher(_fwd, _fwd_impl)(
            hidden, weight, target, bias, ignore_index, scale, softcap, stats_mask, chunk_size, check_targets,
            float64_log_probs,
        )  # fmt: skip
        log_probs, entropy, *stats = out
        ctx.save_for_backward(hidden, weight, target, bias, state)
        # log_probs and the entropy (when asked for) carry gradients; the other statistics do not
        ctx.mark_non_differentiable(*stats, state, *([] if stats_mask & 1 else [entropy]))
        return log_probs, entropy, *stats, state

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy, *_grad_stats):
        need_hidden, need_weight, need_bias = ctx.needs
        hidden, weight, target, bias, state = ctx.saved_tensors
        if not state.numel():
            grad_entropy = None
        if grad_log_probs is None and grad_entropy is None:  # only the detached statistics were used
            return (None,) * 12
        gh, gw, gb = launcher(_bwd, _bwd_impl)(
            grad_log_probs if grad_log_probs is not None else _empty(state).float(),
            grad_entropy if grad_entropy is not None else _empty(state).float(),
            state, hidden, weight, target, bias, *ctx.options, need_hidden, need_weight, need_bias,
            *ctx.accum,
        )  # fmt: skip
        return (
            gh if need_hidden else None,
            gw if need_weight else None,
            None,
            gb if need_bias else None,
            *(None,) * 8,
        )


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
    outputs: tuple[str, ...] | list[str] = ("log_probs",),
    chunk_size: int | None = None,
    max_chunk_bytes: int | None = None,
    accum_dtype: torch.dtype | None = torch.float32,
    check_targets: bool = True,
    log_probs_dtype: torch.dtype = torch.float32,
) -> FusedLogProbs:
    """Per-token ``log_softmax(z)[target]`` of ``z = softcap * tanh(logit_scale * (hidden @ weight.T + bias) /
    softcap) / temperature`` (TRL's transform and order) without materialising the (tokens, V) logits, plus
    the statistics named in ``outputs`` (see the module doc).

    hidden ``(..., H)`` (any strides), weight ``(V, H)``, bias ``(V,)``, target ``(...)`` (class indices in
    [0, V) or ``ignore_index``). Returns ``FusedLogProbs(log_probs, entropy, log_sum_sq_probs, mean_logits,
    is_top1)``, each of target's shape: fp32 (``is_top1`` bool), 0 (False) where ``target == ignore_index``.
    ``log_probs`` is always computed; the other fields are None unless named in ``outputs``. ``log_probs`` and
    ``entropy`` carry gradients (to hidden, weight and bias; as TRL's kernel), the others are detached
    statistics.

    ``chunk_size``/``max_chunk_bytes``: tokens per chunk, or a bound on one chunk's logits (default as
    ``fused_linear_cross_entropy``). ``accum_dtype``: dtype of the dW/dh accumulators (default fp32, as TRL;
    None: the weight's dtype, 2 bytes less per element of W). ``check_targets``: a ValueError for a target
    outside [0, V) (one host sync after the kernels are queued). ``log_probs_dtype``: fp32, or fp64 (the
    kernels' fp64 per-token values unrounded, and their gradient taken in fp64: for a float64 loss formula on
    top, such as GRPO's, whose per-token gradients then reach the kernels without an fp32 rounding). Under
    autocast, hidden/weight/bias are cast to the autocast dtype first, as ``F.linear`` would be.
    """
    _, vocab = check_linear_inputs(hidden, weight, target, bias)
    check_same_device("hidden", hidden, weight=weight, target=target, bias=bias)
    if not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    for name, value in (("temperature", temperature), ("logit_scale", logit_scale)):
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name}={value!r} must be a finite number")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be positive")
    if softcap is not None and not (
        isinstance(softcap, (int, float)) and softcap > 0 and math.isfinite(softcap)
    ):
        raise ValueError(f"softcap={softcap!r} must be a positive number (or None)")
    if isinstance(outputs, str):
        raise TypeError(f"outputs must be a tuple of names, got the string {outputs!r}")
    unknown = [name for name in outputs if name not in OUTPUTS]
    if unknown:
        raise ValueError(f"outputs has unknown field(s) {unknown}; choose among {OUTPUTS}")
    check_chunk_options(accum_dtype, chunk_size, max_chunk_bytes)
    if log_probs_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"log_probs_dtype={log_probs_dtype} must be torch.float32 or torch.float64")
    hidden, weight, bias = autocast_linear_inputs(hidden, weight, bias)
    temperature, logit_scale = float(temperature), float(logit_scale)
    softcap = float(softcap) if softcap is not None else None
    outputs = [name for name in _STATS if name in outputs]  # canonical order (a custom op's list argument)

    if not use_triton(hidden):
        if check_targets:
            check_targets_host(target.reshape(-1), ignore_index, vocab)  # the kernel path's ValueError
        result = reference.fused_linear_logprobs(
            hidden,
            weight,
            target,
            bias,
            temperature=temperature,
            softcap=softcap,
            logit_scale=logit_scale,
            ignore_index=ignore_index,
            outputs=("log_probs", *outputs),
        )
        return result._replace(log_probs=result.log_probs.to(log_probs_dtype))

    out_shape = target.shape
    hidden2d, target1d, chunk_size = flatten_for_chunks(hidden, weight, target, chunk_size, max_chunk_bytes)
    # the rescaled logits x = (logit_scale / temperature) * (h W^T + b) and softcap c' = softcap / temperature
    # give z = c' tanh(x / c') = softcap * tanh(logit_scale * (h W^T + b) / softcap) / temperature
    scale = logit_scale / temperature
    softcap_x = softcap / temperature if softcap is not None else None
    stats_mask = sum(1 << i for i, name in enumerate(_STATS) if name in outputs)
    args = (hidden2d, weight, target1d, bias, ignore_index, scale, softcap_x, stats_mask)
    float64 = log_probs_dtype == torch.float64
    if wants_grad(hidden, weight, bias):
        out = FusedLinearLogProbsFunction.apply(*args, accum_dtype, chunk_size, bool(check_targets), float64)
    else:
        out = launcher(_fwd, _fwd_impl)(*args, chunk_size, bool(check_targets), float64)
    log_probs, *stats, _state = out
    fields = [log_probs.view(out_shape)]
    for name, value in zip(_STATS, stats):
        fields.append(value.view(out_shape) if name in outputs else None)
    return FusedLogProbs(*fields)


def fused_linear_scaled_cross_entropy(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    temperature: float = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Per-token cross-entropy of temperature-scaled logits, as RL trainers (PPO / GRPO policy losses) use it:
    liger-kernel's ``LigerFusedLinearScaledCrossEntropyFunction.apply(input, weight, target, temperature,
    ignore_index, return_entropy=...)``. With ``z = (input @ weight.T) / temperature``::

        nll     = logsumexp(z) - z_target           (fp32; 0 where target == ignore_index)
        entropy = logsumexp(z) - sum_v p_v z_v      (p = softmax(z); in input's dtype; 0 where ignored)

    Returns ``nll``, or ``(nll, entropy)`` with ``return_entropy=True``, each of target's shape; both carry
    gradients to input and weight (the entropy's too, for an entropy bonus). This is ``fused_linear_logprobs``
    (its chunk loop: the (tokens, V) logits never exist in full) with ``outputs=("entropy",)``: nll is minus
    its log_probs and the entropy is rounded once to input's dtype, as liger-kernel returns it. input
    ``(..., H)`` (liger-kernel: 2-D), weight ``(V, H)``, target ``(...)`` int64.
    """
    if not isinstance(return_entropy, bool):
        raise TypeError(f"return_entropy must be a bool, got {type(return_entropy).__name__}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a real number, got {type(temperature).__name__}")
    out = fused_linear_logprobs(
        input,
        weight,
        target,
        temperature=temperature,
        ignore_index=ignore_index,
        outputs=("log_probs", "entropy") if return_entropy else ("log_probs",),
    )
    nll = 0.0 - out.log_probs  # +0 (not -0) at ignored tokens
    if not return_entropy:
        return nll
    return nll, out.entropy.to(input.dtype)

"""Fused linear + per-token log-probs + a loss that sums over groups of rows, with the gradients made in the
forward pass (the logits computed once, never all at once).

Preference losses (DPO, CPO, SimPO, ORPO) are means over pairs of a function of each pair's sequence
log-probs, with normalisers known from the masks before any logit exists. For such a loss, over rows
``(R, T)`` of hidden states partitioned into groups (DPO: pair i = rows i and B + i),

    loss = sum_g  loss_g(log_probs[rows_g], entropy[rows_g], ...)

the gradient of ``loss_g`` with respect to its token log-probs is known as soon as the group's logits are. So
per group, with ``fused_linear_logprobs``'s transform ``z = c' tanh(x / c')``, ``x = scale (h W^T + b)``::

    x_g      = scale (h_g @ W.T + b)           cuBLAS, into one reused (|g| T, V) buffer
    logp_g   = _logit_stats_kernel(x_g)         z_y - logsumexp, entropy (+ the metrics' statistics): one read
    g        = d loss_g / d (logp_g, H_g)       autograd through the caller's formula on a few small tensors
    dx_g     = _logprob_entropy_grad_kernel     in place over x_g: g_logp ([v == y] - p_v) (+ entropy term)
    dh_g     = dx_g @ W                         one GEMM over the whole vocabulary, into its rows of dh
    dW      += dx_g.T @ h_g                     compensated, see below

Three GEMMs per group where log-probs + autograd take four (``fused_linear_logprobs``' backward computes the
logits again); backward multiplies the stored gradients by ``grad_output``.

dW over several groups: eager makes dW in one GEMM (fp32 inside, one rounding to bf16). Adding per-group bf16
results rounds once per group (Liger-Kernel's chunked losses do); an fp32 accumulator costs 4 bytes per
element of W plus the bf16 copy at the end. For bf16 weights and ``accum_dtype=torch.float32`` (the default)
the accumulator is the bf16 gradient ``hi`` itself plus an int8 residual ``r`` in units of 1/128 of ``hi``'s
last place: 3 bytes per element, the returned gradient included. Per slice of the vocabulary a GEMM writes the
group's term in fp32 into a small reused buffer and ``_compensated_add_kernel`` computes::

    s = hi + r ulp(hi) / 128 + term     (the first two exact in fp32)
    hi = bf16(s)                        r = round(128 (s - hi) / ulp(hi))   (|r| <= 64)

Each group adds at most 1/256 of a last place of the running sum (a 16-bit significand where fp32 has 24),
so after G groups ``hi`` is the correctly rounded sum up to G / 256 of a last place of the largest partial
sum: eager's one rounding, unless the groups' terms cancel by more than ~G/256 (then between eager's and a
bf16 running sum's, whose error is up to G / 2 last places). Other dtypes use ``fused_linear_cross_entropy``'s
accumulators. Triton's interpreter truncates ``.to(tl.bfloat16)``: the kernels round by the bits instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import check_same_device, use_triton
from liger_core.ops._ce_kernel import CE_FP32_MATH, looped_row_settings
from liger_core.ops._ce_math import (
    check_targets_host,
    finish_target_check,
    split_f64,
    start_target_check,
    target_stats,
)
from liger_core.ops._chunked_linear import (
    _accum_dtype,
    _mm_accumulate,
    autocast_linear_inputs,
    check_linear_inputs,
    hidden_accum_dtype,
    hidden_grad_into,
    linear_into,
)
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import cdiv
from liger_core.ops._logprob_math import (
    _STATS,
    _launch_stats,
    _logprob_entropy_grad_kernel,
    _scaling,
)
from liger_core.reference.fused_linear_logprobs import FusedLogProbs

__all__ = ["fused_linear_logprob_loss"]

# fp32 buffer for one vocabulary slice of a group's dW term (the compensated accumulation): small enough to
# stay in the H100's 50 MB L2, beside the GEMM's operand tiles, between the GEMM and the kernel that reads it
COMPENSATION_SLICE_BYTES = 16 * 2**20


@triton.jit
def _bf16_ulp(h):
    """(ulp, 1 / ulp) of bf16 values ``h`` held in fp32: 2^(e - 134) for biased exponent e (clamped to >= 8:
    below 2^-119 the residual's resolution stops mattering), both powers of two, built from their bits."""
    exponent = (h.to(tl.int32, bitcast=True) >> 23) & 0xFF
    exponent = tl.maximum(exponent, 8)
    ulp = ((exponent - 7) << 23).to(tl.float32, bitcast=True)
    inv_ulp = ((261 - exponent) << 23).to(tl.float32, bitcast=True)
    return ulp, inv_ulp


@triton.jit
def _round_to_bf16(x):
    """fp32 ``x`` rounded to the nearest bf16 (ties to even), still in fp32: by its bits, because Triton's
    interpreter truncates in ``.to(tl.bfloat16)`` where the GPU rounds; NaN stays NaN."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) & -65536  # -65536 = 0xFFFF0000
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@fast_launch
@triton.jit
def _compensated_add_kernel(
    hi_ptr,  # (n,) bf16 running sum, rounded
    lo_ptr,  # (n,) int8 residual in units of ulp(hi) / 128
    term_ptr,  # (n,) fp32 term to add
    n,
    FIRST: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(term_ptr + offs, mask=mask, other=0.0)
    if not FIRST:
        h = tl.load(hi_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(lo_ptr + offs, mask=mask, other=0).to(tl.float32)
        ulp, _ = _bf16_ulp(h)
        s = (h + r * (ulp * (1.0 / 128.0))) + s
    hf = _round_to_bf16(s)
    _, inv_ulp = _bf16_ulp(hf)
    x = (s - hf) * inv_ulp * 128.0  # exact: s - hf is exact, the factors are powers of two
    r_new = (x + tl.where(x >= 0, 0.5, -0.5)).to(tl.int32)  # round half away from zero
    r_new = tl.minimum(tl.maximum(r_new, -127), 127)
    tl.store(hi_ptr + offs, hf.to(tl.bfloat16), mask=mask)  # exact: hf is a bf16 value
    tl.store(lo_ptr + offs, r_new.to(tl.int8), mask=mask)


@fast_launch
@triton.jit
def _compensated_finish_kernel(hi_ptr, lo_ptr, scale_ptr, n, BLOCK: tl.constexpr):
    """hi = bf16(scale * (hi + r ulp(hi) / 128)) in place: the gradient times grad_output, one rounding."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    h = tl.load(hi_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(lo_ptr + offs, mask=mask, other=0).to(tl.float32)
    ulp, _ = _bf16_ulp(h)
    s = (h + r * (ulp * (1.0 / 128.0))) * tl.load(scale_ptr).to(tl.float32)
    tl.store(hi_ptr + offs, _round_to_bf16(s).to(tl.bfloat16), mask=mask)


def _elementwise_grid(n: int, block: int) -> tuple[int]:
    return (cdiv(n, block),)


class _WeightGradAccumulator:
    """dW = sum over groups of ``dx_g.T @ h_g`` (see the module doc): compensated bf16 + int8 for bf16
    weights with an fp32 ``accum_dtype``, otherwise one buffer of ``_accum_dtype`` (as
    ``fused_linear_cross_entropy``)."""

    def __init__(self, weight: torch.Tensor, accum_dtype: torch.dtype | None):
        vocab, hidden_size = weight.shape
        self.compensated = weight.dtype == torch.bfloat16 and accum_dtype == torch.float32
        self.first = True
        if self.compensated:
            self.hi = torch.empty_like(weight, memory_format=torch.contiguous_format)
            self.lo = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
            rows = max(1, min(vocab, COMPENSATION_SLICE_BYTES // (4 * max(hidden_size, 1))))
            self.term = torch.empty(rows, hidden_size, dtype=torch.float32, device=weight.device)
            self.block = 1024 if weight.device.type == "cuda" else 256
        else:  # fp32 weights: fp64 (their one GEMM rounds once; fp32 sums of per-group GEMMs would not)
            dtype = torch.float64 if weight.dtype == torch.float32 else _accum_dtype(accum_dtype, weight)
            self.acc = torch.empty(weight.shape, dtype=dtype, device=weight.device)

    def add(self, dlogits: torch.Tensor, hidden_g: torch.Tensor) -> None:
        if not self.compensated:
            _mm_accumulate(self.acc, dlogits.t(), hidden_g, first=self.first)
            self.first = False
            return
        rows = self.term.shape[0]
        for start in range(0, self.hi.shape[0], rows):
            end = min(start + rows, self.hi.shape[0])
            term = self.term[: end - start]
            _mm_accumulate(term, dlogits[:, start:end].t(), hidden_g, first=True)
            n = term.numel()
            _compensated_add_kernel[_elementwise_grid(n, self.block)](
                self.hi[start:end], self.lo[start:end], term, n, FIRST=self.first, BLOCK=self.block
            )
        self.first = False

    def finish(self, grad_output: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The gradient times ``grad_output`` (a 0-dim tensor), in the weight's dtype."""
        if self.first:  # no group (an empty batch)
            return torch.zeros_like(weight)
        if not self.compensated:
            return (self.acc * grad_output.to(self.acc.dtype)).to(weight.dtype)
        n = self.hi.numel()
        scale = grad_output.reshape(1).to(torch.float32)
        _compensated_finish_kernel[_elementwise_grid(n, self.block)](
            self.hi, self.lo, scale, n, BLOCK=self.block
        )
        self.lo = self.term = None
        return self.hi


def _check_groups(groups: Sequence[Sequence[tuple[int, int]]], n_rows: int) -> list[list[tuple[int, int]]]:
    """Groups as lists of (start, stop) row ranges that partition range(n_rows)."""
    covered = [0] * n_rows
    out = []
    for group in groups:
        segments = [(int(a), int(b)) for a, b in group]
        for start, stop in segments:
            if not 0 <= start < stop <= n_rows:
                raise ValueError(f"groups: row range ({start}, {stop}) is empty or outside [0, {n_rows})")
            for row in range(start, stop):
                covered[row] += 1
        out.append(segments)
    if any(c != 1 for c in covered):
        raise ValueError("groups must cover every row of hidden exactly once")
    return out


def _gather(x: torch.Tensor, segments: list[tuple[int, int]]) -> torch.Tensor:
    """The rows of x in the group's segments, concatenated (a view for one segment)."""
    if len(segments) == 1:
        return x[segments[0][0] : segments[0][1]]
    return torch.cat([x[a:b] for a, b in segments])


def _scatter(out: torch.Tensor, segments: list[tuple[int, int]], values: torch.Tensor) -> None:
    offset = 0
    for start, stop in segments:
        out[start:stop] = values[offset : offset + stop - start]
        offset += stop - start


def _group_grads(group_loss, index, stats, entropy_grad):
    """The group's loss (detached) and d loss / d(log_probs, entropy) (fp32; the entropy's may be None)."""
    with torch.enable_grad():
        log_probs = stats.log_probs.detach().requires_grad_(True)
        entropy = stats.entropy.detach().requires_grad_(entropy_grad)
        leaves = [log_probs, entropy] if entropy_grad else [log_probs]
        loss = group_loss(index, stats._replace(log_probs=log_probs, entropy=entropy))
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError("group_loss must return a 0-dim tensor (the group's term of the loss)")
        grads = (
            torch.autograd.grad(loss, leaves, allow_unused=True)
            if loss.requires_grad
            else [None] * len(leaves)
        )
    grads = [torch.zeros_like(log_probs) if g is None else g for g in grads]
    return loss.detach(), grads[0], grads[1] if entropy_grad else None


def _loss_loop(hidden, weight, bias, target, seq_len, groups, group_loss, opts, needs):
    """The per-group loop of the module doc. Returns (loss fp64, per-token outputs (rows, T), gradients)."""
    ignore_index, scale, softcap, outputs, entropy_grad, accum_dtype, check_targets = opts
    need_hidden, need_weight, need_bias = needs
    n_tokens, hidden_size = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    n_rows = n_tokens // seq_len
    fields = {
        name: torch.zeros(
            n_rows, seq_len, dtype=torch.bool if name == "is_top1" else torch.float32, device=device
        )
        for name in ("log_probs", *outputs)
    }
    pending = start_target_check(target_stats(target, None, ignore_index, vocab)) if check_targets else None
    accum = hidden_accum_dtype(hidden, weight, accum_dtype)  # fp32 inputs: fp64 (see hidden_grad_into)
    grad_hidden = torch.empty(n_tokens, hidden_size, dtype=accum, device=device) if need_hidden else None
    grad_weight = _WeightGradAccumulator(weight, accum_dtype) if need_weight else None
    bias_accum = torch.float64 if hidden.dtype == torch.float32 else torch.float32
    grad_bias = torch.zeros(vocab, dtype=bias_accum, device=device) if need_bias else None
    gemm_scale, post_scale = _scaling(hidden.dtype, scale)
    fp64_math = hidden.dtype == torch.float32 and CE_FP32_MATH == "fp64"
    block, warps = looped_row_settings(vocab, device, fp64_math)
    largest = max((sum(b - a for a, b in g) for g in groups), default=0) * seq_len  # no groups: no rows
    logits_buffer = torch.empty(largest, vocab, dtype=hidden.dtype, device=device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for index, segments in enumerate(groups):
        token_segments = [(a * seq_len, b * seq_len) for a, b in segments]
        hidden_g = _gather(hidden, token_segments)
        target_g = _gather(target, token_segments)
        n_g = hidden_g.shape[0]
        logits = logits_buffer[:n_g]
        linear_into(logits, hidden_g, weight, bias, gemm_scale)
        if post_scale is not None:
            logits.mul_(post_scale)
        tok = {name: torch.empty(n_g, dtype=torch.bool if name == "is_top1" else torch.float32, device=device)
               for name in _STATS if name in outputs or name == "entropy"}  # fmt: skip
        state = torch.empty(n_g, 2, dtype=torch.float64, device=device)
        log_probs = torch.empty(n_g, dtype=torch.float32, device=device)
        _launch_stats(
            logits, target_g, tok["entropy"], tok.get("log_sum_sq_probs"), tok.get("mean_logits"),
            tok.get("is_top1"), state, ignore_index, softcap, log_probs,
        )  # fmt: skip
        k = n_g // seq_len
        group_stats = FusedLogProbs(
            log_probs.view(k, seq_len),
            *(tok[name].view(k, seq_len) if name in tok else None for name in _STATS),
        )
        for name, value in group_stats._asdict().items():
            if name in fields:
                _scatter(fields[name], segments, value)
        loss_g, g_logp, g_entropy = _group_grads(group_loss, index, group_stats, entropy_grad)
        total += loss_g.to(torch.float64)
        if not (need_hidden or need_weight or need_bias):
            continue
        # d loss / dx = scale * d loss / dz: the factor folded into the per-token gradients
        g_logp = (g_logp.reshape(-1).to(torch.float32) * scale).contiguous()
        if g_entropy is not None:
            g_h = (g_entropy.reshape(-1).to(torch.float32) * scale).contiguous()
        else:
            g_h = g_logp  # not read (HAS_ENTROPY_GRAD False)
        _logprob_entropy_grad_kernel[(n_g,)](
            logits, logits.stride(0), target_g, state, g_logp, g_h,
            vocab, ignore_index, *split_f64(softcap if softcap is not None else 1.0),
            HAS_SOFTCAP=softcap is not None, HAS_LOGP_GRAD=True, HAS_ENTROPY_GRAD=g_entropy is not None,
            COMPUTE_DTYPE=tl.float64 if fp64_math else tl.float32, BLOCK_SIZE=block, num_warps=warps,
        )  # fmt: skip
        if grad_hidden is not None:
            offset = 0
            for start, stop in token_segments:
                rows = stop - start
                hidden_grad_into(grad_hidden[start:stop], logits[offset : offset + rows], weight)
                offset += rows
        if grad_weight is not None:
            grad_weight.add(logits, hidden_g)
        if grad_bias is not None:
            grad_bias += logits.sum(0, dtype=grad_bias.dtype)
    if pending is not None:
        finish_target_check(pending, ignore_index, vocab)
    return total, fields, (grad_hidden, grad_weight, grad_bias)


class FusedLinearLogProbLossFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, target, seq_len, groups, group_loss, opts):
        ctx.needs = (
            ctx.needs_input_grad[0],
            ctx.needs_input_grad[1],
            bias is not None and ctx.needs_input_grad[2],
        )
        ctx.set_materialize_grads(False)
        with torch.autocast(hidden.device.type, enabled=False):
            total, fields, grads = _loss_loop(
                hidden, weight, bias, target, seq_len, groups, group_loss, opts, ctx.needs
            )
        ctx.grads = grads
        ctx.dtypes = (hidden.dtype, bias.dtype if bias is not None else None)
        ctx.weight = weight.detach()
        values = list(fields.values())
        ctx.mark_non_differentiable(*values)
        return (total.to(torch.float32), *values)

    @staticmethod
    def backward(ctx, grad_loss, *_grad_fields):
        grad_hidden, grad_weight, grad_bias = ctx.grads
        ctx.grads = None
        if grad_loss is None:
            return (None,) * 8
        hidden_dtype, bias_dtype = ctx.dtypes
        go = grad_loss.detach()
        gh = (grad_hidden * go.to(grad_hidden.dtype)).to(hidden_dtype) if grad_hidden is not None else None
        gw = grad_weight.finish(go, ctx.weight) if grad_weight is not None else None
        gb = (grad_bias * go.to(grad_bias.dtype)).to(bias_dtype) if grad_bias is not None else None
        return gh, gw, gb, *(None,) * 5


def fused_linear_logprob_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    groups: Sequence[Sequence[tuple[int, int]]],
    group_loss: Callable[[int, FusedLogProbs], torch.Tensor],
    temperature: float = 1.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    ignore_index: int = -100,
    outputs: Sequence[str] = (),
    entropy_grad: bool = False,
    accum_dtype: torch.dtype | None = torch.float32,
    check_targets: bool = True,
) -> tuple[torch.Tensor, FusedLogProbs]:
    """``sum_g group_loss(g, stats_g)`` over the groups of rows of ``hidden (R, T, H)`` (with ``target (R,
    T)``), where ``stats_g`` are ``fused_linear_logprobs``' per-token fields of the group's rows ``(k, T)``
    in the order of its row ranges (``groups[g]``: (start, stop) ranges of rows; the groups partition the
    R rows), and the gradients made in the forward pass (module doc).

    ``group_loss(g, stats_g)`` returns the group's 0-dim term of the loss; its gradient may flow through
    ``stats_g.log_probs`` (and ``stats_g.entropy`` with ``entropy_grad=True``); every other input it uses must
    be detached. Returns ``(loss, FusedLogProbs)``: the fp32 loss and the detached per-token fields ``(R, T)``
    (``log_probs`` and those named in ``outputs``). One group's logits ``(k T, V)`` exist at a time.
    ``temperature``, ``softcap``, ``logit_scale``, ``ignore_index``, ``accum_dtype``, ``check_targets``: as
    ``fused_linear_logprobs``.
    """
    _, vocab = check_linear_inputs(hidden, weight, target, bias)
    check_same_device("hidden", hidden, weight=weight, target=target, bias=bias)
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be (rows, T, H), got shape {tuple(hidden.shape)}")
    n_rows, seq_len = target.shape
    groups = _check_groups(groups, n_rows)
    unknown = [name for name in outputs if name not in _STATS]
    if unknown:
        raise ValueError(f"outputs has unknown field(s) {unknown}; choose among {_STATS}")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be positive")
    hidden, weight, bias = autocast_linear_inputs(hidden, weight, bias)
    outputs = tuple(name for name in _STATS if name in outputs)

    if not use_triton(hidden) or seq_len == 0:
        if check_targets:
            check_targets_host(target.reshape(-1), ignore_index, vocab)
        full = reference.fused_linear_logprobs(
            hidden, weight, target, bias, temperature=temperature, softcap=softcap, logit_scale=logit_scale,
            ignore_index=ignore_index, outputs=("log_probs", "entropy", *outputs),
        )  # fmt: skip
        total = None
        for index, segments in enumerate(groups):
            parts = FusedLogProbs(*(_gather(v, segments) if v is not None else None for v in full))
            if not entropy_grad:
                parts = parts._replace(entropy=parts.entropy.detach())
            term = group_loss(index, parts)
            total = term if total is None else total + term
        if total is None:  # no groups (no rows): 0, connected to the inputs (zero gradients)
            total = full.log_probs.sum()
        detached = FusedLogProbs(
            *(v.detach() if v is not None and (name == "log_probs" or name in outputs) else None
              for name, v in full._asdict().items())
        )  # fmt: skip
        return total.to(torch.float32), detached

    scale = float(logit_scale) / float(temperature)
    softcap_x = float(softcap) / float(temperature) if softcap is not None else None
    hidden2d = hidden.reshape(-1, hidden.shape[-1])
    if hidden2d.stride(-1) != 1:
        hidden2d = hidden2d.contiguous()
    opts = (ignore_index, scale, softcap_x, outputs, bool(entropy_grad), accum_dtype, bool(check_targets))
    loss, *values = FusedLinearLogProbLossFunction.apply(
        hidden2d, weight, bias, target.reshape(-1).contiguous(), seq_len, groups, group_loss, opts
    )
    by_name = dict(zip(("log_probs", *outputs), values))
    return loss, FusedLogProbs(*(by_name.get(name) for name in ("log_probs", *_STATS)))

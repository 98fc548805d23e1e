"""Fused linear + cross-entropy: the lm_head matmul and the loss, without ever holding all the logits.

For hidden states ``h (BT, H)``, lm_head weight ``W (V, H)``, optional bias ``b (V,)``, the loss of
``cross_entropy(h @ W.T + b, target, ...)`` (every option of ``liger_core.ops.cross_entropy``) and its
gradients, computed in the forward pass by one of three loops (``_run_loop`` picks):

1. Two passes (the default): grad_hidden by chunks of tokens, grad_weight by slices of the vocabulary::

       grad_weight's storage (V x H) is allocated first; pass 1 works inside it
       pass 1, chunks of <= H tokens:  logits_c = h_c @ W.T (+ b)      (C, V) in dW's storage
                                       CE kernel(s)                    losses, dlogits_c in place, per-row
                                                                       gradient coefficients
                                       dh_c = dlogits_c @ W             one GEMM over all classes
    without a bias, the last K <= H: logits_K.T = W @ h_K.T          (V, K) vocabulary-major, kept
                                       _columns_stats/finish/grad      losses, dlogits_K.T in place
                                       dh_K = dlogits_K @ W
       pass 2, slices of V_s classes, the last slice first:
                                       logits_s = h_rest @ W_s.T        the other tokens' logits again
                                       _slice_grad_kernel               their dlogits from the coefficients
                                       dlogits_K[s] transposed below them (out of dW's rows s)
                                       dW_s = dlogits_s.T @ h           one GEMM over all tokens
                                       db_s = sum_rows(dlogits_s)

   Exact: every logit and gradient is one GEMM rounded once, as eager's (hence no kept chunk with a bias:
   cuBLAS adds a per-class bias to vocabulary-major logits only through its beta path, which rounds twice).
   FLOPs: 6 BT H V where every token is kept (BT <= H), 8 BT H V at most (the other tokens' logits computed
   twice). Peak extra memory: dW + dh + one slice (default: half the hidden-state gradient's size, >= 32 MiB
   on a GPU; ``max_chunk_bytes``). Rows s of dW are written over storage whose kept slice was just copied out;
   with the last slice first, every lower slice's kept gradient lies below them. H100, bf16, H 4096, V 128256
   (session 13, kernels of one fwd+bwd): 8192 tokens 41.9 ms at 1.073 GiB (4096 kept), 4096 tokens 18.6 ms
   (all kept; torch.compile 19.1 ms at 1.99 GiB); before the kept chunk 52.6 ms at 8192 tokens, and the
   vocabulary-major loop before that (fp32 dh across slices) 53.7 ms at 1.167 GiB (session 5).
2. Token-major with fp32 accumulators, where the memory headroom under the process's own earlier peak holds
   fp32 dW and dh, their rounded copies and a 512 MiB chunk (inside a training step, after its first
   iterations), or where ``max_chunk_bytes`` grants that much (4 bytes per element of W and h plus >= 512
   MiB of logits): chunks of ``C`` tokens, ``logits_c = h_c @ W.T``, CE kernel in place,
   ``dh_c = dlogits_c @ W``, ``dW += dlogits_c.T @ h_c`` into fp32, rounded once at the end. Exact, and
   faster there (no recomputed logits; Llama-1B shape, H100: 56.4k tokens/s vs 53.6k with the vocabulary
   order), at no new peak. H100, 8192 tokens, H 4096, V 128256 bf16: 36.6 ms of GPU kernels in one profiled
   fwd+bwd (session 11, ``benchmarks/variants_ce.py --only profile``), at ~3.1 GiB extra.
   With every logit in the budget (``max_chunk_bytes`` >= tokens x V x 2 bytes, or that much headroom):
   one chunk, nothing accumulated.
3. Token-major in ``accum_dtype`` (default W's dtype) when ``chunk_size`` is given: a bf16 dW rounds once per
   chunk (error up to ~sqrt(chunks) x eager's; Liger-Kernel's default order), each chunk reads W twice and
   reads and writes dW once (~4 |W| bytes). Faster than 1. at small vocabularies (V 32000, 8191 tokens: 10.4
   ms in liger-kernel's version vs 13.0 for 1.), less exact.

The backward pass only scales the stored gradients by ``grad_output`` (free when it is 1; otherwise the stored
bf16 gradients round a second time: ``accum_dtype=torch.float32`` keeps them in fp32 until then, for 2 more
bytes per element of W and h). ``reduction="none"`` cannot fold per-token ``grad_output`` into gradients
computed before it is known, so its forward computes only the losses and its backward runs the loop again with
the per-token factors inside the kernel.
"""

from __future__ import annotations

import collections
import functools

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_same_device,
    check_shape,
    check_tensor,
    launcher,
    use_triton,
)
from liger_core.loss_options import CrossEntropyOptions
from liger_core.loss_options import resolve as resolve_options
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops.cross_entropy import (
    RUNNING_MAX_START,
    _f64,
    _grad_block,
    _grad_coefs,
    _grad_values,
    _online_block,
    _row_loss,
    _scale_rows,
    _scale_rows_impl,
    _softcap,
    check_targets_host,
    denominator_tensor,
    finish_target_check,
    launch_cross_entropy,
    looped_row_settings,
    reduce_losses,
    resident_kernel_runs,
    smoothing_shift,
    split_f64,
    start_target_check,
    target_stats,
    with_denominator,
)
from liger_core.sharding import any_dtensor, check_not_zero3_partitioned, gather_weights

# A chunk of logits may be as large as the hidden-state gradient, and at least this large on a GPU (small
# models: fewer, larger GEMMs; each chunk re-reads and re-writes all of dW).
MIN_CHUNK_BYTES_CUDA = 64 * 2**20
# Largest default chunk taken from memory headroom (choose_chunk_tokens): beyond ~1000-2000 tokens of a
# 128k vocabulary the GEMMs are as efficient as they get (H100: 1024 tokens 40.0 ms, 2048 39.2 ms).
HEADROOM_CHUNK_BYTES = 512 * 2**20
# Whether loop and chunk choices may use the memory headroom under the process's own earlier peak. Benchmarks
# of the op alone turn it off: a timing loop's leftover gradients would otherwise give the timed runs a faster
# loop than the one whose memory the one-shot measurement reports.
USE_HEADROOM = True


def choose_chunk_tokens(
    n_tokens: int,
    hidden_size: int,
    vocab_size: int,
    dtype: torch.dtype,
    device: torch.device,
    chunk_size: int | None = None,
    max_chunk_bytes: int | None = None,
    reserved_bytes: int = 0,
) -> int:
    """Tokens per chunk: one chunk's logits no larger than ``max_chunk_bytes``, and than a quarter of the free
    memory; chunks balanced (equal sizes), multiples of 8 rows on a GPU.

    Default budget on a GPU: the hidden-state gradient's size, at least 64 MiB (Liger-Kernel's memory), or
    more where the process has already been higher: up to ``max_memory_allocated() - memory_allocated() -
    reserved_bytes`` (the gradients about to be allocated), capped at HEADROOM_CHUNK_BYTES. Larger chunks then
    cost no peak memory: inside a training step the loss runs below the backward pass's high-water mark
    (Llama-1B shape, H100: 51.8k -> 56.0k tokens/s, same 10.66 GiB peak), while a fresh process or a
    benchmark that resets the peak statistics gets the default."""
    if n_tokens == 0:
        return 1
    if chunk_size is not None:
        return max(1, min(chunk_size, n_tokens))
    elt = torch.empty((), dtype=dtype).element_size()
    if max_chunk_bytes is not None:
        budget = max_chunk_bytes
    else:
        budget = n_tokens * hidden_size * elt
        if device.type == "cuda":
            headroom = _headroom(device)
            budget = max(budget, MIN_CHUNK_BYTES_CUDA, min(headroom - reserved_bytes, HEADROOM_CHUNK_BYTES))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        allocated = _allocator_bytes(device)
        free += allocated["reserved_bytes"]["all"]["current"] - allocated["allocated_bytes"]["all"]["current"]
        budget = min(budget, free // 4)
    chunk = max(8, min(n_tokens, budget // (vocab_size * elt)))
    n_chunks = -(-n_tokens // chunk)
    chunk = -(-n_tokens // n_chunks)
    if device.type == "cuda":
        chunk = min(n_tokens, -(-chunk // 8) * 8)
    return chunk


@functools.cache
def _has_mixed_precision_mm(device_type: str, in_dtype: torch.dtype, out_dtype: torch.dtype) -> bool:
    """Whether ``torch.addmm(..., out_dtype=)`` works here (16-bit operands, fp32 accumulator: CUDA)."""
    try:
        a = torch.ones(8, 8, dtype=in_dtype, device=device_type)
        acc = torch.ones(8, 8, dtype=out_dtype, device=device_type)
        torch.addmm(acc, a, a, out_dtype=out_dtype, out=acc)
        return bool((acc == 9).all())
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def _mm_accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool) -> None:
    """``acc = a @ b`` (first) or ``acc += a @ b``, accumulated in ``acc``'s dtype without a temporary."""
    if acc.dtype != a.dtype and not _has_mixed_precision_mm(acc.device.type, a.dtype, acc.dtype):
        # no mixed-precision GEMM here (the CPU): upcasting the operands is exact, only slower
        a, b = a.to(acc.dtype), b.to(acc.dtype)
    if acc.dtype == a.dtype:
        if first:
            torch.mm(a, b, out=acc)
        else:
            acc.addmm_(a, b)
    elif first:
        torch.mm(a, b, out_dtype=acc.dtype, out=acc)
    else:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0)


def _accum_dtype(accum_dtype: torch.dtype | None, weight: torch.Tensor) -> torch.dtype:
    """dtype of the dW and dh accumulators: ``accum_dtype`` (default: the weight's), never below it."""
    return torch.promote_types(accum_dtype or weight.dtype, weight.dtype)


def hidden_accum_dtype(
    hidden: torch.Tensor, weight: torch.Tensor, accum_dtype: torch.dtype | None
) -> torch.dtype:
    """dtype of the dh buffer: fp64 for fp32 inputs (see ``hidden_grad_into``), else ``_accum_dtype``."""
    return torch.float64 if hidden.dtype == torch.float32 else _accum_dtype(accum_dtype, weight)


# vocabulary slice of the fp64 dh product for fp32 inputs (hidden_grad_into)
FP64_SLICE_BYTES = 64 * 2**20


def hidden_grad_into(out: torch.Tensor, dlogits: torch.Tensor, weight: torch.Tensor) -> None:
    """``out = dlogits @ weight`` (a chunk's rows of grad_hidden). For fp32 inputs ``out`` is fp64 and the
    product is taken in fp64 by vocabulary slices: cuBLAS's (and the CPU BLAS's) fp32 GEMM is less exact for a
    chunk's few rows than for eager's all tokens (H100, 2048 x 32000 x 4096: 3.2e-6 vs 1.4e-6 relative; CPU
    tests failed 1 run in 10 at 1.38 x eager's), and fp64 GEMMs run at fp32's rate or faster on H100/A100."""
    if out.dtype != torch.float64 or dlogits.dtype != torch.float32:
        _mm_accumulate(out, dlogits, weight, first=True)
        return
    # fp64 slices of dlogits and W no larger than half the chunk itself (and FP64_SLICE_BYTES)
    budget = min(FP64_SLICE_BYTES, dlogits.numel() * dlogits.element_size() // 2)
    step = max(1, budget // (8 * max(weight.shape[1], dlogits.shape[0], 1)))
    for start in range(0, weight.shape[0], step):
        part = dlogits[:, start : start + step].double() @ weight[start : start + step].double()
        if start == 0:
            out.copy_(part)
        else:
            out += part


def _grad_buffers(hidden, weight, need_hidden, need_weight, need_bias, accum_dtype):
    """grad_hidden and grad_weight in the accumulation dtype (uninitialised: the first chunk writes them) and
    a zeroed grad_bias, or None where not requested."""
    n_tokens, hidden_size = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    accum = _accum_dtype(accum_dtype, weight)
    grad_hidden = (
        torch.empty(
            n_tokens, hidden_size, dtype=hidden_accum_dtype(hidden, weight, accum_dtype), device=device
        )
        if need_hidden
        else None
    )
    grad_weight = torch.empty(vocab, hidden_size, dtype=accum, device=device) if need_weight else None
    # db sums every token's row: fp64 for fp32 logits, so it is not less exact than eager's one reduction
    bias_accum = torch.float64 if hidden.dtype == torch.float32 else torch.float32
    grad_bias = torch.zeros(vocab, dtype=bias_accum, device=device) if need_bias else None
    if grad_weight is not None and n_tokens == 0:
        grad_weight.zero_()
    return grad_hidden, grad_weight, grad_bias


def _chunk_logits(hidden, weight, bias, chunk, logit_scale=1.0):
    """Yield ``(start, end, hidden_c, logits)`` for each chunk of ``chunk`` tokens, with ``logits =
    logit_scale * (hidden_c @ weight.T + bias)`` in one reused (chunk, V) buffer of the input dtype (the
    factor in the GEMM's epilogue: no extra rounding, no pass over memory)."""
    n_tokens, vocab = hidden.shape[0], weight.shape[0]
    logits_buffer = torch.empty(min(chunk, n_tokens), vocab, dtype=hidden.dtype, device=hidden.device)
    for start in range(0, n_tokens, chunk):
        end = min(start + chunk, n_tokens)
        hidden_c = hidden[start:end]
        logits = logits_buffer[: end - start]
        linear_into(logits, hidden_c, weight, bias, logit_scale)
        yield start, end, hidden_c, logits


def linear_into(logits, hidden_c, weight, bias, logit_scale=1.0) -> None:
    """``logits = logit_scale * (hidden_c @ weight.T + bias)`` into the given buffer (one GEMM, the factor in
    its epilogue). Rounded once, except a bias with a factor: cuBLAS's beta path then rounds 0.09 % of the
    logits differently (H100, factor 1/0.7: error 1.662e-3 against 1.661e-3 for one rounding and eager's
    2.338e-3, which rounds the logits before scaling them; session 14)."""
    weight_t = weight.t()
    if logit_scale != 1.0:
        if bias is None:  # beta=0: the (uninitialised) buffer is ignored, not read
            torch.addmm(logits, hidden_c, weight_t, beta=0, alpha=logit_scale, out=logits)
        else:
            torch.addmm(bias, hidden_c, weight_t, beta=logit_scale, alpha=logit_scale, out=logits)
    elif bias is None:
        torch.mm(hidden_c, weight_t, out=logits)
    else:
        torch.addmm(bias, hidden_c, weight_t, out=logits)


def _accumulate_grads(dlogits, hidden_c, weight, start, end, grad_hidden, grad_weight, grad_bias):
    """From one chunk's ``dlogits``: its rows of grad_hidden, and its terms of grad_weight and grad_bias
    (each None when not requested)."""
    if grad_hidden is not None:
        hidden_grad_into(grad_hidden[start:end], dlogits, weight)
    if grad_weight is not None:
        _mm_accumulate(grad_weight, dlogits.t(), hidden_c, first=start == 0)
    if grad_bias is not None:
        grad_bias += dlogits.sum(0, dtype=grad_bias.dtype)


def _grads_in_dtypes(grads, hidden, weight, bias):
    """(grad_hidden, grad_weight, grad_bias) rounded to the dtypes of hidden, weight and bias; empty where
    None."""
    gh, gw, gb = grads
    return (
        gh.to(hidden.dtype) if gh is not None else _empty(hidden),
        gw.to(weight.dtype) if gw is not None else _empty(weight),
        gb.to(bias.dtype) if gb is not None and bias is not None else _empty(weight),
    )


def _fake_grads(hidden, weight, bias, need_hidden, need_weight, need_bias):
    """Fake-tensor outputs of a backward custom op returning ``_grads_in_dtypes``."""
    return (
        torch.empty_like(hidden) if need_hidden else _empty(hidden),
        torch.empty_like(weight) if need_weight else _empty(weight),
        torch.empty_like(bias) if need_bias and bias is not None else _empty(weight),
    )


def check_linear_inputs(hidden, weight, target, bias) -> tuple[int, int]:
    """The argument checks of a fused lm_head op (hidden ``(..., H)``, weight ``(V, H)``, target
    ``hidden.shape[:-1]`` of class indices, bias ``(V,)``); returns ``(H, V)``."""
    check_tensor("hidden", hidden, min_ndim=1)
    check_tensor("weight", weight, ndim=2)
    hidden_size = hidden.shape[-1]
    vocab = weight.shape[0]
    if weight.shape[1] != hidden_size:
        raise ValueError(
            f"weight has shape {tuple(weight.shape)}; expected (V, {hidden_size}) to match hidden"
        )
    if vocab == 0:
        raise ValueError("weight has 0 rows (an empty vocabulary)")
    check_tensor("target", target, dtypes=INDEX_DTYPES)
    check_shape("target", target, tuple(hidden.shape[:-1]), "target must have the shape of hidden[..., 0]")
    if bias is not None:
        check_tensor("bias", bias)
        check_shape("bias", bias, (vocab,), "one bias per vocabulary row of weight")
    return hidden_size, vocab


def check_chunk_options(accum_dtype, chunk_size, max_chunk_bytes) -> None:
    if accum_dtype is not None and accum_dtype not in FLOAT_DTYPES:
        raise TypeError(f"accum_dtype={accum_dtype} is not one of {FLOAT_DTYPES}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive int (or None)")
    if max_chunk_bytes is not None and (not isinstance(max_chunk_bytes, int) or max_chunk_bytes < 1):
        raise ValueError(f"max_chunk_bytes={max_chunk_bytes!r} must be a positive int (or None)")


def autocast_linear_inputs(hidden, weight, bias):
    """hidden, weight, bias cast to the autocast dtype where autocast is on (what F.linear does), then
    checked to share hidden's dtype."""
    if torch.is_autocast_enabled(hidden.device.type):
        cast = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(cast), weight.to(cast)
        bias = bias.to(cast) if bias is not None else None
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != hidden.dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but hidden has dtype {hidden.dtype}; they must match"
            )
    return hidden, weight, bias


def flatten_for_chunks(hidden, weight, target, chunk_size, max_chunk_bytes):
    """(hidden2d with unit column stride, contiguous target1d, chunk_size: ``max_chunk_bytes`` turned into
    tokens when no ``chunk_size`` is given)."""
    hidden_size = hidden.shape[-1]
    hidden2d = hidden.reshape(-1, hidden_size)
    if chunk_size is None and max_chunk_bytes is not None:
        chunk_size = choose_chunk_tokens(
            hidden2d.shape[0],
            hidden_size,
            weight.shape[0],
            hidden.dtype,
            hidden.device,
            max_chunk_bytes=max_chunk_bytes,
        )
    if hidden2d.stride(1) != 1:
        hidden2d = hidden2d.contiguous()
    return hidden2d, target.reshape(-1).contiguous(), chunk_size


def wants_grad(hidden, weight, bias) -> bool:
    """Whether autograd will need gradients of hidden, weight or bias."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))


def _chunk_loop(
    hidden,
    weight,
    target,
    bias,
    ce_weight,
    ignore_index,
    reduction,
    label_smoothing,
    lse_square_scale,
    softcap,
    need_hidden,
    need_weight,
    need_bias,
    accum_dtype,
    chunk_size,
    row_scale=None,
    check_targets=False,
    logit_scale=1.0,
    on_logits=None,
    denominator=None,
):
    """Unscaled per-row cross-entropy and z-loss (fp64), the target stats (``cross_entropy.target_stats``),
    and the requested gradients (grad_hidden and grad_weight in the accumulation dtype, grad_bias in fp32).

    Hooks for ``fused_linear_logprobs``: ``logit_scale`` multiplies each chunk's logits inside the GEMM
    (``logit_scale * (h @ W.T + b)``, one rounding; the kernel's gradient is then with respect to the scaled
    logits, so the caller folds the factor into ``row_scale``), and ``on_logits(start, end, logits)``
    sees each chunk's logits before the CE kernel overwrites them."""
    n_tokens, hidden_size = hidden.shape
    vocab = weight.shape[0]
    need_stats_weight = ce_weight is not None and (reduction == "mean" or label_smoothing != 0.0)
    stats = target_stats(target, ce_weight if need_stats_weight else None, ignore_index, vocab)
    pending = start_target_check(stats) if check_targets else None
    if denominator is not None:  # "mean" over a given count (see _flce_fwd_impl)
        stats = with_denominator(stats, denominator)
    compute_grad = need_hidden or need_weight or need_bias
    # accum_dtype=fp32 keeps grad_hidden in fp32 too (BT x H: small), so that scaling by grad_output in
    # backward is followed by a single rounding to the input dtype
    accum = _accum_dtype(accum_dtype, weight)
    grad_bytes = (need_hidden * n_tokens + need_weight * vocab) * hidden_size * accum.itemsize
    chunk = choose_chunk_tokens(
        n_tokens, hidden_size, vocab, hidden.dtype, hidden.device, chunk_size, reserved_bytes=grad_bytes
    )

    device = hidden.device
    loss_rows = torch.empty(n_tokens, dtype=torch.float64, device=device)
    z_rows = torch.empty(n_tokens, dtype=torch.float64, device=device)
    grads = _grad_buffers(hidden, weight, need_hidden, need_weight, need_bias, accum_dtype)
    for start, end, hidden_c, logits in _chunk_logits(hidden, weight, bias, chunk, logit_scale):
        if on_logits is not None:
            on_logits(start, end, logits)
        launch_cross_entropy(
            logits,
            target[start:end],
            ce_weight,
            logits if compute_grad else None,
            loss_rows[start:end],
            z_rows[start:end],
            stats,
            ignore_index=ignore_index,
            mean=reduction == "mean",
            label_smoothing=label_smoothing,
            lse_square_scale=lse_square_scale,
            softcap=softcap,
            grad_scale=row_scale[start:end] if row_scale is not None else None,
        )
        # `logits` now holds dloss/dlogits for the chunk
        _accumulate_grads(logits, hidden_c, weight, start, end, *grads)
    if pending is not None:  # after the launches: the GPU works while the host waits for the stats
        finish_target_check(pending, ignore_index, vocab)
    grad_hidden, grad_weight, grad_bias = grads
    if grad_bias is not None:
        grad_bias = grad_bias.float()
    return loss_rows, z_rows, stats, grad_hidden, grad_weight, grad_bias


# ----------------------------------------------------------------------------------------------------------
# Two-pass order (the default): exact gradients at the memory of the gradients and one slice of logits
# ----------------------------------------------------------------------------------------------------------
# Per-row gradient coefficients from pass 1 to pass 2, fp64 (n_rows, _STATE): the row max m and the
# coefficients (coef_p, coef_c, coef_y) of ``_grad_block``.
_STATE = 4


@fast_launch
@triton.jit
def _row_stats_kernel(
    logits_ptr,  # (n_rows, n_classes): a chunk's logits, every class
    logits_row_stride,
    target_ptr,
    weight_ptr,  # class weights (V,), read only when HAS_WEIGHT
    state_ptr,  # (n_rows, _STATE) fp64 out (COMPUTE_GRAD)
    loss_ptr,  # (n_rows,) fp64 out: unscaled cross-entropy per row
    z_loss_ptr,  # (n_rows,) fp64 out: unscaled z-loss per row
    grad_scale_ptr,  # (n_rows,) per-row gradient multiplier, read only when HAS_GRAD_SCALE
    stats_ptr,  # (5,) fp64 from cross_entropy's _target_stats_kernel
    n_classes,
    ignore_index,
    smoothing_hi, smoothing_lo, z_scale_hi, z_scale_lo, softcap_hi, softcap_lo,
    MEAN: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_GRAD_SCALE: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """Pass 1 of cross_entropy's kernel, kept apart from its gradient pass: the row's online max / sum of exp
    / smoothing sum, its loss and z-loss, and (COMPUTE_GRAD) the gradient coefficients that
    ``_slice_grad_kernel`` applies to any slice of the row's classes, then or after the logits are
    recomputed."""
    row = tl.program_id(0).to(tl.int64)  # int64: rows * stride passes 2^31
    logits_row = logits_ptr + row * logits_row_stride
    y = tl.load(target_ptr + row).to(tl.int64)
    if y == ignore_index:
        tl.store(loss_ptr + row, 0.0)
        tl.store(z_loss_ptr + row, 0.0)
        return
    softcap = _f64(softcap_hi, softcap_lo).to(COMPUTE_DTYPE)
    m = tl.full([], RUNNING_MAX_START, tl.float32)
    d = tl.cast(0.0, COMPUTE_DTYPE)
    smooth_acc = tl.cast(0.0, COMPUTE_DTYPE)
    # the smoothing sum is shifted by the row's first logit s (the CE kernel by x_y), by 0 where that is -inf
    shift = tl.load(logits_row).to(COMPUTE_DTYPE)
    if HAS_SOFTCAP:
        shift, _ = _softcap(shift, softcap, COMPUTE_DTYPE)
    shift = smoothing_shift(shift)
    offs = tl.arange(0, BLOCK_SIZE)
    for start in range(0, n_classes, BLOCK_SIZE):
        cols = start + offs
        mask = cols < n_classes
        x_raw = tl.load(logits_row + cols, mask=mask, other=-float("inf"))
        m, d, smooth_acc = _online_block(
            x_raw, mask, cols, m, d, smooth_acc, shift, weight_ptr, softcap,
            HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, COMPUTE_DTYPE,
        )  # fmt: skip
    # the target logit (clamped: an out-of-range target is reported by the host)
    y_safe = tl.minimum(tl.maximum(y, 0), n_classes - 1)
    ce, z_loss, coef_p, coef_c, coef_y = _finish_rows(
        m, d, smooth_acc, shift, tl.load(logits_row + y_safe), y_safe, row, weight_ptr, stats_ptr,
        grad_scale_ptr, softcap, smoothing_hi, smoothing_lo, z_scale_hi, z_scale_lo, n_classes,
        MEAN, HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, HAS_GRAD_SCALE, COMPUTE_DTYPE,
    )  # fmt: skip
    tl.store(loss_ptr + row, ce)
    tl.store(z_loss_ptr + row, z_loss)
    if COMPUTE_GRAD:
        state = state_ptr + row * 4
        tl.store(state + 0, m.to(tl.float64))
        tl.store(state + 1, coef_p)
        tl.store(state + 2, coef_c)
        tl.store(state + 3, coef_y)


@triton.jit
def _finish_rows(
    m, d, smooth_acc, shift, x_y_raw, y_safe, rows, weight_ptr, stats_ptr, grad_scale_ptr, softcap,
    smoothing_hi, smoothing_lo, z_scale_hi, z_scale_lo, n_classes,
    MEAN: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_GRAD_SCALE: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):  # fmt: skip
    """A row's (or a vector of rows') loss, z-loss and gradient coefficients (coef_p, coef_c, coef_y), fp64,
    from its max m, rescaled sum d, smoothing sum shifted by ``shift`` (the row's first logit; the CE kernel
    shifts by x_y) and target logit ``x_y_raw``: the CE kernel's per-row scalars."""
    x_y = x_y_raw.to(COMPUTE_DTYPE)
    if HAS_SOFTCAP:
        x_y, _ = _softcap(x_y, softcap, COMPUTE_DTYPE)
    x_y = x_y.to(tl.float64)
    w_y = 1.0
    if HAS_WEIGHT:
        w_y = tl.load(weight_ptr + y_safe).to(tl.float64)
    d64 = d.to(tl.float64)
    log_d = tl.log(d64)
    m64 = m.to(tl.float64)
    lse = m64 + log_d
    eps = _f64(smoothing_hi, smoothing_lo)
    zs = _f64(z_scale_hi, z_scale_lo)
    w_total = tl.load(stats_ptr + 4)
    nll_shift = (m64 - shift.to(tl.float64)) + log_d
    ce = _row_loss((m64 - x_y) + log_d, nll_shift, smooth_acc, w_y, eps, w_total, n_classes, HAS_SMOOTHING)
    p_ce, p_z, coef_c, coef_y = _grad_coefs(
        stats_ptr, grad_scale_ptr, rows, w_y, eps, zs, w_total, n_classes, MEAN, HAS_GRAD_SCALE
    )
    return ce, zs * lse * lse, (p_ce + p_z * lse) / d64, coef_c, coef_y


@fast_launch
@triton.jit
def _slice_grad_kernel(
    logits_ptr,  # (n_rows, n_cols): this slice's logits, overwritten with their gradient
    logits_row_stride,
    target_ptr,
    weight_ptr,
    state_ptr,  # (n_rows, _STATE) fp64 from _row_stats_kernel
    n_cols,
    col_offset,
    ignore_index,
    softcap_hi,
    softcap_lo,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Pass 2 of cross_entropy's kernel over one slice: dx_c = coef_p * exp(x_c - m) - coef_c * w_c
    - coef_y * [c == y] (``_grad_block``, the same arithmetic and one rounding), in place."""
    row = tl.program_id(0).to(tl.int64)
    logits_row = logits_ptr + row * logits_row_stride
    state = state_ptr + row * 4
    y = tl.load(target_ptr + row).to(tl.int64)
    offs = tl.arange(0, BLOCK_SIZE)
    if y == ignore_index:
        for start in range(0, n_cols, BLOCK_SIZE):
            cols = start + offs
            tl.store(
                logits_row + cols,
                tl.zeros([BLOCK_SIZE], tl.float32).to(logits_ptr.dtype.element_ty),
                mask=cols < n_cols,
            )
        return
    softcap = _f64(softcap_hi, softcap_lo).to(COMPUTE_DTYPE)
    m_c = tl.load(state + 0).to(tl.float32).to(COMPUTE_DTYPE)
    coef_p = tl.load(state + 1).to(COMPUTE_DTYPE)
    coef_c = tl.load(state + 2).to(COMPUTE_DTYPE)
    coef_y = tl.load(state + 3).to(COMPUTE_DTYPE)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + offs
        mask = cols < n_cols
        x_raw = tl.load(logits_row + cols, mask=mask, other=0.0)
        # global class indices for the weights and the target; the row pointer shifted to match
        _grad_block(
            x_raw, mask, col_offset + cols, logits_row - col_offset, y, m_c, coef_p, coef_c, coef_y,
            weight_ptr, softcap, HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, COMPUTE_DTYPE, "", "",
        )  # fmt: skip


# Kernels on vocabulary-major logits (classes x tokens: the two-pass loop's kept chunk), in (classes, tokens)
# tiles (BLOCK_V, BLOCK_T, num_warps). The statistics pass splits the classes among programs (COLUMNS_SPLIT
# classes each) so that a few thousand tokens still fill the GPU; a second kernel merges the splits. Tiles
# from a sweep (H100 session 14, `call7_columns_tiles.log`, bf16 V 128256 x 4096 tokens, 0.98 GiB): stats
# 128 x 64, 4 warps 0.505 ms (64 x 64: 0.72; floor 0.35), gradient 64 x 128 (256 contiguous bytes per class
# row), 4 warps 0.732 ms (64 x 64: 1.26; floor 0.70).
COLUMNS_STATS_TILE = (128, 64, 4)
COLUMNS_GRAD_TILE = (64, 128, 4)
COLUMNS_SPLIT = 2048


@fast_launch
@triton.jit
def _columns_stats_kernel(
    logits_ptr,  # (n_classes, n_tokens) vocabulary-major, row stride logits_row_stride
    logits_row_stride,
    weight_ptr,  # class weights (V,), read only when HAS_WEIGHT and HAS_SMOOTHING
    partials_ptr,  # (n_splits, 3, n_tokens) fp64 out: m, d, smoothing sum of this split's classes
    n_tokens,
    n_classes,
    softcap_hi,
    softcap_lo,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """``_online_block`` over one split of the classes for BLOCK_T tokens (one per column), the smoothing sum
    shifted by each token's first logit as in ``_row_stats_kernel``."""
    split = tl.program_id(1)
    # tokens stay an unclamped arange (masked instead): Triton then proves each class row's run contiguous
    # and vectorises the loads (a clamp made them 2-byte loads: 10x slower, H100 session 13)
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_range = tokens < n_tokens
    softcap = _f64(softcap_hi, softcap_lo).to(COMPUTE_DTYPE)
    shift = tl.load(logits_ptr + tokens, mask=in_range, other=0.0).to(COMPUTE_DTYPE)
    if HAS_SOFTCAP:
        shift, _ = _softcap(shift, softcap, COMPUTE_DTYPE)
    shift = smoothing_shift(shift)
    m = tl.full([BLOCK_T], RUNNING_MAX_START, tl.float32)
    # fp64 running sums of the tiles' fp32 sums: a split adds 32 tiles of 64 classes where the row kernel
    # adds a few wide blocks; in fp32 the mean loss came out up to 1.5x eager's error (H100 GPU test)
    d = tl.zeros([BLOCK_T], tl.float64)
    smooth_acc = tl.zeros([BLOCK_T], tl.float64)
    lo = split * SPLIT
    hi = tl.minimum(lo + SPLIT, n_classes)
    lane_classes = tl.arange(0, BLOCK_V)[:, None] + tl.zeros([1, BLOCK_T], tl.int32)
    # masked classes read -inf (exp gives 0); the tail's lanes past n_tokens read 0 (no -inf - -inf)
    other = tl.where(in_range, -float("inf"), 0.0)[None, :]
    for start in range(lo, hi, BLOCK_V):
        classes = start + lane_classes
        mask = (classes < hi) & in_range[None, :]
        ptrs = logits_ptr + classes.to(tl.int64) * logits_row_stride + tokens[None, :]
        x_raw = tl.load(ptrs, mask=mask, other=other)
        m, d, smooth_acc = _online_block(
            x_raw, mask, classes, m, d, smooth_acc, shift[None, :], weight_ptr, softcap,
            HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, COMPUTE_DTYPE,
        )  # fmt: skip
    out = partials_ptr + split.to(tl.int64) * 3 * n_tokens + tokens
    tl.store(out, m.to(tl.float64), mask=in_range)
    tl.store(out + n_tokens, d, mask=in_range)
    tl.store(out + 2 * n_tokens, smooth_acc, mask=in_range)


@fast_launch
@triton.jit
def _columns_finish_kernel(
    logits_ptr,
    logits_row_stride,
    target_ptr,
    weight_ptr,
    partials_ptr,  # from _columns_stats_kernel
    state_ptr,  # (n_tokens, _STATE) fp64 out
    loss_ptr,  # (n_tokens,) fp64 out: unscaled cross-entropy per token
    z_loss_ptr,  # (n_tokens,) fp64 out: unscaled z-loss per token
    grad_scale_ptr,  # (n_tokens,) per-token gradient multiplier, read only when HAS_GRAD_SCALE
    stats_ptr,  # (5,) fp64 from cross_entropy's _target_stats_kernel
    n_tokens,
    n_classes,
    n_splits,
    ignore_index,
    smoothing_hi, smoothing_lo, z_scale_hi, z_scale_lo, softcap_hi, softcap_lo,
    MEAN: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_GRAD_SCALE: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    """The splits' (m, d, smoothing sum) merged per token, then ``_finish_rows``: losses and the gradient
    coefficients into ``state`` (as ``_row_stats_kernel`` writes them)."""
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_range = tokens < n_tokens
    tokens = tl.minimum(tokens, n_tokens - 1)  # the tail's lanes repeat the last token; nothing is stored
    m = tl.full([BLOCK_T], -float("inf"), tl.float32)
    for i in range(n_splits):
        m = tl.maximum(m, tl.load(partials_ptr + i * 3 * n_tokens + tokens).to(tl.float32))
    # the splits' sums merged in fp64: one more level of partial sums than the row kernel's, no more error
    d = tl.zeros([BLOCK_T], tl.float64)
    smooth_acc = tl.zeros([BLOCK_T], tl.float64)
    for i in range(n_splits):
        part = partials_ptr + i * 3 * n_tokens + tokens
        m_i = tl.load(part).to(tl.float32)
        d += tl.load(part + n_tokens) * tl.exp((m_i - m).to(COMPUTE_DTYPE)).to(tl.float64)
        smooth_acc += tl.load(part + 2 * n_tokens)
    y = tl.load(target_ptr + tokens).to(tl.int64)
    active = in_range & (y != ignore_index)
    y_safe = tl.minimum(tl.maximum(y, 0), n_classes - 1)
    softcap = _f64(softcap_hi, softcap_lo).to(COMPUTE_DTYPE)
    shift = tl.load(logits_ptr + tokens).to(COMPUTE_DTYPE)
    if HAS_SOFTCAP:
        shift, _ = _softcap(shift, softcap, COMPUTE_DTYPE)
    shift = smoothing_shift(shift)
    ce, z_loss, coef_p, coef_c, coef_y = _finish_rows(
        m, d, smooth_acc, shift, tl.load(logits_ptr + y_safe * logits_row_stride + tokens), y_safe, tokens,
        weight_ptr, stats_ptr, grad_scale_ptr, softcap, smoothing_hi, smoothing_lo, z_scale_hi, z_scale_lo,
        n_classes, MEAN, HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, HAS_GRAD_SCALE, COMPUTE_DTYPE,
    )  # fmt: skip
    tl.store(loss_ptr + tokens, tl.where(active, ce, 0.0), mask=in_range)
    tl.store(z_loss_ptr + tokens, tl.where(active, z_loss, 0.0), mask=in_range)
    lanes = tl.zeros([BLOCK_T], tl.float64)  # without per-token factors coef_c and coef_y are scalars
    state = state_ptr + tokens * 4
    tl.store(state + 0, m.to(tl.float64), mask=in_range)
    tl.store(state + 1, coef_p + lanes, mask=in_range)
    tl.store(state + 2, coef_c + lanes, mask=in_range)
    tl.store(state + 3, coef_y + lanes, mask=in_range)


@fast_launch
@triton.jit
def _columns_grad_kernel(
    logits_ptr,  # (n_cols, n_tokens) vocabulary-major slice of classes col_offset.., overwritten with dlogits
    logits_row_stride,
    target_ptr,
    weight_ptr,
    state_ptr,  # (n_tokens, _STATE) fp64: _row_stats_kernel, the resident kernel or _columns_finish_kernel
    n_tokens,
    n_cols,
    col_offset,
    ignore_index,
    softcap_hi,
    softcap_lo,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """``_slice_grad_kernel`` on one (BLOCK_V classes, BLOCK_T tokens) tile of vocabulary-major logits: the
    same ``_grad_values`` from each token's stored coefficients, in place; ignored tokens get 0."""
    tokens = tl.program_id(1).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)  # unclamped: vector loads
    in_range = tokens < n_tokens
    y = tl.load(target_ptr + tokens, mask=in_range, other=ignore_index).to(tl.int64)
    active = in_range & (y != ignore_index)
    state = state_ptr + tokens * 4
    m_c = tl.load(state + 0, mask=in_range, other=0.0).to(tl.float32).to(COMPUTE_DTYPE)
    coef_p = tl.load(state + 1, mask=in_range, other=0.0).to(COMPUTE_DTYPE)
    coef_c = tl.load(state + 2, mask=in_range, other=0.0).to(COMPUTE_DTYPE)
    coef_y = tl.load(state + 3, mask=in_range, other=0.0).to(COMPUTE_DTYPE)
    softcap = _f64(softcap_hi, softcap_lo).to(COMPUTE_DTYPE)
    classes = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)[:, None] + tl.zeros([1, BLOCK_T], tl.int32)
    mask = (classes < n_cols) & in_range[None, :]
    ptrs = logits_ptr + classes.to(tl.int64) * logits_row_stride + tokens[None, :]
    x_raw = tl.load(ptrs, mask=mask, other=0.0)
    dx = _grad_values(
        x_raw, mask, col_offset + classes, y[None, :], m_c[None, :], coef_p[None, :], coef_c[None, :],
        coef_y[None, :], weight_ptr, softcap, HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, COMPUTE_DTYPE,
    )  # fmt: skip
    dx = tl.where(active[None, :], dx, 0.0)
    tl.store(ptrs, dx.to(logits_ptr.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _transpose_kernel(
    src_ptr,  # (n_rows, n_cols), row stride src_row_stride
    src_row_stride,
    dst_ptr,  # (n_cols, n_rows), row stride dst_row_stride
    dst_row_stride,
    n_rows,
    n_cols,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """dst = src.T by (BLOCK_R, BLOCK_C) tiles: both sides read and written along their contiguous rows
    (Triton reorders the tile through shared memory between the two); torch's strided copy reads one side
    element by element (4.1 ms vs a 0.7 ms floor for pass 2's kept slices, H100 session 13)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tile = tl.load(src_ptr + rows[:, None] * src_row_stride + cols[None, :], mask=mask)
    tl.store(dst_ptr + cols[None, :] * dst_row_stride + rows[:, None], tile, mask=mask)


def transpose_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src.T)`` for 2-D tensors with unit column strides (``_transpose_kernel``)."""
    n_rows, n_cols = src.shape
    if n_rows == 0 or n_cols == 0:
        return
    grid = (triton.cdiv(n_rows, 64), triton.cdiv(n_cols, 64))
    _transpose_kernel[grid](src, src.stride(0), dst, dst.stride(0), n_rows, n_cols, BLOCK_R=64, BLOCK_C=64)


# vocabulary slice of pass 2 of the two-pass loop: at least this large on a GPU, by default half the
# hidden-state gradient's size, so that the loss's extra memory (the two gradients and this slice) stays below
# Liger-Kernel's (the gradients and a 256-token chunk: 62.6 MiB of logits at V 128256)
MIN_SLICE_BYTES_CUDA = 32 * 2**20


def vocab_slice_columns(n_tokens: int, vocab: int, elt: int, budget_bytes: int, device: torch.device) -> int:
    """Classes per vocabulary slice: the slice's (n_tokens, V_s) logits within ``budget_bytes``; balanced
    slices, multiples of 128 classes on a GPU (full GEMM tiles)."""
    cols = max(1, min(vocab, budget_bytes // max(1, n_tokens * elt)))
    if device.type == "cuda":
        cols = max(cols, min(vocab, 128))
    n_slices = -(-vocab // cols)
    cols = -(-vocab // n_slices)
    if device.type == "cuda":
        cols = min(vocab, -(-cols // 128) * 128)
    return cols


def two_pass_sizes(
    n_tokens: int,
    hidden_size: int,
    vocab: int,
    dtype: torch.dtype,
    device: torch.device,
    max_chunk_bytes: int | None,
    reserved_bytes: int,
    need_chunk: bool = True,
) -> tuple[int, int]:
    """(tokens per pass-1 chunk where grad_weight's storage does not hold the chunks, else 0 (``need_chunk``
    False: no allocator queries on the host), classes per pass-2 slice) of ``_two_pass_loop``. The chunk is
    the token-major loop's own (``choose_chunk_tokens``). The
    slice's logits (all tokens) fit the working budget: ``max_chunk_bytes``, or by default half the
    hidden-state gradient's size, at least MIN_SLICE_BYTES_CUDA on a GPU, more where the process's headroom
    (below its own earlier peak) allows."""
    chunk = 0
    if need_chunk:
        chunk = choose_chunk_tokens(
            n_tokens, hidden_size, vocab, dtype, device, None, max_chunk_bytes, reserved_bytes
        )
    elt = torch.empty((), dtype=dtype).element_size()
    if max_chunk_bytes is not None:
        budget = max_chunk_bytes
    else:
        budget = n_tokens * hidden_size * elt // 2
        if device.type == "cuda":
            headroom = _headroom(device) - reserved_bytes
            budget = max(budget, MIN_SLICE_BYTES_CUDA, min(headroom, HEADROOM_CHUNK_BYTES))
    return chunk, vocab_slice_columns(n_tokens, vocab, elt, budget, device)


def _two_pass_loop(
    hidden,
    weight,
    target,
    bias,
    ce_weight,
    ignore_index,
    reduction,
    label_smoothing,
    lse_square_scale,
    softcap,
    need_hidden,
    need_weight,
    need_bias,
    accum_dtype,
    max_chunk_bytes,
    row_scale=None,
    check_targets=False,
    denominator=None,
):
    """``_chunk_loop``'s results, every gradient rounded once (the default order; see the module doc).

    Pass 1, token-major (chunks of tokens, every class): ``logits_c = h_c @ W.T``; ``_row_stats_kernel`` and
    ``_slice_grad_kernel`` (or, on Hopper, cross_entropy's resident kernel) write the losses, each row's
    gradient coefficients into ``state`` and the chunk's gradient in place; ``dh_c = dlogits_c @ W``, one GEMM
    over all classes. Where grad_weight is wanted its storage holds the chunks, and (without a bias) the last
    chunk (up to its capacity: H tokens for equal dtypes; a multiple of 8 on a GPU) is computed
    vocabulary-major, ``logits_K.T = W @ h_K.T`` (the ``_columns_*`` kernels), and kept. Pass 2, by slices of
    V_s classes in descending order (only when grad_weight or grad_bias is wanted): the other tokens' logits
    again and their gradient from the stored coefficients, the kept tokens' gradient transposed below them,
    ``dW_s = dlogits_s.T @ h``, one GEMM over all tokens; ``db_s`` a sum over all tokens. The slice's rows of
    grad_weight are written over storage whose kept gradient was just copied out; the descending order keeps
    every lower slice's kept gradient below them. FLOPs: 6 BT H V where every token is kept (BT <= H), up to
    8 BT H V; extra memory: the gradients and one slice of logits."""
    n_tokens, hidden_size = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    need_stats_weight = ce_weight is not None and (reduction == "mean" or label_smoothing != 0.0)
    stats = target_stats(target, ce_weight if need_stats_weight else None, ignore_index, vocab)
    pending = start_target_check(stats) if check_targets else None
    if denominator is not None:  # "mean" over a given count (see _flce_fwd_impl)
        stats = with_denominator(stats, denominator)
    compute_grad = need_hidden or need_weight or need_bias
    vocab_pass = need_weight or need_bias
    accum = _accum_dtype(accum_dtype, weight)
    fp64_math = hidden.dtype == torch.float32
    dh_dtype = hidden_accum_dtype(hidden, weight, accum_dtype)
    weight_grad_bytes = need_weight * vocab * hidden_size * accum.itemsize
    in_weight_storage = need_weight and n_tokens > 0  # pass 1's chunks then live in grad_weight's storage
    chunk, cols = two_pass_sizes(
        n_tokens, hidden_size, vocab, hidden.dtype, device, max_chunk_bytes,
        reserved_bytes=weight_grad_bytes + need_hidden * n_tokens * hidden_size * dh_dtype.itemsize,
        need_chunk=not in_weight_storage,
    )  # fmt: skip

    loss_rows = torch.empty(n_tokens, dtype=torch.float64, device=device)
    z_rows = torch.empty(n_tokens, dtype=torch.float64, device=device)
    state = torch.empty(n_tokens, _STATE, dtype=torch.float64, device=device)
    grad_hidden = torch.empty(n_tokens, hidden_size, dtype=dh_dtype, device=device) if need_hidden else None
    weight_arg = ce_weight if ce_weight is not None else loss_rows
    row_scale_arg = row_scale if row_scale is not None else loss_rows
    softcap_args = split_f64(softcap if softcap is not None else 1.0)
    loss_args = (*split_f64(label_smoothing), *split_f64(lse_square_scale), *softcap_args)
    flags = dict(
        HAS_WEIGHT=ce_weight is not None,
        HAS_SMOOTHING=label_smoothing != 0.0,
        HAS_SOFTCAP=softcap is not None,
        COMPUTE_DTYPE=tl.float64 if fp64_math else tl.float32,
    )
    on_gpu = device.type == "cuda"

    def row_grads(logits, start, end, col_start):
        """dlogits of rows start:end over classes col_start:col_start + logits.shape[1], in place."""
        block, warps = looped_row_settings(logits.shape[1], device, fp64_math)
        _slice_grad_kernel[(end - start,)](
            logits, logits.stride(0), target[start:end], weight_arg, state[start:end], logits.shape[1],
            col_start, ignore_index, *softcap_args, **flags, BLOCK_SIZE=block, num_warps=warps,
        )  # fmt: skip

    def columns_grads(logits_t, start, end, col_start):
        """dlogits of tokens start:end stored vocabulary-major (classes col_start.. by tokens), in place."""
        n_cols, n = logits_t.shape
        block_v, block_t, warps = COLUMNS_GRAD_TILE
        grid = (triton.cdiv(n_cols, block_v), triton.cdiv(n, block_t))
        _columns_grad_kernel[grid](
            logits_t, logits_t.stride(0), target[start:end], weight_arg, state[start:end], n, n_cols,
            col_start, ignore_index, *softcap_args, **flags, BLOCK_V=block_v, BLOCK_T=block_t,
            num_warps=warps,
        )  # fmt: skip

    def token_chunk(logits, start, end):
        """Pass 1 on the (end - start, V) logits of rows start:end: losses, coefficients, grad_hidden rows."""
        if need_hidden and resident_kernel_runs(logits, ce_weight, softcap):
            # the CE kernel with the row on chip: one read, one write, and the coefficients for pass 2
            launch_cross_entropy(
                logits, target[start:end], ce_weight, logits, loss_rows[start:end], z_rows[start:end], stats,
                ignore_index=ignore_index, mean=reduction == "mean", label_smoothing=label_smoothing,
                lse_square_scale=lse_square_scale, softcap=softcap,
                grad_scale=row_scale[start:end] if row_scale is not None else None, state=state[start:end],
            )  # fmt: skip
        else:
            block, warps = looped_row_settings(vocab, device, fp64_math)
            _row_stats_kernel[(end - start,)](
                logits, logits.stride(0), target[start:end], weight_arg, state[start:end],
                loss_rows[start:end], z_rows[start:end], row_scale_arg[start:end], stats, vocab, ignore_index,
                *loss_args, MEAN=reduction == "mean", HAS_GRAD_SCALE=row_scale is not None,
                COMPUTE_GRAD=compute_grad, **flags, BLOCK_SIZE=block, num_warps=warps,
            )  # fmt: skip
            if need_hidden:
                row_grads(logits, start, end, 0)
        if need_hidden:
            hidden_grad_into(grad_hidden[start:end], logits, weight)

    grad_weight = kept = None
    kept_tokens = 0  # the last tokens, whose gradient pass 1 keeps vocabulary-major for pass 2
    if in_weight_storage:
        # pass 1 inside grad_weight's storage: token chunks, then the kept chunk
        storage = torch.empty(vocab * hidden_size * accum.itemsize, dtype=torch.uint8, device=device)
        grad_weight = storage.view(accum).view(vocab, hidden_size)
        logits_store = storage.view(hidden.dtype)
        capacity = logits_store.numel() // vocab  # tokens per chunk; H for equal dtypes
        # no kept chunk with a bias: a vocabulary-major GEMM adds a per-class bias only through cuBLAS's beta
        # path, which rounds twice (7 % of the logits one ulp off, H100 session 14); the token-major GEMM adds
        # it in its epilogue, rounded once, as eager's
        kept_tokens = min(n_tokens, capacity) if bias is None else 0
        if on_gpu:  # a multiple of 8: the kept chunk's GEMMs run over it contiguously (odd counts: slow
            kept_tokens -= kept_tokens % 8  # unaligned kernels, 84 vs 18.6 ms at 4093 tokens, H100)
        rest = n_tokens - kept_tokens
        if rest:
            n_chunks = -(-rest // capacity)
            step = -(-rest // n_chunks)
            step = min(capacity, -(-step // 8) * 8) if on_gpu else step
            for start in range(0, rest, step):
                end = min(start + step, rest)
                logits = logits_store[: (end - start) * vocab].view(end - start, vocab)
                linear_into(logits, hidden[start:end], weight, bias)
                token_chunk(logits, start, end)
        if kept_tokens:
            kept = logits_store[: vocab * kept_tokens].view(vocab, kept_tokens)
            torch.mm(weight, hidden[rest:].t(), out=kept)
            n_splits = triton.cdiv(vocab, COLUMNS_SPLIT)
            partials = torch.empty(n_splits, 3, kept_tokens, dtype=torch.float64, device=device)
            block_v, block_t, warps = COLUMNS_STATS_TILE
            _columns_stats_kernel[(triton.cdiv(kept_tokens, block_t), n_splits)](
                kept, kept.stride(0), weight_arg, partials, kept_tokens, vocab, *softcap_args, **flags,
                SPLIT=COLUMNS_SPLIT, BLOCK_V=block_v, BLOCK_T=block_t, num_warps=warps,
            )  # fmt: skip
            _columns_finish_kernel[(triton.cdiv(kept_tokens, 128),)](
                kept, kept.stride(0), target[rest:], weight_arg, partials, state[rest:], loss_rows[rest:],
                z_rows[rest:], row_scale_arg[rest:], stats, kept_tokens, vocab, n_splits, ignore_index,
                *loss_args, MEAN=reduction == "mean", HAS_GRAD_SCALE=row_scale is not None, **flags,
                BLOCK_T=128, num_warps=4,
            )  # fmt: skip
            partials = None
            columns_grads(kept, rest, n_tokens, 0)
            if need_hidden:
                hidden_grad_into(grad_hidden[rest:], kept.t(), weight)
    else:
        for start, end, _, logits in _chunk_logits(hidden, weight, bias, chunk):
            token_chunk(logits, start, end)
        logits = None  # pass 1's chunk buffer is freed before pass 2's slice

    # pass 2: grad_weight and grad_bias, by slices of classes over every token, the last slice first
    rest = n_tokens - kept_tokens
    grad_bias = (
        torch.empty(vocab, dtype=torch.float64 if fp64_math else torch.float32, device=device)
        if need_bias
        else None
    )
    if vocab_pass and n_tokens == 0:
        grad_weight = torch.zeros(vocab, hidden_size, dtype=accum, device=device) if need_weight else None
        if grad_bias is not None:
            grad_bias.zero_()
    elif vocab_pass:
        # the slice token-major (tokens, V_s): the other tokens' logits and the kept ones' gradient by rows
        # (dW's GEMM then runs over the tokens as its strided dimension: any count, aligned kernels)
        buffer = torch.empty(n_tokens * cols, dtype=hidden.dtype, device=device)
        for start in reversed(range(0, vocab, cols)):
            end = min(start + cols, vocab)
            logits = buffer[: n_tokens * (end - start)].view(n_tokens, end - start)
            if rest:
                b = bias[start:end] if bias is not None else None
                linear_into(logits[:rest], hidden[:rest], weight[start:end], b)
                row_grads(logits[:rest], 0, rest, start)
            if kept is not None:
                transpose_into(logits[rest:], kept[start:end])  # before grad_weight's rows overwrite it
            if grad_weight is not None:
                _slice_weight_grad(grad_weight[start:end], logits, hidden)
            if grad_bias is not None:
                grad_bias[start:end] = logits.sum(0, dtype=grad_bias.dtype)
        buffer = logits = None
    if pending is not None:  # after the launches: the GPU works while the host waits for the stats
        finish_target_check(pending, ignore_index, vocab)
    if grad_bias is not None:
        grad_bias = grad_bias.float()
    return loss_rows, z_rows, stats, grad_hidden, grad_weight, grad_bias


def _slice_weight_grad(out: torch.Tensor, dlogits: torch.Tensor, hidden: torch.Tensor) -> None:
    """``dW_s = dlogits.T @ h`` over all tokens into its rows of grad_weight: one GEMM, one rounding (fp64
    products for fp32 inputs: cuBLAS's fp32 GEMM rounds more than eager's single GEMM, see
    ``hidden_grad_into``)."""
    if dlogits.dtype == torch.float32:
        out.copy_(dlogits.double().t() @ hidden.double())
        return
    _mm_accumulate(out, dlogits.t(), hidden, first=True)


def _run_loop(chunk_size: int | None, max_chunk_bytes: int | None, *args, **kwargs):
    """Which loop computes the loss and gradients:

    - ``chunk_size`` given: the token-major chunk loop with that many tokens per chunk (dW accumulates in
      ``accum_dtype``: a bf16 dW rounds once per chunk);
    - otherwise (16-bit inputs, gradients wanted), where ``max_chunk_bytes`` or the process's memory
      headroom (below its own earlier peak, so no new peak) holds every logit: the token-major loop in one
      chunk (exact: each gradient is one GEMM; the fastest order);
    - otherwise, where the headroom holds fp32 dW and dh accumulators, their rounded copies and a large
      chunk, or ``max_chunk_bytes`` the fp32 accumulators and a HEADROOM_CHUNK_BYTES chunk: the token-major
      loop with fp32 accumulation, rounded once at the end (exact, faster than the two-pass loop);
    - otherwise the two-pass loop (exact; ``max_chunk_bytes`` bounds its vocabulary slice)."""
    if chunk_size is not None:
        LOOP_COUNTS["token-major"] += 1
        return _chunk_loop(*args, chunk_size, **kwargs)
    hidden, weight, accum_dtype = args[0], args[1], args[13]
    need_hidden, need_weight = args[10], args[11]
    n_tokens, vocab = hidden.shape[0], weight.shape[0]
    elements = _gradient_elements(hidden, weight, need_hidden, need_weight)
    all_logits = n_tokens * vocab * hidden.element_size()
    fp32_loop, fp32_chunk = False, None  # fp32_chunk None: the headroom chunk (choose_chunk_tokens)
    if hidden.dtype == torch.float32 or not (need_hidden or need_weight):
        pass  # the two-pass loop: fp64 products for fp32 inputs; one pass for losses alone
    elif max_chunk_bytes is None:
        headroom = _headroom(hidden.device)  # one query: host time on every call
        if headroom >= all_logits + elements * hidden.element_size():
            # every logit at once, below the process's earlier peak: one chunk, nothing accumulated
            LOOP_COUNTS["token-major one chunk"] += 1
            return _chunk_loop(*args, n_tokens, **kwargs)
        # fp32 accumulators, the gradients they are rounded to at the end (both alive then), a chunk
        fp32_loop = headroom >= elements * (4 + hidden.element_size()) + HEADROOM_CHUNK_BYTES
    elif max_chunk_bytes >= all_logits:
        # the budget holds every logit: one chunk, each gradient one GEMM rounded once (as eager), no
        # accumulation and no recomputed logits: the fastest exact order
        LOOP_COUNTS["token-major one chunk"] += 1
        return _chunk_loop(*args, n_tokens, **kwargs)
    elif max_chunk_bytes - 4 * elements >= HEADROOM_CHUNK_BYTES:
        # a budget that holds fp32 accumulators and a large chunk: the token order, exact, faster than the
        # two-pass loop's recomputed logits
        fp32_loop = True
        fp32_chunk = choose_chunk_tokens(
            n_tokens, hidden.shape[1], vocab, hidden.dtype, hidden.device,
            max_chunk_bytes=max_chunk_bytes - 4 * elements,
        )  # fmt: skip
    if fp32_loop:
        LOOP_COUNTS["token-major fp32"] += 1
        loss_rows, z_rows, stats, gh, gw, gb = _chunk_loop(*args[:13], torch.float32, fp32_chunk, **kwargs)
        gh = gh.to(hidden_accum_dtype(hidden, weight, accum_dtype)) if gh is not None else None
        gw = gw.to(_accum_dtype(accum_dtype, weight)) if gw is not None else None
        return loss_rows, z_rows, stats, gh, gw, gb
    LOOP_COUNTS["two-pass"] += 1
    return _two_pass_loop(*args, max_chunk_bytes, **kwargs)


LOOP_COUNTS: collections.Counter = collections.Counter()  # calls per loop (benchmarks report which ran)


def _gradient_elements(hidden, weight, need_hidden: bool, need_weight: bool) -> int:
    n_tokens, hidden_size = hidden.shape
    return need_weight * weight.shape[0] * hidden_size + need_hidden * n_tokens * hidden_size


def _allocator_bytes(device: torch.device) -> dict:
    """The caching allocator's statistics as nested dicts. Not ``torch.cuda.memory_allocated`` and friends:
    each of those flattens every statistic through a self-referencing closure, a reference cycle of thousands
    of tuples per call that only the garbage collector frees; a training step's worth of them made Python run
    a full collection every few dozen steps (a 285 ms pause, Llama-1B shape on the H100, session 12)."""
    return torch.cuda.memory_stats_as_nested_dict(device)


def _headroom(device: torch.device) -> int:
    """Bytes the process may allocate without a new peak (CUDA; 0 elsewhere, or without USE_HEADROOM)."""
    if device.type != "cuda" or not USE_HEADROOM:
        return 0
    allocated = _allocator_bytes(device)["allocated_bytes"]["all"]
    return allocated["peak"] - allocated["current"]


def _flce_fwd_impl(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ce_weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    need_hidden: bool,
    need_weight: bool,
    need_bias: bool,
    accum_dtype: torch.dtype | None,
    chunk_size: int | None,
    check_targets: bool = True,
    max_chunk_bytes: int | None = None,
    denominator: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, z_loss, grad_hidden and grad_weight [accumulation dtype], grad_bias [fp32]); gradients not
    requested are empty. ``denominator`` (0-dim fp64, with reduction "sum"): the sum divided by it, computed
    as a "mean" whose denominator it is, so the gradients carry the division before their one rounding."""
    if denominator is not None:
        reduction = "mean"
    with torch.autocast(hidden.device.type, enabled=False):
        loss_rows, z_rows, stats, gh, gw, gb = _run_loop(
            chunk_size,
            max_chunk_bytes,
            hidden,
            weight,
            target,
            bias,
            ce_weight,
            ignore_index,
            reduction,
            label_smoothing,
            lse_square_scale,
            softcap,
            need_hidden,
            need_weight,
            need_bias,
            accum_dtype,
            check_targets=check_targets,
            denominator=denominator,
        )
        loss, z = reduce_losses(loss_rows, z_rows, stats, reduction)
    return (
        loss,
        z,
        gh if gh is not None else _empty(hidden),
        gw if gw is not None else _empty(weight),
        gb if gb is not None else _empty(hidden).float(),
    )


# Custom ops for torch.compile; eager mode calls the *_impl functions (see cross_entropy.py)
_flce_fwd = torch.library.custom_op(
    "liger_core::fused_linear_cross_entropy_fwd", _flce_fwd_impl, mutates_args=()
)


@_flce_fwd.register_fake
def _(
    hidden,
    weight,
    target,
    bias,
    ce_weight,
    ignore_index,
    reduction,
    label_smoothing,
    lse_square_scale,
    softcap,
    need_hidden,
    need_weight,
    need_bias,
    accum_dtype,
    chunk_size,
    check_targets=True,
    max_chunk_bytes=None,
    denominator=None,
):
    shape = (hidden.shape[0],) if reduction == "none" else ()
    f32 = dict(dtype=torch.float32)
    accum = _accum_dtype(accum_dtype, weight)
    return (
        hidden.new_empty(shape, **f32),
        hidden.new_empty(shape, **f32),
        hidden.new_empty(hidden.shape, dtype=hidden_accum_dtype(hidden, weight, accum_dtype))
        if need_hidden
        else _empty(hidden),
        weight.new_empty(weight.shape, dtype=accum) if need_weight else _empty(weight),
        hidden.new_empty(weight.shape[0], **f32) if need_bias else _empty(hidden).float(),
    )


def _flce_bwd_rows_impl(
    grad_rows: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ce_weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    need_hidden: bool,
    need_weight: bool,
    need_bias: bool,
    accum_dtype: torch.dtype | None,
    chunk_size: int | None,
    max_chunk_bytes: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """reduction="none" backward: the loop again with one grad_output per token inside the kernel;
    gradients in the dtypes of hidden, weight and bias (empty where not requested)."""
    with torch.autocast(hidden.device.type, enabled=False):
        *_, gh, gw, gb = _run_loop(
            chunk_size,
            max_chunk_bytes,
            hidden,
            weight,
            target,
            bias,
            ce_weight,
            ignore_index,
            "none",
            label_smoothing,
            lse_square_scale,
            softcap,
            need_hidden,
            need_weight,
            need_bias,
            accum_dtype,
            row_scale=grad_rows.contiguous(),
        )
    return _grads_in_dtypes((gh, gw, gb), hidden, weight, bias)


_flce_bwd_rows = torch.library.custom_op(
    "liger_core::fused_linear_cross_entropy_bwd_rows", _flce_bwd_rows_impl, mutates_args=()
)


@_flce_bwd_rows.register_fake
def _(
    grad_rows,
    hidden,
    weight,
    target,
    bias,
    ce_weight,
    ignore_index,
    label_smoothing,
    lse_square_scale,
    softcap,
    need_hidden,
    need_weight,
    need_bias,
    accum_dtype,
    chunk_size,
    max_chunk_bytes=None,
):
    return _fake_grads(hidden, weight, bias, need_hidden, need_weight, need_bias)


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        target,
        bias,
        ce_weight,
        ignore_index,
        reduction,
        label_smoothing,
        lse_square_scale,
        softcap,
        accum_dtype,
        chunk_size,
        check_targets,
        max_chunk_bytes,
        denominator=None,
    ):
        need_hidden, need_weight, _, need_bias = ctx.needs_input_grad[:4]
        need_bias = need_bias and bias is not None
        ctx.needs = (need_hidden, need_weight, need_bias)
        ctx.options = (ignore_index, label_smoothing, lse_square_scale, softcap)
        ctx.accum = (accum_dtype, chunk_size, max_chunk_bytes)
        ctx.reduction = reduction
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.grad_consumed = False
        args = (
            hidden,
            weight,
            target,
            bias,
            ce_weight,
            ignore_index,
            reduction,
            label_smoothing,
            lse_square_scale,
            softcap,
        )
        if reduction == "none":
            loss, z, *_ = launcher(_flce_fwd, _flce_fwd_impl)(
                *args, False, False, False, accum_dtype, chunk_size, check_targets, max_chunk_bytes
            )
            ctx.save_for_backward(hidden, weight, target, bias, ce_weight)
        else:
            loss, z, gh, gw, gb = launcher(_flce_fwd, _flce_fwd_impl)(
                *args,
                need_hidden,
                need_weight,
                need_bias,
                accum_dtype,
                chunk_size,
                check_targets,
                max_chunk_bytes,
                denominator,
            )
            ctx.save_for_backward(gh, gw, gb)
        ctx.mark_non_differentiable(z)
        return loss, z

    @staticmethod
    def backward(ctx, grad_loss, _grad_z):
        need_hidden, need_weight, need_bias = ctx.needs
        if ctx.reduction == "none":
            hidden, weight, target, bias, ce_weight = ctx.saved_tensors
            gh, gw, gb = launcher(_flce_bwd_rows, _flce_bwd_rows_impl)(
                grad_loss,
                hidden,
                weight,
                target,
                bias,
                ce_weight,
                *ctx.options,
                need_hidden,
                need_weight,
                need_bias,
                *ctx.accum,
            )
        else:
            if ctx.grad_consumed:
                raise RuntimeError(
                    "fused_linear_cross_entropy: the gradients stored in forward were scaled in place "
                    "by the first backward; backward through it twice (retain_graph=True) is not supported"
                )
            ctx.grad_consumed = True
            gh, gw, gb = ctx.saved_tensors
            hidden_dtype, weight_dtype, bias_dtype = ctx.dtypes
            for grad, needed in ((gh, need_hidden), (gw, need_weight), (gb, need_bias)):
                if needed:
                    launcher(_scale_rows, _scale_rows_impl)(grad, grad_loss)  # in place; free when it is 1
            # one rounding to the parameter dtype after the scaling (a no-op without accum_dtype)
            gh = gh.to(hidden_dtype) if need_hidden else gh
            gw = gw.to(weight_dtype) if need_weight else gw
            gb = gb.to(bias_dtype) if need_bias else gb
        return (
            gh if need_hidden else None,
            gw if need_weight else None,
            None,
            gb if need_bias else None,
            *(None,) * 11,  # ce_weight, the options, denominator
        )


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    return_z_loss: bool = False,
    ce_weight: torch.Tensor | None = None,
    accum_dtype: torch.dtype | None = None,
    *,
    options: CrossEntropyOptions | None = None,
    chunk_size: int | None = None,
    max_chunk_bytes: int | None = None,
    check_targets: bool = True,
    denominator: torch.Tensor | float | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``cross_entropy(hidden @ weight.T + bias, target, ...)`` without materialising the (tokens, V) logits.

    hidden ``(..., H)``, weight ``(V, H)`` (lm_head layout), bias ``(V,)``, target ``(...)``, all of any
    strides; ``ce_weight`` are the cross-entropy class weights. Every loss option is that of
    ``liger_core.ops.cross_entropy`` (same semantics, same departures from torch: a mean over nothing is
    torch's NaN, ignored tokens' logits get a zero gradient whatever they hold, non-finite logits give
    torch's results). ``denominator`` (a number >= 0 or a 0-dim tensor, with ``reduction="sum"``): the
    loss is the sum divided by it, as Hugging Face's causal-LM loss divides by ``num_items_in_batch``; the op
    divides before the gradients stored in forward are rounded, where dividing the returned loss would round
    them a second time in backward (0 gives a loss of 0 and zero gradients, where the division gives NaN).

    Returns an fp32 loss (as Hugging Face's loss on upcast logits), or ``(loss, z_loss)``. The default
    computes every gradient at eager's accuracy (two-pass loop, see the module doc). ``accum_dtype``:
    dtype of the stored gradients (default: weight's dtype; ``torch.float32`` keeps them exact through a
    ``grad_output`` other than 1, at 2 more bytes per element of weight and hidden). ``max_chunk_bytes``: a
    bound on the working memory beside the gradients (default: half the hidden-state gradient's size, >= 32
    MiB on a GPU): the vocabulary slice of the two-pass loop; a budget that holds every logit selects one
    token-major chunk (each gradient one GEMM), and one that holds fp32 copies of the gradients (4 bytes per
    element of weight and hidden) plus >= 512 MiB of logits the token-major loop with fp32 accumulators:
    exact like the default, and faster (numbers in the module doc). ``chunk_size``:
    tokens per chunk in the token-major loop instead (a bf16 dW then rounds once per chunk, as
    Liger-Kernel's; faster at small vocabularies). ``check_targets``: as in
    ``cross_entropy``. Tied weights work (autograd adds this gradient to the embedding's). Under autocast,
    hidden/weight/bias are cast to the autocast dtype first, as ``F.linear`` would be.

    ``options``: the seven loss options as one ``CrossEntropyOptions`` (its ``weight`` is ``ce_weight``),
    instead of the keywords (which then keep their defaults).
    """
    options = resolve_options(
        options, ce_weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss
    )
    ce_weight, ignore_index, reduction = options.weight, options.ignore_index, options.reduction
    if any_dtensor(hidden, weight, bias, target):
        inputs = {"hidden": hidden, "target": target}
        gathered = gather_weights("fused_linear_cross_entropy", inputs, {"weight": weight, "bias": bias})
        weight, bias = gathered["weight"], gathered["bias"]
    check_not_zero3_partitioned(weight=weight, bias=bias)
    _, vocab = check_linear_inputs(hidden, weight, target, bias)
    if ce_weight is not None:
        check_tensor("ce_weight", ce_weight, dtypes=FLOAT_DTYPES + (torch.float64,))
        check_shape("ce_weight", ce_weight, (vocab,), "one class weight per vocabulary entry")
    check_same_device("hidden", hidden, weight=weight, target=target, bias=bias, ce_weight=ce_weight)
    check_chunk_options(accum_dtype, chunk_size, max_chunk_bytes)
    denominator = denominator_tensor(denominator, reduction, hidden.device)
    hidden, weight, bias = autocast_linear_inputs(hidden, weight, bias)

    if not use_triton(hidden):
        check_targets_host(target.reshape(-1), ignore_index, vocab)  # same ValueError as the kernel path
        return reference.fused_linear_cross_entropy(
            hidden, weight, target, bias, options=options, accum_dtype=accum_dtype, denominator=denominator
        )

    out_shape = target.shape
    # max_chunk_bytes stays a byte budget: it bounds the two-pass loop's vocabulary slice
    hidden2d, target1d, chunk_size = flatten_for_chunks(hidden, weight, target, chunk_size, None)
    ce_weight = ce_weight.contiguous() if ce_weight is not None else None
    if wants_grad(hidden, weight, bias):
        loss, z = FusedLinearCrossEntropyFunction.apply(
            hidden2d,
            weight,
            target1d,
            bias,
            ce_weight,
            *options.row_options(),
            accum_dtype,
            chunk_size,
            bool(check_targets),
            max_chunk_bytes,
            denominator,
        )
    else:  # evaluation: losses only, no gradient GEMMs
        loss, z, *_ = launcher(_flce_fwd, _flce_fwd_impl)(
            hidden2d,
            weight,
            target1d,
            bias,
            ce_weight,
            *options.row_options(),
            False,
            False,
            False,
            accum_dtype,
            chunk_size,
            bool(check_targets),
            max_chunk_bytes,
            denominator,
        )
    if reduction == "none":
        loss, z = loss.view(out_shape), z.view(out_shape)
    return (loss, z) if options.return_z_loss else loss

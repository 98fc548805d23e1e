"""Chunked lm_head GEMMs shared by the fused-linear losses (``fused_linear_cross_entropy``,
``fused_linear_logprobs``, ``fused_linear_logprob_loss``): how many tokens a chunk of logits holds, the
gradient buffers and their accumulation dtypes, the GEMMs into and out of a chunk of logits, the input checks,
the allocator probe for memory headroom, and the token-major chunk loop (logits of a chunk of tokens, the
cross-entropy kernel in place, the gradients accumulated from the chunk's dlogits).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from liger_core import tuning
from liger_core.dispatch import FLOAT_DTYPES, INDEX_DTYPES, check_shape, check_tensor
from liger_core.ops._ce_kernel import launch_cross_entropy
from liger_core.ops._ce_math import finish_target_check, start_target_check, target_stats, with_denominator
from liger_core.sharding import check_not_zero3_partitioned, gather_weights

# A chunk of logits may be as large as the hidden-state gradient, and at least this large on a GPU (small
# models: fewer, larger GEMMs; each chunk re-reads and re-writes all of dW).
MIN_CHUNK_BYTES_CUDA = 64 * 2**20


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
            budget = max(
                budget, MIN_CHUNK_BYTES_CUDA, min(headroom - reserved_bytes, tuning.HEADROOM_CHUNK_BYTES)
            )
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
    2.338e-3, which rounds the logits before scaling them)."""
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


def _gradient_elements(hidden, weight, need_hidden: bool, need_weight: bool) -> int:
    n_tokens, hidden_size = hidden.shape
    return need_weight * weight.shape[0] * hidden_size + need_hidden * n_tokens * hidden_size


def _allocator_bytes(device: torch.device) -> dict:
    """The caching allocator's statistics as nested dicts. Not ``torch.cuda.memory_allocated`` and friends:
    each of those flattens every statistic through a self-referencing closure, a reference cycle of thousands
    of tuples per call that only the garbage collector frees; a training step's worth of them made Python run
    a full collection every few dozen steps (a 285 ms pause, Llama-1B shape on the H100)."""
    return torch.cuda.memory_stats_as_nested_dict(device)


def _headroom(device: torch.device) -> int:
    """Bytes the process may allocate without a new peak (CUDA; 0 elsewhere, or without USE_HEADROOM)."""
    if device.type != "cuda" or not tuning.USE_HEADROOM:
        return 0
    allocated = _allocator_bytes(device)["allocated_bytes"]["all"]
    return allocated["peak"] - allocated["current"]


class LinearLossArgs(NamedTuple):
    """One fused linear cross-entropy problem as every loop takes it (``_chunk_loop``, ``_two_pass_loop``,
    ``fused_linear_cross_entropy._run_loop``): the inputs, the loss options and which gradients to compute.
    The torch.library custom ops take these flat (their schema needs tensors and scalars) and build it."""

    hidden: torch.Tensor  # (tokens, H)
    weight: torch.Tensor  # (V, H)
    target: torch.Tensor  # (tokens,)
    bias: torch.Tensor | None  # (V,)
    ce_weight: torch.Tensor | None  # (V,) class weights
    ignore_index: int
    reduction: str
    label_smoothing: float
    lse_square_scale: float  # z-loss factor
    softcap: float | None
    need_hidden: bool
    need_weight: bool
    need_bias: bool
    accum_dtype: torch.dtype | None  # of grad_weight (and grad_hidden with fp32); None: the weight's


def _chunk_loop(
    args: LinearLossArgs,
    chunk_size,
    row_scale=None,
    check_targets=False,
    logit_scale=1.0,
    on_logits=None,
    denominator=None,
    argmax_rows=None,
    token_scaling=False,
):
    """Unscaled per-row cross-entropy and z-loss (fp64), the target stats (``cross_entropy.target_stats``),
    and the requested gradients (grad_hidden and grad_weight in the accumulation dtype, grad_bias in fp32).

    Hooks for ``fused_linear_logprobs``: ``logit_scale`` multiplies each chunk's logits inside the GEMM
    (``logit_scale * (h @ W.T + b)``, one rounding; the kernel's gradient is then with respect to the scaled
    logits, so the caller folds the factor into ``row_scale``), and ``on_logits(start, end, logits)``
    sees each chunk's logits before the CE kernel overwrites them. ``argmax_rows`` ((tokens,) int64): filled
    with each token's argmax by the CE kernel's first pass; ``token_scaling``: see
    ``launch_cross_entropy``."""
    (
        hidden, weight, target, bias, ce_weight, ignore_index, reduction, label_smoothing, lse_square_scale,
        softcap, need_hidden, need_weight, need_bias, accum_dtype,
    ) = args  # fmt: skip
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
            argmax=argmax_rows[start:end] if argmax_rows is not None else None,
            token_scaling=token_scaling,
        )
        # `logits` now holds dloss/dlogits for the chunk
        _accumulate_grads(logits, hidden_c, weight, start, end, *grads)
    if pending is not None:  # after the launches: the GPU works while the host waits for the stats
        finish_target_check(pending, ignore_index, vocab)
    grad_hidden, grad_weight, grad_bias = grads
    if grad_bias is not None:
        grad_bias = grad_bias.float()
    return loss_rows, z_rows, stats, grad_hidden, grad_weight, grad_bias


# Distillation (``fused_linear_jsd``, ``fused_linear_cosine_similarity``): a student and a teacher head, each
# chunk holding both models' logits.

# Budget for the two per-chunk logits buffers (student + teacher): 512 MiB is 1024 rows of a 128256-entry
# bf16 vocabulary, enough rows for the chunk matmuls to run near peak, and small next to the fp32 dW.
CHUNK_LOGITS_BYTES = 512 * 2**20
MIN_CHUNK_ROWS = 16


def default_chunk_rows(n_rows: int, vocab: int, bytes_per_logit_pair: int) -> int:
    """Rows per chunk: a power of two whose two logits buffers fit CHUNK_LOGITS_BYTES (at most n_rows)."""
    fit = max(1, CHUNK_LOGITS_BYTES // max(1, vocab * bytes_per_logit_pair))
    rows = max(MIN_CHUNK_ROWS, 2 ** int(math.log2(fit)))
    return max(1, min(n_rows, rows))


def distill_chunk_rows(
    chunk_size: object, n_rows: int, vocab: int, student_hidden: torch.Tensor, teacher_hidden: torch.Tensor
) -> int:
    """The checked ``chunk_size`` option, or (None) ``default_chunk_rows`` for both models' logits."""
    if chunk_size is None:
        return default_chunk_rows(
            n_rows, vocab, student_hidden.element_size() + teacher_hidden.element_size()
        )
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive int")
    return chunk_size


def gather_distill_heads(
    op: str,
    inputs: dict[str, torch.Tensor | None],
    student_weight: torch.Tensor,
    teacher_weight: torch.Tensor,
    student_bias: torch.Tensor | None,
    teacher_bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Both heads' weights and biases gathered whole from DTensors (``sharding.gather_weights``)."""
    weights = {
        "student_weight": student_weight,
        "teacher_weight": teacher_weight,
        "student_bias": student_bias,
        "teacher_bias": teacher_bias,
    }
    gathered = gather_weights(op, inputs, weights)
    return (
        gathered["student_weight"],
        gathered["teacher_weight"],
        gathered["student_bias"],
        gathered["teacher_bias"],
    )


def check_distill_tensors(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
) -> tuple[int, int]:
    """Hidden states (at least 1-D) and 2-D weights of both models, not ZeRO-3 partitioned; returns the
    student's and the teacher's hidden sizes."""
    check_not_zero3_partitioned(student_weight=student_weight, teacher_weight=teacher_weight)
    check_tensor("student_hidden", student_hidden, min_ndim=1)
    check_tensor("student_weight", student_weight, ndim=2)
    check_tensor("teacher_hidden", teacher_hidden, min_ndim=1)
    check_tensor("teacher_weight", teacher_weight, ndim=2)
    return student_hidden.shape[-1], teacher_hidden.shape[-1]


def check_head_dtypes(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
) -> None:
    """Each model's weight in its hidden states' dtype."""
    for name, t, ref_name, ref in (
        ("student_weight", student_weight, "student_hidden", student_hidden),
        ("teacher_weight", teacher_weight, "teacher_hidden", teacher_hidden),
    ):
        if t.dtype != ref.dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but {ref_name} has dtype {ref.dtype}; they must match"
            )


def check_head_biases(
    student_bias: torch.Tensor | None,
    student_weight: torch.Tensor,
    teacher_bias: torch.Tensor | None,
    teacher_weight: torch.Tensor,
) -> None:
    """Each given bias 1-D, one entry per vocabulary row of its weight, in its weight's dtype."""
    for name, bias, weight in (
        ("student_bias", student_bias, student_weight),
        ("teacher_bias", teacher_bias, teacher_weight),
    ):
        if bias is None:
            continue
        check_tensor(name, bias, ndim=1)
        check_shape(name, bias, (weight.shape[0],), "one entry per vocabulary row of its weight")
        if bias.dtype != weight.dtype:
            raise TypeError(f"{name} has dtype {bias.dtype}; expected its weight's {weight.dtype}")

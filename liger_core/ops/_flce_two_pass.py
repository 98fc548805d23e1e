"""The two-pass loop of ``fused_linear_cross_entropy`` (its default order; see that module's docstring):
pass 1 over chunks of tokens (losses, per-row gradient coefficients, grad_hidden), pass 2 over slices of
the vocabulary (the logits again, their gradients from the coefficients, grad_weight and grad_bias), and
the kernels on vocabulary-major logits of the kept chunk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import tuning
from liger_core.ops._ce_kernel import launch_cross_entropy, looped_row_settings, resident_kernel_runs
from liger_core.ops._ce_math import (
    RUNNING_MAX_START,
    _f64,
    _grad_block,
    _grad_coefs,
    _grad_values,
    _online_block,
    _row_loss,
    _softcap,
    finish_target_check,
    smoothing_shift,
    split_f64,
    start_target_check,
    target_stats,
    with_denominator,
)
from liger_core.ops._chunked_linear import (
    LinearLossArgs,
    _accum_dtype,
    _chunk_logits,
    _headroom,
    _mm_accumulate,
    choose_chunk_tokens,
    hidden_accum_dtype,
    hidden_grad_into,
    linear_into,
)
from liger_core.ops._fastlaunch import fast_launch

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
# from a sweep (H100, `benchmarks/results/h100/flce_columns_tiles.log`, bf16 V 128256 x 4096 tokens, 0.98
# GiB): stats 128 x 64, 4 warps 0.505 ms (64 x 64: 0.72; floor 0.35), gradient 64 x 128 (256 contiguous bytes
# per class row), 4 warps 0.732 ms (64 x 64: 1.26; floor 0.70).
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
    # and vectorises the loads (a clamp made them 2-byte loads: 10x slower on the H100)
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
    element by element (4.1 ms vs a 0.7 ms floor for pass 2's kept slices on the H100)."""
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
            budget = max(budget, MIN_SLICE_BYTES_CUDA, min(headroom, tuning.HEADROOM_CHUNK_BYTES))
    return chunk, vocab_slice_columns(n_tokens, vocab, elt, budget, device)


def _two_pass_loop(
    args: LinearLossArgs,
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
    (
        hidden, weight, target, bias, ce_weight, ignore_index, reduction, label_smoothing, lse_square_scale,
        softcap, need_hidden, need_weight, need_bias, accum_dtype,
    ) = args  # fmt: skip
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
        # path, which rounds twice (7 % of the logits one ulp off on the H100); the token-major GEMM adds
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

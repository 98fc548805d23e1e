"""LayerNorm over the last dimension: ``y = (x - mean) * rstd * w + b``, as ``F.layer_norm``.

Math (per row of n columns; fp32 inside the kernels, row statistics in fp64 for fp32 data)::

    mean = s + sum(x - s) / n          s = x[0]: shifting by one element of the row makes the mean exact for a
                                       constant row (variance 0) and keeps it accurate when |mean| >> std
    rstd = 1 / sqrt(sum((x - mean)**2) / n + eps)       (mean and rstd: the only per-row values saved)
    xhat = (x - mean) * rstd
    y    = xhat * w + b                one rounding to the input dtype
    g    = dy * w
    dx   = rstd * (g - xhat * sum(g * xhat) / n - sum(g) / n)
    dw   = sum over rows of dy * xhat,     db = sum over rows of dy

The reference implementation is ``liger_core.reference.layer_norm`` (``F.layer_norm``).

HBM traffic: forward reads x (+ w, b) and writes y, mean, rstd; backward reads dy, x, mean, rstd (+ w) and
writes dx and one partial row of dw and db per program of a persistent grid (summed afterwards; no atomics;
fp64 partials for fp32 data, fp32 otherwise).
Rows longer than ``NORM_FUSED_MAX_COLS`` loop over column chunks (``SINGLE_PASS=False``), as in RMSNorm.
16-bit rows of the widths in ``NORM_BWD_ROWWISE_LAYER_NORM`` (8192) take ``_layer_norm_bwd_row_kernel``: the
same math one row at a time in 1-D tiles (H100, kernel alone, 65536 x 8192: 1.270 vs 1.393 ms;
``benchmarks/results/h100/layer_norm_rowwise.log``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference, tuning
from liger_core.dispatch import check_same_device, check_shape, check_tensor, launcher, use_triton
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import cdiv, norm_bwd_programs, norm_settings
from liger_core.ops._norm_math import (
    accumulate,
    add_to_partial_rows,
    as_shape,
    check_group_size,
    chunk_mask,
    first_tiles,
    inv_sqrt_mean,
    load_row_chunk,
    load_rows,
    next_tiles,
    partials_buffer,
    per_group,
    reload_tiles,
    row_block,
    rows_view,
    store_lane_sums,
    store_rows,
    store_tile,
    sum_partials,
    widen,
    zero_partial_rows,
)
from liger_core.sharding import any_dtensor, check_not_zero3_partitioned, on_local_shards


@fast_launch
@triton.jit
def _layer_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    eps,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    PRECISE: tl.constexpr,
):
    rows, row_mask, cols, x_rows, y_rows = row_block(
        x_ptr, y_ptr, n_rows, x_row_stride, y_row_stride, BLOCK_M, BLOCK_N
    )
    # statistics in widen()-ed precision (fp64 for fp32 data): mean_w, and x - mean_w before any rounding
    shift = widen(tl.load(x_ptr + rows * x_row_stride, mask=row_mask, other=0.0).to(tl.float32), PRECISE)

    if SINGLE_PASS:
        mask = chunk_mask(row_mask, cols, n_cols)
        x_wide = widen(load_rows(x_rows, cols, mask), PRECISE)
        mean_w = shift + tl.sum(tl.where(mask, x_wide - shift[:, None], 0.0), axis=1) / n_cols
        xc_wide = tl.where(mask, x_wide - mean_w[:, None], 0.0)
        sum_sq = tl.sum(xc_wide * xc_wide, axis=1)
        xc = xc_wide.to(tl.float32)
    else:
        shifted_sum = widen(tl.zeros([BLOCK_M], dtype=tl.float32), PRECISE)
        for start in range(0, n_cols, BLOCK_N):
            chunk = start + cols
            mask = chunk_mask(row_mask, chunk, n_cols)
            x_wide = widen(load_rows(x_rows, chunk, mask), PRECISE)
            shifted_sum += tl.sum(tl.where(mask, x_wide - shift[:, None], 0.0), axis=1)
        mean_w = shift + shifted_sum / n_cols
        sum_sq = widen(tl.zeros([BLOCK_M], dtype=tl.float32), PRECISE)
        for start in range(0, n_cols, BLOCK_N):
            chunk = start + cols
            mask = chunk_mask(row_mask, chunk, n_cols)
            x_wide = widen(load_rows(x_rows, chunk, mask), PRECISE)
            xc_wide = tl.where(mask, x_wide - mean_w[:, None], 0.0)
            sum_sq += tl.sum(xc_wide * xc_wide, axis=1)
    rstd = inv_sqrt_mean(sum_sq, n_cols, eps)
    tl.store(mean_ptr + rows, mean_w.to(tl.float32), mask=row_mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)

    if SINGLE_PASS:
        col_mask = cols < n_cols
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = xc * rstd[:, None] * w[None, :]
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        store_rows(y_rows, cols, y, mask)
    else:
        for start in range(0, n_cols, BLOCK_N):
            chunk = start + cols
            col_mask = chunk < n_cols
            mask = row_mask[:, None] & col_mask[None, :]
            x_wide = widen(load_rows(x_rows, chunk, mask), PRECISE)
            xc = (x_wide - mean_w[:, None]).to(tl.float32)
            w = tl.load(w_ptr + chunk, mask=col_mask, other=0.0).to(tl.float32)
            y = xc * rstd[:, None] * w[None, :]
            if HAS_BIAS:
                y += tl.load(b_ptr + chunk, mask=col_mask, other=0.0).to(tl.float32)[None, :]
            store_rows(y_rows, chunk, y, mask)


@fast_launch
@triton.jit
def _layer_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    partials_ptr,
    n_rows,
    n_cols,
    dy_row_stride,
    x_row_stride,
    dx_row_stride,
    tiles_per_program,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    PREFETCH: tl.constexpr,
    PRECISE: tl.constexpr,
    RELOAD: tl.constexpr,  # wide rows: w, dy, x re-loaded after the reductions (see rms_norm)
    TILE_SUM: tl.constexpr,  # dW/dB: each tile's column sums into one row of accumulators (fewer registers)
):
    pid = tl.program_id(0).to(tl.int64)
    first_row = pid * tiles_per_program * BLOCK_M
    cols = tl.arange(0, BLOCK_N)
    # partials: (2 if HAS_BIAS else 1, programs, n_cols): dW's partial rows, then dB's
    dw_partial_row = partials_ptr + pid * n_cols
    db_partial_row = partials_ptr + (tl.num_programs(0) + pid) * n_cols

    if SINGLE_PASS:
        col_mask = cols < n_cols
        if not RELOAD:
            w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        # per-row-lane accumulators over this program's tiles, summed once at the end (see rms_norm)
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        dw_comp = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        db_comp = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        dw_row = tl.zeros([BLOCK_N], dtype=tl.float32)
        db_row = tl.zeros([BLOCK_N], dtype=tl.float32)
        rows, rows_end, dy_next, x_next = first_tiles(
            dy_ptr, x_ptr, first_row, cols, n_rows, col_mask, dy_row_stride, x_row_stride, tiles_per_program,
            BLOCK_M, PREFETCH,
        )  # fmt: skip
        for _ in range(0, tiles_per_program):
            dy, x, row_mask, mask, dy_next, x_next = next_tiles(
                dy_ptr, x_ptr, rows, cols, n_rows, rows_end, col_mask, dy_row_stride, x_row_stride,
                dy_next, x_next, BLOCK_M, PREFETCH,
            )  # fmt: skip
            mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
            rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
            if RELOAD:
                w = tl.load(w_ptr + cols, mask=col_mask, other=0.0, eviction_policy="evict_last")
                w = w.to(tl.float32)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
            g = dy * w[None, :]
            mean_gxhat = tl.sum(g * xhat, axis=1) / n_cols
            mean_g = tl.sum(g, axis=1) / n_cols
            if TILE_SUM:
                dw_row += tl.sum(dy * xhat, axis=0)
                if HAS_BIAS:
                    db_row += tl.sum(dy, axis=0)
            else:
                dw_acc, dw_comp = accumulate(dw_acc, dw_comp, dy * xhat, PRECISE)
                if HAS_BIAS:
                    db_acc, db_comp = accumulate(db_acc, db_comp, dy, PRECISE)
            if RELOAD:  # same values, read again (L1/L2) rather than held across the reductions
                dy, x = reload_tiles(dy_ptr, x_ptr, rows, cols, dy_row_stride, x_row_stride, mask)
                w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
                xhat = tl.where(mask, (x.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)
                g = dy.to(tl.float32) * w[None, :]
            dx = rstd[:, None] * (g - xhat * mean_gxhat[:, None] - mean_g[:, None])
            store_tile(dx_ptr, rows, cols, dx_row_stride, dx, mask)
            rows += BLOCK_M
        if TILE_SUM:
            tl.store(dw_partial_row + cols, dw_row, mask=col_mask)
            if HAS_BIAS:
                tl.store(db_partial_row + cols, db_row, mask=col_mask)
        else:
            store_lane_sums(dw_partial_row, cols, dw_acc, dw_comp, col_mask, PRECISE)
            if HAS_BIAS:
                store_lane_sums(db_partial_row, cols, db_acc, db_comp, col_mask, PRECISE)
    else:
        # BLOCK_M == 1: one row at a time, two passes over its column chunks (``_norm_math``)
        zero_partial_rows(dw_partial_row, db_partial_row, n_cols, BLOCK_N, HAS_BIAS)
        for tile in range(0, tiles_per_program):
            row = first_row + tile
            if row < n_rows:
                mean = tl.load(mean_ptr + row)
                rstd = tl.load(rstd_ptr + row)
                sum_gxhat = tl.zeros([BLOCK_N], dtype=tl.float32)
                sum_g = tl.zeros([BLOCK_N], dtype=tl.float32)
                for start in range(0, n_cols, BLOCK_N):
                    chunk, mask, dy, x, w = load_row_chunk(
                        dy_ptr, x_ptr, w_ptr, row, start, cols, n_cols, dy_row_stride, x_row_stride
                    )
                    g = dy * w
                    sum_gxhat += g * tl.where(mask, (x - mean) * rstd, 0.0)
                    sum_g += g
                mean_gxhat = tl.sum(sum_gxhat, axis=0) / n_cols
                mean_g = tl.sum(sum_g, axis=0) / n_cols
                for start in range(0, n_cols, BLOCK_N):
                    chunk, mask, dy, x, w = load_row_chunk(
                        dy_ptr, x_ptr, w_ptr, row, start, cols, n_cols, dy_row_stride, x_row_stride
                    )
                    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
                    dx = rstd * (dy * w - xhat * mean_gxhat - mean_g)
                    tl.store(dx_ptr + row * dx_row_stride + chunk, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                    add_to_partial_rows(
                        dw_partial_row, db_partial_row, chunk, dy, xhat, mask, PRECISE, HAS_BIAS
                    )


# Kernel launchers: torch.library custom ops for torch.compile, plain calls in eager mode
# (``dispatch.launcher``, as in rms_norm).
def _layer_norm_fwd_impl(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, mean, rstd
    s = norm_settings(n_cols)
    _layer_norm_fwd_kernel[(cdiv(n_rows, s.block_m),)](
        x, w, w if b is None else b, y, mean, rstd, n_rows, n_cols, x.stride(0), y.stride(0), eps,
        HAS_BIAS=b is not None, BLOCK_M=s.block_m, BLOCK_N=s.block_n, SINGLE_PASS=s.single_pass,
        PRECISE=x.dtype == torch.float32, num_warps=s.num_warps,
    )  # fmt: skip
    return y, mean, rstd


@fast_launch
@triton.jit
def _layer_norm_bwd_row_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    partials_ptr,
    n_rows,
    n_cols,
    dy_row_stride,
    x_row_stride,
    dx_row_stride,
    rows_per_program,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """``_layer_norm_bwd_kernel``'s single-pass math for one row per step in 1-D tiles (16-bit data; a
    contiguous block of rows per program, dW and dB accumulated across them in fp32 and written as one
    partial row each). At 8192 columns this form runs 9 % faster than the 2-D tile kernel with one row per
    tile (H100, ``benchmarks/results/h100/layer_norm_rowwise.log``, 2026-11-24)."""
    pid = tl.program_id(0).to(tl.int64)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    for row in range(first, last):
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        g = dy * w
        mean_gxhat = tl.sum(g * xhat, axis=0) / n_cols
        mean_g = tl.sum(g, axis=0) / n_cols
        dx = rstd * (g - xhat * mean_gxhat - mean_g)
        tl.store(dx_ptr + row * dx_row_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        if HAS_BIAS:
            db += dy
    tl.store(partials_ptr + pid * n_cols + cols, dw, mask=mask)
    if HAS_BIAS:
        tl.store(partials_ptr + (tl.num_programs(0) + pid) * n_cols + cols, db, mask=mask)


def _layer_norm_bwd_impl(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, has_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db); db is an empty tensor when there is no bias."""
    n_rows, n_cols = x.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return dx, torch.zeros_like(w), torch.zeros_like(w) if has_bias else w.new_empty(0)
    s = norm_settings(n_cols, backward=True, layer_norm=True)
    precise = x.dtype == torch.float32
    rowwise = not precise and s.single_pass and s.block_n in tuning.NORM_BWD_ROWWISE_LAYER_NORM
    if rowwise:
        s = s._replace(block_m=1, programs_per_sm=1)
    # 16-bit rows of NORM_BWD_TILE_SUM_LAYER_NORM's widths: per-tile column sums, many small programs
    tile_sum = (
        not precise and not rowwise and s.single_pass and s.block_n in tuning.NORM_BWD_TILE_SUM_LAYER_NORM
    )
    if tile_sum:
        s = s._replace(
            block_m=max(1, tuning.NORM_BWD_TILE_SUM_TILE_ELEMENTS // s.block_n),
            programs_per_sm=tuning.NORM_BWD_TILE_SUM_PROGRAMS_PER_SM,
            prefetch=tuning.NORM_BWD_TILE_SUM_PREFETCH,
            num_warps=tuning.NORM_BWD_TILE_SUM_WARPS,
        )
    programs, tiles_per_program = norm_bwd_programs(x.device, cdiv(n_rows, s.block_m), s)
    partials = partials_buffer(x, (2, programs, n_cols) if has_bias else (programs, n_cols))
    if rowwise:
        _layer_norm_bwd_row_kernel[(programs,)](
            dy, x, w, mean, rstd, dx, partials, n_rows, n_cols,
            dy.stride(0), x.stride(0), dx.stride(0), tiles_per_program,
            HAS_BIAS=has_bias, BLOCK_N=s.block_n, num_warps=tuning.NORM_BWD_ROWWISE_WARPS,
        )  # fmt: skip
    else:
        _layer_norm_bwd_kernel[(programs,)](
            dy, x, w, mean, rstd, dx, partials, n_rows, n_cols,
            dy.stride(0), x.stride(0), dx.stride(0), tiles_per_program,
            HAS_BIAS=has_bias, BLOCK_M=s.block_m, BLOCK_N=s.block_n, SINGLE_PASS=s.single_pass,
            PREFETCH=s.prefetch, PRECISE=precise, RELOAD=s.reload, num_warps=s.num_warps,
            TILE_SUM=tile_sum,
        )  # fmt: skip
    sums = sum_partials(partials, w.dtype)  # dW (and dB) in one launch
    if has_bias:
        dw, db = sums.unbind()
        return dx, dw, db
    return dx, sums, w.new_empty(0)


def _layer_norm_bwd_op_impl(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, has_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The custom op's implementation (torch.compile): its outputs may not alias each other, so dB is copied
    out of the stacked sums (eager calls ``_layer_norm_bwd_impl`` and keeps the views)."""
    dx, dw, db = _layer_norm_bwd_impl(dy, x, w, mean, rstd, has_bias)
    return dx, dw, db.clone() if has_bias else db


_layer_norm_fwd = torch.library.custom_op("liger_core::layer_norm_fwd", _layer_norm_fwd_impl, mutates_args=())
_layer_norm_bwd = torch.library.custom_op(
    "liger_core::layer_norm_bwd", _layer_norm_bwd_op_impl, mutates_args=()
)


@_layer_norm_fwd.register_fake
def _(x, w, b, eps):
    n_rows = x.shape[0]
    return (
        x.new_empty(x.shape),
        x.new_empty(n_rows, dtype=torch.float32),
        x.new_empty(n_rows, dtype=torch.float32),
    )


@_layer_norm_bwd.register_fake
def _(dy, x, w, mean, rstd, has_bias):
    db = torch.empty_like(w) if has_bias else w.new_empty(0)
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(w), db


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps: float):
        x2d = rows_view(x)
        y, mean, rstd = launcher(_layer_norm_fwd, _layer_norm_fwd_impl)(x2d, w, b, eps)
        ctx.save_for_backward(x2d, w, mean, rstd)
        ctx.has_bias = b is not None
        ctx.x_shape = x.shape
        return as_shape(y, x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2d, w, mean, rstd = ctx.saved_tensors
        bwd = launcher(_layer_norm_bwd, _layer_norm_bwd_impl)
        dx, dw, db = bwd(rows_view(dy), x2d, w, mean, rstd, ctx.has_bias)
        return as_shape(dx, ctx.x_shape), dw, db if ctx.has_bias else None, None


def layer_norm(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None = None,
    eps: float = 1e-5,
    group_size: int | None = None,
) -> torch.Tensor:
    """``F.layer_norm(x, (x.shape[-1],), w, b, eps)``: statistics in fp32, one rounding to ``x.dtype``.

    ``w`` (and ``b``) have ``x``'s dtype, or fp32 with a bf16/fp16 ``x`` (mixed precision, as PyTorch allows).
    ``group_size``: each row is normalised in groups of that many consecutive features (own mean and rstd
    per group), ``w``/``b`` indexed by the feature's position in the full row: ``y[..., s:s+g] =
    layer_norm(x[..., s:s+g], w[s:s+g], b[s:s+g])`` (a per-head LayerNorm on the heads' concatenation).
    """
    if any_dtensor(x, w, b):  # tensor/sequence parallel, or an FSDP2 weight outside its unit's forward
        return on_local_shards(layer_norm, x, {"w": w, "b": b}, eps=eps, group_size=group_size)
    check_not_zero3_partitioned(w=w, b=b)
    check_tensor("x", x, min_ndim=1)
    check_tensor("w", w, ndim=1)
    check_shape("w", w, (x.shape[-1],), "w must match the last dimension of x")
    if w.dtype != x.dtype and not (w.dtype == torch.float32 and x.dtype in (torch.bfloat16, torch.float16)):
        raise TypeError(f"w has dtype {w.dtype} but x has dtype {x.dtype}; w must match x or be float32")
    if b is not None:
        check_tensor("b", b, ndim=1)
        check_shape("b", b, (x.shape[-1],), "b must match the last dimension of x")
        if b.dtype != w.dtype:
            raise TypeError(f"b has dtype {b.dtype} but w has dtype {w.dtype}; they must match")
    check_same_device("x", x, w=w, b=b)
    if x.shape[-1] == 0:
        raise ValueError("x has an empty last dimension; LayerNorm needs at least one element per row")
    if check_group_size(group_size, x.shape[-1]) is not None:
        return per_group(layer_norm, x, (w, b), group_size, eps=eps)
    if not use_triton(x):
        return reference.layer_norm(x, w, b, eps)
    # the kernels read w and b with unit stride; strided parameters are rare, so they are copied here,
    # outside the autograd Function: dw and db flow back through the copies to the strided tensors
    if not w.is_contiguous():
        w = w.contiguous()
    if b is not None and not b.is_contiguous():
        b = b.contiguous()
    # the Function works on rows; the caller's shape is a view taken outside it, so a model may modify the
    # output in place (XLM does; a view made inside a custom Function may not be)
    return as_shape(LayerNormFunction.apply(rows_view(x), w, b, float(eps)), x.shape)

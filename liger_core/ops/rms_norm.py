"""RMSNorm over the last dimension: ``y = x * rstd * (offset + w)``, with HF's rounding (``casting_mode``).

Math (per row of n columns; fp32 inside the kernels, row statistics in fp64 for fp32 data)::

    rstd = 1 / sqrt(sum(x**2) / n + eps)            (the only per-row value saved for backward)
    xn   = x * rstd
    y    = xn * (offset + w)                       "gemma", "none": one rounding to the output dtype
    y    = round_to(x.dtype, xn) * (offset + w)    "llama": HF rounds xn to the input dtype before the weight
    g    = dy * (offset + w)
    dx   = rstd * (g - xn * sum(g * xn) / n)
    dw   = sum over rows of dy * xn

The reference implementation (HF's code, bit for bit) is ``liger_core.reference.rms_norm``.

HBM traffic: forward reads x (+ w) and writes y and rstd; backward reads dy, x, rstd (+ w) and writes dx and
one partial row of dw per program: the backward grid is persistent (a few programs per SM, each looping over
a contiguous block of rows with the next tile's loads in flight, accumulating dw in fp32 registers), and the
partial rows are summed afterwards. No atomics. ``in_place=True`` writes dx over dy (one buffer
fewer; never when dy is reused later, as Gemma2's residual stream does).

Rows longer than ``NORM_FUSED_MAX_COLS`` do not fit in registers: the same kernels then loop over column
chunks (``SINGLE_PASS=False``), re-reading the row once per pass and accumulating dw in the program's partial
row in global memory.

The partial rows are fp64 for fp32 data and fp32 otherwise (bf16/fp16 dw: fp32 sums are ~2^16 finer than
the final rounding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import (
    check_choice,
    check_same_device,
    check_shape,
    check_tensor,
    launcher,
    use_triton,
)
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
from liger_core.reference.rms_norm import CASTING_MODES
from liger_core.sharding import any_dtensor, check_not_zero3_partitioned, on_local_shards


@triton.jit
def _rms_norm_scale(x, rstd, w, offset, x_dtype: tl.constexpr, ROUND_BEFORE_WEIGHT: tl.constexpr):
    """y = xn * (offset + w), fp32 in and out; the llama mode rounds xn to the input dtype first."""
    xn = x * rstd[:, None]
    if ROUND_BEFORE_WEIGHT:
        xn = xn.to(x_dtype).to(tl.float32)
    return xn * (offset + w[None, :])


@fast_launch
@triton.jit
def _rms_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    rstd_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    eps,
    offset,
    ROUND_BEFORE_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    PRECISE: tl.constexpr,
):
    rows, row_mask, cols, x_rows, y_rows = row_block(
        x_ptr, y_ptr, n_rows, x_row_stride, y_row_stride, BLOCK_M, BLOCK_N
    )
    x_dtype = x_ptr.dtype.element_ty

    if SINGLE_PASS:
        mask = chunk_mask(row_mask, cols, n_cols)
        x = load_rows(x_rows, cols, mask)
        x_wide = widen(x, PRECISE)
        sum_sq = tl.sum(x_wide * x_wide, axis=1)
    else:
        sum_sq = widen(tl.zeros([BLOCK_M], dtype=tl.float32), PRECISE)
        for start in range(0, n_cols, BLOCK_N):
            chunk = start + cols
            mask = chunk_mask(row_mask, chunk, n_cols)
            x_wide = widen(load_rows(x_rows, chunk, mask), PRECISE)
            sum_sq += tl.sum(x_wide * x_wide, axis=1)
    rstd = inv_sqrt_mean(sum_sq, n_cols, eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)

    if SINGLE_PASS:
        w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = _rms_norm_scale(x, rstd, w, offset, x_dtype, ROUND_BEFORE_WEIGHT)
        store_rows(y_rows, cols, y, mask)
    else:
        for start in range(0, n_cols, BLOCK_N):
            chunk = start + cols
            mask = chunk_mask(row_mask, chunk, n_cols)
            x = load_rows(x_rows, chunk, mask)
            w = tl.load(w_ptr + chunk, mask=chunk < n_cols, other=0.0).to(tl.float32)
            y = _rms_norm_scale(x, rstd, w, offset, x_dtype, ROUND_BEFORE_WEIGHT)
            store_rows(y_rows, chunk, y, mask)


@fast_launch
@triton.jit
def _rms_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,
    n_rows,
    n_cols,
    dy_row_stride,
    x_row_stride,
    dx_row_stride,
    offset,
    tiles_per_program,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    PREFETCH: tl.constexpr,
    PRECISE: tl.constexpr,
    RELOAD: tl.constexpr,  # wide rows: w, dy, x re-loaded after the reduction (``NORM_BWD_WIDE_RMS_NORM``)
):
    pid = tl.program_id(0).to(tl.int64)
    first_row = pid * tiles_per_program * BLOCK_M
    cols = tl.arange(0, BLOCK_N)
    dw_partial_row = dw_partial_ptr + pid * n_cols

    if SINGLE_PASS:
        col_mask = cols < n_cols
        if not RELOAD:
            w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        # dw accumulates per row lane over this program's tiles (no cross-warp reduction per tile); the
        # BLOCK_M lanes are summed once at the end (in fp64 when PRECISE)
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        dw_comp = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        rows, rows_end, dy_next, x_next = first_tiles(
            dy_ptr, x_ptr, first_row, cols, n_rows, col_mask, dy_row_stride, x_row_stride, tiles_per_program,
            BLOCK_M, PREFETCH,
        )  # fmt: skip
        for _ in range(0, tiles_per_program):
            dy, x, row_mask, mask, dy_next, x_next = next_tiles(
                dy_ptr, x_ptr, rows, cols, n_rows, rows_end, col_mask, dy_row_stride, x_row_stride,
                dy_next, x_next, BLOCK_M, PREFETCH,
            )  # fmt: skip
            rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
            if RELOAD:
                w = tl.load(w_ptr + cols, mask=col_mask, other=0.0, eviction_policy="evict_last")
                w = w.to(tl.float32) + offset
            xn = x * rstd[:, None]
            g = dy * w[None, :]
            mean_gxn = tl.sum(g * xn, axis=1) / n_cols
            dw_acc, dw_comp = accumulate(dw_acc, dw_comp, dy * xn, PRECISE)
            if RELOAD:  # same values, read again (L1/L2) rather than held across the reduction
                dy, x = reload_tiles(dy_ptr, x_ptr, rows, cols, dy_row_stride, x_row_stride, mask)
                w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
                xn = x.to(tl.float32) * rstd[:, None]
                g = dy.to(tl.float32) * w[None, :]
            dx = rstd[:, None] * (g - xn * mean_gxn[:, None])
            store_tile(dx_ptr, rows, cols, dx_row_stride, dx, mask)
            rows += BLOCK_M
        store_lane_sums(dw_partial_row, cols, dw_acc, dw_comp, col_mask, PRECISE)
    else:
        # BLOCK_M == 1: one row at a time, two passes over its column chunks (``_norm_math``)
        zero_partial_rows(dw_partial_row, dw_partial_row, n_cols, BLOCK_N, False)
        for tile in range(0, tiles_per_program):
            row = first_row + tile
            if row < n_rows:
                rstd = tl.load(rstd_ptr + row)
                dot = tl.zeros([BLOCK_N], dtype=tl.float32)
                for start in range(0, n_cols, BLOCK_N):
                    chunk, mask, dy, x, w = load_row_chunk(
                        dy_ptr, x_ptr, w_ptr, row, start, cols, n_cols, dy_row_stride, x_row_stride
                    )
                    w += offset
                    dot += dy * w * (x * rstd)
                mean_gxn = tl.sum(dot, axis=0) / n_cols
                for start in range(0, n_cols, BLOCK_N):
                    chunk, mask, dy, x, w = load_row_chunk(
                        dy_ptr, x_ptr, w_ptr, row, start, cols, n_cols, dy_row_stride, x_row_stride
                    )
                    w += offset
                    xn = x * rstd
                    dx = rstd * (dy * w - xn * mean_gxn)
                    tl.store(dx_ptr + row * dx_row_stride + chunk, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                    add_to_partial_rows(dw_partial_row, dw_partial_row, chunk, dy, xn, mask, PRECISE, False)


def _output_dtype(x_dtype: torch.dtype, w_dtype: torch.dtype, casting_mode: str) -> torch.dtype:
    """What HF returns: gemma casts back to the input dtype; llama/none multiply by w with type promotion."""
    return x_dtype if casting_mode == "gemma" else torch.promote_types(x_dtype, w_dtype)


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces a patched
# model through them without graph breaks; the autograd Function below composes them, and in eager mode calls
# the plain implementations (``dispatch.launcher``: the dispatcher's host time per call is as long as the
# kernel at typical shapes, and the GPU then waits for the host).
def _rms_norm_fwd_impl(
    x: torch.Tensor, w: torch.Tensor, eps: float, offset: float, casting_mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=_output_dtype(x.dtype, w.dtype, casting_mode), device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, rstd
    s = norm_settings(n_cols)
    _rms_norm_fwd_kernel[(cdiv(n_rows, s.block_m),)](
        x, w, y, rstd, n_rows, n_cols, x.stride(0), y.stride(0), eps, offset,
        ROUND_BEFORE_WEIGHT=casting_mode == "llama", BLOCK_M=s.block_m, BLOCK_N=s.block_n,
        SINGLE_PASS=s.single_pass, PRECISE=x.dtype == torch.float32, num_warps=s.num_warps,
    )  # fmt: skip
    return y, rstd


def _launch_bwd(dy, x, w, rstd, dx, offset) -> torch.Tensor:
    """Run the backward kernel writing dx into ``dx`` (which may be ``dy`` itself); return dw."""
    n_rows, n_cols = x.shape
    if n_rows == 0:
        return torch.zeros_like(w)
    s = norm_settings(n_cols, backward=True)
    programs, tiles_per_program = norm_bwd_programs(x.device, cdiv(n_rows, s.block_m), s)
    precise = x.dtype == torch.float32
    dw_partial = partials_buffer(x, (programs, n_cols))
    _rms_norm_bwd_kernel[(programs,)](
        dy, x, w, rstd, dx, dw_partial, n_rows, n_cols, dy.stride(0), x.stride(0), dx.stride(0), offset,
        tiles_per_program, BLOCK_M=s.block_m, BLOCK_N=s.block_n, SINGLE_PASS=s.single_pass,
        PREFETCH=s.prefetch, PRECISE=precise, RELOAD=s.reload, num_warps=s.num_warps,
    )  # fmt: skip
    return sum_partials(dw_partial, w.dtype)


def _rms_norm_bwd_impl(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor, offset: float
) -> tuple[torch.Tensor, torch.Tensor]:
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw = _launch_bwd(dy, x, w, rstd, dx, offset)
    return dx, dw


def _rms_norm_bwd_inplace_impl(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor, offset: float
) -> torch.Tensor:
    """Backward that overwrites dy with dx (dy: contiguous, dtype of x); returns dw."""
    return _launch_bwd(dy, x, w, rstd, dy, offset)


_rms_norm_fwd = torch.library.custom_op("liger_core::rms_norm_fwd", _rms_norm_fwd_impl, mutates_args=())
_rms_norm_bwd = torch.library.custom_op("liger_core::rms_norm_bwd", _rms_norm_bwd_impl, mutates_args=())
_rms_norm_bwd_inplace = torch.library.custom_op(
    "liger_core::rms_norm_bwd_inplace", _rms_norm_bwd_inplace_impl, mutates_args=("dy",)
)


@_rms_norm_fwd.register_fake
def _(x, w, eps, offset, casting_mode):
    y = x.new_empty(x.shape, dtype=_output_dtype(x.dtype, w.dtype, casting_mode))
    return y, x.new_empty(x.shape[0], dtype=torch.float32)


@_rms_norm_bwd.register_fake
def _(dy, x, w, rstd, offset):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(w)


@_rms_norm_bwd_inplace.register_fake
def _(dy, x, w, rstd, offset):
    return torch.empty_like(w)


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps: float, offset: float, casting_mode: str, in_place: bool):
        x2d = rows_view(x)
        y, rstd = launcher(_rms_norm_fwd, _rms_norm_fwd_impl)(x2d, w, eps, offset, casting_mode)
        ctx.save_for_backward(x2d, w, rstd)
        ctx.offset = offset
        ctx.in_place = in_place
        ctx.x_shape = x.shape
        return as_shape(y, x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2d, w, rstd = ctx.saved_tensors
        dy2d = rows_view(dy)
        if ctx.in_place and dy2d.dtype == x2d.dtype and dy2d.is_contiguous():
            dw = launcher(_rms_norm_bwd_inplace, _rms_norm_bwd_inplace_impl)(dy2d, x2d, w, rstd, ctx.offset)
            # a new view object, never ``dy`` itself: AccumulateGrad takes a gradient without copying it only
            # when nothing else holds that object (a leaf x's .grad would otherwise be a full copy of dx)
            return dy2d.view(*ctx.x_shape), dw, None, None, None, None
        dx, dw = launcher(_rms_norm_bwd, _rms_norm_bwd_impl)(dy2d, x2d, w, rstd, ctx.offset)
        return as_shape(dx, ctx.x_shape), dw, None, None, None, None


def rms_norm(
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float = 1e-6,
    offset: float = 0.0,
    casting_mode: str = "llama",
    in_place: bool = False,
    group_size: int | None = None,
) -> torch.Tensor:
    """RMSNorm of ``x`` over its last dimension, scaled by ``offset + w``, rounded as HF does (module doc).

    ``casting_mode``: "llama" (LlamaRMSNorm and most models), "gemma" (GemmaRMSNorm: use ``offset=1.0``) or
    "none". ``in_place=True`` lets backward overwrite the incoming gradient with dx (saves one buffer; keep
    it off where that gradient is used again, e.g. Gemma2). The output dtype is HF's: the input dtype for
    "gemma", ``promote_types(x.dtype, w.dtype)`` otherwise.

    ``group_size``: each row is normalised in groups of that many consecutive features (its own rstd per
    group), the weight indexed by the feature's position in the full row (``w`` has the full row's size):
    ``y[..., s:s+g] = rms_norm(x[..., s:s+g], w[s:s+g])`` (Qwen4-Exp's grouped RMSNorm).
    """
    if any_dtensor(x, w):  # tensor/sequence parallel, or an FSDP2 weight outside its unit's forward
        options = dict(eps=eps, offset=offset, casting_mode=casting_mode, in_place=in_place)
        return on_local_shards(rms_norm, x, {"w": w}, group_size=group_size, **options)
    check_not_zero3_partitioned(w=w)
    check_tensor("x", x, min_ndim=1)
    check_tensor("w", w, ndim=1)
    check_shape("w", w, (x.shape[-1],), "w must match the last dimension of x")
    check_same_device("x", x, w=w)
    check_choice("casting_mode", casting_mode, CASTING_MODES)
    if x.shape[-1] == 0:
        raise ValueError("x has an empty last dimension; RMSNorm needs at least one element per row")
    if check_group_size(group_size, x.shape[-1]) is not None:
        options = dict(eps=eps, offset=offset, casting_mode=casting_mode, in_place=in_place)
        return per_group(rms_norm, x, (w,), group_size, **options)
    if not use_triton(x):
        return reference.rms_norm(x, w, eps, offset, casting_mode, in_place)
    if not w.is_contiguous():
        # the kernels read w with unit stride; a strided weight is rare, so it is copied here, outside the
        # autograd Function: dw flows back through the copy to the strided tensor
        w = w.contiguous()
    # the Function works on rows; the caller's shape is a view taken outside it, so a model may modify the
    # output in place (a view made inside a custom Function may not be)
    y = RMSNormFunction.apply(rows_view(x), w, float(eps), float(offset), casting_mode, bool(in_place))
    return as_shape(y, x.shape)

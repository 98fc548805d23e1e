"""Modulated RMSNorm (AdaLN): ``y = rms_norm(x, w) * (1 + scale) + shift`` over the last dimension, with
``scale`` and ``shift`` given per block of consecutive rows (``liger_core.reference.modulated_rms_norm``
describes the shapes).

Math (per row of n columns, ``m`` its modulation row; fp32 inside the kernels, fp64 for fp32 data)::

    rstd = 1 / sqrt(sum(x**2) / n + eps)          (saved for backward)
    xn   = x * rstd                                 ("llama" with a weight: rounded to x's dtype)
    r    = xn * (offset + w)                        (r = xn without a weight)
    y    = r * (1 + scale[m]) + shift[m]           (one rounding, to y's dtype)
    g    = dy * (1 + scale[m]) * (offset + w)
    dx   = rstd * (g - xn * sum(g * xn) / n)
    dw   = sum over rows of dy * (1 + scale[m]) * xn
    dscale[m] = sum over m's rows of dy * r,   dshift[m] = sum over m's rows of dy

Grid: forward, one program per block of rows; backward, a persistent grid over rows writing dx, one partial
row of dw per program, and dscale / dshift per row (with one modulation row per token these are the
gradients themselves; shared modulation rows are then summed over their blocks of rows). No atomics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference, tuning
from liger_core.dispatch import (
    check_choice,
    check_same_device,
    check_shape,
    check_tensor,
    launcher,
    use_triton,
)
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import MAX_FUSED_SIZE, cdiv, next_power_of_2, num_sms
from liger_core.ops._norm_math import (
    as_shape,
    block_tile,
    inv_sqrt_mean,
    rows_view,
    store_wide_tile,
    sum_partials,
    widen,
)
from liger_core.reference.rms_norm import CASTING_MODES
from liger_core.sharding import is_dtensor


@triton.jit
def _normed(x, rstd, w_ptr, cols, col_mask, offset, x_dtype: tl.constexpr, HAS_WEIGHT: tl.constexpr,
            ROUND_NORMED: tl.constexpr, PRECISE: tl.constexpr):  # fmt: skip
    """(xn, r, W): the normalised tile, times the weight (r), and offset + w (1 without a weight)."""
    xn = x * rstd[:, None]
    if HAS_WEIGHT:
        if ROUND_NORMED:
            xn = widen(xn.to(tl.float32).to(x_dtype).to(tl.float32), PRECISE)
        w = widen(tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32), PRECISE) + offset
        r = xn * w[None, :]
    else:
        w = widen(tl.full([cols.shape[0]], 1.0, tl.float32), PRECISE)
        r = xn
    return xn, r, w


@fast_launch
@triton.jit
def _modulated_rms_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    shift_ptr,
    y_ptr,
    rstd_ptr,
    n_rows,
    n_cols,
    rows_per_mod,
    x_row_stride,
    y_row_stride,
    eps,
    offset,
    HAS_WEIGHT: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    ROUND_NORMED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISE: tl.constexpr,
):
    rows, row_mask, cols, col_mask, mask = block_tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    mods = rows // rows_per_mod
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0)
    x = widen(x.to(tl.float32), PRECISE)
    rstd = inv_sqrt_mean(tl.sum(x * x, axis=1), n_cols, eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    x_dtype = x_ptr.dtype.element_ty
    _, r, _ = _normed(x, rstd, w_ptr, cols, col_mask, offset, x_dtype, HAS_WEIGHT, ROUND_NORMED, PRECISE)
    scale = tl.load(scale_ptr + mods[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
    y = r * (1.0 + widen(scale.to(tl.float32), PRECISE))
    if HAS_SHIFT:
        shift = tl.load(shift_ptr + mods[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
        y += widen(shift.to(tl.float32), PRECISE)
    store_wide_tile(y_ptr, rows, cols, y_row_stride, y, mask)


@fast_launch
@triton.jit
def _modulated_rms_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    scale_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,
    dscale_ptr,  # per row: (n_rows, n_cols)
    dshift_ptr,
    n_rows,
    n_cols,
    rows_per_mod,
    dy_row_stride,
    x_row_stride,
    dx_row_stride,
    offset,
    tiles_per_program,
    HAS_WEIGHT: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    ROUND_NORMED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    dw_acc = widen(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), PRECISE)
    rows = pid * tiles_per_program * BLOCK_M + tl.arange(0, BLOCK_M)
    for _ in range(0, tiles_per_program):
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        mods = rows // rows_per_mod
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + cols[None, :], mask=mask, other=0.0)
        scale = tl.load(scale_ptr + mods[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
        rstd = widen(tl.load(rstd_ptr + rows, mask=row_mask, other=0.0), PRECISE)
        x = widen(x.to(tl.float32), PRECISE)
        dy = widen(dy.to(tl.float32), PRECISE)
        xn, r, w = _normed(x, rstd, w_ptr, cols, col_mask, offset, x_ptr.dtype.element_ty, HAS_WEIGHT,
                           ROUND_NORMED, PRECISE)  # fmt: skip
        xn = x * rstd[:, None]  # the derivative's normalised rows, unrounded
        dmod = dy * (1.0 + widen(scale.to(tl.float32), PRECISE))
        g = dmod * w[None, :]
        mean_gxn = tl.sum(g * xn, axis=1) / n_cols
        dx = rstd[:, None] * (g - xn * mean_gxn[:, None])
        if dx_ptr.dtype.element_ty != tl.float64:
            dx = dx.to(tl.float32)
        tl.store(
            dx_ptr + rows[:, None] * dx_row_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask
        )
        dscale = dy * r
        if dscale_ptr.dtype.element_ty != tl.float64:
            dscale = dscale.to(tl.float32)
        tl.store(
            dscale_ptr + rows[:, None] * n_cols + cols[None, :],
            dscale.to(dscale_ptr.dtype.element_ty),
            mask=mask,
        )
        if HAS_SHIFT:
            dshift = dy
            if dshift_ptr.dtype.element_ty != tl.float64:
                dshift = dshift.to(tl.float32)
            tl.store(
                dshift_ptr + rows[:, None] * n_cols + cols[None, :],
                dshift.to(dshift_ptr.dtype.element_ty),
                mask=mask,
            )
        if HAS_WEIGHT:
            dw_acc += tl.where(mask, dmod * xn, 0.0)
        rows += BLOCK_M
    if HAS_WEIGHT:
        tl.store(dw_partial_ptr + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_mask)


def _tile(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): whole rows, several rows per tile for short rows."""
    block_n = next_power_of_2(n_cols)
    block_m = max(1, tuning.NORM_TILE_ELEMENTS // block_n)
    warps = min(32, max(4, block_m * block_n // (32 * tuning.NORM_FWD_ELEMENTS_PER_THREAD)))
    return block_m, block_n, warps


def _output_dtype(x, w, scale, shift, casting_mode: str) -> torch.dtype:
    """The eager code's: the normalised rows' dtype (x's, promoted with w's except for "gemma"), promoted with
    scale's and shift's."""
    dtype = x.dtype if w is None or casting_mode == "gemma" else torch.promote_types(x.dtype, w.dtype)
    dtype = torch.promote_types(dtype, scale.dtype)
    return dtype if shift is None else torch.promote_types(dtype, shift.dtype)


def _dtype(t: torch.Tensor | None) -> torch.dtype | None:
    return None if t is None else t.dtype


def _precise(x, w, scale, shift, casting_mode: str) -> bool:
    """fp64 in the kernels: for fp32 data or an fp32 output (backward: also an fp32 weight or gradient)."""
    return _output_dtype(x, w, scale, shift, casting_mode) == torch.float32 or x.dtype == torch.float32


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces a patched
# model through them without graph breaks; eager mode calls the plain implementations (``dispatch.launcher``).
# x: 2-D rows with unit column stride; w, scale, shift contiguous, scale and shift as (R_m, n) rows.
def _modulated_rms_norm_fwd_impl(
    x: torch.Tensor,
    w: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor | None,
    eps: float,
    offset: float,
    casting_mode: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=_output_dtype(x, w, scale, shift, casting_mode), device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, rstd
    block_m, block_n, warps = _tile(n_cols)
    _modulated_rms_norm_fwd_kernel[(cdiv(n_rows, block_m),)](
        x, x if w is None else w, scale, scale if shift is None else shift, y, rstd, n_rows, n_cols,
        n_rows // scale.shape[0], x.stride(0), y.stride(0), eps, offset, HAS_WEIGHT=w is not None,
        HAS_SHIFT=shift is not None, ROUND_NORMED=casting_mode == "llama", BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISE=_precise(x, w, scale, shift, casting_mode), num_warps=warps,
    )  # fmt: skip
    return y, rstd


def _modulated_rms_norm_bwd_impl(
    dy: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor | None,
    scale: torch.Tensor,
    has_shift: bool,
    rstd: torch.Tensor,
    offset: float,
    casting_mode: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, dscale, dshift) with dscale and dshift as (n_rows, n) rows (summed per modulation row by
    the caller) and dw zero-sized without a weight."""
    n_rows, n_cols = x.shape
    precise = _precise(x, w, scale, None, casting_mode) or torch.float32 in (dy.dtype, _dtype(w))
    wide = torch.float64 if precise else torch.float32
    per_row = scale.shape[0] == n_rows
    mod_dtype = scale.dtype if per_row else wide  # shared rows are summed afterwards, in the wide dtype
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    dscale = torch.empty((n_rows, n_cols), dtype=mod_dtype, device=x.device)
    dshift = torch.empty((n_rows if has_shift else 0, n_cols), dtype=mod_dtype, device=x.device)
    if n_rows == 0:
        return dx, x.new_zeros(0 if w is None else n_cols, dtype=wide), dscale, dshift
    block_m, block_n, warps = _tile(n_cols)
    n_tiles = cdiv(n_rows, block_m)
    target = num_sms(x.device) * tuning.NORM_BWD_PROGRAMS_PER_SM
    tiles_per_program = cdiv(n_tiles, min(target, n_tiles))
    programs = cdiv(n_tiles, tiles_per_program)
    partials = torch.empty((programs if w is not None else 0, n_cols), dtype=wide, device=x.device)
    _modulated_rms_norm_bwd_kernel[(programs,)](
        dy, x, x if w is None else w, scale, rstd, dx, partials if w is not None else dx, dscale,
        dshift if has_shift else dscale, n_rows, n_cols, n_rows // scale.shape[0], dy.stride(0), x.stride(0),
        dx.stride(0), offset, tiles_per_program, HAS_WEIGHT=w is not None, HAS_SHIFT=has_shift,
        ROUND_NORMED=casting_mode == "llama", BLOCK_M=block_m, BLOCK_N=block_n, PRECISE=precise,
        num_warps=warps,
    )  # fmt: skip
    dw = x.new_zeros(0, dtype=wide) if w is None else sum_partials(partials, wide)
    return dx, dw, dscale, dshift


_modulated_rms_norm_fwd = torch.library.custom_op(
    "liger_core::modulated_rms_norm_fwd", _modulated_rms_norm_fwd_impl, mutates_args=()
)
_modulated_rms_norm_bwd = torch.library.custom_op(
    "liger_core::modulated_rms_norm_bwd", _modulated_rms_norm_bwd_impl, mutates_args=()
)


@_modulated_rms_norm_fwd.register_fake
def _(x, w, scale, shift, eps, offset, casting_mode):
    y = x.new_empty(x.shape, dtype=_output_dtype(x, w, scale, shift, casting_mode))
    return y, x.new_empty(x.shape[0], dtype=torch.float32)


@_modulated_rms_norm_bwd.register_fake
def _(dy, x, w, scale, has_shift, rstd, offset, casting_mode):
    precise = _precise(x, w, scale, None, casting_mode) or torch.float32 in (dy.dtype, _dtype(w))
    wide = torch.float64 if precise else torch.float32
    mod_dtype = scale.dtype if scale.shape[0] == x.shape[0] else wide
    n_rows, n_cols = x.shape
    return (
        x.new_empty(x.shape),
        x.new_empty(0 if w is None else n_cols, dtype=wide),
        x.new_empty((n_rows, n_cols), dtype=mod_dtype),
        x.new_empty((n_rows if has_shift else 0, n_cols), dtype=mod_dtype),
    )


class ModulatedRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, scale, shift, eps: float, offset: float, casting_mode: str):
        fwd = launcher(_modulated_rms_norm_fwd, _modulated_rms_norm_fwd_impl)
        y, rstd = fwd(x, w, scale, shift, eps, offset, casting_mode)
        ctx.save_for_backward(x, w, scale, rstd)
        ctx.options = (offset, casting_mode)
        ctx.shift_dtype = None if shift is None else shift.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, scale, rstd = ctx.saved_tensors
        bwd = launcher(_modulated_rms_norm_bwd, _modulated_rms_norm_bwd_impl)
        offset, casting_mode = ctx.options
        dx, dw, dscale, dshift = bwd(
            rows_view(dy), x, w, scale, ctx.shift_dtype is not None, rstd, *ctx.options
        )
        n_mod, n_cols = scale.shape
        if n_mod != x.shape[0]:  # shared modulation rows: the sum over each one's block of rows
            dscale = dscale.view(n_mod, -1, n_cols).sum(1).to(scale.dtype)
            dshift = dshift.view(n_mod, -1, n_cols).sum(1) if ctx.shift_dtype is not None else dshift
        dw = None if w is None else dw.to(w.dtype)
        dshift = None if ctx.shift_dtype is None else dshift.to(ctx.shift_dtype)
        return dx, dw, dscale, dshift, None, None, None


def modulated_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor | None = None,
    eps: float = 1e-6,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> torch.Tensor:
    """``rms_norm(x, weight) * (1 + scale) + shift`` over the last dimension (module doc).

    Args:
        x: ``(..., n)``; any strides (rows without unit column stride are copied).
        weight: ``(n,)`` used as ``offset + weight``, or None (no weight).
        scale: ``R_m * n`` elements, ``R_m`` dividing the rows of x: ``(n,)``/``(1, n)`` shared by all rows,
            ``(B, n)`` per sample of x ``(B, T, n)``, or x's shape (per token).
        shift: like ``scale``, or None.
        casting_mode: "llama", "gemma" or "none", as ``liger_core.ops.rms_norm``.

    Returns:
        ``y`` of x's shape; its dtype is the eager code's (the normalised rows' dtype promoted with scale's
        and shift's).
    """
    if any(is_dtensor(t) for t in (x, weight, scale, shift) if t is not None):
        raise TypeError("x, weight, scale and shift must be plain tensors (DTensors are not supported here)")
    check_tensor("x", x, min_ndim=1)
    check_tensor("scale", scale, min_ndim=1)
    n = x.shape[-1]
    if n == 0:
        raise ValueError("x has an empty last dimension; RMSNorm needs at least one element per row")
    n_rows = x.numel() // n
    if scale.shape[-1] != n or scale.numel() == 0 or n_rows % (scale.numel() // n):
        raise ValueError(
            f"scale has shape {tuple(scale.shape)}; expected rows of x's last dimension {n} whose count "
            f"divides x's {n_rows} rows"
        )
    if shift is not None:
        check_tensor("shift", shift, min_ndim=1)
        check_shape("shift", shift, tuple(scale.shape), "shift must have the shape of scale")
    if weight is not None:
        check_tensor("weight", weight, ndim=1)
        check_shape("weight", weight, (n,), "weight must match the last dimension of x")
    check_same_device("x", x, weight=weight, scale=scale, shift=shift)
    check_choice("casting_mode", casting_mode, CASTING_MODES)
    if not use_triton(x):
        return reference.modulated_rms_norm(x, weight, scale, shift, eps, offset, casting_mode)
    if next_power_of_2(n) > MAX_FUSED_SIZE:
        raise ValueError(f"x.shape[-1]={n} exceeds the {MAX_FUSED_SIZE} columns a program holds in registers")
    rows = scale.numel() // n
    params = (
        None if weight is None else weight.contiguous(),
        scale.reshape(rows, n).contiguous(),
        None if shift is None else shift.reshape(rows, n).contiguous(),
    )
    y = ModulatedRMSNormFunction.apply(rows_view(x), *params, float(eps), float(offset), casting_mode)
    return as_shape(y, x.shape)

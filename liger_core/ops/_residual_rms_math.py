"""Kernels shared by ``fused_add_rms_norm`` and ``rms_norm_no_weight``: RMSNorm over whole rows held in
registers, with an optional residual added first and an optional weight.

Math (per row of n columns; fp32 inside the kernels, row statistics in fp64 for fp32 data)::

    s    = round_to(x.dtype, x + r)          (HAS_RESIDUAL; else s = x) -- the new residual stream
    rstd = 1 / sqrt(sum(s**2) / n + eps)     (the only per-row value saved for backward)
    sn   = s * rstd
    y    = sn * W                             W = offset + w (HAS_WEIGHT; else W = 1)
           "llama": sn rounded to x's dtype before the weight; otherwise one rounding, of y
    g    = dy * W
    ds'  = rstd * (g - sn * sum(g * sn) / n) + ds     (ds: the gradient of the new residual, if any)
    dw   = sum over rows of dy * sn

Grid: forward, one program per block of rows; backward, a persistent grid (a few programs per SM, each
looping over a contiguous block of rows), accumulating dw in fp32 registers (Kahan for fp32 data) and writing
one partial row of it per program, summed afterwards (no atomics). A row is held in registers whole (up to
``MAX_FUSED_SIZE`` columns).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import tuning
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import MAX_FUSED_SIZE, cdiv, next_power_of_2, num_sms
from liger_core.ops._norm_math import accumulate, block_tile, inv_sqrt_mean, sum_partials, widen


@fast_launch
@triton.jit
def _fwd_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    s_ptr,
    rstd_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    r_row_stride,
    y_row_stride,
    s_row_stride,
    eps,
    offset,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    ROUND_NORMED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISE: tl.constexpr,
):
    rows, row_mask, cols, col_mask, mask = block_tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    x_dtype = x_ptr.dtype.element_ty
    s = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + rows[:, None] * r_row_stride + cols[None, :], mask=mask, other=0.0)
        # eager's x + r: the exact sum rounded once to the storage dtype (fp32 holds it for 16-bit data)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(x_dtype)
        tl.store(s_ptr + rows[:, None] * s_row_stride + cols[None, :], s, mask=mask)
    s = s.to(tl.float32)
    s_wide = widen(s, PRECISE)
    rstd = inv_sqrt_mean(tl.sum(s_wide * s_wide, axis=1), n_cols, eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    y = s * rstd[:, None]
    if HAS_WEIGHT:
        if ROUND_NORMED:
            y = y.to(x_dtype).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        y = y * w[None, :]
    tl.store(y_ptr + rows[:, None] * y_row_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _bwd_kernel(
    dy_ptr,
    ds_ptr,
    s_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,
    n_rows,
    n_cols,
    dy_row_stride,
    ds_row_stride,
    s_row_stride,
    dx_row_stride,
    offset,
    tiles_per_program,
    HAS_DS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
    # dw accumulates per row lane over this program's tiles; the BLOCK_M lanes are summed once at the end
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    dw_comp = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    rows = pid * tiles_per_program * BLOCK_M + tl.arange(0, BLOCK_M)
    for _ in range(0, tiles_per_program):
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + cols[None, :], mask=mask, other=0.0)
        s = tl.load(s_ptr + rows[:, None] * s_row_stride + cols[None, :], mask=mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        dy = dy.to(tl.float32)
        sn = s.to(tl.float32) * rstd[:, None]
        if HAS_WEIGHT:
            g = dy * w[None, :]
            dw_acc, dw_comp = accumulate(dw_acc, dw_comp, dy * sn, PRECISE)
        else:
            g = dy
        mean_gsn = tl.sum(g * sn, axis=1) / n_cols
        dx = rstd[:, None] * (g - sn * mean_gsn[:, None])
        if HAS_DS:
            ds = tl.load(ds_ptr + rows[:, None] * ds_row_stride + cols[None, :], mask=mask, other=0.0)
            dx += ds.to(tl.float32)  # the two gradients of s added in fp32, rounded once
        tl.store(
            dx_ptr + rows[:, None] * dx_row_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask
        )
        rows += BLOCK_M
    if HAS_WEIGHT:
        dw = tl.sum(widen(dw_acc, PRECISE) - widen(dw_comp, PRECISE), axis=0)
        tl.store(dw_partial_ptr + pid * n_cols + cols, dw, mask=col_mask)


def check_row_fits(n_cols: int) -> None:
    """ValueError naming ``x`` when its rows do not fit one program's registers."""
    if next_power_of_2(n_cols) > MAX_FUSED_SIZE:
        raise ValueError(
            f"x.shape[-1]={n_cols} exceeds the {MAX_FUSED_SIZE} columns a program holds in registers"
        )


def _tile(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): whole rows of BLOCK_N (padded) columns, several rows per tile for short
    rows (the rms_norm tile size and elements per thread)."""
    block_n = next_power_of_2(n_cols)
    block_m = max(1, tuning.NORM_TILE_ELEMENTS // block_n)
    warps = min(32, max(4, block_m * block_n // (32 * tuning.NORM_FWD_ELEMENTS_PER_THREAD)))
    return block_m, block_n, warps


def forward(
    x: torch.Tensor,
    r: torch.Tensor | None,
    w: torch.Tensor | None,
    y_dtype: torch.dtype,
    eps: float,
    offset: float,
    round_normed: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(y, s or None, rstd) of 2-D rows ``x`` (and ``r``) with unit column stride, ``w`` contiguous."""
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=y_dtype, device=x.device)
    s = None if r is None else torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, s, rstd
    block_m, block_n, warps = _tile(n_cols)
    _fwd_kernel[(cdiv(n_rows, block_m),)](
        x, x if r is None else r, x if w is None else w, y, y if s is None else s, rstd, n_rows, n_cols,
        x.stride(0), 0 if r is None else r.stride(0), y.stride(0), 0 if s is None else s.stride(0), eps,
        offset,
        HAS_RESIDUAL=r is not None, HAS_WEIGHT=w is not None, ROUND_NORMED=round_normed, BLOCK_M=block_m,
        BLOCK_N=block_n, PRECISE=x.dtype == torch.float32, num_warps=warps,
    )  # fmt: skip
    return y, s, rstd


def backward(
    dy: torch.Tensor,
    ds: torch.Tensor | None,
    s: torch.Tensor,
    w: torch.Tensor | None,
    rstd: torch.Tensor,
    offset: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ds', dw or None) of 2-D rows with unit column stride: ds' is the gradient reaching the normalised
    rows ``s`` (plus ``ds``), in s's dtype."""
    n_rows, n_cols = s.shape
    dx = torch.empty((n_rows, n_cols), dtype=s.dtype, device=s.device)
    if n_rows == 0:
        return dx, None if w is None else torch.zeros_like(w)
    block_m, block_n, warps = _tile(n_cols)
    n_tiles = cdiv(n_rows, block_m)
    target = num_sms(s.device) * tuning.NORM_BWD_PROGRAMS_PER_SM
    tiles_per_program = cdiv(n_tiles, min(target, n_tiles))
    programs = cdiv(n_tiles, tiles_per_program)
    # fp64 sums also for an fp32 weight with 16-bit data: dw is then an fp32 result of a long sum over rows
    precise = s.dtype == torch.float32 or (w is not None and w.dtype == torch.float32)
    partials = None
    if w is not None:
        # partial rows in fp64 only where the data is fp32 (bf16/fp16: fp32 partials, summed in fp32)
        partial_dtype = torch.float64 if precise else torch.float32
        partials = torch.empty((programs, n_cols), dtype=partial_dtype, device=s.device)
    _bwd_kernel[(programs,)](
        dy, dy if ds is None else ds, s, s if w is None else w, rstd, dx,
        dx if partials is None else partials,
        n_rows, n_cols, dy.stride(0), 0 if ds is None else ds.stride(0), s.stride(0), dx.stride(0), offset,
        tiles_per_program, HAS_DS=ds is not None, HAS_WEIGHT=w is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISE=precise, num_warps=warps,
    )  # fmt: skip
    return dx, None if w is None else sum_partials(partials, w.dtype)

"""PolyNorm (PolyCom; Motif models) over the last dimension::

    u_1, u_2, u_3 = x, x**2, x**3
    r_k  = 1 / sqrt(sum(u_k**2) / n + eps)        (per row and power: the values saved for backward)
    y    = w[0] * u_3 * r_3 + w[1] * u_2 * r_2 + w[2] * u_1 * r_1 + b

Backward, with ``v_k = u_k * r_k`` and ``c_k = sum(dy * v_k)`` per row (``w_k``: the weight of power k)::

    du_k = w_k * r_k * (dy - v_k * c_k / n)
    dx   = du_1 + 2 x du_2 + 3 x**2 du_3
    dw_k = sum over rows of c_k,   db = sum(dy)

Precision: fp32 in the kernels for 16-bit data; for fp32 data the powers, row sums and y are computed in fp64
(the powers' own roundings would otherwise make the error comparable to eager's). Grid: forward, one program
per block of rows; backward, a persistent grid (a few programs per SM looping over contiguous rows), each
writing one partial row (dw_1..3, db), summed afterwards. Rows are held in registers whole.

The reference implementation (PolyCom's module, in the input dtype) is ``liger_core.reference.poly_norm``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference, tuning
from liger_core.dispatch import check_same_device, check_tensor, launcher, use_triton
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import MAX_FUSED_SIZE, cdiv, next_power_of_2, num_sms
from liger_core.ops._norm_math import as_shape, rows_view, store_wide_tile, widen
from liger_core.sharding import is_dtensor


@triton.jit
def _normalised_powers(x, r_ptr, rows, row_mask, n_cols, eps, PRECISE: tl.constexpr, FORWARD: tl.constexpr):
    """(x, v_1, v_2, v_3, r_1, r_2, r_3) of a tile of rows, in the wide precision; the forward computes the
    r_k and stores them (fp32), the backward loads them."""
    xw = widen(x, PRECISE)
    u2 = xw * xw
    u3 = u2 * xw
    if FORWARD:
        r1 = 1.0 / tl.sqrt(tl.sum(u2, axis=1) / n_cols + eps)
        r2 = 1.0 / tl.sqrt(tl.sum(u2 * u2, axis=1) / n_cols + eps)
        r3 = 1.0 / tl.sqrt(tl.sum(u3 * u3, axis=1) / n_cols + eps)
        tl.store(r_ptr + rows * 3, r1.to(tl.float32), mask=row_mask)
        tl.store(r_ptr + rows * 3 + 1, r2.to(tl.float32), mask=row_mask)
        tl.store(r_ptr + rows * 3 + 2, r3.to(tl.float32), mask=row_mask)
    else:
        r1 = widen(tl.load(r_ptr + rows * 3, mask=row_mask, other=0.0), PRECISE)
        r2 = widen(tl.load(r_ptr + rows * 3 + 1, mask=row_mask, other=0.0), PRECISE)
        r3 = widen(tl.load(r_ptr + rows * 3 + 2, mask=row_mask, other=0.0), PRECISE)
    return xw, xw * r1[:, None], u2 * r2[:, None], u3 * r3[:, None], r1, r2, r3


@fast_launch
@triton.jit
def _poly_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    r_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISE: tl.constexpr,
):
    # int64 row indices: rows * stride passes 2^31 for long sequences x wide hidden sizes
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    mask = row_mask[:, None] & (cols < n_cols)[None, :]
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    _, v1, v2, v3, _, _, _ = _normalised_powers(x, r_ptr, rows, row_mask, n_cols, eps, PRECISE, True)
    w0 = widen(tl.load(w_ptr).to(tl.float32), PRECISE)
    w1 = widen(tl.load(w_ptr + 1).to(tl.float32), PRECISE)
    w2 = widen(tl.load(w_ptr + 2).to(tl.float32), PRECISE)
    b = widen(tl.load(b_ptr).to(tl.float32), PRECISE)
    y = w0 * v3 + w1 * v2 + w2 * v1 + b
    store_wide_tile(y_ptr, rows, cols, y_row_stride, y, mask)


@fast_launch
@triton.jit
def _poly_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    r_ptr,
    dx_ptr,
    partials_ptr,
    n_rows,
    n_cols,
    dy_row_stride,
    x_row_stride,
    dx_row_stride,
    tiles_per_program,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    w0 = widen(tl.load(w_ptr).to(tl.float32), PRECISE)
    w1 = widen(tl.load(w_ptr + 1).to(tl.float32), PRECISE)
    w2 = widen(tl.load(w_ptr + 2).to(tl.float32), PRECISE)
    # per row lane sums of c_1, c_2, c_3 and dy over this program's tiles (wide: fp64 for fp32 data)
    acc1 = widen(tl.zeros([BLOCK_M], dtype=tl.float32), PRECISE)
    acc2 = widen(tl.zeros([BLOCK_M], dtype=tl.float32), PRECISE)
    acc3 = widen(tl.zeros([BLOCK_M], dtype=tl.float32), PRECISE)
    acc_b = widen(tl.zeros([BLOCK_M], dtype=tl.float32), PRECISE)
    rows = pid * tiles_per_program * BLOCK_M + tl.arange(0, BLOCK_M)
    for _ in range(0, tiles_per_program):
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + cols[None, :], mask=mask, other=0.0)
        dy = widen(dy.to(tl.float32), PRECISE)
        xw, v1, v2, v3, r1, r2, r3 = _normalised_powers(x, r_ptr, rows, row_mask, n_cols, 0.0, PRECISE, False)
        c1 = tl.sum(dy * v1, axis=1)
        c2 = tl.sum(dy * v2, axis=1)
        c3 = tl.sum(dy * v3, axis=1)
        du1 = (w2 * r1)[:, None] * (dy - v1 * (c1 / n_cols)[:, None])
        du2 = (w1 * r2)[:, None] * (dy - v2 * (c2 / n_cols)[:, None])
        du3 = (w0 * r3)[:, None] * (dy - v3 * (c3 / n_cols)[:, None])
        dx = du1 + xw * (2.0 * du2 + 3.0 * xw * du3)
        if dx_ptr.dtype.element_ty != tl.float64:
            dx = dx.to(tl.float32)
        tl.store(
            dx_ptr + rows[:, None] * dx_row_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask
        )
        acc1 += c1
        acc2 += c2
        acc3 += c3
        acc_b += tl.sum(dy, axis=1)
        rows += BLOCK_M
    # partial row: (dw_0, dw_1, dw_2, db), weight k multiplying power 3 - k
    tl.store(partials_ptr + pid * 4, tl.sum(acc3, axis=0))
    tl.store(partials_ptr + pid * 4 + 1, tl.sum(acc2, axis=0))
    tl.store(partials_ptr + pid * 4 + 2, tl.sum(acc1, axis=0))
    tl.store(partials_ptr + pid * 4 + 3, tl.sum(acc_b, axis=0))


def _tile(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): whole rows, several rows per tile for short rows."""
    block_n = next_power_of_2(n_cols)
    block_m = max(1, tuning.NORM_TILE_ELEMENTS // block_n)
    warps = min(32, max(4, block_m * block_n // (32 * tuning.NORM_FWD_ELEMENTS_PER_THREAD)))
    return block_m, block_n, warps


def _output_dtype(x_dtype: torch.dtype, b: torch.Tensor) -> torch.dtype:
    """The eager module's: x's dtype, promoted with a bias that has a dimension (0-dim tensors do not
    promote a dimensioned one of the same category)."""
    return x_dtype if b.dim() == 0 else torch.promote_types(x_dtype, b.dtype)


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces a patched
# model through them without graph breaks; eager mode calls the plain implementations (``dispatch.launcher``).
# Inputs: 2-D rows with unit column stride, w and b contiguous.
def _poly_norm_fwd_impl(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=_output_dtype(x.dtype, b), device=x.device)
    r = torch.empty((n_rows, 3), dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, r
    block_m, block_n, warps = _tile(n_cols)
    _poly_norm_fwd_kernel[(cdiv(n_rows, block_m),)](
        x, w, b, y, r, n_rows, n_cols, x.stride(0), y.stride(0), eps,
        BLOCK_M=block_m, BLOCK_N=block_n, PRECISE=torch.float32 in (x.dtype, y.dtype), num_warps=warps,
    )  # fmt: skip
    return y, r


def _poly_norm_bwd_impl(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n_rows, n_cols = x.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return dx, torch.zeros_like(w), torch.zeros_like(b)
    block_m, block_n, warps = _tile(n_cols)
    n_tiles = cdiv(n_rows, block_m)
    target = num_sms(x.device) * tuning.NORM_BWD_PROGRAMS_PER_SM
    tiles_per_program = cdiv(n_tiles, min(target, n_tiles))
    programs = cdiv(n_tiles, tiles_per_program)
    # fp64 wherever a result is fp32: dx, or dw / db of fp32 parameters (long sums over all elements)
    precise = torch.float32 in (x.dtype, dy.dtype, w.dtype, b.dtype)
    partials = torch.empty((programs, 4), dtype=torch.float64 if precise else torch.float32, device=x.device)
    _poly_norm_bwd_kernel[(programs,)](
        dy, x, w, r, dx, partials, n_rows, n_cols, dy.stride(0), x.stride(0), dx.stride(0), tiles_per_program,
        BLOCK_M=block_m, BLOCK_N=block_n, PRECISE=precise, num_warps=warps,
    )  # fmt: skip
    sums = partials.sum(0)  # a few hundred values at most: one small reduction
    return dx, sums[:3].to(w.dtype), sums[3].to(b.dtype).reshape(b.shape)


_poly_norm_fwd = torch.library.custom_op("liger_core::poly_norm_fwd", _poly_norm_fwd_impl, mutates_args=())
_poly_norm_bwd = torch.library.custom_op("liger_core::poly_norm_bwd", _poly_norm_bwd_impl, mutates_args=())


@_poly_norm_fwd.register_fake
def _(x, w, b, eps):
    return x.new_empty(x.shape, dtype=_output_dtype(x.dtype, b)), x.new_empty(
        (x.shape[0], 3), dtype=torch.float32
    )


@_poly_norm_bwd.register_fake
def _(dy, x, w, b, r):
    return x.new_empty(x.shape), torch.empty_like(w), torch.empty_like(b)


class PolyNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps: float):
        y, r = launcher(_poly_norm_fwd, _poly_norm_fwd_impl)(x, w, b, eps)
        ctx.save_for_backward(x, w, b, r)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, b, r = ctx.saved_tensors
        dx, dw, db = launcher(_poly_norm_bwd, _poly_norm_bwd_impl)(rows_view(dy), x, w, b, r)
        return dx, dw, db, None


def poly_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """PolyNorm of ``x`` over its last dimension (module doc).

    Args:
        x: ``(..., n)``; any strides (rows without unit column stride are copied).
        weight: ``(3,)``: the weights of ``norm(x**3)``, ``norm(x**2)``, ``norm(x)``.
        bias: a 0-dim tensor (liger-kernel's module) or of shape ``(1,)`` (PolyCom's).

    Returns:
        ``y`` of x's shape and the eager module's dtype: x's, promoted with a bias of shape ``(1,)``.
    """
    if is_dtensor(x) or is_dtensor(weight) or is_dtensor(bias):
        raise TypeError("x, weight and bias must be plain tensors (DTensors are not supported here)")
    check_tensor("x", x, min_ndim=1)
    check_tensor("weight", weight, ndim=1)
    check_tensor("bias", bias)
    if tuple(weight.shape) != (3,):
        raise ValueError(f"weight has shape {tuple(weight.shape)}; expected (3,) (one weight per power)")
    if tuple(bias.shape) not in ((), (1,)):
        raise ValueError(f"bias has shape {tuple(bias.shape)}; expected () or (1,)")
    check_same_device("x", x, weight=weight, bias=bias)
    n = x.shape[-1]
    if n == 0:
        raise ValueError("x has an empty last dimension; PolyNorm needs at least one element per row")
    if not use_triton(x):
        return reference.poly_norm(x, weight, bias, eps)
    if next_power_of_2(n) > MAX_FUSED_SIZE:
        raise ValueError(f"x.shape[-1]={n} exceeds the {MAX_FUSED_SIZE} columns a program holds in registers")
    y = PolyNormFunction.apply(rows_view(x), weight.contiguous(), bias.contiguous(), float(eps))
    return as_shape(y, x.shape)

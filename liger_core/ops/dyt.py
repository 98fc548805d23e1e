"""Dynamic Tanh (DyT), the normalisation-free replacement of LayerNorm: ``y = gamma * tanh(alpha * x) + beta``
over the last dimension (``alpha`` a scalar parameter, ``gamma`` and ``beta`` per feature).

Math (``t = tanh(alpha * x)``, ``sech2 = 1 - t**2``)::

    dx     = dy * gamma * alpha * sech2
    dalpha = sum(dy * gamma * sech2 * x)
    dgamma = sum over rows of dy * t,      dbeta = sum over rows of dy

tanh is evaluated without cancellation: an odd Taylor polynomial for |z| < 1/16, else
``sign(z) (1 - e) / (1 + e)`` with ``e = exp(-2|z|)``, whose ``sech2 = 4e / (1 + e)**2``.

Precision: fp32 in the kernels for 16-bit data, fp64 where the output (or a gradient) is fp32 (tanh's and the
products' own roundings would otherwise make the error comparable to eager's). Grid: forward, tiles of rows x
columns; backward, per column block a persistent grid over rows, each program writing one partial row of
dgamma and dbeta and one partial dalpha, summed afterwards (no atomics), so any width runs.

The reference implementation (the DyT module's code) is ``liger_core.reference.dyt``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference, tuning
from liger_core.dispatch import check_same_device, check_shape, check_tensor, launcher, use_triton
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import cdiv, next_power_of_2, num_sms
from liger_core.ops._norm_math import as_shape, rows_view, store_wide_tile, sum_partials, widen
from liger_core.sharding import is_dtensor

# Columns per tile at most: the backward's per-column accumulators live in registers.
DYT_MAX_BLOCK_N = 1024


@triton.jit
def _tanh_sech2(z):
    """(tanh(z), 1 - tanh(z)**2) in z's precision, both to within a few ulps of it (no cancellation)."""
    a = tl.abs(z)
    zs = tl.where(a < 0.0625, z, 0.0)  # the series only where it is used (no overflow on large z)
    z2 = zs * zs
    # tanh(z) = z - z^3/3 + 2z^5/15 - 17z^7/315 + 62z^9/2835 - ...: below 1/16 the next term is < 1e-14 z
    small = zs * (1.0 + z2 * (-1.0 / 3.0 + z2 * (2.0 / 15.0 + z2 * (-17.0 / 315.0 + z2 * (62.0 / 2835.0)))))
    e = tl.exp(-2.0 * a)
    large = (1.0 - e) / (1.0 + e)
    large = tl.where(z < 0, -large, large)
    t = tl.where(a < 0.0625, small, large)
    sech2 = tl.where(a < 0.0625, 1.0 - small * small, 4.0 * e / ((1.0 + e) * (1.0 + e)))
    return t, sech2


@fast_launch
@triton.jit
def _dyt_fwd_kernel(
    x_ptr,
    alpha_ptr,
    gamma_ptr,
    beta_ptr,
    y_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    HAS_BETA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISE: tl.constexpr,
):
    # int64 row indices: rows * stride passes 2^31 for long sequences x wide hidden sizes
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    x = widen(
        tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32),
        PRECISE,
    )
    alpha = widen(tl.load(alpha_ptr).to(tl.float32), PRECISE)
    gamma = widen(tl.load(gamma_ptr + cols, mask=col_mask, other=0.0).to(tl.float32), PRECISE)
    t, _ = _tanh_sech2(alpha * x)
    y = gamma[None, :] * t
    if HAS_BETA:
        y += widen(tl.load(beta_ptr + cols, mask=col_mask, other=0.0).to(tl.float32), PRECISE)[None, :]
    store_wide_tile(y_ptr, rows, cols, y_row_stride, y, mask)


@fast_launch
@triton.jit
def _dyt_bwd_kernel(
    dy_ptr,
    x_ptr,
    alpha_ptr,
    gamma_ptr,
    dx_ptr,
    dparams_ptr,  # (2, programs, n_cols): dgamma and dbeta partial rows
    dalpha_ptr,  # (programs, column blocks)
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
    block = tl.program_id(1)
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    alpha = widen(tl.load(alpha_ptr).to(tl.float32), PRECISE)
    gamma = widen(tl.load(gamma_ptr + cols, mask=col_mask, other=0.0).to(tl.float32), PRECISE)
    zero = widen(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), PRECISE)
    dgamma, dbeta, dalpha = zero, zero, zero
    rows = pid * tiles_per_program * BLOCK_M + tl.arange(0, BLOCK_M)
    for _ in range(0, tiles_per_program):
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + cols[None, :], mask=mask, other=0.0)
        x = widen(x.to(tl.float32), PRECISE)
        dy = widen(dy.to(tl.float32), PRECISE)
        t, sech2 = _tanh_sech2(alpha * x)
        dz = dy * gamma[None, :] * sech2
        dx = dz * alpha
        if dx_ptr.dtype.element_ty != tl.float64:
            dx = dx.to(tl.float32)
        tl.store(
            dx_ptr + rows[:, None] * dx_row_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask
        )
        # padding lanes hold x = 0: with an infinite alpha, z = 0 * inf there is NaN, kept out of the sums
        dgamma += tl.where(mask, dy * t, 0.0)
        dbeta += dy
        dalpha += tl.where(mask, dz * x, 0.0)
        rows += BLOCK_M
    n_programs = tl.num_programs(0)
    tl.store(dparams_ptr + pid * n_cols + cols, tl.sum(dgamma, axis=0), mask=col_mask)
    tl.store(dparams_ptr + (n_programs + pid) * n_cols + cols, tl.sum(dbeta, axis=0), mask=col_mask)
    tl.store(dalpha_ptr + pid * tl.num_programs(1) + block, tl.sum(tl.sum(dalpha, axis=1), axis=0))


def _tile(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): column blocks of at most DYT_MAX_BLOCK_N, several rows per tile."""
    block_n = min(DYT_MAX_BLOCK_N, next_power_of_2(n_cols))
    block_m = max(1, tuning.NORM_TILE_ELEMENTS // block_n)
    warps = min(32, max(4, block_m * block_n // (32 * tuning.NORM_FWD_ELEMENTS_PER_THREAD)))
    return block_m, block_n, warps


def _output_dtype(x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None):
    dtype = torch.promote_types(torch.promote_types(x.dtype, alpha.dtype), gamma.dtype)
    return dtype if beta is None else torch.promote_types(dtype, beta.dtype)


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces a patched
# model through them without graph breaks; eager mode calls the plain implementations (``dispatch.launcher``).
# Inputs: 2-D rows with unit column stride, parameters contiguous.
def _dyt_fwd_impl(
    x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None
) -> torch.Tensor:
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=_output_dtype(x, alpha, gamma, beta), device=x.device)
    if n_rows == 0:
        return y
    block_m, block_n, warps = _tile(n_cols)
    _dyt_fwd_kernel[(cdiv(n_rows, block_m), cdiv(n_cols, block_n))](
        x, alpha, gamma, gamma if beta is None else beta, y, n_rows, n_cols, x.stride(0), y.stride(0),
        HAS_BETA=beta is not None, BLOCK_M=block_m, BLOCK_N=block_n, PRECISE=y.dtype == torch.float32,
        num_warps=warps,
    )  # fmt: skip
    return y


def _dyt_bwd_impl(
    dy: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dalpha, dgamma, dbeta); dbeta in gamma's dtype (the caller casts it to beta's)."""
    n_rows, n_cols = x.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return dx, torch.zeros_like(alpha), torch.zeros_like(gamma), torch.zeros_like(gamma)
    block_m, block_n, warps = _tile(n_cols)
    n_tiles = cdiv(n_rows, block_m)
    col_blocks = cdiv(n_cols, block_n)
    target = max(1, num_sms(x.device) * tuning.NORM_BWD_PROGRAMS_PER_SM // col_blocks)
    tiles_per_program = cdiv(n_tiles, min(target, n_tiles))
    programs = cdiv(n_tiles, tiles_per_program)
    # fp64 where any of the tensors is fp32 (an fp32 alpha, gamma or beta: eager computes in fp32)
    precise = torch.float32 in (x.dtype, dy.dtype, alpha.dtype, gamma.dtype)
    partial_dtype = torch.float64 if precise else torch.float32
    dparams = torch.empty((2, programs, n_cols), dtype=partial_dtype, device=x.device)
    dalpha = torch.empty((programs, col_blocks), dtype=partial_dtype, device=x.device)
    _dyt_bwd_kernel[(programs, col_blocks)](
        dy, x, alpha, gamma, dx, dparams, dalpha, n_rows, n_cols, dy.stride(0), x.stride(0), dx.stride(0),
        tiles_per_program, BLOCK_M=block_m, BLOCK_N=block_n, PRECISE=precise,
        num_warps=warps,
    )  # fmt: skip
    sums = sum_partials(dparams, partial_dtype)
    dgamma, dbeta = sums[0].to(gamma.dtype), sums[1].to(gamma.dtype)
    return dx, dalpha.sum().to(alpha.dtype).reshape(alpha.shape), dgamma, dbeta


_dyt_fwd = torch.library.custom_op("liger_core::dyt_fwd", _dyt_fwd_impl, mutates_args=())
_dyt_bwd = torch.library.custom_op("liger_core::dyt_bwd", _dyt_bwd_impl, mutates_args=())


@_dyt_fwd.register_fake
def _(x, alpha, gamma, beta):
    return x.new_empty(x.shape, dtype=_output_dtype(x, alpha, gamma, beta))


@_dyt_bwd.register_fake
def _(dy, x, alpha, gamma):
    return x.new_empty(x.shape), torch.empty_like(alpha), torch.empty_like(gamma), torch.empty_like(gamma)


class DyTFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, gamma, beta):
        y = launcher(_dyt_fwd, _dyt_fwd_impl)(x, alpha, gamma, beta)
        ctx.save_for_backward(x, alpha, gamma)
        ctx.beta_dtype = None if beta is None else beta.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, alpha, gamma = ctx.saved_tensors
        dx, dalpha, dgamma, dbeta = launcher(_dyt_bwd, _dyt_bwd_impl)(rows_view(dy), x, alpha, gamma)
        dbeta = None if ctx.beta_dtype is None else dbeta.to(ctx.beta_dtype)
        return dx, dalpha, dgamma, dbeta


def dyt(
    x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None = None
) -> torch.Tensor:
    """Dynamic Tanh ``gamma * tanh(alpha * x) + beta`` over the last dimension (module doc).

    Args:
        x: ``(..., C)``; any strides (rows without unit column stride are copied).
        alpha: shape ``(1,)``, the scalar scale.
        gamma: ``(C,)``. beta: ``(C,)`` or None.

    Returns:
        ``y`` of x's shape; its dtype is the type promotion of x and the parameters (as eager's).
    """
    if any(is_dtensor(t) for t in (x, alpha, gamma, beta) if t is not None):
        raise TypeError("x, alpha, gamma and beta must be plain tensors (DTensors are not supported here)")
    check_tensor("x", x, min_ndim=1)
    check_tensor("alpha", alpha, ndim=1)
    check_tensor("gamma", gamma, ndim=1)
    check_shape("alpha", alpha, (1,), "alpha is one scalar parameter")
    check_shape("gamma", gamma, (x.shape[-1],), "gamma must match the last dimension of x")
    if beta is not None:
        check_tensor("beta", beta, ndim=1)
        check_shape("beta", beta, (x.shape[-1],), "beta must match the last dimension of x")
    check_same_device("x", x, alpha=alpha, gamma=gamma, beta=beta)
    if x.shape[-1] == 0:
        raise ValueError("x has an empty last dimension; DyT needs at least one feature")
    if not use_triton(x):
        return reference.dyt(x, alpha, gamma, beta)
    params = (alpha.contiguous(), gamma.contiguous(), None if beta is None else beta.contiguous())
    return as_shape(DyTFunction.apply(rows_view(x), *params), x.shape)

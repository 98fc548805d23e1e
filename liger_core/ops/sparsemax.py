"""Sparsemax (Martins & Astudillo, 2016), forward and backward, along any ``dim`` (liger-kernel's
``LigerSparsemax(dim)``): the Euclidean projection of each row onto the probability simplex.

Math, per row z of the sparsemax dimension (float64 math for fp32 tensors, fp32 math for bf16/fp16 ones)::

    z_(1) >= z_(2) >= ...          the row sorted in descending order
    k   = max { r : 1 + r z_(r) > sum_{j<=r} z_(j) }         (the support's size, at least 1)
    tau = (sum_{j<=k} z_(j) - 1) / k
    y_i = max(z_i - tau, 0)
    dx_i = [y_i > 0] (dy_i - (sum_{j: y_j > 0} dy_j) / k)

The sort is torch's (``torch.sort``, which moves values and does no arithmetic); the forward kernel streams
the sorted row once (running prefix sums across column blocks) to find k and tau, then writes y from the
unsorted row. Backward recomputes the support as ``z - tau > 0`` from the saved input and the per-row tau
(not from the rounded output, which for fp16 could underflow to 0 inside the support), and streams each row
twice (the support's sum of dy, then dx).

Non-finite rows follow the reference composition: -inf entries are never in the support (y = 0 there); a
+inf or NaN entry sorts first, no r satisfies the support condition, k is taken as 1 and tau = z_(1) - 1 is
+inf or NaN, so y is NaN at +inf entries, 0 elsewhere for +inf, and NaN throughout for NaN. dx of such a row
is NaN (tau is not finite); the eager composition there passes finite values through relu's NaN output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import launcher
from liger_core.ops._divergence_math import (
    apply_along_dim,
    compute_dtype,
    from_rows,
    launch_over_rows,
    rows_along,
    tile_rows,
)


def _torch_dtype(dtype: tl.dtype) -> torch.dtype:
    return torch.float64 if dtype == tl.float64 else torch.float32


@triton.jit
def _sparsemax_fwd_kernel(
    x_ptr,
    x_row_stride,
    zs_ptr,  # the rows sorted in descending order, contiguous
    y_ptr,
    tau_ptr,
    n_rows,
    n_cols,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    carry = tl.zeros([BLOCK_M], dtype=COMPUTE)  # sum of the row's sorted values before this block
    k = tl.zeros([BLOCK_M], dtype=COMPUTE)
    support_sum = tl.zeros([BLOCK_M], dtype=COMPUTE)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        mask = row_mask[:, None] & (offsets < n_cols)[None, :]
        z = tl.load(zs_ptr + rows[:, None] * n_cols + offsets[None, :], mask=mask, other=0.0).to(COMPUTE)
        prefix = carry[:, None] + tl.cumsum(z, axis=1)
        rank = (offsets + 1).to(COMPUTE)[None, :]
        # sorted descending, the condition holds on a prefix of the row: its count is k
        support = mask & (1.0 + rank * z > prefix)
        k += tl.sum(support.to(COMPUTE), axis=1)
        support_sum += tl.sum(tl.where(support, z, 0.0), axis=1)
        carry += tl.sum(z, axis=1)
    z_first = tl.load(zs_ptr + rows * n_cols, mask=row_mask, other=0.0).to(COMPUTE)
    # k = 0 only where z_(1) is +inf or NaN: k taken as 1, tau = z_(1) - 1 (the module doc)
    tau = tl.where(k > 0.0, (support_sum - 1.0) / tl.maximum(k, 1.0), z_first - 1.0)
    tl.store(tau_ptr + rows, tau, mask=row_mask)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        mask = row_mask[:, None] & (offsets < n_cols)[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + offsets[None, :], mask=mask, other=0.0)
        d = x.to(COMPUTE) - tau[:, None]
        y = tl.where(d > 0.0, d, tl.where(d <= 0.0, 0.0, d))  # relu that keeps NaN
        tl.store(y_ptr + rows[:, None] * n_cols + offsets[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sparsemax_bwd_kernel(
    dy_ptr,
    dy_row_stride,
    x_ptr,
    x_row_stride,
    tau_ptr,
    dx_ptr,
    n_rows,
    n_cols,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    tau = tl.load(tau_ptr + rows, mask=row_mask, other=0.0).to(COMPUTE)
    k = tl.zeros([BLOCK_M], dtype=COMPUTE)
    dy_sum = tl.zeros([BLOCK_M], dtype=COMPUTE)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        mask = row_mask[:, None] & (offsets < n_cols)[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + offsets[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + offsets[None, :], mask=mask, other=0.0)
        support = mask & (x.to(COMPUTE) - tau[:, None] > 0.0)
        k += tl.sum(support.to(COMPUTE), axis=1)
        dy_sum += tl.sum(tl.where(support, dy.to(COMPUTE), 0.0), axis=1)
    # a row with a non-finite tau (a +inf or NaN entry) gets NaN: tau - tau is NaN there, 0 elsewhere
    mean = dy_sum / tl.maximum(k, 1.0) + (tau - tau)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        mask = row_mask[:, None] & (offsets < n_cols)[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + offsets[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + offsets[None, :], mask=mask, other=0.0)
        support = x.to(COMPUTE) - tau[:, None] > 0.0
        dx = tl.where(support, dy.to(COMPUTE) - mean[:, None], 0.0 * mean[:, None])
        out = rows[:, None] * n_cols + offsets[None, :]
        tl.store(dx_ptr + out, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# Launchers are torch.library custom ops (torch.compile traces through them without graph breaks); eager
# mode calls the plain implementations (see ``dispatch.launcher``).
def _sparsemax_fwd_impl(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, tau) for a (rows, V) tensor with unit column stride: y contiguous in x's dtype, tau (rows,) in the
    math dtype."""
    n_rows, n_cols = x.shape
    compute = compute_dtype(x.dtype)
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    tau = torch.empty(n_rows, dtype=_torch_dtype(compute), device=x.device)
    if n_rows and n_cols:
        zs = torch.sort(x, dim=-1, descending=True).values.contiguous()
        launch_over_rows(
            _sparsemax_fwd_kernel, (x, x.stride(0), zs, y, tau, n_rows, n_cols), n_rows, n_cols, x
        )
    return y, tau


def _sparsemax_bwd_impl(dy: torch.Tensor, x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    n_rows, n_cols = x.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    args = (dy, dy.stride(0), x, x.stride(0), tau, dx, n_rows, n_cols)
    launch_over_rows(_sparsemax_bwd_kernel, args, n_rows, n_cols, x)
    return dx


_sparsemax_fwd = torch.library.custom_op("liger_core::sparsemax_fwd", _sparsemax_fwd_impl, mutates_args=())
_sparsemax_bwd = torch.library.custom_op("liger_core::sparsemax_bwd", _sparsemax_bwd_impl, mutates_args=())


@_sparsemax_fwd.register_fake
def _(x):
    return x.new_empty(x.shape), x.new_empty(x.shape[0], dtype=_torch_dtype(compute_dtype(x.dtype)))


@_sparsemax_bwd.register_fake
def _(dy, x, tau):
    return x.new_empty(x.shape)


class SparsemaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int) -> torch.Tensor:
        rows, moved_shape = rows_along(x, dim)
        y, tau = launcher(_sparsemax_fwd, _sparsemax_fwd_impl)(rows)
        ctx.save_for_backward(rows, tau)
        ctx.dim, ctx.moved_shape = dim, moved_shape
        return from_rows(y, moved_shape, dim)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        rows, tau = ctx.saved_tensors
        dx = launcher(_sparsemax_bwd, _sparsemax_bwd_impl)(rows_along(dy, ctx.dim)[0], rows, tau)
        return from_rows(dx, ctx.moved_shape, ctx.dim), None


def sparsemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sparsemax of ``x`` along ``dim`` (the module doc): a probability vector per row with exact zeros off
    its support. Any shape and strides; the result and the gradient in x's dtype, from fp32 math (float64 for
    fp32 x), rounded once."""
    return apply_along_dim(SparsemaxFunction, reference.sparsemax, x, dim)

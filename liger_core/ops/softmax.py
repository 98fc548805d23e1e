"""Row softmax, forward and backward (liger-kernel's ``liger_softmax``; any ``dim``, as ``torch.softmax``).

Math, per row x of the softmax dimension (float64 math for fp32 tensors, so every fp32 output is its exact
value rounded once; fp32 math for bf16/fp16 ones, as eager's)::

    m = max_j x_j,   s = sum_j e^(x_j - m),   y_i = e^(x_i - m) / s
    dx_i = y_i * (dy_i - sum_j dy_j y_j)

The forward kernel makes two passes over each row (an online max and rescaled sum, then y); the backward
kernel two (the dot product, then dx). Backward uses the saved output y in its dtype, as torch's softmax
backward does. The running max starts at the most negative finite float, not -inf, so a block of -inf
entries (a masked vocabulary) adds e^-inf = 0 instead of NaN; a row that is all -inf gives 0 / 0 = NaN and a
row holding +inf or NaN gives NaN, as eager. exp is ``exp_precise`` (about 1 ulp in fp32 on every backend).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import launcher
from liger_core.ops._divergence_math import (
    apply_along_dim,
    exp_precise,
    from_rows,
    launch_over_rows,
    rows_along,
    tile_rows,
)

_MAX_START = tl.constexpr(-3.4028234663852886e38)


@triton.jit
def _softmax_fwd_kernel(
    x_ptr,
    x_row_stride,
    y_ptr,
    n_rows,
    n_cols,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    m = tl.full([BLOCK_M], _MAX_START, dtype=COMPUTE)
    s = tl.zeros([BLOCK_M], dtype=COMPUTE)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        mask = row_mask[:, None] & (offsets < n_cols)[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + offsets[None, :], mask=mask, other=float("-inf"))
        x = x.to(COMPUTE)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        s = s * exp_precise(m - m_new) + tl.sum(exp_precise(x - m_new[:, None]), axis=1)
        m = m_new
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        mask = row_mask[:, None] & (offsets < n_cols)[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + offsets[None, :], mask=mask, other=float("-inf"))
        y = exp_precise(x.to(COMPUTE) - m[:, None]) / s[:, None]
        tl.store(y_ptr + rows[:, None] * n_cols + offsets[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_kernel(
    dy_ptr,
    dy_row_stride,
    y_ptr,
    dx_ptr,
    n_rows,
    n_cols,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dot = tl.zeros([BLOCK_M], dtype=COMPUTE)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        mask = row_mask[:, None] & (offsets < n_cols)[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + offsets[None, :], mask=mask, other=0.0)
        y = tl.load(y_ptr + rows[:, None] * n_cols + offsets[None, :], mask=mask, other=0.0)
        dot += tl.sum(dy.to(COMPUTE) * y.to(COMPUTE), axis=1)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        mask = row_mask[:, None] & (offsets < n_cols)[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + offsets[None, :], mask=mask, other=0.0)
        y = tl.load(y_ptr + rows[:, None] * n_cols + offsets[None, :], mask=mask, other=0.0)
        dx = y.to(COMPUTE) * (dy.to(COMPUTE) - dot[:, None])
        out = rows[:, None] * n_cols + offsets[None, :]
        tl.store(dx_ptr + out, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# Launchers are torch.library custom ops (torch.compile traces through them without graph breaks); eager
# mode calls the plain implementations (see ``dispatch.launcher``).
def _softmax_fwd_impl(x: torch.Tensor) -> torch.Tensor:
    """Softmax of each row of a (rows, V) tensor with unit column stride; a contiguous result."""
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    launch_over_rows(_softmax_fwd_kernel, (x, x.stride(0), y, n_rows, n_cols), n_rows, n_cols, x)
    return y


def _softmax_bwd_impl(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    n_rows, n_cols = y.shape
    dx = torch.empty_like(y)
    launch_over_rows(_softmax_bwd_kernel, (dy, dy.stride(0), y, dx, n_rows, n_cols), n_rows, n_cols, y)
    return dx


_softmax_fwd = torch.library.custom_op("liger_core::softmax_fwd", _softmax_fwd_impl, mutates_args=())
_softmax_bwd = torch.library.custom_op("liger_core::softmax_bwd", _softmax_bwd_impl, mutates_args=())


@_softmax_fwd.register_fake
def _(x):
    return x.new_empty(x.shape)


@_softmax_bwd.register_fake
def _(dy, y):
    return y.new_empty(y.shape)


class SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int) -> torch.Tensor:
        rows, moved_shape = rows_along(x, dim)
        y = launcher(_softmax_fwd, _softmax_fwd_impl)(rows)
        ctx.save_for_backward(y)
        ctx.dim, ctx.moved_shape = dim, moved_shape
        return from_rows(y, moved_shape, dim)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        dx = launcher(_softmax_bwd, _softmax_bwd_impl)(rows_along(dy, ctx.dim)[0], y)
        return from_rows(dx, ctx.moved_shape, ctx.dim), None


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.softmax(x, dim)`` in Triton, forward and backward, for a floating tensor of any shape and
    strides; the result and the gradient in x's dtype, from fp32 math (float64 for fp32 x), rounded once."""
    return apply_along_dim(SoftmaxFunction, reference.softmax, x, dim)

"""Squared ReLU: ``y = relu(x)^2`` (Primer / Nemotron MLP activation; transformers' ``ACT2FN["relu2"]``).

Math (fp32 inside the kernel, one rounding to the output dtype)::

    r  = relu(x) = max(x, 0)
    y  = r * r
    dx = dy * 2 r            (0 wherever x <= 0, whatever dy is: relu's backward masks there)

NaN in x gives NaN in y and dx (``x <= 0`` is false for NaN, so it passes through as in eager's relu).
Only x is saved for backward; the backward kernel recomputes r. Forward reads x and writes y; backward
reads dy, x and writes dx.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import check_tensor, launcher, use_triton
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import cdiv, elementwise_settings


@fast_launch
@triton.jit
def _relu_squared_fwd_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    # int64 offsets: n_elements can pass 2^31
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    # where(x <= 0, 0, x) rather than maximum: NaN must pass through (tl.maximum may drop it on the GPU)
    r = tl.where(x <= 0.0, 0.0, x)
    tl.store(y_ptr + offsets, (r * r).to(y_ptr.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _relu_squared_bwd_kernel(dy_ptr, x_ptr, dx_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    # masked, not multiplied by 0: an inf/NaN dy at x <= 0 gives 0, as relu's backward does in eager
    dx = tl.where(x <= 0.0, 0.0, dy * (2.0 * x))
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _grid_settings(n: int) -> tuple[int, int, int]:
    block, warps = elementwise_settings(n)
    return cdiv(n, block), block, warps


# Launchers are torch.library custom ops (torch.compile traces through them without graph breaks); eager
# mode calls the plain implementations (see ``dispatch.launcher``).
def _relu_squared_fwd_impl(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        grid, block, warps = _grid_settings(n)
        _relu_squared_fwd_kernel[(grid,)](x, y, n, BLOCK_SIZE=block, num_warps=warps)
    return y


def _relu_squared_bwd_impl(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    dx = torch.empty_like(x)
    n = x.numel()
    if n:
        grid, block, warps = _grid_settings(n)
        _relu_squared_bwd_kernel[(grid,)](dy, x, dx, n, BLOCK_SIZE=block, num_warps=warps)
    return dx


_relu_squared_fwd = torch.library.custom_op(
    "liger_core::relu_squared_fwd", _relu_squared_fwd_impl, mutates_args=()
)
_relu_squared_bwd = torch.library.custom_op(
    "liger_core::relu_squared_bwd", _relu_squared_bwd_impl, mutates_args=()
)


@_relu_squared_fwd.register_fake
def _(x):
    return torch.empty_like(x)


@_relu_squared_bwd.register_fake
def _(dy, x):
    return torch.empty_like(x)


class ReLUSquaredFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        ctx.save_for_backward(x)
        return launcher(_relu_squared_fwd, _relu_squared_fwd_impl)(x)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (x,) = ctx.saved_tensors
        return launcher(_relu_squared_bwd, _relu_squared_bwd_impl)(dy.contiguous(), x)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)^2`` elementwise for a floating tensor of any shape (liger-kernel's ``liger_relu_squared``,
    transformers' ``ReLUSquaredActivation``). Exact fp32 math, one rounding to the input dtype."""
    check_tensor("x", x)
    if not use_triton(x):
        return reference.relu_squared(x)
    return ReLUSquaredFunction.apply(x)

"""KL divergence with ``torch.nn.functional.kl_div``'s semantics: ``input`` holds log-probabilities,
``target`` probabilities (or log-probabilities with ``log_target=True``).

Math (elementwise, x = input, t = target; float64 math for fp32 tensors, so that every fp32 output is its
exact value rounded once; fp32 math for bf16/fp16 ones, as eager's on upcast inputs: float64 math made the
forward twice as slow there, H200)::

    log_target=False:  l = t * log(t) - t * x      (t * log t := 0 at t = 0, like torch.xlogy)   dl/dx = -t
    log_target=True:   l = e^t * (t - x)                                                      dl/dx = -e^t

    reduction="none": l;  "sum": sum(l);  "mean": sum(l) / numel;  "batchmean": sum(l) / input.size(0)

Rows are the last dimension (any leading dims, any strides). The forward kernel streams each row once and
writes either l (``none``, fp32) or the row's float64 sum, which torch then adds up; one rounding to the fp32
loss at the end (whatever the input dtype: a bf16 loss would carry a relative error of ~2e-3). Nothing but
``target`` is saved for backward, whose kernel reads target (and grad_output for ``none``) and writes
``-p * grad_output / divisor`` in the input's dtype. Only ``input`` gets a gradient: ``target`` is treated as
a constant (as in Liger-Kernel; torch would also differentiate w.r.t. target).

torch's semantics otherwise: no elements give ``sum`` 0, ``mean`` NaN (0 / 0), ``batchmean`` NaN for
``input.size(0) == 0``; non-finite inputs give torch's NaN and +-inf (e.g. NaN where a -inf log-target meets
its exp of 0, or a zero target a -inf input: 0 * inf).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import check_choice, check_same_device, check_shape, check_tensor, use_triton
from liger_core.ops._divergence_math import (
    as_rows,
    compute_dtype,
    exp_precise,
    log_precise,
    row_tiles,
    tile_rows,
)

REDUCTIONS = ("none", "sum", "mean", "batchmean")


@triton.jit
def _kl_div_fwd_kernel(
    x_ptr,
    x_row_stride,
    t_ptr,
    t_row_stride,
    out_ptr,  # (rows, n_cols) fp32 when not REDUCE, else (rows,) float64 row sums
    n_rows,
    n_cols,
    LOG_TARGET: tl.constexpr,
    REDUCE: tl.constexpr,
    COMPUTE: tl.constexpr,  # float64 for fp32 inputs, float32 for bf16/fp16 ones
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    x_rows = x_ptr + rows[:, None] * x_row_stride
    t_rows = t_ptr + rows[:, None] * t_row_stride
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float64)
    for start in range(0, n_cols, BLOCK_N):
        offsets = (start + cols)[None, :]
        mask = row_mask[:, None] & (offsets < n_cols)
        x = tl.load(x_rows + offsets, mask=mask, other=0.0).to(COMPUTE)
        t = tl.load(t_rows + offsets, mask=mask, other=0.0).to(COMPUTE)
        if LOG_TARGET:
            loss = exp_precise(t) * (t - x)
        else:
            loss = tl.where(t == 0.0, 0.0, t * log_precise(t)) - t * x
        if REDUCE:
            acc += tl.where(mask, loss, 0.0).to(tl.float64)
        else:
            tl.store(out_ptr + rows[:, None] * n_cols + offsets, loss.to(out_ptr.dtype.element_ty), mask=mask)
    if REDUCE:
        tl.store(out_ptr + rows, tl.sum(acc, axis=1), mask=row_mask)


@triton.jit
def _kl_div_bwd_kernel(
    t_ptr,
    t_row_stride,
    g_ptr,  # grad_output / divisor as an fp32 0-dim tensor when SCALAR_GRAD, else grad_output (rows, n_cols)
    g_row_stride,
    dx_ptr,
    n_rows,
    n_cols,
    LOG_TARGET: tl.constexpr,
    SCALAR_GRAD: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    t_rows = t_ptr + rows[:, None] * t_row_stride
    if SCALAR_GRAD:
        g = tl.load(g_ptr).to(COMPUTE)
    for start in range(0, n_cols, BLOCK_N):
        offsets = (start + cols)[None, :]
        mask = row_mask[:, None] & (offsets < n_cols)
        p = tl.load(t_rows + offsets, mask=mask, other=0.0).to(COMPUTE)
        if LOG_TARGET:
            p = exp_precise(p)
        if not SCALAR_GRAD:
            g = tl.load(g_ptr + rows[:, None] * g_row_stride + offsets, mask=mask, other=0.0).to(COMPUTE)
        tl.store(dx_ptr + rows[:, None] * n_cols + offsets, (-p * g).to(dx_ptr.dtype.element_ty), mask=mask)


@torch.library.custom_op("liger_core::kl_div_fwd", mutates_args=())
def _kl_div_fwd(x: torch.Tensor, t: torch.Tensor, log_target: bool, reduce: bool) -> torch.Tensor:
    """(rows, V) fp32 elementwise loss, or (rows,) float64 row sums when ``reduce``."""
    n_rows, n_cols = x.shape
    if reduce:
        out = torch.empty(n_rows, dtype=torch.float64, device=x.device)
    else:
        out = torch.empty((n_rows, n_cols), dtype=torch.float32, device=x.device)
    tiles = row_tiles(n_rows, n_cols, x.device)
    if n_rows:
        _kl_div_fwd_kernel[tiles.grid(n_rows)](
            x,
            x.stride(0),
            t,
            t.stride(0),
            out,
            n_rows,
            n_cols,
            LOG_TARGET=log_target,
            REDUCE=reduce,
            COMPUTE=compute_dtype(x.dtype),
            BLOCK_M=tiles.block_m,
            BLOCK_N=tiles.block_n,
            num_warps=tiles.num_warps,
        )
    return out


@_kl_div_fwd.register_fake
def _(x, t, log_target, reduce):
    if reduce:
        return x.new_empty(x.shape[0], dtype=torch.float64)
    return x.new_empty(x.shape, dtype=torch.float32)


@torch.library.custom_op("liger_core::kl_div_bwd", mutates_args=())
def _kl_div_bwd(
    grad_output: torch.Tensor, t: torch.Tensor, log_target: bool, dtype: torch.dtype
) -> torch.Tensor:
    """d loss / d input (rows, V) in ``dtype``; grad_output is already divided by the reduction's divisor."""
    n_rows, n_cols = t.shape
    dx = torch.empty((n_rows, n_cols), dtype=dtype, device=t.device)
    scalar_grad = grad_output.dim() == 0
    tiles = row_tiles(n_rows, n_cols, t.device)
    if n_rows:
        _kl_div_bwd_kernel[tiles.grid(n_rows)](
            t,
            t.stride(0),
            grad_output,
            0 if scalar_grad else grad_output.stride(0),
            dx,
            n_rows,
            n_cols,
            LOG_TARGET=log_target,
            SCALAR_GRAD=scalar_grad,
            COMPUTE=compute_dtype(dtype),
            BLOCK_M=tiles.block_m,
            BLOCK_N=tiles.block_n,
            num_warps=tiles.num_warps,
        )
    return dx


@_kl_div_bwd.register_fake
def _(grad_output, t, log_target, dtype):
    return t.new_empty(t.shape, dtype=dtype)


class KLDivFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, target, reduction, log_target):
        x, t = as_rows(input), as_rows(target.detach())
        reduce = reduction != "none"
        out = _kl_div_fwd(x, t, log_target, reduce)
        ctx.save_for_backward(t)
        ctx.divisor = {"none": 1, "sum": 1, "mean": input.numel(), "batchmean": input.shape[0]}[reduction]
        ctx.log_target, ctx.input_shape, ctx.input_dtype = log_target, input.shape, input.dtype
        if not reduce:
            return out.view(input.shape)
        return (out.sum() / ctx.divisor).to(torch.float32)  # 0 / 0 (empty input) is NaN, as in torch

    @staticmethod
    def backward(ctx, grad_output):
        (t,) = ctx.saved_tensors
        if grad_output.dim() == 0:
            # grad_output / divisor correctly rounded, as eager's mean backward computes it
            grad_output = grad_output.to(torch.float32) / ctx.divisor
        else:
            grad_output = as_rows(grad_output)
        dx = _kl_div_bwd(grad_output, t, ctx.log_target, ctx.input_dtype)
        return dx.view(ctx.input_shape), None, None, None


def kl_div(
    input: torch.Tensor, target: torch.Tensor, reduction: str = "batchmean", log_target: bool = False
) -> torch.Tensor:
    """``torch.nn.functional.kl_div(input, target, reduction, log_target)`` in Triton, for tensors of equal
    shape (..., V) and dtype, any strides. ``input`` is log-probabilities; only ``input`` gets a gradient, in
    its dtype. The loss (elementwise for ``reduction="none"``) is fp32 whatever the input dtype, computed in
    fp32 math (float64 for fp32 inputs), the sums in float64, and rounded once."""
    check_tensor("input", input, min_ndim=1)
    check_tensor("target", target)
    check_shape("target", target, tuple(input.shape), "target must match input")
    if target.dtype != input.dtype:
        raise TypeError(f"target has dtype {target.dtype} but input has dtype {input.dtype}; they must match")
    check_same_device("input", input, target=target)
    check_choice("reduction", reduction, REDUCTIONS)
    if not isinstance(log_target, bool):
        raise TypeError(f"log_target must be a bool, got {type(log_target).__name__}")
    if not use_triton(input):
        return reference.kl_div(input, target, reduction, log_target)
    return KLDivFunction.apply(input, target, reduction, log_target)

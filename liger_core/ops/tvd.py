"""Total variation distance between two distributions given as probabilities (liger-kernel's
``LigerTVDLoss``).

Math (elementwise, p = input, q = target, over rows of the last dimension; float64 math for fp32 tensors, so
every fp32 output is its exact value rounded once; fp32 math for bf16/fp16 ones)::

    l = 0.5 * |p - q|                      (0 in rows whose shift_labels is ignore_index)
    dl/dp = 0.5 * sign(p - q),  dl/dq = -dl/dp      (torch.sign, as abs's backward: 0 at 0 and at NaN)

    reduction="none": l (ignored rows 0);  "sum": sum(l);
              "mean": sum(l) / (n_kept * V);  "batchmean": sum(l) / n_kept

n_kept is the number of rows whose label is not ``ignore_index`` (every row without ``shift_labels``). A
batch with no kept row gives 0 with zero gradients for the reduced losses (the mean over no rows taken as 0,
as ``ops.jsd``; liger-kernel divides by 0 there). At p == q the gradient is 0 (torch's subgradient of |x|;
liger-kernel's kernel gives -0.5). Both inputs get gradients when they require them (liger-kernel gives
only ``p`` one).

The forward kernel streams p and q once and writes l (``none``, fp32) or each row's float64 sum, which torch
adds and divides by the divisor held in float64 (no host sync); the loss is fp32 whatever the inputs' dtype.
Nothing is saved but references to p and q; the backward kernel reads them again (and grad_output for
``none``) and writes dp (and dq) with grad_output / divisor folded in, rounded once to the inputs' dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import check_choice, check_same_device, check_shape, check_tensor, use_triton
from liger_core.ops._divergence_math import (
    as_rows,
    check_ignore_index,
    check_shift_labels,
    compute_dtype,
    kept_rows,
    row_tiles,
    tile_rows,
)

REDUCTIONS = ("none", "sum", "mean", "batchmean")


@triton.jit
def _tvd_fwd_kernel(
    p_ptr,
    p_row_stride,
    q_ptr,
    q_row_stride,
    labels_ptr,
    out_ptr,
    n_rows,
    n_cols,
    ignore_index,
    HAS_LABELS: tl.constexpr,
    REDUCE: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    keep = kept_rows(labels_ptr, rows, row_mask, ignore_index, HAS_LABELS)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float64)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        col_mask = (offsets < n_cols)[None, :]
        # ignored rows are never read: they hold 0 - 0, whatever their inputs are
        mask = keep[:, None] & col_mask
        p = tl.load(p_ptr + rows[:, None] * p_row_stride + offsets[None, :], mask=mask, other=0.0)
        q = tl.load(q_ptr + rows[:, None] * q_row_stride + offsets[None, :], mask=mask, other=0.0)
        loss = 0.5 * tl.abs(p.to(COMPUTE) - q.to(COMPUTE))
        if REDUCE:
            acc += loss.to(tl.float64)
        else:
            tl.store(
                out_ptr + rows[:, None] * n_cols + offsets[None, :],
                loss.to(tl.float32),
                mask=row_mask[:, None] & col_mask,
            )
    if REDUCE:
        tl.store(out_ptr + rows, tl.sum(acc, axis=1), mask=row_mask)


@triton.jit
def _tvd_bwd_kernel(
    p_ptr,
    p_row_stride,
    q_ptr,
    q_row_stride,
    labels_ptr,
    g_ptr,  # 0-dim float64 grad_output / divisor, or the (rows, V) grad_output of reduction="none"
    g_row_stride,
    dp_ptr,
    dq_ptr,
    n_rows,
    n_cols,
    ignore_index,
    HAS_LABELS: tl.constexpr,
    SCALAR_GRAD: tl.constexpr,
    WRITE_DP: tl.constexpr,
    WRITE_DQ: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    keep = kept_rows(labels_ptr, rows, row_mask, ignore_index, HAS_LABELS)
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        col_mask = (offsets < n_cols)[None, :]
        mask = keep[:, None] & col_mask
        p = tl.load(p_ptr + rows[:, None] * p_row_stride + offsets[None, :], mask=mask, other=0.0)
        q = tl.load(q_ptr + rows[:, None] * q_row_stride + offsets[None, :], mask=mask, other=0.0)
        d = p.to(COMPUTE) - q.to(COMPUTE)
        # torch.sign: 0 at d = 0 and at NaN (what abs's backward multiplies by in eager)
        sign = tl.where(d > 0.0, 1.0, tl.where(d < 0.0, -1.0, 0.0))
        if SCALAR_GRAD:
            g = tl.load(g_ptr).to(COMPUTE)  # one cached scalar
        else:
            g = tl.load(g_ptr + rows[:, None] * g_row_stride + offsets[None, :], mask=mask, other=0.0).to(
                COMPUTE
            )
        # ignored rows: zeros, whatever grad_output holds there
        dp = tl.where(keep[:, None], g * (0.5 * sign), 0.0)
        out_offsets = rows[:, None] * n_cols + offsets[None, :]
        out_mask = row_mask[:, None] & col_mask
        if WRITE_DP:
            tl.store(dp_ptr + out_offsets, dp.to(dp_ptr.dtype.element_ty), mask=out_mask)
        if WRITE_DQ:
            tl.store(dq_ptr + out_offsets, (-dp).to(dq_ptr.dtype.element_ty), mask=out_mask)


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces through
# them without graph breaks; the autograd Function below composes them.
@torch.library.custom_op("liger_core::tvd_fwd", mutates_args=())
def _tvd_fwd(
    p: torch.Tensor, q: torch.Tensor, labels: torch.Tensor | None, ignore_index: int, reduce: bool
) -> torch.Tensor:
    """(rows, V) fp32 elementwise loss, or (rows,) float64 row sums when ``reduce``."""
    n_rows, n_cols = p.shape
    if reduce:
        out = torch.empty(n_rows, dtype=torch.float64, device=p.device)
    else:
        out = torch.empty((n_rows, n_cols), dtype=torch.float32, device=p.device)
    tiles = row_tiles(n_rows, n_cols, p.device)
    if n_rows and n_cols:
        _tvd_fwd_kernel[tiles.grid(n_rows)](
            p, p.stride(0), q, q.stride(0), labels, out, n_rows, n_cols, int(ignore_index),
            HAS_LABELS=labels is not None, REDUCE=reduce, COMPUTE=compute_dtype(p.dtype),
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.num_warps,
        )  # fmt: skip
    elif reduce:
        out.zero_()
    return out


@_tvd_fwd.register_fake
def _(p, q, labels, ignore_index, reduce):
    if reduce:
        return p.new_empty(p.shape[0], dtype=torch.float64)
    return p.new_empty(p.shape, dtype=torch.float32)


@torch.library.custom_op("liger_core::tvd_bwd", mutates_args=())
def _tvd_bwd(
    p: torch.Tensor,
    q: torch.Tensor,
    labels: torch.Tensor | None,
    grad: torch.Tensor,
    ignore_index: int,
    write_dp: bool,
    write_dq: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dp, dq) as (rows, V) tensors in the inputs' dtype (a 0-element placeholder for one not asked for)."""
    n_rows, n_cols = p.shape
    dp = torch.empty((n_rows, n_cols) if write_dp else (0,), dtype=p.dtype, device=p.device)
    dq = torch.empty((n_rows, n_cols) if write_dq else (0,), dtype=p.dtype, device=p.device)
    scalar_grad = grad.dim() == 0
    tiles = row_tiles(n_rows, n_cols, p.device)
    if n_rows and n_cols:
        _tvd_bwd_kernel[tiles.grid(n_rows)](
            p, p.stride(0), q, q.stride(0), labels, grad, 0 if scalar_grad else grad.stride(0), dp, dq,
            n_rows, n_cols, int(ignore_index),
            HAS_LABELS=labels is not None, SCALAR_GRAD=scalar_grad, WRITE_DP=write_dp, WRITE_DQ=write_dq,
            COMPUTE=compute_dtype(p.dtype), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
            num_warps=tiles.num_warps,
        )  # fmt: skip
    return dp, dq


@_tvd_bwd.register_fake
def _(p, q, labels, grad, ignore_index, write_dp, write_dq):
    n_rows, n_cols = p.shape
    return (
        p.new_empty((n_rows, n_cols) if write_dp else (0,)),
        p.new_empty((n_rows, n_cols) if write_dq else (0,)),
    )


def _divisor(
    labels: torch.Tensor | None, ignore_index: int, n_rows: int, n_cols: int, reduction: str, device
) -> torch.Tensor | None:
    """The reduction's divisor as a float64 0-dim device tensor (no host sync; exact up to 2^53); None for
    "none" and "sum". At least 1 row: a batch with no kept row gives 0 / 1 = 0."""
    if reduction in ("none", "sum"):
        return None
    if labels is None:
        n_kept = torch.full((), max(n_rows, 1), dtype=torch.float64, device=device)
    else:
        n_kept = (labels != ignore_index).sum().clamp_min(1).to(torch.float64)
    return n_kept * n_cols if reduction == "mean" else n_kept


class TVDFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, q, labels, reduction, ignore_index):
        x, y = as_rows(p), as_rows(q)
        reduce = reduction != "none"
        out = _tvd_fwd(x, y, labels, ignore_index, reduce)
        divisor = _divisor(labels, ignore_index, x.shape[0], x.shape[1], reduction, p.device)
        ctx.save_for_backward(x, y, labels, divisor)
        ctx.ignore_index, ctx.shape = ignore_index, p.shape
        if not reduce:
            return out.view(p.shape)
        total = out.sum()
        return (total if divisor is None else total / divisor).to(torch.float32)

    @staticmethod
    def backward(ctx, grad_output):
        x, y, labels, divisor = ctx.saved_tensors
        if grad_output.dim() == 0:
            # grad_output / divisor computed in float64: one rounding in the kernel's math dtype
            grad = grad_output.to(torch.float64)
            if divisor is not None:
                grad = grad / divisor
        else:
            grad = as_rows(grad_output)
        want_p, want_q = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dp, dq = _tvd_bwd(x, y, labels, grad, ctx.ignore_index, want_p, want_q)
        return (
            dp.view(ctx.shape) if want_p else None,
            dq.view(ctx.shape) if want_q else None,
            None,
            None,
            None,
        )


def tvd(
    p: torch.Tensor,
    q: torch.Tensor,
    shift_labels: torch.Tensor | None = None,
    reduction: str = "batchmean",
    ignore_index: int = -100,
) -> torch.Tensor:
    """Total variation distance ``0.5 * |p - q|`` between probabilities of shape (..., V) (equal shape and
    dtype, any strides), reduced by ``reduction`` ("none", "sum", "mean" over kept elements, "batchmean" over
    kept rows); rows whose ``shift_labels`` (shape (...) or flat) equal ``ignore_index`` count as 0 and are
    left out of the divisor. The loss is fp32 whatever the inputs' dtype; p and q get gradients in their
    dtype. liger-kernel's ``liger_tvd(input, target, shift_labels, reduction, ignore_index)``; the module doc
    says where the results differ (p == q, no kept row)."""
    check_tensor("p", p, min_ndim=1)
    check_tensor("q", q)
    check_shape("q", q, tuple(p.shape), "q must match p")
    if q.dtype != p.dtype:
        raise TypeError(f"q has dtype {q.dtype} but p has dtype {p.dtype}; they must match")
    check_same_device("p", p, q=q)
    if p.shape[-1] == 0:
        raise ValueError("p has an empty distribution (last) dimension")
    check_choice("reduction", reduction, REDUCTIONS)
    ignore_index = check_ignore_index(ignore_index)
    labels = check_shift_labels(shift_labels, tuple(p.shape[:-1]), "p", p)
    if not use_triton(p):
        return reference.tvd(p, q, shift_labels, reduction, ignore_index)
    return TVDFunction.apply(p, q, labels, reduction, ignore_index)

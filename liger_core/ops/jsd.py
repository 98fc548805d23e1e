"""Generalised Jensen-Shannon divergence between student and teacher log-probabilities (distillation).

Math, per row, with ``x = student_logp`` (``Q = e^x``) and ``y = teacher_logp`` (``P = e^y``) (TRL GKD /
Liger-Kernel convention: beta weights the teacher; the endpoints are the named KLs, not limits)::

    0 < beta < 1:  M = beta * P + (1 - beta) * Q
                   JSD = sum_i beta * P_i * (y_i - log M_i) + (1 - beta) * Q_i * (x_i - log M_i)
                   dJSD/dx_i = (1 - beta) * Q_i * (x_i - log M_i)
    beta == 0:     KL(P || Q) = sum_i P_i * (y_i - x_i)          dx_i = -P_i         (forward KL)
    beta == 1:     KL(Q || P) = sum_i Q_i * (x_i - y_i)          dx_i = Q_i * (x_i - y_i + 1)  (reverse KL)

    loss = sum over kept rows of JSD / n_kept,   kept = shift_labels != ignore_index (all rows without labels)

A term whose probability is 0 contributes 0 (``0 * log 0 = 0``), so log-probs of -inf (a masked vocabulary
entry) give finite results where the eager formula gives NaN (a documented choice: torch has no JSD of its
own; the reference path follows it). A NaN log-prob gives a NaN loss. With no rows, or every row ignored,
the loss is 0 and the gradient is 0 (the mean over no rows taken as 0: a batch without a kept token adds
nothing to a distillation loss; eager's 0 / 0 would be NaN). The loss is fp32 whatever the inputs' dtype;
only ``student_logp`` gets a gradient (in its dtype); ``teacher_logp`` is a constant.

One kernel per pass. Forward streams x and y once and writes each row's loss; torch adds the rows and divides
by n_kept (kept on the device: no host sync). Backward streams x and y again and writes
``dx * grad_output / n_kept`` with grad_output folded into the math, so the gradient is rounded once to the
student's dtype whatever grad_output is (distillation losses are usually weighted or scaled for gradient
accumulation). HBM traffic: forward reads 2 tensors, backward reads 2 and writes 1; nothing is saved but
references to the inputs, and no logits-sized buffer lives between forward and backward.

Precision: the math is fp32 for bf16/fp16 inputs and float64 for fp32 inputs (``compute_dtype``), and the
loss is always summed in float64: every output of fp32 inputs is its exact value rounded once; the gradient
of 16-bit inputs too (fp32 math is far below their rounding), and their fp32 loss carries the fp32 terms'
last-place errors, averaged over the rows (measured no larger than eager's fp32 on upcast inputs). exp and
log are ``exp_precise`` / ``log_precise`` (about 1 ulp in fp32 on every backend) rather than
``tl.exp`` / ``tl.log``, which on NVIDIA GPUs are approximations several ulp off for fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import check_same_device, check_shape, check_tensor, use_triton
from liger_core.ops._divergence_math import (
    as_rows,
    check_beta,
    check_ignore_index,
    check_shift_labels,
    compute_dtype,
    jsd_mode,
    jsd_terms,
    kept_count,
    kept_rows,
    row_tiles,
    tile_rows,
)


@triton.jit
def _jsd_fwd_kernel(
    x_ptr,
    x_row_stride,
    y_ptr,
    y_row_stride,
    labels_ptr,
    loss_ptr,
    n_rows,
    n_cols,
    beta_ptr,  # float64 0-dim
    ignore_index,
    MODE: tl.constexpr,
    HAS_LABELS: tl.constexpr,
    COMPUTE: tl.constexpr,  # float64 for fp32 inputs, float32 for bf16/fp16 ones
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    keep = kept_rows(labels_ptr, rows, row_mask, ignore_index, HAS_LABELS)
    cols = tl.arange(0, BLOCK_N)
    beta = tl.load(beta_ptr).to(COMPUTE)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float64)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        # ignored rows and padding columns are never read: -inf log-probs contribute exactly 0
        mask = keep[:, None] & (offsets < n_cols)[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + offsets[None, :], mask=mask, other=float("-inf"))
        y = tl.load(y_ptr + rows[:, None] * y_row_stride + offsets[None, :], mask=mask, other=float("-inf"))
        loss, _ = jsd_terms(x.to(COMPUTE), y.to(COMPUTE), beta, MODE)
        acc += loss.to(tl.float64)
    tl.store(loss_ptr + rows, tl.sum(acc, axis=1), mask=row_mask)


@triton.jit
def _jsd_bwd_kernel(
    x_ptr,
    x_row_stride,
    y_ptr,
    y_row_stride,
    labels_ptr,
    scale_ptr,  # grad_output / n_kept, fp32 0-dim
    dx_ptr,
    n_rows,
    n_cols,
    beta_ptr,  # float64 0-dim
    ignore_index,
    MODE: tl.constexpr,
    HAS_LABELS: tl.constexpr,
    COMPUTE: tl.constexpr,  # float64 for fp32 inputs, float32 for bf16/fp16 ones
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    keep = kept_rows(labels_ptr, rows, row_mask, ignore_index, HAS_LABELS)
    cols = tl.arange(0, BLOCK_N)
    beta = tl.load(beta_ptr).to(COMPUTE)
    scale = tl.load(scale_ptr).to(COMPUTE)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        col_mask = (offsets < n_cols)[None, :]
        mask = keep[:, None] & col_mask
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + offsets[None, :], mask=mask, other=float("-inf"))
        y = tl.load(y_ptr + rows[:, None] * y_row_stride + offsets[None, :], mask=mask, other=float("-inf"))
        _, dx = jsd_terms(x.to(COMPUTE), y.to(COMPUTE), beta, MODE)
        dx = tl.where(keep[:, None], dx * scale, 0.0)  # ignored rows: zeros, whatever their inputs hold
        tl.store(
            dx_ptr + rows[:, None] * n_cols + offsets[None, :],
            dx.to(dx_ptr.dtype.element_ty),
            mask=row_mask[:, None] & col_mask,
        )


def _launch(kernel, student_logp, teacher_logp, labels, beta, ignore_index, *outputs) -> None:
    """Launches ``_jsd_fwd_kernel`` or ``_jsd_bwd_kernel`` over (rows, V) log-probs: both take the inputs,
    then ``outputs`` (forward: the row losses; backward: the scale and dx), then the sizes and options."""
    n_rows, n_cols = student_logp.shape
    if not n_rows:
        return
    tiles = row_tiles(n_rows, n_cols, student_logp.device)
    kernel[tiles.grid(n_rows)](
        student_logp,
        student_logp.stride(0),
        teacher_logp,
        teacher_logp.stride(0),
        labels,
        *outputs,
        n_rows,
        n_cols,
        torch.full((), beta, dtype=torch.float64, device=student_logp.device),
        int(ignore_index),
        MODE=jsd_mode(beta),
        HAS_LABELS=labels is not None,
        COMPUTE=compute_dtype(student_logp.dtype),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        num_warps=tiles.num_warps,
    )


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces through
# them without graph breaks; the autograd Function below composes them.
@torch.library.custom_op("liger_core::jsd_fwd", mutates_args=())
def _jsd_fwd(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    labels: torch.Tensor | None,
    beta: float,
    ignore_index: int,
) -> torch.Tensor:
    """Per-row JSD (float64 sums, 0 for ignored rows) of (rows, V) log-probs."""
    row_loss = torch.empty(student_logp.shape[0], dtype=torch.float64, device=student_logp.device)
    _launch(_jsd_fwd_kernel, student_logp, teacher_logp, labels, beta, ignore_index, row_loss)
    return row_loss


@_jsd_fwd.register_fake
def _(student_logp, teacher_logp, labels, beta, ignore_index):
    return student_logp.new_empty(student_logp.shape[0], dtype=torch.float64)


@torch.library.custom_op("liger_core::jsd_bwd", mutates_args=())
def _jsd_bwd(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    labels: torch.Tensor | None,
    scale: torch.Tensor,
    beta: float,
    ignore_index: int,
) -> torch.Tensor:
    """d(scale * sum of kept rows' JSD) / d student_logp, (rows, V) in the student's dtype."""
    dx = torch.empty(student_logp.shape, dtype=student_logp.dtype, device=student_logp.device)
    _launch(_jsd_bwd_kernel, student_logp, teacher_logp, labels, beta, ignore_index, scale, dx)
    return dx


@_jsd_bwd.register_fake
def _(student_logp, teacher_logp, labels, scale, beta, ignore_index):
    return student_logp.new_empty(student_logp.shape)


class JSDFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, student_logp, teacher_logp, labels, beta, ignore_index):
        x, y = as_rows(student_logp), as_rows(teacher_logp.detach())
        n_kept = kept_count(labels, ignore_index, x.shape[0], x.device)
        row_loss = _jsd_fwd(x, y, labels, beta, ignore_index)
        ctx.save_for_backward(x, y, labels, n_kept)
        ctx.beta, ctx.ignore_index, ctx.student_shape = beta, ignore_index, student_logp.shape
        return (row_loss.sum() / n_kept).to(torch.float32)

    @staticmethod
    def backward(ctx, grad_output):
        x, y, labels, n_kept = ctx.saved_tensors
        scale = grad_output.to(torch.float32) / n_kept
        dx = _jsd_bwd(x, y, labels, scale, ctx.beta, ctx.ignore_index)
        return dx.view(ctx.student_shape), None, None, None, None


def jsd(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    beta: float = 0.5,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Generalised JSD between student and teacher log-probs of shape (..., V), averaged over kept rows.

    ``beta`` weights the teacher in the mixture ``M = beta * P_teacher + (1 - beta) * Q_student``; beta = 0 is
    the forward KL(teacher || student), beta = 1 the reverse KL(student || teacher). Rows whose
    ``shift_labels`` (shape (...) or flat) equal ``ignore_index`` are left out; with no rows or every row
    ignored the loss is 0 with zero gradients (see the module doc). Inputs of any strides. Returns an fp32
    0-dim tensor whatever the inputs' dtype; only ``student_logp`` gets a gradient, in its dtype. -inf
    log-probs follow ``0 * log 0 = 0`` (the module doc), NaN ones give NaN.
    """
    check_tensor("student_logp", student_logp, min_ndim=1)
    check_tensor("teacher_logp", teacher_logp)
    check_shape(
        "teacher_logp", teacher_logp, tuple(student_logp.shape), "teacher_logp must match student_logp"
    )
    if teacher_logp.dtype != student_logp.dtype:
        raise TypeError(
            f"teacher_logp has dtype {teacher_logp.dtype} but student_logp has dtype {student_logp.dtype}; "
            "they must match"
        )
    check_same_device("student_logp", student_logp, teacher_logp=teacher_logp)
    if student_logp.shape[-1] == 0:
        raise ValueError("student_logp has an empty vocabulary (last) dimension")
    beta = check_beta(beta)
    ignore_index = check_ignore_index(ignore_index)
    labels = check_shift_labels(shift_labels, tuple(student_logp.shape[:-1]), "student_logp", student_logp)
    if not use_triton(student_logp):
        return reference.jsd(student_logp, teacher_logp, beta, ignore_index, shift_labels)
    return JSDFunction.apply(student_logp, teacher_logp, labels, beta, ignore_index)

"""Generalised Jensen-Shannon divergence between student and teacher log-probabilities (distillation).

Math, per row, with ``x = student_logp`` (``Q = e^x``), ``y = teacher_logp`` (``P = e^y``), all in fp32 inside
the kernel (TRL GKD / Liger-Kernel convention: beta weights the teacher)::

    0 < beta < 1:  M = beta * P + (1 - beta) * Q
                   JSD = sum_i beta * P_i * (y_i - log M_i) + (1 - beta) * Q_i * (x_i - log M_i)
                   dJSD/dx_i = (1 - beta) * Q_i * (x_i - log M_i)
    beta == 0:     KL(P || Q) = sum_i P_i * (y_i - x_i)          dx_i = -P_i         (forward KL)
    beta == 1:     KL(Q || P) = sum_i Q_i * (x_i - y_i)          dx_i = Q_i * (x_i - y_i + 1)  (reverse KL)

    loss = sum over kept rows of JSD / n_kept,   kept = shift_labels != ignore_index (all rows without labels)

A term whose probability is 0 contributes 0 (``0 * log 0 = 0``), so log-probs of -inf (a masked vocabulary
entry) give finite results where the eager formula gives NaN. When every row is ignored the loss is 0 and the
gradient is 0 (eager divides 0 by 0). Only ``student_logp`` gets a gradient; ``teacher_logp`` is a constant.

One kernel: the forward pass writes each row's loss (fp32) and, when the student needs a gradient, the
gradient ``dx / n_kept`` in the student's dtype (one rounding). Backward only scales it by grad_output, in
place and in fp32, and skips even that when grad_output is 1 (the usual ``loss.backward()``). HBM traffic:
forward reads x, y and writes dx (3 tensors); no logits-sized temporary beyond dx itself. ``n_kept`` stays on
the device (no host sync in forward).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import INDEX_DTYPES, check_same_device, check_shape, check_tensor, use_triton

# Rows of any length are streamed through the kernels in blocks of at most this many columns.
MAX_BLOCK = 4096

FORWARD_KL, REVERSE_KL, MIXTURE = 0, 1, 2


def looped_row_settings(n_cols: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for kernels that stream a row of ``n_cols`` elements block by block."""
    block = min(MAX_BLOCK, triton.next_power_of_2(n_cols))
    return block, 8 if block >= 2048 else 4


def jsd_mode(beta: float) -> int:
    return FORWARD_KL if beta == 0.0 else REVERSE_KL if beta == 1.0 else MIXTURE


@triton.jit
def jsd_terms(x, y, beta, MODE: tl.constexpr):
    """Elementwise (loss, dloss/dx) for fp32 student log-probs ``x`` and teacher log-probs ``y``.

    Every product is masked where its probability is 0, so -inf inputs (and masked-off lanes loaded as -inf)
    contribute exactly 0 instead of 0 * inf = NaN.
    """
    if MODE == 0:  # forward KL(P || Q)
        p = tl.exp(y)
        loss = tl.where(p > 0.0, p * (y - x), 0.0)
        dx = -p
    elif MODE == 1:  # reverse KL(Q || P)
        q = tl.exp(x)
        diff = x - y
        loss = tl.where(q > 0.0, q * diff, 0.0)
        dx = tl.where(q > 0.0, q * (diff + 1.0), 0.0)
    else:
        p_part = beta * tl.exp(y)
        q_part = (1.0 - beta) * tl.exp(x)
        # Clamped at the smallest normal float: where M is smaller, both terms are < 1e-36 anyway, and the
        # clamp keeps log finite on hardware that flushes subnormals (0 * -inf would be NaN).
        log_m = tl.log(tl.maximum(p_part + q_part, 1.1754944e-38))
        dx = tl.where(q_part > 0.0, q_part * (x - log_m), 0.0)
        loss = tl.where(p_part > 0.0, p_part * (y - log_m), 0.0) + dx
    return loss, dx


@triton.jit
def _jsd_fwd_kernel(
    x_ptr,
    x_row_stride,
    y_ptr,
    y_row_stride,
    labels_ptr,
    inv_n_ptr,
    loss_ptr,
    dx_ptr,
    n_cols,
    beta,
    ignore_index,
    MODE: tl.constexpr,
    HAS_LABELS: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride can pass 2^31
    x_ptr += row * x_row_stride
    y_ptr += row * y_row_stride
    dx_ptr += row * n_cols
    cols = tl.arange(0, BLOCK_SIZE)
    if HAS_LABELS:
        if tl.load(labels_ptr + row) == ignore_index:
            tl.store(loss_ptr + row, 0.0)
            if COMPUTE_GRAD:
                zeros = tl.zeros([BLOCK_SIZE], dtype=dx_ptr.dtype.element_ty)
                for start in range(0, n_cols, BLOCK_SIZE):
                    tl.store(dx_ptr + start + cols, zeros, mask=start + cols < n_cols)
            return
    inv_n = tl.load(inv_n_ptr)
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + cols
        mask = offsets < n_cols
        x = tl.load(x_ptr + offsets, mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.load(y_ptr + offsets, mask=mask, other=float("-inf")).to(tl.float32)
        loss, dx = jsd_terms(x, y, beta, MODE)
        acc += loss
        if COMPUTE_GRAD:
            tl.store(dx_ptr + offsets, (dx * inv_n).to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(loss_ptr + row, tl.sum(acc, axis=0) * inv_n)


@triton.jit
def _scale_kernel(g_ptr, scale_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    scale = tl.load(scale_ptr).to(tl.float32)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(g_ptr + offsets, (g * scale).to(g_ptr.dtype.element_ty), mask=mask)


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces through
# them without graph breaks; the autograd Function below composes them.
@torch.library.custom_op("liger_core::jsd_fwd", mutates_args=())
def _jsd_fwd(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    labels: torch.Tensor | None,
    inv_n: torch.Tensor,
    beta: float,
    ignore_index: int,
    compute_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, n_cols = student_logp.shape
    row_loss = torch.empty(n_rows, dtype=torch.float32, device=student_logp.device)
    dx = torch.empty_like(student_logp, memory_format=torch.contiguous_format) if compute_grad else None
    block, warps = looped_row_settings(n_cols)
    if n_rows:
        _jsd_fwd_kernel[(n_rows,)](
            student_logp,
            student_logp.stride(0),
            teacher_logp,
            teacher_logp.stride(0),
            labels,
            inv_n,
            row_loss,
            dx if dx is not None else row_loss,  # unused when COMPUTE_GRAD is False
            n_cols,
            float(beta),
            int(ignore_index),
            MODE=jsd_mode(beta),
            HAS_LABELS=labels is not None,
            COMPUTE_GRAD=compute_grad,
            BLOCK_SIZE=block,
            num_warps=warps,
        )
    return row_loss, dx if dx is not None else student_logp.new_empty(0)


@_jsd_fwd.register_fake
def _(student_logp, teacher_logp, labels, inv_n, beta, ignore_index, compute_grad):
    row_loss = student_logp.new_empty(student_logp.shape[0], dtype=torch.float32)
    dx = torch.empty_like(student_logp, memory_format=torch.contiguous_format)
    return row_loss, dx if compute_grad else student_logp.new_empty(0)


@torch.library.custom_op("liger_core::scale_", mutates_args=("grad",))
def _scale_(grad: torch.Tensor, scale: torch.Tensor) -> None:
    """``grad *= scale`` in place, in fp32 (scale is a 0-dim tensor on grad's device: no host sync)."""
    n = grad.numel()
    block, warps = 4096, 8
    if n:
        _scale_kernel[(triton.cdiv(n, block),)](grad, scale, n, BLOCK_SIZE=block, num_warps=warps)


@_scale_.register_fake
def _(grad, scale):
    return None


def scale_grads_(grad_output: torch.Tensor, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """Multiply gradients computed in forward by the incoming ``grad_output`` (a 0-dim tensor), in place.

    Skipped when grad_output is exactly 1 (``loss.backward()``): that check costs a host sync, which in eager
    mode is far cheaper than a pass over the gradients; under torch.compile they are always scaled. Scaling
    in place bumps the saved tensors' version, so a second backward through the same graph fails loudly
    (autograd's "modified by an inplace operation" error) instead of returning doubly scaled gradients.
    """
    if not torch.compiler.is_compiling() and grad_output.item() == 1.0:
        return grads
    scale = grad_output.detach().to(torch.float32)
    for g in grads:
        if g is not None:
            _scale_(g, scale)
    return grads


def inverse_kept_count(
    labels: torch.Tensor | None, ignore_index: int, n_rows: int, device: torch.device
) -> torch.Tensor:
    """1 / (rows whose label is not ignore_index) as an fp32 0-dim device tensor (1 when none is kept)."""
    if labels is None:
        return torch.full((), 1.0 / max(n_rows, 1), dtype=torch.float32, device=device)
    kept = (labels != ignore_index).sum().clamp_min(1)
    return kept.to(torch.float32).reciprocal()


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as (rows, last dim) with unit column stride (copied only when it cannot be)."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 or rows.shape[-1] == 1 else rows.contiguous()


def check_beta(beta: object) -> float:
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= float(beta) <= 1.0:
        raise ValueError(f"beta={beta!r} must be a number in [0, 1]")
    return float(beta)


def check_ignore_index(ignore_index: object) -> int:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    return ignore_index


def check_shift_labels(
    shift_labels: torch.Tensor | None, leading_shape: tuple[int, ...], ref_name: str, ref: torch.Tensor
) -> torch.Tensor | None:
    """Check ``shift_labels`` (shape: the inputs' leading dims, or flat); return it flat and contiguous."""
    if shift_labels is None:
        return None
    check_tensor("shift_labels", shift_labels, dtypes=INDEX_DTYPES)
    n_rows = 1
    for d in leading_shape:
        n_rows *= d
    if tuple(shift_labels.shape) != tuple(leading_shape) and tuple(shift_labels.shape) != (n_rows,):
        check_shape("shift_labels", shift_labels, leading_shape, f"one label per row of {ref_name}")
    check_same_device(ref_name, ref, shift_labels=shift_labels)
    return shift_labels.reshape(-1).contiguous()


class JSDFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, student_logp, teacher_logp, labels, beta, ignore_index):
        x, y = as_rows(student_logp), as_rows(teacher_logp.detach())
        inv_n = inverse_kept_count(labels, ignore_index, x.shape[0], x.device)
        compute_grad = ctx.needs_input_grad[0]
        row_loss, dx = _jsd_fwd(x, y, labels, inv_n, beta, ignore_index, compute_grad)
        if compute_grad:
            ctx.save_for_backward(dx)
        ctx.student_shape = student_logp.shape
        return row_loss.sum().to(student_logp.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        (dx,) = ctx.saved_tensors
        scale_grads_(grad_output, dx)
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
    ``shift_labels`` (shape (...) or flat) equal ``ignore_index`` are left out; with every row ignored the
    loss is 0 with zero gradients. Returns a 0-dim tensor in the inputs' dtype; only ``student_logp`` gets a
    gradient.
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

"""Fused linear + generalised JSD for distillation: neither the student's nor the teacher's logits ever exist
in full.

Math (``jsd`` is liger_core.ops.jsd's generalised JSD, beta weighting the teacher)::

    z_s = h_s @ W_s^T + b_s,  z_t = h_t @ W_t^T + b_t            (per token chunk, in the models' dtypes;
                                                                 the lm_head biases b are optional)
    x   = log_softmax(z_s / T),  y = log_softmax(z_t / T)        (inside the kernel, fp32 or float64 math)
    loss = sum over kept rows of JSD_beta(x, y) / n_kept         (float64 sums; no T^2 factor)
    dz_s = (dx - Q * sum_j dx_j) / T,  Q = e^x                   (softmax backward, dx = dJSD/dx / n_kept)
    dh_s = dz_s @ W_s,   dW_s = sum over chunks of dz_s^T @ h_s  (dW_s accumulated in fp32)
    db_s = sum over rows of dz_s                                 (fp32)

Tokens are processed in chunks of ``chunk_size`` rows: two matmuls give the chunk's student and teacher
logits, one kernel turns them into the chunk's loss rows and writes dz_s over the student logits (three
streaming passes per row: max and sum of exp, loss and sum of dx, then dz_s), and two more matmuls add the
chunk's dh_s and dW_s into fp32 buffers. All gradients are thus computed in forward; backward multiplies them
by grad_output and rounds them once to the parameters' dtype (no host sync, exact for any grad_output).
Peak extra memory: two (chunk_size x V) logits buffers and the fp32 gradients (for bf16 parameters the fp32
dW_s lives until backward, where the bf16 one is written from it). The teacher gets no gradient.

For fp32 models the kernel's math is float64 (the fp32 loss and dz_s are then exact to their last rounding;
fp32 log-probs would leave a few ulp of |log-prob| in every term), for bf16/fp16 models fp32. exp and log
are liger_core.ops.jsd's exp_precise / log_precise (about 1 ulp in fp32), and logits / T is a correctly
rounded division, as in the eager composition.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import check_same_device, check_shape, use_triton
from liger_core.ops._ce_math import RUNNING_MAX_START
from liger_core.ops._chunked_linear import (
    check_distill_tensors,
    check_head_biases,
    check_head_dtypes,
    distill_chunk_rows,
    gather_distill_heads,
)
from liger_core.ops._chunked_linear import default_chunk_rows as default_chunk_rows  # re-exported
from liger_core.ops._divergence_math import (
    as_rows,
    check_beta,
    check_ignore_index,
    check_shift_labels,
    check_temperature,
    exp_precise,
    jsd_mode,
    jsd_terms,
    kept_count,
    kept_rows,
    log_precise,
    row_tiles,
    tile_rows,
)
from liger_core.ops._launch import cdiv, elementwise_settings
from liger_core.sharding import any_dtensor

# cuBLAS matmuls of bf16/fp16 operands into an fp32 output (torch.addmm ``out_dtype``): torch >= 2.8
_CUDA_OUT_DTYPE_MM = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 8)


@triton.jit
def _scaled_logits(ptr, offsets, mask, temperature, DTYPE: tl.constexpr):
    """Logits / temperature in DTYPE, correctly rounded like the eager division; masked-off lanes are -inf."""
    z = tl.load(ptr + offsets, mask=mask, other=float("-inf")).to(DTYPE)
    if DTYPE == tl.float64:
        result = z / temperature  # IEEE division in float64
    else:
        result = tl.math.div_rn(z, tl.zeros_like(z) + temperature)  # div_rn does not broadcast
    return result


@triton.jit
def _fused_jsd_logits_kernel(
    zs_ptr,  # student logits of the chunk; overwritten with d loss / d logits when COMPUTE_GRAD
    zs_row_stride,
    zt_ptr,  # teacher logits of the chunk
    zt_row_stride,
    labels_ptr,
    params_ptr,  # float64 [temperature, beta, 1 / (n_kept * temperature)]
    loss_ptr,  # per-row JSD, float64 (the caller divides the sum by n_kept)
    n_rows,
    n_cols,
    ignore_index,
    MODE: tl.constexpr,
    HAS_LABELS: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    STATS: tl.constexpr,  # dtype of the math after the loads: float64 (fp32 logits) or float32
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    keep = kept_rows(labels_ptr, rows, row_mask, ignore_index, HAS_LABELS)
    cols = tl.arange(0, BLOCK_N)
    zs_row = zs_ptr + rows[:, None] * zs_row_stride
    zt_row = zt_ptr + rows[:, None] * zt_row_stride
    temperature = tl.load(params_ptr).to(STATS)
    beta = tl.load(params_ptr + 1).to(STATS)

    # Pass 1: online max and sum of exp of both rows of scaled logits. Ignored rows are never read (their
    # lanes are -inf: the sums stay 0, replaced below).
    max_s = tl.full([BLOCK_M], RUNNING_MAX_START, STATS)  # not -inf: see cross_entropy.RUNNING_MAX_START
    max_t = tl.full([BLOCK_M], RUNNING_MAX_START, STATS)
    sum_s = tl.zeros([BLOCK_M], dtype=STATS)
    sum_t = tl.zeros([BLOCK_M], dtype=STATS)
    for start in range(0, n_cols, BLOCK_N):
        offsets = (start + cols)[None, :]
        mask = keep[:, None] & (offsets < n_cols)
        zs = _scaled_logits(zs_row, offsets, mask, temperature, STATS)
        zt = _scaled_logits(zt_row, offsets, mask, temperature, STATS)
        new_max_s = tl.maximum(max_s, tl.max(zs, axis=1))
        new_max_t = tl.maximum(max_t, tl.max(zt, axis=1))
        sum_s = sum_s * exp_precise(max_s - new_max_s) + tl.sum(exp_precise(zs - new_max_s[:, None]), axis=1)
        sum_t = sum_t * exp_precise(max_t - new_max_t) + tl.sum(exp_precise(zt - new_max_t[:, None]), axis=1)
        max_s = new_max_s
        max_t = new_max_t
    # Ignored rows: finite stand-ins, so that their (all -inf) lanes give exactly zero loss and gradient.
    max_s = tl.where(keep, max_s, 0.0)[:, None]
    max_t = tl.where(keep, max_t, 0.0)[:, None]
    # log_softmax = (z - max) - log(sum), as torch computes it: max + log(sum) is never rounded as one number
    log_sum_s = log_precise(tl.where(keep, sum_s, 1.0))[:, None]
    log_sum_t = log_precise(tl.where(keep, sum_t, 1.0))[:, None]

    # Pass 2: the rows' loss, and sum_j dx_j for the softmax backward.
    loss_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float64)
    dx_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=STATS)
    for start in range(0, n_cols, BLOCK_N):
        offsets = (start + cols)[None, :]
        mask = keep[:, None] & (offsets < n_cols)
        x = (_scaled_logits(zs_row, offsets, mask, temperature, STATS) - max_s) - log_sum_s
        y = (_scaled_logits(zt_row, offsets, mask, temperature, STATS) - max_t) - log_sum_t
        loss, dx = jsd_terms(x, y, beta, MODE)
        loss_acc += loss.to(tl.float64)
        dx_acc += dx
    tl.store(loss_ptr + rows, tl.sum(loss_acc, axis=1), mask=row_mask)

    # Pass 3: dlogits = (dx - Q * sum(dx)) / (T * n_kept), written over the student logits (ignored rows get
    # zeros: their buffer rows hold logits).
    if COMPUTE_GRAD:
        grad_scale = tl.load(params_ptr + 2).to(STATS)
        dx_sum = tl.sum(dx_acc, axis=1)[:, None]
        for start in range(0, n_cols, BLOCK_N):
            offsets = (start + cols)[None, :]
            col_mask = offsets < n_cols
            mask = keep[:, None] & col_mask
            x = (_scaled_logits(zs_row, offsets, mask, temperature, STATS) - max_s) - log_sum_s
            y = (_scaled_logits(zt_row, offsets, mask, temperature, STATS) - max_t) - log_sum_t
            _, dx = jsd_terms(x, y, beta, MODE)
            dz = tl.where(keep[:, None], (dx - exp_precise(x) * dx_sum) * grad_scale, 0.0)
            tl.store(zs_row + offsets, dz.to(zs_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask)


@triton.jit
def _scale_kernel(src_ptr, dst_ptr, scale_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """dst = src * scale (fp32 math, one rounding to dst's dtype); dst may be src."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    scale = tl.load(scale_ptr).to(tl.float32)
    g = tl.load(src_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst_ptr + offsets, (g * scale).to(dst_ptr.dtype.element_ty), mask=mask)


def _launch_scale(src: torch.Tensor, dst: torch.Tensor, scale: torch.Tensor) -> None:
    n = src.numel()
    block, warps = elementwise_settings(n)
    if n:
        _scale_kernel[(cdiv(n, block),)](src, dst, scale, n, BLOCK_SIZE=block, num_warps=warps)


def _add_mm_fp32_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` into an fp32 accumulator, a and b in the model dtype (no fp32 copies on the GPU)."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
    elif acc.is_cuda and _CUDA_OUT_DTYPE_MM and torch.cuda.get_device_capability(acc.device)[0] >= 8:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)  # cuBLAS accumulates into fp32 C in place
    else:
        acc.addmm_(a.float(), b.float())


@torch.library.custom_op("liger_core::fused_linear_jsd_fwd", mutates_args=())
def _fused_linear_jsd_fwd(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    labels: torch.Tensor | None,
    beta: float,
    ignore_index: int,
    temperature: float,
    chunk_size: int,
    grad_hidden: bool,
    grad_weight: bool,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    grad_bias: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp32 0-dim loss, fp32 d loss/d student_hidden, fp32 d loss/d student_weight, fp32 d loss/d
    student_bias); the gradients are empty when not asked for. They stay fp32 until backward folds
    grad_output in and rounds them once. The biases (V,) are added to the chunk's logits by the GEMM
    (``addmm``, as ``F.linear``: one rounding of the biased logits)."""
    n_rows = student_hidden.shape[0]
    vocab = student_weight.shape[0]
    device = student_hidden.device
    grad_bias = grad_bias and student_bias is not None
    compute_grad = grad_hidden or grad_weight or grad_bias
    row_loss = torch.empty(n_rows, dtype=torch.float64, device=device)
    n_kept = kept_count(labels, ignore_index, n_rows, device).double()
    # float64 [T, beta, 1 / (n_kept * T)]: exact for float64 math, each rounded once for fp32 math (eager
    # rounds g / n_kept, then / T)
    params = torch.stack(
        [torch.full_like(n_kept, temperature), torch.full_like(n_kept, beta), 1.0 / (n_kept * temperature)]
    )
    # zero-filled: the chunk matmuls accumulate into them (one cuBLAS pattern for both, fp32 output in place)
    dh = torch.zeros(student_hidden.shape, dtype=torch.float32, device=device) if grad_hidden else None
    dw = torch.zeros(student_weight.shape, dtype=torch.float32, device=device) if grad_weight else None
    db = torch.zeros((vocab,), dtype=torch.float32, device=device) if grad_bias else None

    chunk_size = max(1, min(chunk_size, n_rows))
    zs_buffer = torch.empty((chunk_size, vocab), dtype=student_hidden.dtype, device=device)
    zt_buffer = torch.empty((chunk_size, vocab), dtype=teacher_hidden.dtype, device=device)
    tiles = row_tiles(chunk_size, vocab, device)
    # fp32 logits: float64 math, so that the fp32 loss and dlogits are exact to their last rounding (fp32
    # log-probs would leave a few ulp of |log-prob| in every term); bf16/fp16 logits: their own rounding
    # dominates, fp32 math is plenty
    stats_dtype = tl.float64 if student_hidden.dtype == torch.float32 else tl.float32
    for start in range(0, n_rows, chunk_size):
        end = min(start + chunk_size, n_rows)
        hs = student_hidden[start:end]
        zs = zs_buffer[: end - start]
        zt = zt_buffer[: end - start]
        if student_bias is None:
            torch.mm(hs, student_weight.t(), out=zs)
        else:
            torch.addmm(student_bias, hs, student_weight.t(), out=zs)
        if teacher_bias is None:
            torch.mm(teacher_hidden[start:end], teacher_weight.t(), out=zt)
        else:
            torch.addmm(teacher_bias, teacher_hidden[start:end], teacher_weight.t(), out=zt)
        _fused_jsd_logits_kernel[tiles.grid(end - start)](
            zs,
            zs.stride(0),
            zt,
            zt.stride(0),
            labels[start:end] if labels is not None else None,
            params,
            row_loss[start:end],
            end - start,
            vocab,
            ignore_index,
            MODE=jsd_mode(beta),
            HAS_LABELS=labels is not None,
            COMPUTE_GRAD=compute_grad,
            STATS=stats_dtype,
            BLOCK_M=tiles.block_m,
            BLOCK_N=tiles.block_n,
            num_warps=tiles.num_warps,
        )
        if dh is not None:  # zs now holds d loss / d logits
            _add_mm_fp32_(dh[start:end], zs, student_weight)
        if dw is not None:
            _add_mm_fp32_(dw, zs.t(), hs)
        if db is not None:  # ignored rows hold dz = 0
            db.add_(zs.sum(0, dtype=torch.float32))
    del zs_buffer, zt_buffer
    # outputs of a custom op may not alias each other: a fresh empty tensor per gradient not asked for
    dh = dh if dh is not None else student_hidden.new_empty(0, dtype=torch.float32)
    dw = dw if dw is not None else student_hidden.new_empty(0, dtype=torch.float32)
    db = db if db is not None else student_hidden.new_empty(0, dtype=torch.float32)
    return (row_loss.sum() / n_kept).to(torch.float32), dh, dw, db


@_fused_linear_jsd_fwd.register_fake
def _(
    student_hidden,
    student_weight,
    teacher_hidden,
    teacher_weight,
    labels,
    beta,
    ignore_index,
    temperature,
    chunk_size,
    grad_hidden,
    grad_weight,
    student_bias=None,
    teacher_bias=None,
    grad_bias=False,
):
    loss = student_hidden.new_empty((), dtype=torch.float32)
    empty = (0,)
    dh = student_hidden.new_empty(student_hidden.shape if grad_hidden else empty, dtype=torch.float32)
    dw = student_hidden.new_empty(student_weight.shape if grad_weight else empty, dtype=torch.float32)
    grad_bias = grad_bias and student_bias is not None
    db = student_hidden.new_empty(student_weight.shape[:1] if grad_bias else empty, dtype=torch.float32)
    return loss, dh, dw, db


@torch.library.custom_op("liger_core::fused_linear_jsd_scale_", mutates_args=("grad",))
def _scale_(grad: torch.Tensor, scale: torch.Tensor) -> None:
    """``grad *= scale`` in place (fp32 gradients of fp32 parameters)."""
    _launch_scale(grad, grad, scale)


@_scale_.register_fake
def _(grad, scale):
    return None


@torch.library.custom_op("liger_core::fused_linear_jsd_scale_to", mutates_args=())
def _scale_to(grad: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(grad * scale).to(dtype)``, one rounding (fp32 gradients of bf16/fp16 parameters)."""
    out = torch.empty(grad.shape, dtype=dtype, device=grad.device)
    _launch_scale(grad, out, scale)
    return out


@_scale_to.register_fake
def _(grad, scale, dtype):
    return grad.new_empty(grad.shape, dtype=dtype)


def _finish_grad(grad32: torch.Tensor | None, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """grad_output times the fp32 gradient from forward, in the parameter's dtype: one rounding, no host sync.
    For fp32 parameters it scales in place, so a second backward through the same graph fails loudly
    (autograd's "modified by an inplace operation") instead of returning a doubly scaled gradient."""
    if grad32 is None:
        return None
    if dtype == torch.float32:
        _scale_(grad32, scale)
        return grad32
    return _scale_to(grad32, scale, dtype)


class FusedLinearJSDFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        labels,
        beta,
        ignore_index,
        temperature,
        chunk_size,
        student_bias,
        teacher_bias,
    ):
        hs = as_rows(student_hidden)
        ht = as_rows(teacher_hidden.detach())
        grad_hidden, grad_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_bias = ctx.needs_input_grad[9]
        loss, dh, dw, db = _fused_linear_jsd_fwd(
            hs,
            student_weight,
            ht,
            teacher_weight.detach(),
            labels,
            beta,
            ignore_index,
            temperature,
            chunk_size,
            grad_hidden,
            grad_weight,
            student_bias,
            teacher_bias.detach() if teacher_bias is not None else None,
            grad_bias,
        )
        ctx.save_for_backward(
            dh if grad_hidden else None, dw if grad_weight else None, db if grad_bias else None
        )
        ctx.hidden_shape, ctx.hidden_dtype = student_hidden.shape, student_hidden.dtype
        ctx.weight_dtype = student_weight.dtype
        ctx.bias_dtype = student_bias.dtype if student_bias is not None else None
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        dh, dw, db = ctx.saved_tensors
        scale = grad_output.detach().to(torch.float32)
        dh = _finish_grad(dh, scale, ctx.hidden_dtype)
        dw = _finish_grad(dw, scale, ctx.weight_dtype)
        db = _finish_grad(db, scale, ctx.bias_dtype)
        return (
            dh.view(ctx.hidden_shape) if dh is not None else None,
            dw,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            db,
            None,
        )


def fused_linear_jsd(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    shift_labels: torch.Tensor | None = None,
    beta: float = 0.5,
    ignore_index: int = -100,
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Generalised JSD between ``softmax((student_hidden @ student_weight^T + student_bias) / T)`` and the
    teacher's distribution, averaged over rows whose ``shift_labels`` is not ``ignore_index``, computed in
    token chunks so that neither model's (tokens x vocab) logits are ever materialised.

    student_hidden (..., Hs), student_weight (V, Hs), teacher_hidden (..., Ht), teacher_weight (V, Ht): the
    hidden sizes may differ, the vocabularies may not; student_bias, teacher_bias (V,): the lm_heads' optional
    biases (dtypes of their weights). Returns an fp32 0-dim loss; gradients flow to student_hidden,
    student_weight and student_bias only (student_weight's and student_bias's accumulated in fp32).
    ``chunk_size`` (rows per chunk) defaults to a size whose logits buffers fit in 512 MiB. Inputs of any
    strides. As ``jsd``: with no rows, or every row ignored, the loss is 0 with zero gradients; a -inf logit
    (a masked vocabulary entry)
    has probability 0 and contributes 0; NaN or +inf logits make the loss NaN.
    """
    if any_dtensor(
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        shift_labels,
        student_bias,
        teacher_bias,
    ):
        inputs = {"student_hidden": student_hidden, "teacher_hidden": teacher_hidden}
        student_weight, teacher_weight, student_bias, teacher_bias = gather_distill_heads(
            "fused_linear_jsd", dict(inputs, shift_labels=shift_labels), student_weight, teacher_weight,
            student_bias, teacher_bias,
        )  # fmt: skip
    hidden_s, hidden_t = check_distill_tensors(student_hidden, student_weight, teacher_hidden, teacher_weight)
    vocab = student_weight.shape[0]
    if student_weight.shape[1] != hidden_s:
        raise ValueError(
            f"student_weight has shape {tuple(student_weight.shape)}; expected (vocab, {hidden_s}) to match "
            f"student_hidden's hidden size {hidden_s}"
        )
    if teacher_weight.shape[1] != hidden_t:
        raise ValueError(
            f"teacher_weight has shape {tuple(teacher_weight.shape)}; expected (vocab, {hidden_t}) to match "
            f"teacher_hidden's hidden size {hidden_t}"
        )
    if teacher_weight.shape[0] != vocab:
        raise ValueError(
            f"teacher_weight has vocabulary size {teacher_weight.shape[0]} but student_weight has {vocab}; "
            "student and teacher must share one vocabulary"
        )
    if vocab == 0:
        raise ValueError("student_weight has an empty vocabulary (first) dimension")
    check_shape(
        "teacher_hidden",
        teacher_hidden,
        tuple(student_hidden.shape[:-1]) + (hidden_t,),
        "one teacher hidden state per student token",
    )
    check_head_dtypes(student_hidden, student_weight, teacher_hidden, teacher_weight)
    check_head_biases(student_bias, student_weight, teacher_bias, teacher_weight)
    biases = {
        k: v for k, v in (("student_bias", student_bias), ("teacher_bias", teacher_bias)) if v is not None
    }
    check_same_device(
        "student_hidden",
        student_hidden,
        student_weight=student_weight,
        teacher_hidden=teacher_hidden,
        teacher_weight=teacher_weight,
        **biases,
    )
    beta = check_beta(beta)
    ignore_index = check_ignore_index(ignore_index)
    temperature = check_temperature(temperature)
    labels = check_shift_labels(
        shift_labels, tuple(student_hidden.shape[:-1]), "student_hidden", student_hidden
    )
    n_rows = math.prod(student_hidden.shape[:-1])
    chunk_size = distill_chunk_rows(chunk_size, n_rows, vocab, student_hidden, teacher_hidden)
    if not use_triton(student_hidden):
        return reference.fused_linear_jsd(
            student_hidden,
            student_weight,
            teacher_hidden,
            teacher_weight,
            shift_labels,
            beta,
            ignore_index,
            temperature,
            student_bias=student_bias,
            teacher_bias=teacher_bias,
        )
    return FusedLinearJSDFunction.apply(
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        labels,
        beta,
        ignore_index,
        temperature,
        chunk_size,
        student_bias,
        teacher_bias,
    )


def fused_linear_kl_div(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    shift_labels: torch.Tensor | None = None,
    ignore_index: int = -100,
    temperature: float = 1.0,
    *,
    reverse: bool = False,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """KL divergence between the teacher's and the student's next-token distributions, fused with both
    lm_head projections: with ``Q = softmax(student_hidden @ student_weight^T / T)`` and ``P`` the teacher's,
    ``KL(P || Q)`` per token (``torch.nn.functional.kl_div(log Q, log P, log_target=True)``, the forward KL
    of distillation), or ``KL(Q || P)`` with ``reverse=True``, averaged over the rows whose ``shift_labels``
    is not ``ignore_index``.

    Exactly ``fused_linear_jsd`` with ``beta = 0`` (forward) or ``beta = 1`` (reverse): the generalised JSD
    takes its two endpoints as the KLs by name, in the same kernel. Shapes, dtypes, gradients (student only)
    and the no-kept-row convention are fused_linear_jsd's.
    """
    if not isinstance(reverse, bool):
        raise TypeError(f"reverse must be a bool, got {type(reverse).__name__}")
    return fused_linear_jsd(
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        shift_labels,
        1.0 if reverse else 0.0,
        ignore_index,
        temperature,
        chunk_size=chunk_size,
    )

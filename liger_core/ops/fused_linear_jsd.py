"""Fused linear + generalised JSD for distillation: neither the student's nor the teacher's logits ever exist
in full.

Math (``jsd`` is liger_core.ops.jsd's generalised JSD, beta weighting the teacher)::

    z_s = h_s @ W_s^T,  z_t = h_t @ W_t^T                        (per token chunk, in the models' dtypes)
    x   = log_softmax(z_s / T),  y = log_softmax(z_t / T)        (fp32, inside the kernel)
    loss = sum over kept rows of JSD_beta(x, y) / n_kept         (fp32; not rescaled by T^2)
    dz_s = (dx - Q * sum_j dx_j) / T,  Q = e^x                   (softmax backward, dx = dJSD/dx / n_kept)
    dh_s = dz_s @ W_s,   dW_s = sum over chunks of dz_s^T @ h_s  (dW_s accumulated in fp32)

Tokens are processed in chunks of ``chunk_size`` rows: two matmuls give the chunk's student and teacher
logits, one kernel turns them into the chunk's loss rows and writes dz_s over the student logits (three
streaming passes per row: log-sum-exps, loss and sum of dx, then dz_s), and two more matmuls give the chunk's
dh_s and add its dW_s. All gradients are thus computed in forward; backward only scales them by grad_output
(skipped when it is 1). Peak extra memory: two (chunk_size x V) logits buffers, the fp32 dW_s accumulator and
the gradients themselves. The teacher (hidden states and weight) gets no gradient.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import check_same_device, check_shape, check_tensor, use_triton
from liger_core.ops.jsd import (
    as_rows,
    check_beta,
    check_ignore_index,
    check_shift_labels,
    inverse_kept_count,
    jsd_mode,
    jsd_terms,
    looped_row_settings,
    scale_grads_,
)

# Budget for the two per-chunk logits buffers (student + teacher): 512 MiB is 1024 rows of a 128256-entry
# bf16 vocabulary, enough rows for the chunk matmuls to run near peak, and small next to the fp32 dW.
CHUNK_LOGITS_BYTES = 512 * 2**20
MIN_CHUNK_ROWS = 16

_TORCH_VERSION = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])


def default_chunk_rows(n_rows: int, vocab: int, bytes_per_logit_pair: int) -> int:
    """Rows per chunk: a power of two whose two logits buffers fit CHUNK_LOGITS_BYTES (at most n_rows)."""
    fit = max(1, CHUNK_LOGITS_BYTES // max(1, vocab * bytes_per_logit_pair))
    rows = max(MIN_CHUNK_ROWS, 2 ** int(math.log2(fit)))
    return max(1, min(n_rows, rows))


@triton.jit
def _scaled_logits(ptr, offsets, mask, inv_temperature):
    """Logits / temperature in fp32; masked-off lanes are -inf (probability 0)."""
    return tl.load(ptr + offsets, mask=mask, other=float("-inf")).to(tl.float32) * inv_temperature


@triton.jit
def _fused_jsd_logits_kernel(
    zs_ptr,  # student logits of the chunk; overwritten with dloss/dlogits when COMPUTE_GRAD
    zs_row_stride,
    zt_ptr,  # teacher logits of the chunk
    zt_row_stride,
    labels_ptr,
    inv_n_ptr,
    loss_ptr,
    n_cols,
    inv_temperature,
    beta,
    ignore_index,
    MODE: tl.constexpr,
    HAS_LABELS: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    zs_ptr += row * zs_row_stride
    zt_ptr += row * zt_row_stride
    cols = tl.arange(0, BLOCK_SIZE)
    if HAS_LABELS:
        if tl.load(labels_ptr + row) == ignore_index:
            tl.store(loss_ptr + row, 0.0)
            if COMPUTE_GRAD:  # the buffer holds logits: an ignored row's gradient must be written as 0
                zeros = tl.zeros([BLOCK_SIZE], dtype=zs_ptr.dtype.element_ty)
                for start in range(0, n_cols, BLOCK_SIZE):
                    tl.store(zs_ptr + start + cols, zeros, mask=start + cols < n_cols)
            return

    # Pass 1: online log-sum-exp of both rows of scaled logits.
    max_s = float("-inf")
    max_t = float("-inf")
    sum_s = 0.0
    sum_t = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + cols
        mask = offsets < n_cols
        zs = _scaled_logits(zs_ptr, offsets, mask, inv_temperature)
        zt = _scaled_logits(zt_ptr, offsets, mask, inv_temperature)
        new_max_s = tl.maximum(max_s, tl.max(zs, axis=0))
        new_max_t = tl.maximum(max_t, tl.max(zt, axis=0))
        sum_s = sum_s * tl.exp(max_s - new_max_s) + tl.sum(tl.exp(zs - new_max_s), axis=0)
        sum_t = sum_t * tl.exp(max_t - new_max_t) + tl.sum(tl.exp(zt - new_max_t), axis=0)
        max_s = new_max_s
        max_t = new_max_t
    lse_s = max_s + tl.log(sum_s)
    lse_t = max_t + tl.log(sum_t)

    # Pass 2: the row's loss, and sum_j dx_j for the softmax backward.
    loss_acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    dx_acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + cols
        mask = offsets < n_cols
        x = _scaled_logits(zs_ptr, offsets, mask, inv_temperature) - lse_s
        y = _scaled_logits(zt_ptr, offsets, mask, inv_temperature) - lse_t
        loss, dx = jsd_terms(x, y, beta, MODE)
        loss_acc += loss
        dx_acc += dx
    inv_n = tl.load(inv_n_ptr)
    tl.store(loss_ptr + row, tl.sum(loss_acc, axis=0) * inv_n)

    # Pass 3: dlogits = (dx - Q * sum(dx)) / (T * n_kept), written over the student logits.
    if COMPUTE_GRAD:
        dx_sum = tl.sum(dx_acc, axis=0)
        grad_scale = inv_temperature * inv_n
        for start in range(0, n_cols, BLOCK_SIZE):
            offsets = start + cols
            mask = offsets < n_cols
            x = _scaled_logits(zs_ptr, offsets, mask, inv_temperature) - lse_s
            y = _scaled_logits(zt_ptr, offsets, mask, inv_temperature) - lse_t
            _, dx = jsd_terms(x, y, beta, MODE)
            dz = (dx - tl.exp(x) * dx_sum) * grad_scale
            tl.store(zs_ptr + offsets, dz.to(zs_ptr.dtype.element_ty), mask=mask)


def _add_matmul_fp32_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` with an fp32 accumulator and a, b in the model dtype, without an fp32 copy of a."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
    elif acc.is_cuda and _TORCH_VERSION >= (2, 8) and torch.cuda.get_device_capability(acc.device)[0] >= 8:
        # cuBLAS reads bf16/fp16 operands and accumulates into the fp32 output in place
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:  # CPU (no out_dtype kernel) and old GPUs: upcast the operands
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp32 0-dim loss, d loss/d student_hidden, d loss/d student_weight); empty when not asked for."""
    n_rows = student_hidden.shape[0]
    vocab = student_weight.shape[0]
    device = student_hidden.device
    compute_grad = grad_hidden or grad_weight
    row_loss = torch.empty(n_rows, dtype=torch.float32, device=device)
    inv_n = inverse_kept_count(labels, ignore_index, n_rows, device)
    dh = torch.empty_like(student_hidden, memory_format=torch.contiguous_format) if grad_hidden else None
    dw_acc = torch.zeros(student_weight.shape, dtype=torch.float32, device=device) if grad_weight else None

    chunk_size = max(1, min(chunk_size, n_rows))
    zs_buffer = torch.empty((chunk_size, vocab), dtype=student_hidden.dtype, device=device)
    zt_buffer = torch.empty((chunk_size, vocab), dtype=teacher_hidden.dtype, device=device)
    block, warps = looped_row_settings(vocab)
    for start in range(0, n_rows, chunk_size):
        end = min(start + chunk_size, n_rows)
        hs = student_hidden[start:end]
        zs = zs_buffer[: end - start]
        zt = zt_buffer[: end - start]
        torch.mm(hs, student_weight.t(), out=zs)
        torch.mm(teacher_hidden[start:end], teacher_weight.t(), out=zt)
        _fused_jsd_logits_kernel[(end - start,)](
            zs,
            zs.stride(0),
            zt,
            zt.stride(0),
            labels[start:end] if labels is not None else None,
            inv_n,
            row_loss[start:end],
            vocab,
            1.0 / temperature,
            beta,
            ignore_index,
            MODE=jsd_mode(beta),
            HAS_LABELS=labels is not None,
            COMPUTE_GRAD=compute_grad,
            BLOCK_SIZE=block,
            num_warps=warps,
        )
        if dh is not None:
            torch.mm(zs, student_weight, out=dh[start:end])
        if dw_acc is not None:
            _add_matmul_fp32_(dw_acc, zs.t(), hs)
    del zs_buffer, zt_buffer

    dw = None
    if dw_acc is not None:
        dw = dw_acc if student_weight.dtype == torch.float32 else dw_acc.to(student_weight.dtype)
        del dw_acc
    # outputs of a custom op may not alias each other: one fresh empty tensor per gradient not asked for
    dh = dh if dh is not None else student_hidden.new_empty(0)
    dw = dw if dw is not None else student_hidden.new_empty(0)
    return row_loss.sum(), dh, dw


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
):
    loss = student_hidden.new_empty((), dtype=torch.float32)
    dh = torch.empty_like(student_hidden) if grad_hidden else student_hidden.new_empty(0)
    dw = torch.empty_like(student_weight) if grad_weight else student_hidden.new_empty(0)
    return loss, dh, dw


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
    ):
        hs = as_rows(student_hidden)
        ht = as_rows(teacher_hidden.detach())
        grad_hidden, grad_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        loss, dh, dw = _fused_linear_jsd_fwd(
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
        )
        ctx.grad_hidden, ctx.grad_weight = grad_hidden, grad_weight
        ctx.hidden_shape = student_hidden.shape
        ctx.save_for_backward(dh if grad_hidden else None, dw if grad_weight else None)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        dh, dw = ctx.saved_tensors
        scale_grads_(grad_output, dh, dw)
        dh = dh.view(ctx.hidden_shape) if dh is not None else None
        return dh, dw, None, None, None, None, None, None, None


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
) -> torch.Tensor:
    """Generalised JSD between ``softmax(student_hidden @ student_weight^T / T)`` and the teacher's
    distribution, averaged over rows whose ``shift_labels`` is not ``ignore_index``, computed in token chunks
    so that neither model's (tokens x vocab) logits are ever materialised.

    student_hidden (..., Hs), student_weight (V, Hs), teacher_hidden (..., Ht), teacher_weight (V, Ht): the
    hidden sizes may differ, the vocabularies may not. Returns an fp32 0-dim loss; gradients flow to
    student_hidden and student_weight only (student_weight's is accumulated in fp32). ``chunk_size`` (rows per
    chunk) defaults to a size whose logits buffers fit in 512 MiB.
    """
    check_tensor("student_hidden", student_hidden, min_ndim=1)
    check_tensor("student_weight", student_weight, ndim=2)
    check_tensor("teacher_hidden", teacher_hidden, min_ndim=1)
    check_tensor("teacher_weight", teacher_weight, ndim=2)
    hidden_s, hidden_t = student_hidden.shape[-1], teacher_hidden.shape[-1]
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
    for name, t, ref_name, ref in (
        ("student_weight", student_weight, "student_hidden", student_hidden),
        ("teacher_weight", teacher_weight, "teacher_hidden", teacher_hidden),
    ):
        if t.dtype != ref.dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but {ref_name} has dtype {ref.dtype}; they must match"
            )
    check_same_device(
        "student_hidden",
        student_hidden,
        student_weight=student_weight,
        teacher_hidden=teacher_hidden,
        teacher_weight=teacher_weight,
    )
    beta = check_beta(beta)
    ignore_index = check_ignore_index(ignore_index)
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not (0.0 < float(temperature) < math.inf)
    ):
        raise ValueError(f"temperature={temperature!r} must be a positive finite number")
    temperature = float(temperature)
    labels = check_shift_labels(
        shift_labels, tuple(student_hidden.shape[:-1]), "student_hidden", student_hidden
    )
    n_rows = math.prod(student_hidden.shape[:-1])
    if chunk_size is None:
        chunk_size = default_chunk_rows(
            n_rows, vocab, student_hidden.element_size() + teacher_hidden.element_size()
        )
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive int")
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
    )

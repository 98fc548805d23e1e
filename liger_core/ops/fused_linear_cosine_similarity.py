"""Fused linear + cosine-similarity distillation (Liger-Kernel's ``LigerFusedLinearCosineSimilarityLoss``):
a hard cross-entropy on the labels plus a soft term pulling the student's logit vector towards the teacher's,
computed in token chunks so that neither model's logits exist in full.

Math, per token i whose target is not ``ignore_index`` (n of them, at least 1)::

    z_s = h_s W_s^T + b_s  (V_s entries),   z_t = h_t W_t^T + b_t  (V_t >= V_s entries; the student's
                                            vector is taken as padded with zeros to V_t, as Liger-Kernel's)
    hard_i = logsumexp(z_s) - z_s[y_i]                       (no temperature)
    cos_i  = <z_s, z_t> / (|z_s| |z_t|)                      (0 where a norm is 0)
    soft_i = beta * (1 - cos_i)
    loss   = weight_hard_loss * sum_i hard_i / n + weight_soft_loss * sum_i soft_i / n

    dz_s = weight_hard_loss / n * (softmax(z_s) - onehot(y))
         + weight_soft_loss * beta / n * (cos * z_s / |z_s|^2 - z_t / (|z_s| |z_t|))     (first V_s entries)

Liger-Kernel divides both logits by ``temperature`` before the cosine; the cosine is scale-invariant, so the
kernel computes it on the logits themselves (the exact value, with no rounding of the divisions and no
overflow for small temperatures). Where a row's norm is 0 the cosine is taken as 0 (soft_i = beta) with a
zero gradient (Liger-Kernel's clamped normalisation gives a gradient of order 1e20 there). NaN or +-inf
logits make the loss NaN.

Per chunk: two GEMMs give the chunk's student and teacher logits, one kernel streams both rows once for the
norms, the dot product and the online log-sum-exp (and the target logit), writes each row's soft and hard
terms, and streams them again to write dz_s over the student logits; then the chunk's dh_s, dW_s and db_s are
accumulated (fp64 dh_s and db_s for fp32 models, fp32 otherwise; fp32 dW_s). Backward multiplies them by
grad_output and rounds once. Kernel math is float64 for fp32 logits and fp32 for bf16/fp16 ones.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import INDEX_DTYPES, check_same_device, check_shape, check_tensor, use_triton
from liger_core.ops._ce_math import (
    RUNNING_MAX_START,
    check_targets_host,
    finish_target_check,
    start_target_check,
    target_stats,
)
from liger_core.ops._chunked_linear import (
    _mm_accumulate,
    check_distill_tensors,
    check_head_biases,
    check_head_dtypes,
    distill_chunk_rows,
    gather_distill_heads,
    hidden_grad_into,
    linear_into,
)
from liger_core.ops._divergence_math import (
    as_rows,
    check_ignore_index,
    compute_dtype,
    exp_precise,
    log_precise,
    row_tiles,
    tile_rows,
)
from liger_core.sharding import any_dtensor


@triton.jit
def _sqrt_rn(x):
    """Correctly rounded square root (an fp32 ``tl.sqrt`` is sqrt.approx on NVIDIA GPUs)."""
    if x.dtype == tl.float64:
        result = tl.sqrt(x)  # sqrt.rn.f64
    else:
        result = tl.sqrt_rn(x)
    return result


@triton.jit
def _cosine_ce_rows_kernel(
    zs_ptr,  # student logits of the chunk (V_s columns); overwritten with d loss / d logits when COMPUTE_GRAD
    zs_row_stride,
    zt_ptr,  # teacher logits of the chunk (V_t >= V_s columns)
    zt_row_stride,
    labels_ptr,
    params_ptr,  # float64 [weight_hard_loss / n, weight_soft_loss * beta / n, beta]
    soft_ptr,  # per-row beta * (1 - cos), float64
    hard_ptr,  # per-row cross-entropy, float64
    n_rows,
    n_cols_s,
    n_cols_t,
    ignore_index,
    HAS_HARD: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    STATS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    y = tl.load(labels_ptr + rows, mask=row_mask, other=ignore_index).to(tl.int64)
    keep = row_mask & (y != ignore_index)
    # clamped: an out-of-range target is reported by the host check, never read out of bounds
    y_safe = tl.minimum(tl.maximum(y, 0), n_cols_s - 1)
    cols = tl.arange(0, BLOCK_N)
    zs_row = zs_ptr + rows[:, None] * zs_row_stride
    zt_row = zt_ptr + rows[:, None] * zt_row_stride
    beta = tl.load(params_ptr + 2).to(STATS)

    # Pass 1: |z_s|^2, |z_t|^2, <z_s, z_t>, and the online max / sum of exp of z_s. Ignored rows are never
    # read (all their sums stay 0; their outputs are written as 0 below).
    ss = tl.zeros([BLOCK_M], dtype=STATS)
    tt = tl.zeros([BLOCK_M], dtype=STATS)
    st = tl.zeros([BLOCK_M], dtype=STATS)
    row_max = tl.full([BLOCK_M], RUNNING_MAX_START, STATS)
    sum_exp = tl.zeros([BLOCK_M], dtype=STATS)
    for start in range(0, n_cols_t, BLOCK_N):
        offsets = (start + cols)[None, :]
        s_mask = keep[:, None] & (offsets < n_cols_s)
        s = tl.load(zs_row + offsets, mask=s_mask, other=0.0).to(STATS)
        t = tl.load(zt_row + offsets, mask=keep[:, None] & (offsets < n_cols_t), other=0.0).to(STATS)
        ss += tl.sum(s * s, axis=1)
        tt += tl.sum(t * t, axis=1)
        st += tl.sum(s * t, axis=1)
        if HAS_HARD:
            s_inf = tl.where(s_mask, s, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(s_inf, axis=1))
            sum_exp = sum_exp * exp_precise(row_max - new_max) + tl.sum(
                exp_precise(s_inf - new_max[:, None]), axis=1
            )
            row_max = new_max
    denom = _sqrt_rn(ss) * _sqrt_rn(tt)
    zero = denom == 0.0  # a NaN denominator is not: the NaN reaches the loss
    inv_denom = 1.0 / tl.where(zero, 1.0, denom)
    cos = tl.where(zero, 0.0, st * inv_denom)
    soft = tl.where(keep, beta * (1.0 - cos), 0.0)
    tl.store(soft_ptr + rows, soft.to(tl.float64), mask=row_mask)
    if HAS_HARD:
        z_y = tl.load(zs_row + y_safe[:, None], mask=keep[:, None], other=0.0).to(STATS)
        z_y = tl.sum(z_y, axis=1)
        row_max = tl.where(keep, row_max, 0.0)
        log_sum = log_precise(tl.where(keep, sum_exp, 1.0))
        # logsumexp - z_y as log(sum) + (max - z_y): the large terms cancel exactly first
        hard = tl.where(keep, log_sum + (row_max - z_y), 0.0)
        tl.store(hard_ptr + rows, hard.to(tl.float64), mask=row_mask)

    # Pass 2: dz_s over the student logits (ignored rows get zeros).
    if COMPUTE_GRAD:
        c_hard = tl.load(params_ptr).to(STATS)
        c_soft = tl.load(params_ptr + 1).to(STATS)
        # soft part: c_soft * (cos / |z_s|^2 * z_s - z_t / (|z_s| |z_t|)), zero where a norm is 0
        a = tl.where(zero, 0.0, c_soft * cos / tl.where(ss == 0.0, 1.0, ss))[:, None]
        b = tl.where(zero, 0.0, c_soft * inv_denom)[:, None]
        inv_sum = (1.0 / tl.where(keep, sum_exp, 1.0))[:, None]
        for start in range(0, n_cols_s, BLOCK_N):
            offsets = (start + cols)[None, :]
            col_mask = offsets < n_cols_s
            mask = keep[:, None] & col_mask
            s = tl.load(zs_row + offsets, mask=mask, other=0.0).to(STATS)
            t = tl.load(zt_row + offsets, mask=mask, other=0.0).to(STATS)
            dz = a * s - b * t
            if HAS_HARD:
                p = exp_precise(s - row_max[:, None]) * inv_sum
                dz += c_hard * (p - tl.where(offsets == y_safe[:, None], 1.0, 0.0))
            dz = tl.where(keep[:, None], dz, 0.0)
            tl.store(zs_row + offsets, dz.to(zs_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask)


@torch.library.custom_op("liger_core::fused_linear_cosine_similarity_fwd", mutates_args=())
def _fused_linear_cosine_fwd(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    labels: torch.Tensor,
    student_bias: torch.Tensor | None,
    teacher_bias: torch.Tensor | None,
    weight_hard_loss: float,
    weight_soft_loss: float,
    beta: float,
    ignore_index: int,
    chunk_size: int,
    compute_hard: bool,
    grad_hidden: bool,
    grad_weight: bool,
    grad_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, soft, hard) as float64 0-dim tensors (hard 0 unless ``compute_hard``: with weight_hard_loss 0
    the cross-entropy is computed only when it is returned), then d loss / d (student_hidden, student_weight,
    student_bias) unscaled by grad_output (fp64 or fp32; empty when not asked for)."""
    n_rows = student_hidden.shape[0]
    vocab_s, vocab_t = student_weight.shape[0], teacher_weight.shape[0]
    device = student_hidden.device
    has_hard = compute_hard or weight_hard_loss != 0.0
    pending = start_target_check(target_stats(labels, None, ignore_index, vocab_s)) if has_hard else None
    n_kept = (labels != ignore_index).sum().clamp_min(1).to(torch.float64)
    params = torch.stack(
        [weight_hard_loss / n_kept, (weight_soft_loss * beta) / n_kept, torch.full_like(n_kept, beta)]
    )
    soft_rows = torch.zeros(n_rows, dtype=torch.float64, device=device)
    hard_rows = torch.zeros(n_rows, dtype=torch.float64, device=device)
    exact = student_hidden.dtype == torch.float32
    dh = (
        torch.zeros(student_hidden.shape, dtype=torch.float64 if exact else torch.float32, device=device)
        if grad_hidden
        else None
    )
    dw = torch.zeros(student_weight.shape, dtype=torch.float32, device=device) if grad_weight else None
    db = (
        torch.zeros(vocab_s, dtype=torch.float64 if exact else torch.float32, device=device)
        if grad_bias
        else None
    )

    chunk_size = max(1, min(chunk_size, n_rows))
    zs_buffer = torch.empty((chunk_size, vocab_s), dtype=student_hidden.dtype, device=device)
    zt_buffer = torch.empty((chunk_size, vocab_t), dtype=teacher_hidden.dtype, device=device)
    tiles = row_tiles(chunk_size, vocab_t, device)
    for start in range(0, n_rows, chunk_size):
        end = min(start + chunk_size, n_rows)
        hs = student_hidden[start:end]
        zs = zs_buffer[: end - start]
        zt = zt_buffer[: end - start]
        linear_into(zs, hs, student_weight, student_bias)
        linear_into(zt, teacher_hidden[start:end], teacher_weight, teacher_bias)
        _cosine_ce_rows_kernel[tiles.grid(end - start)](
            zs, zs.stride(0), zt, zt.stride(0), labels[start:end], params, soft_rows[start:end],
            hard_rows[start:end], end - start, vocab_s, vocab_t, ignore_index,
            HAS_HARD=has_hard, COMPUTE_GRAD=grad_hidden or grad_weight or grad_bias,
            STATS=compute_dtype(student_hidden.dtype), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
            num_warps=tiles.num_warps,
        )  # fmt: skip
        # zs now holds d loss / d logits
        if dh is not None:
            hidden_grad_into(dh[start:end], zs, student_weight)
        if dw is not None:
            _mm_accumulate(dw, zs.t(), hs, first=False)
        if db is not None:
            db += zs.sum(0, dtype=db.dtype)
    del zs_buffer, zt_buffer
    if pending is not None:
        finish_target_check(pending, ignore_index, vocab_s)
    soft = soft_rows.sum() / n_kept
    hard = hard_rows.sum() / n_kept
    loss = (
        weight_soft_loss * soft + weight_hard_loss * hard
        if weight_hard_loss != 0.0
        else weight_soft_loss * soft
    )

    def _or_empty(g: torch.Tensor | None) -> torch.Tensor:
        # outputs of a custom op may not alias each other: a fresh empty tensor per gradient not asked for
        return g if g is not None else student_hidden.new_empty(0, dtype=torch.float32)

    return loss, soft, hard, _or_empty(dh), _or_empty(dw), _or_empty(db)


@_fused_linear_cosine_fwd.register_fake
def _(
    student_hidden, student_weight, teacher_hidden, teacher_weight, labels, student_bias, teacher_bias,
    weight_hard_loss, weight_soft_loss, beta, ignore_index, chunk_size, compute_hard, grad_hidden,
    grad_weight, grad_bias,
):  # fmt: skip
    exact = student_hidden.dtype == torch.float32
    wide = torch.float64 if exact else torch.float32
    scalar = [student_hidden.new_empty((), dtype=torch.float64) for _ in range(3)]
    empty = (0,)
    dh = student_hidden.new_empty(student_hidden.shape if grad_hidden else empty, dtype=wide)
    dw = student_hidden.new_empty(student_weight.shape if grad_weight else empty, dtype=torch.float32)
    db = student_hidden.new_empty((student_weight.shape[0],) if grad_bias else empty, dtype=wide)
    if not grad_hidden:
        dh = dh.to(torch.float32)
    if not grad_bias:
        db = db.to(torch.float32)
    return (*scalar, dh, dw, db)


class FusedLinearCosineSimilarityFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        labels,
        student_bias,
        teacher_bias,
        weight_hard_loss,
        weight_soft_loss,
        beta,
        ignore_index,
        chunk_size,
        compute_hard,
    ):
        hs = as_rows(student_hidden)
        ht = as_rows(teacher_hidden.detach())
        needs = ctx.needs_input_grad
        grad_hidden, grad_weight = needs[0], needs[1]
        grad_bias = student_bias is not None and needs[5]
        loss, soft, hard, dh, dw, db = _fused_linear_cosine_fwd(
            hs,
            student_weight,
            ht,
            teacher_weight.detach(),
            labels,
            student_bias,
            teacher_bias.detach() if teacher_bias is not None else None,
            weight_hard_loss,
            weight_soft_loss,
            beta,
            ignore_index,
            chunk_size,
            compute_hard,
            grad_hidden,
            grad_weight,
            grad_bias,
        )
        ctx.save_for_backward(
            dh if grad_hidden else None, dw if grad_weight else None, db if grad_bias else None
        )
        ctx.hidden_shape, ctx.hidden_dtype = student_hidden.shape, student_hidden.dtype
        ctx.weight_dtype = student_weight.dtype
        ctx.bias_dtype = student_bias.dtype if student_bias is not None else None
        soft, hard = soft.to(torch.float32), hard.to(torch.float32)
        ctx.mark_non_differentiable(soft, hard)
        return loss.to(torch.float32), soft, hard

    @staticmethod
    def backward(ctx, grad_loss, grad_soft, grad_hard):
        dh, dw, db = ctx.saved_tensors

        def scaled(g: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
            # grad_output times the gradient kept from forward, in its (wider) dtype: one rounding to dtype
            return None if g is None else (g * grad_loss.to(g.dtype)).to(dtype)

        dh = scaled(dh, ctx.hidden_dtype)
        return (
            dh.view(ctx.hidden_shape) if dh is not None else None,
            scaled(dw, ctx.weight_dtype),
            None,
            None,
            None,
            scaled(db, ctx.bias_dtype),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def _check_number(name: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    if positive and value <= 0:
        raise ValueError(f"{name}={value!r} must be positive")
    return float(value)


def fused_linear_cosine_similarity(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    target: torch.Tensor,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    *,
    weight_hard_loss: float = 0.5,
    weight_soft_loss: float = 0.5,
    beta: float = 0.5,
    ignore_index: int = -100,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    return_soft_hard_loss: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``weight_hard_loss * CE + weight_soft_loss * beta * mean(1 - cos(student logits, teacher logits))``
    over the tokens whose ``target`` is not ``ignore_index`` (module docstring), in token chunks.

    student_hidden (..., Hs) with student_weight (V_s, Hs) and student_bias (V_s,), teacher_hidden (..., Ht)
    with teacher_weight (V_t, Ht) and teacher_bias (V_t,), V_t >= V_s; target (...) (already shifted, values
    in [0, V_s) or ignore_index). Returns the fp32 0-dim loss, or ``(loss, soft_loss, hard_loss)`` with
    ``return_soft_hard_loss`` (the two means, unweighted, without gradient). Gradients flow to the student's
    hidden states, weight and bias only. ``temperature`` (positive) does not change the cosine; ``chunk_size``
    defaults to a size whose two logits buffers fit in 512 MiB. With no kept token the loss is 0 with zero
    gradients.
    """
    if any_dtensor(student_hidden, student_weight, teacher_hidden, teacher_weight, target):
        inputs = {"student_hidden": student_hidden, "teacher_hidden": teacher_hidden, "target": target}
        student_weight, teacher_weight, student_bias, teacher_bias = gather_distill_heads(
            "fused_linear_cosine_similarity",
            inputs,
            student_weight,
            teacher_weight,
            student_bias,
            teacher_bias,
        )
    hidden_s, hidden_t = check_distill_tensors(student_hidden, student_weight, teacher_hidden, teacher_weight)
    vocab_s, vocab_t = student_weight.shape[0], teacher_weight.shape[0]
    for name, w, size, ref_name in (
        ("student_weight", student_weight, hidden_s, "student_hidden"),
        ("teacher_weight", teacher_weight, hidden_t, "teacher_hidden"),
    ):
        if w.shape[1] != size:
            raise ValueError(
                f"{name} has shape {tuple(w.shape)}; expected (vocab, {size}) for {ref_name}'s hidden size"
            )
    if vocab_s == 0:
        raise ValueError("student_weight has an empty vocabulary (first) dimension")
    if vocab_t < vocab_s:
        raise ValueError(
            f"teacher_weight has vocabulary size {vocab_t} < student_weight's {vocab_s}; the teacher's "
            "vocabulary must hold the student's (a larger one is the student's padded)"
        )
    leading = tuple(student_hidden.shape[:-1])
    check_shape("teacher_hidden", teacher_hidden, leading + (hidden_t,), "one teacher hidden state per token")
    check_tensor("target", target, dtypes=INDEX_DTYPES)
    n_rows = math.prod(leading)
    if tuple(target.shape) != leading and tuple(target.shape) != (n_rows,):
        check_shape("target", target, leading, "one label per token of student_hidden")
    check_head_biases(student_bias, student_weight, teacher_bias, teacher_weight)
    check_head_dtypes(student_hidden, student_weight, teacher_hidden, teacher_weight)
    check_same_device(
        "student_hidden",
        student_hidden,
        student_weight=student_weight,
        teacher_hidden=teacher_hidden,
        teacher_weight=teacher_weight,
        target=target,
        student_bias=student_bias,
        teacher_bias=teacher_bias,
    )
    weight_hard_loss = _check_number("weight_hard_loss", weight_hard_loss)
    weight_soft_loss = _check_number("weight_soft_loss", weight_soft_loss)
    beta = _check_number("beta", beta)
    temperature = _check_number("temperature", temperature, positive=True)
    ignore_index = check_ignore_index(ignore_index)
    if not isinstance(return_soft_hard_loss, bool):
        raise TypeError(f"return_soft_hard_loss must be a bool, got {type(return_soft_hard_loss).__name__}")
    chunk_size = distill_chunk_rows(chunk_size, n_rows, vocab_t, student_hidden, teacher_hidden)
    if not use_triton(student_hidden):
        if weight_hard_loss != 0 or return_soft_hard_loss:
            check_targets_host(target.reshape(-1), ignore_index, vocab_s)  # the kernel path's ValueError
        return reference.fused_linear_cosine_similarity(
            student_hidden,
            student_weight,
            teacher_hidden,
            teacher_weight,
            target,
            student_bias,
            teacher_bias,
            weight_hard_loss=weight_hard_loss,
            weight_soft_loss=weight_soft_loss,
            beta=beta,
            ignore_index=ignore_index,
            temperature=temperature,
            return_soft_hard_loss=return_soft_hard_loss,
        )
    labels = target.reshape(-1).contiguous()
    loss, soft, hard = FusedLinearCosineSimilarityFunction.apply(
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        labels,
        student_bias,
        teacher_bias,
        weight_hard_loss,
        weight_soft_loss,
        beta,
        ignore_index,
        chunk_size,
        return_soft_hard_loss,
    )
    return (loss, soft, hard) if return_soft_hard_loss else loss

"""Per-token cross-entropy and total variation distance to a teacher, in one pass over the vocabulary
(Liger-Kernel's ``LigerFusedCETVDLoss``).

Math, per row (p = softmax(student logits z), q = softmax(teacher logits), y the target)::

    ce    = logsumexp(z) - z_y
    tvd   = 0.5 * sum_j |p_j - q_j|
    dz_j  = g_ce * (p_j - [j == y]) + g_tvd * 0.5 * p_j * (s_j - sigma)
            with s = sign(p - q), sigma = sum_k s_k p_k

Both are returned unreduced (fp32, shape ``logits.shape[:-1]``), 0 with zero gradient in rows whose target is
``ignore_index``; the caller owns masking weights and the divisor. ``sign`` is torch's (0 at p == q, as
``liger_core.ops.tvd``; Liger-Kernel's fused kernel also takes 0 there). The teacher gets no gradient.

Forward streams each row twice (online max and sum of exp of both rows and the target logit; then the TVD and
sigma) and saves three numbers per row (the two log-sum-exps and sigma) next to references to the logits;
backward streams the row once more and writes dz in the logits' dtype. Math in float64 for fp32 logits
(every fp32 output is its exact value rounded once), fp32 for bf16/fp16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import INDEX_DTYPES, check_same_device, check_shape, check_tensor, use_triton
from liger_core.ops._ce_math import RUNNING_MAX_START, check_targets_host
from liger_core.ops._divergence_math import (
    as_rows,
    check_ignore_index,
    compute_dtype,
    exp_precise,
    log_precise,
    row_tiles,
    tile_rows,
)


@triton.jit
def _row_target(labels_ptr, rows, row_mask, n_cols, ignore_index):
    y = tl.load(labels_ptr + rows, mask=row_mask, other=ignore_index).to(tl.int64)
    keep = row_mask & (y != ignore_index)
    # clamped: an out-of-range target is reported by the host check, never read out of bounds
    return keep, tl.minimum(tl.maximum(y, 0), n_cols - 1)


@triton.jit
def _sign(d):
    """torch.sign: 0 at 0 (and at NaN, whose loss is NaN anyway)."""
    return tl.where(d > 0.0, 1.0, tl.where(d < 0.0, -1.0, 0.0))


@triton.jit
def _ce_tvd_fwd_kernel(
    zs_ptr,
    zs_row_stride,
    zt_ptr,
    zt_row_stride,
    labels_ptr,
    ce_ptr,  # out fp32 per row
    tvd_ptr,  # out fp32 per row
    stats_ptr,  # out float64 (rows, 3): student lse, teacher lse, sigma
    n_rows,
    n_cols,
    ignore_index,
    STATS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    keep, y = _row_target(labels_ptr, rows, row_mask, n_cols, ignore_index)
    zs_row = zs_ptr + rows[:, None] * zs_row_stride
    zt_row = zt_ptr + rows[:, None] * zt_row_stride
    cols = tl.arange(0, BLOCK_N)
    max_s = tl.full([BLOCK_M], RUNNING_MAX_START, STATS)
    max_t = tl.full([BLOCK_M], RUNNING_MAX_START, STATS)
    sum_s = tl.zeros([BLOCK_M], dtype=STATS)
    sum_t = tl.zeros([BLOCK_M], dtype=STATS)
    for start in range(0, n_cols, BLOCK_N):
        offsets = (start + cols)[None, :]
        mask = keep[:, None] & (offsets < n_cols)
        zs = tl.load(zs_row + offsets, mask=mask, other=float("-inf")).to(STATS)
        zt = tl.load(zt_row + offsets, mask=mask, other=float("-inf")).to(STATS)
        new_s = tl.maximum(max_s, tl.max(zs, axis=1))
        new_t = tl.maximum(max_t, tl.max(zt, axis=1))
        sum_s = sum_s * exp_precise(max_s - new_s) + tl.sum(exp_precise(zs - new_s[:, None]), axis=1)
        sum_t = sum_t * exp_precise(max_t - new_t) + tl.sum(exp_precise(zt - new_t[:, None]), axis=1)
        max_s = new_s
        max_t = new_t
    max_s = tl.where(keep, max_s, 0.0)
    max_t = tl.where(keep, max_t, 0.0)
    log_s = log_precise(tl.where(keep, sum_s, 1.0))
    log_t = log_precise(tl.where(keep, sum_t, 1.0))
    z_y = tl.sum(tl.load(zs_row + y[:, None], mask=keep[:, None], other=0.0).to(STATS), axis=1)
    ce = tl.where(keep, log_s + (max_s - z_y), 0.0)  # the large terms cancel exactly first

    # Pass 2: TVD and sigma, with p = exp((z - max) - log(sum)) as torch's softmax rounds it.
    tvd_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=STATS)
    sigma_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=STATS)
    for start in range(0, n_cols, BLOCK_N):
        offsets = (start + cols)[None, :]
        mask = keep[:, None] & (offsets < n_cols)
        zs = tl.load(zs_row + offsets, mask=mask, other=float("-inf")).to(STATS)
        zt = tl.load(zt_row + offsets, mask=mask, other=float("-inf")).to(STATS)
        p = exp_precise((zs - max_s[:, None]) - log_s[:, None])
        q = exp_precise((zt - max_t[:, None]) - log_t[:, None])
        d = p - q
        tvd_acc += tl.abs(d)
        sigma_acc += _sign(d) * p
    tvd = tl.where(keep, 0.5 * tl.sum(tvd_acc, axis=1), 0.0)
    tl.store(ce_ptr + rows, ce.to(tl.float32), mask=row_mask)
    tl.store(tvd_ptr + rows, tvd.to(tl.float32), mask=row_mask)
    stats_row = stats_ptr + rows * 3
    tl.store(stats_row, (max_s + log_s).to(tl.float64), mask=row_mask)
    tl.store(stats_row + 1, (max_t + log_t).to(tl.float64), mask=row_mask)
    tl.store(stats_row + 2, tl.sum(sigma_acc, axis=1).to(tl.float64), mask=row_mask)


@triton.jit
def _ce_tvd_bwd_kernel(
    zs_ptr,
    zs_row_stride,
    zt_ptr,
    zt_row_stride,
    labels_ptr,
    stats_ptr,
    g_ce_ptr,
    g_ce_stride,
    g_tvd_ptr,
    g_tvd_stride,
    dz_ptr,
    n_rows,
    n_cols,
    ignore_index,
    STATS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    keep, y = _row_target(labels_ptr, rows, row_mask, n_cols, ignore_index)
    zs_row = zs_ptr + rows[:, None] * zs_row_stride
    zt_row = zt_ptr + rows[:, None] * zt_row_stride
    stats_row = stats_ptr + rows * 3
    lse_s = tl.load(stats_row, mask=keep, other=0.0).to(STATS)[:, None]
    lse_t = tl.load(stats_row + 1, mask=keep, other=0.0).to(STATS)[:, None]
    sigma = tl.load(stats_row + 2, mask=keep, other=0.0).to(STATS)[:, None]
    g_ce = tl.load(g_ce_ptr + rows * g_ce_stride, mask=keep, other=0.0).to(STATS)[:, None]
    g_tvd = tl.load(g_tvd_ptr + rows * g_tvd_stride, mask=keep, other=0.0).to(STATS)[:, None]
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, n_cols, BLOCK_N):
        offsets = (start + cols)[None, :]
        col_mask = offsets < n_cols
        mask = keep[:, None] & col_mask
        zs = tl.load(zs_row + offsets, mask=mask, other=float("-inf")).to(STATS)
        zt = tl.load(zt_row + offsets, mask=mask, other=float("-inf")).to(STATS)
        p = exp_precise(zs - lse_s)
        q = exp_precise(zt - lse_t)
        dz = g_ce * (p - tl.where(offsets == y[:, None], 1.0, 0.0)) + (0.5 * g_tvd) * p * (
            _sign(p - q) - sigma
        )
        dz = tl.where(keep[:, None], dz, 0.0)
        tl.store(
            dz_ptr + rows[:, None] * n_cols + offsets,
            dz.to(dz_ptr.dtype.element_ty),
            mask=row_mask[:, None] & col_mask,
        )


class CrossEntropyTVDFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, student_logits, teacher_logits, labels, ignore_index):
        zs, zt = as_rows(student_logits), as_rows(teacher_logits.detach())
        n_rows, n_cols = zs.shape
        ce = torch.empty(n_rows, dtype=torch.float32, device=zs.device)
        tvd = torch.empty(n_rows, dtype=torch.float32, device=zs.device)
        stats = torch.empty((n_rows, 3), dtype=torch.float64, device=zs.device)
        tiles = row_tiles(n_rows, n_cols, zs.device)
        if n_rows:
            _ce_tvd_fwd_kernel[tiles.grid(n_rows)](
                zs, zs.stride(0), zt, zt.stride(0), labels, ce, tvd, stats, n_rows, n_cols, ignore_index,
                STATS=compute_dtype(zs.dtype), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                num_warps=tiles.num_warps,
            )  # fmt: skip
        ctx.save_for_backward(zs, zt, labels, stats)
        ctx.ignore_index, ctx.shape = ignore_index, student_logits.shape
        lead = student_logits.shape[:-1]
        return ce.view(lead), tvd.view(lead)

    @staticmethod
    def backward(ctx, grad_ce, grad_tvd):
        zs, zt, labels, stats = ctx.saved_tensors
        n_rows, n_cols = zs.shape
        g_ce = (grad_ce if grad_ce is not None else zs.new_zeros(ctx.shape[:-1])).reshape(-1)
        g_tvd = (grad_tvd if grad_tvd is not None else zs.new_zeros(ctx.shape[:-1])).reshape(-1)
        dz = torch.empty((n_rows, n_cols), dtype=zs.dtype, device=zs.device)
        tiles = row_tiles(n_rows, n_cols, zs.device)
        if n_rows:
            _ce_tvd_bwd_kernel[tiles.grid(n_rows)](
                zs, zs.stride(0), zt, zt.stride(0), labels, stats, g_ce, g_ce.stride(0), g_tvd,
                g_tvd.stride(0), dz, n_rows, n_cols, ctx.ignore_index, STATS=compute_dtype(zs.dtype),
                BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.num_warps,
            )  # fmt: skip
        return dz.view(ctx.shape), None, None, None


def cross_entropy_tvd(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ce, tvd)`` per row of ``student_logits`` (..., V) against ``target`` (...) and against the teacher's
    distribution ``softmax(teacher_logits)`` (same shape and dtype), both fp32 and unreduced, 0 in rows whose
    target is ignore_index (module docstring). Gradients flow to student_logits only."""
    check_tensor("student_logits", student_logits, min_ndim=1)
    check_tensor("teacher_logits", teacher_logits)
    check_shape(
        "teacher_logits", teacher_logits, tuple(student_logits.shape), "one teacher row per student row"
    )
    if teacher_logits.dtype != student_logits.dtype:
        raise TypeError(
            f"teacher_logits has dtype {teacher_logits.dtype} but student_logits has {student_logits.dtype}"
        )
    if student_logits.shape[-1] == 0:
        raise ValueError("student_logits has an empty vocabulary (last) dimension")
    check_tensor("target", target, dtypes=INDEX_DTYPES)
    check_shape("target", target, tuple(student_logits.shape[:-1]), "one class index per row")
    check_same_device("student_logits", student_logits, teacher_logits=teacher_logits, target=target)
    ignore_index = check_ignore_index(ignore_index)
    labels = target.reshape(-1).contiguous()
    check_targets_host(labels, ignore_index, student_logits.shape[-1])
    if not use_triton(student_logits):
        return reference.cross_entropy_tvd(student_logits, teacher_logits, target, ignore_index)
    return CrossEntropyTVDFunction.apply(student_logits, teacher_logits, labels, ignore_index)

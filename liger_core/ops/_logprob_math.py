"""Per-row kernels of the log-probability losses shared by ``fused_linear_logprobs`` and
``fused_linear_logprob_loss``: the statistics kernel (entropy, log_sum_sq_probs, mean_logits, is_top1;
formulas in ``fused_linear_logprobs``' module docstring), the one-pass log-prob + entropy gradient
kernel, and the logit scaling split between the GEMM epilogue and the CE kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core.ops._ce_kernel import CE_FP32_MATH, looped_row_settings
from liger_core.ops._ce_math import RUNNING_MAX_START, _f64, _softcap, split_f64
from liger_core.reference.fused_linear_logprobs import OUTPUTS

_STATS = OUTPUTS[1:]  # entropy, log_sum_sq_probs, mean_logits, is_top1


@triton.jit
def _logit_stats_kernel(
    logits_ptr,
    logits_row_stride,
    target_ptr,
    entropy_ptr,  # (N,) fp32 outputs, written only when requested
    log_sum_sq_ptr,
    mean_ptr,
    top1_ptr,  # (N,) uint8 (a bool tensor's storage)
    state_ptr,  # (N, 2) fp64: logsumexp(z) and the entropy unrounded, for the entropy's gradient
    logp_ptr,  # (N,) fp32 log-probabilities of the targets (fused_linear_logprob_loss)
    n_cols,
    ignore_index,
    softcap_hi, softcap_lo,  # c' as an fp64 scalar (see cross_entropy._f64)
    HAS_SOFTCAP: tl.constexpr,
    HAS_ENTROPY: tl.constexpr,
    HAS_LOG_SUM_SQ: tl.constexpr,
    HAS_MEAN: tl.constexpr,
    HAS_TOP1: tl.constexpr,
    HAS_LOGP: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """One program per token: the statistics of softmax(z) of its row (see the module doc), and with HAS_LOGP
    its target's log-probability z_y - logsumexp(z)."""
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(target_ptr + row).to(tl.int64)
    if y == ignore_index:
        if HAS_ENTROPY:
            tl.store(entropy_ptr + row, 0.0)
            tl.store(state_ptr + 2 * row, 0.0)
            tl.store(state_ptr + 2 * row + 1, 0.0)
        if HAS_LOG_SUM_SQ:
            tl.store(log_sum_sq_ptr + row, 0.0)
        if HAS_MEAN:
            tl.store(mean_ptr + row, 0.0)
        if HAS_TOP1:
            tl.store(top1_ptr + row, tl.zeros([], tl.uint8))
        if HAS_LOGP:
            tl.store(logp_ptr + row, 0.0)
        return
    logits_row = logits_ptr + row * logits_row_stride
    softcap = _f64(softcap_hi, softcap_lo).to(COMPUTE_DTYPE)
    m = tl.full([], RUNNING_MAX_START, COMPUTE_DTYPE)
    d = tl.zeros([], COMPUTE_DTYPE)
    s = tl.zeros([], COMPUTE_DTYPE)
    q = tl.zeros([], COMPUTE_DTYPE)
    t = tl.zeros([], COMPUTE_DTYPE)
    best = tl.full([], -float("inf"), COMPUTE_DTYPE)
    best_col = tl.full([], 0, tl.int64)
    nan_col = tl.full([], n_cols, tl.int64)
    z_y = tl.zeros([], COMPUTE_DTYPE)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        z = tl.load(logits_row + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        if HAS_SOFTCAP:
            z, _ = _softcap(z, softcap, COMPUTE_DTYPE)
        z_masked = tl.where(mask, z, -float("inf"))
        block_max = tl.max(z_masked, 0)
        m_new = tl.maximum(m, block_max)
        rescale = tl.exp(m - m_new)  # 0 (or 1 while all are -inf) on the first blocks, where d = s = q = 0
        e = tl.where(mask, tl.exp(z_masked - m_new), 0.0)
        z_rel = tl.where(mask, z - m_new, 0.0)
        # s relative to the new max: sum e_old (z - m_new) = rescale * (s + (m - m_new) * d)
        shift = (tl.where(d > 0.0, m, m_new) - m_new) * d
        s = rescale * (s + shift) + tl.sum(e * z_rel, 0)
        q = q * rescale * rescale + tl.sum(e * e, 0)
        d = d * rescale + tl.sum(e, 0)
        t += tl.sum(tl.where(mask, z, 0.0), 0)
        if HAS_LOGP:
            z_y += tl.sum(tl.where(cols == y, z, 0.0), 0)
        if HAS_TOP1:  # first column of the block's max; a later block must beat the max strictly
            block_col = tl.min(tl.where(z_masked == block_max, cols, n_cols), 0).to(tl.int64)
            best_col = tl.where(block_max > best, block_col, best_col)
            best = tl.maximum(best, block_max)
            block_nan = tl.min(tl.where(z_masked != z_masked, cols, n_cols), 0).to(tl.int64)
            nan_col = tl.minimum(nan_col, block_nan)
        m = m_new
    log_d = tl.log(d)
    if HAS_ENTROPY:
        entropy = log_d - s / d
        tl.store(entropy_ptr + row, entropy.to(tl.float32))
        tl.store(state_ptr + 2 * row, (m + log_d).to(tl.float64))
        tl.store(state_ptr + 2 * row + 1, entropy.to(tl.float64))
    if HAS_LOG_SUM_SQ:
        tl.store(log_sum_sq_ptr + row, (tl.log(q) - 2.0 * log_d).to(tl.float32))
    if HAS_MEAN:
        tl.store(mean_ptr + row, (t / n_cols).to(tl.float32))
    if HAS_TOP1:  # torch.argmax takes the first NaN as the maximum
        best_col = tl.where(nan_col < n_cols, nan_col, best_col)
        tl.store(top1_ptr + row, (best_col == y).to(tl.uint8))
    if HAS_LOGP:
        tl.store(logp_ptr + row, ((z_y - m) - log_d).to(tl.float32))


def _launch_stats(
    logits, target, entropy, log_sum_sq, mean, top1, state, ignore_index, softcap, log_probs=None
):
    """Run ``_logit_stats_kernel`` on one chunk (N, V) of logits (unit column stride); outputs may be None
    (``state`` goes with ``entropy``)."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    fp64_math = logits.dtype == torch.float32 and CE_FP32_MATH == "fp64"
    block, warps = looped_row_settings(n_cols, logits.device, fp64_math)
    dummy = target
    _logit_stats_kernel[(n_rows,)](
        logits,
        logits.stride(0),
        target,
        entropy if entropy is not None else dummy,
        log_sum_sq if log_sum_sq is not None else dummy,
        mean if mean is not None else dummy,
        top1.view(torch.uint8) if top1 is not None else dummy,
        state if state is not None else dummy,
        log_probs if log_probs is not None else dummy,
        n_cols,
        ignore_index,
        *split_f64(softcap if softcap is not None else 1.0),
        HAS_SOFTCAP=softcap is not None,
        HAS_ENTROPY=entropy is not None,
        HAS_LOG_SUM_SQ=log_sum_sq is not None,
        HAS_MEAN=mean is not None,
        HAS_TOP1=top1 is not None,
        HAS_LOGP=log_probs is not None,
        COMPUTE_DTYPE=tl.float64 if fp64_math else tl.float32,
        BLOCK_SIZE=block,
        num_warps=warps,
    )


@triton.jit
def _logprob_entropy_grad_kernel(
    logits_ptr,  # (N, V) chunk of rescaled logits x, overwritten with d(loss)/dx
    logits_row_stride,
    target_ptr,
    state_ptr,  # (N, 2) fp64 logsumexp(z) and entropy from the forward pass
    grad_logp_ptr,  # (N,) fp32 d(loss)/d(log_probs) and d(loss)/d(entropy), times dz/dx's constant factor
    grad_entropy_ptr,
    n_cols,
    ignore_index,
    softcap_hi, softcap_lo,
    HAS_SOFTCAP: tl.constexpr,
    HAS_LOGP_GRAD: tl.constexpr,
    HAS_ENTROPY_GRAD: tl.constexpr,  # False: g_H is 0, its term is left out (0 * (-inf) where p_v = 0)
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """One program per token, one pass: with log p_v = z_v - lse,

        dz_v = g_logp ([v == y] - p_v) - g_H p_v (log p_v + H),   dx_v = dz_v (1 - tanh^2(x_v / c'))

    (the log-prob's and the entropy's gradients, d H / d z_v = -p_v (log p_v + H); the tanh factor with a
    softcap only); 0 for ignored tokens."""
    row = tl.program_id(0).to(tl.int64)
    logits_row = logits_ptr + row * logits_row_stride
    y = tl.load(target_ptr + row).to(tl.int64)
    ignored = y == ignore_index
    softcap = _f64(softcap_hi, softcap_lo).to(COMPUTE_DTYPE)
    lse = tl.load(state_ptr + 2 * row).to(COMPUTE_DTYPE)
    entropy = tl.load(state_ptr + 2 * row + 1).to(COMPUTE_DTYPE)
    g_h = tl.load(grad_entropy_ptr + row).to(COMPUTE_DTYPE)
    g_logp = tl.zeros([], COMPUTE_DTYPE)
    if HAS_LOGP_GRAD:
        g_logp = tl.load(grad_logp_ptr + row).to(COMPUTE_DTYPE)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        z = tl.load(logits_row + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        if HAS_SOFTCAP:
            z, sech2 = _softcap(z, softcap, COMPUTE_DTYPE)
        log_p = z - lse
        p = tl.exp(log_p)
        if HAS_ENTROPY_GRAD:
            dz = -g_h * p * (log_p + entropy) - g_logp * p
        else:
            dz = -g_logp * p
        dz = tl.where(cols == y, dz + g_logp, dz)
        if HAS_SOFTCAP:
            dz = dz * sech2
        dz = tl.where(ignored, 0.0, dz)
        tl.store(logits_row + cols, dz.to(logits_ptr.dtype.element_ty), mask=mask)


def _scaling(dtype: torch.dtype, scale: float) -> tuple[float, float | None]:
    """(factor in the GEMM's epilogue, factor applied in place after it) for x = scale * (h W^T + b): 16-bit
    logits get it in the epilogue (one rounding, no pass over memory); fp32 logits after the plain GEMM, whose
    result is then the eager lm_head's bit for bit, plus one rounding where eager has two (scale, then
    temperature): never less exact than eager (fp32 models are small, the extra pass is cheap there)."""
    if scale == 1.0:
        return 1.0, None
    return (1.0, scale) if dtype == torch.float32 else (scale, None)

"""The cross-entropy row kernel (one program per row, two passes over the row in column blocks) and its
launcher, run by ``cross_entropy`` and by every fused-linear loop that computes a cross-entropy over a
chunk of logits; on Hopper the launcher hands 16-bit rows to the resident kernel of
``_cross_entropy_resident``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import tuning
from liger_core.ops import _cross_entropy_resident as resident
from liger_core.ops._ce_math import (
    RUNNING_MAX_START,
    _f64,
    _grad_block,
    _grad_coefs,
    _online_block,
    _row_loss,
    _softcap,
    smoothing_shift,
    split_f64,
)
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import next_power_of_2

# Launch knobs of the cross-entropy kernel on a GPU (module globals so that a benchmark can compare settings
# in one process). Columns per block and warps: see ``looped_row_settings``. 16384 with the pass-1 prefetch
# (H100, 8192 x 128256 bf16: 1.710 ms, 53 registers; 32768 columns with the prefetch spill: 1.914; 32768
# without it 1.751; script at 0aa2349: `python benchmarks/ce_kernel_study.py`)
CE_MAX_BLOCK = 16384
# fp32 logits (fp64 math, twice the registers): 16384 columns with 16 warps 6.2 ms, 8192 columns 7.4 ms
CE_MAX_BLOCK_FP64_MATH = 16384
CE_WARPS: int | None = None  # None: from the block size
# Cache policies on a GPU: pass-1 loads keep the row in L2 for pass 2 (evict-last), pass-2 loads and the
# gradient stores leave first. Measured on the H100: 2.11 -> 1.77 ms for 8192 x 128256 bf16.
CE_PASS1_POLICY = "evict_last"
CE_PASS2_POLICY = "evict_first"
CE_STORE_POLICY = "evict_first"
CE_PASS1_PREFETCH = True  # pass 1: next block's load issued before this block's reductions
CE_STORE_CACHE = ""  # cache modifier of the gradient stores ("" or ".cs": streaming)
CE_FP32_MATH = (
    "fp64"  # per-element math for fp32 logits: "fp64" (exact, see the kernel) or "fp32" (a benchmark)
)


@fast_launch
@triton.jit
def _cross_entropy_kernel(
    logits_ptr,
    logits_row_stride,
    grad_ptr,  # may equal logits_ptr (gradient written in place)
    grad_row_stride,
    target_ptr,
    weight_ptr,  # class weights (V,), read only when HAS_WEIGHT
    loss_ptr,  # (N,) fp64: per-row cross-entropy (label smoothing included, z-loss not), unscaled
    z_loss_ptr,  # (N,) fp64: per-row z-loss, unscaled
    grad_scale_ptr,  # (N,) per-row multiplier of the gradient, read only when HAS_GRAD_SCALE
    stats_ptr,  # (5,) fp64 from _target_stats_kernel: the reduction's denominators, sum of class weights
    argmax_ptr,  # (N,) int64: per-row argmax of the logits (-1 on ignored rows), written when RETURN_ARGMAX
    n_cols,
    ignore_index,
    smoothing_hi, smoothing_lo,  # label_smoothing, lse_square_scale, softcap: fp64 scalars (see _f64)
    z_scale_hi, z_scale_lo,
    softcap_hi, softcap_lo,
    MEAN: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_GRAD_SCALE: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    # per-element math: fp32 for 16-bit logits (its error is far below their rounding); fp64 for fp32 logits,
    # whose fp32 exp (GPU ex2.approx, numpy's 0.6 ulp rms) and extra roundings would double eager's error
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PASS1_POLICY: tl.constexpr,  # eviction policies ("" = default)
    PASS2_POLICY: tl.constexpr,
    STORE_POLICY: tl.constexpr,
    STORE_CACHE: tl.constexpr,
    PASS1_PREFETCH: tl.constexpr,  # issue the next block's load before this block's reductions
    RETURN_ARGMAX: tl.constexpr = False,  # track the row's argmax in pass 1 (torch.argmax: first maximum,
    # a NaN counting as the maximum)
    TOKEN_SCALING: tl.constexpr = False,  # loss and gradient times p_y = softmax(logits)_y (a constant)
):  # fmt: skip
    # int64 row offsets: rows * V passes 2^31 at 16k tokens x 128k vocabulary
    row = tl.program_id(0).to(tl.int64)
    logits_row = logits_ptr + row * logits_row_stride
    grad_row = grad_ptr + row * grad_row_stride
    y = tl.load(target_ptr + row).to(tl.int64)

    if y == ignore_index:
        tl.store(loss_ptr + row, 0.0)
        tl.store(z_loss_ptr + row, 0.0)
        if RETURN_ARGMAX:
            tl.store(argmax_ptr + row, -1)
        if COMPUTE_GRAD:
            for start in range(0, n_cols, BLOCK_SIZE):
                cols = start + tl.arange(0, BLOCK_SIZE)
                tl.store(
                    grad_row + cols,
                    tl.zeros([BLOCK_SIZE], tl.float32).to(grad_ptr.dtype.element_ty),
                    mask=cols < n_cols,
                )
        return

    softcap = _f64(softcap_hi, softcap_lo).to(COMPUTE_DTYPE)
    # a target outside [0, V) is reported by the host after the launch; clamped here so nothing reads out
    # of bounds. The target logit is read before pass 2 can overwrite it.
    y_safe = tl.minimum(tl.maximum(y, 0), n_cols - 1)
    x_y = tl.load(logits_row + y_safe).to(COMPUTE_DTYPE)
    if HAS_SOFTCAP:
        x_y, _ = _softcap(x_y, softcap, COMPUTE_DTYPE)
    shift = x_y  # of the smoothing sum
    if HAS_SMOOTHING:
        shift = smoothing_shift(x_y)
    w_y = 1.0
    if HAS_WEIGHT:
        w_y = tl.load(weight_ptr + y_safe).to(tl.float64)
    # Everything per row that does not depend on the row's max and sum, before pass 1: with one program per
    # SM, the latency of these loads and fp64 divisions between the passes would otherwise stall it (H100,
    # 8192 x 128256: ~0.12 ms of a 1.75 ms kernel).
    eps = _f64(smoothing_hi, smoothing_lo)
    zs = _f64(z_scale_hi, z_scale_lo)
    w_total = tl.load(stats_ptr + 4)
    if COMPUTE_GRAD:
        p_ce, p_z, coef_c64, coef_y64 = _grad_coefs(
            stats_ptr, grad_scale_ptr, row, w_y, eps, zs, w_total, n_cols, MEAN, HAS_GRAD_SCALE
        )
        coef_c = coef_c64.to(COMPUTE_DTYPE)
        coef_y = coef_y64.to(COMPUTE_DTYPE)

    # pass 1 (see _online_block); with PASS1_PREFETCH the next block's load is issued before this block's
    # two block-wide reductions, so loads stay in flight while they run
    m = tl.full([], RUNNING_MAX_START, tl.float32)
    d = tl.cast(0.0, COMPUTE_DTYPE)
    smooth_acc = tl.cast(0.0, COMPUTE_DTYPE)
    offs = tl.arange(0, BLOCK_SIZE)
    best = tl.full([], -float("inf"), tl.float32)
    best_col = tl.full([], 0, tl.int64)
    first_nan = tl.zeros([], tl.int64) + n_cols  # n_cols: no NaN seen (n_cols may be a specialised 1)
    if PASS1_PREFETCH:
        x_next = tl.load(
            logits_row + offs, mask=offs < n_cols, other=-float("inf"), eviction_policy=PASS1_POLICY
        )
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + offs
        mask = cols < n_cols
        if PASS1_PREFETCH:
            x_raw = x_next
            next_cols = cols + BLOCK_SIZE
            x_next = tl.load(
                logits_row + next_cols,
                mask=next_cols < n_cols,
                other=-float("inf"),
                eviction_policy=PASS1_POLICY,
            )
        else:
            x_raw = tl.load(logits_row + cols, mask=mask, other=-float("inf"), eviction_policy=PASS1_POLICY)
        if RETURN_ARGMAX:  # of the raw logits (softcap is increasing), first index of the block maximum
            x_f = x_raw.to(tl.float32)
            block_max = tl.max(tl.where(mask, x_f, -float("inf")), axis=0)
            block_col = tl.min(tl.where(mask & (x_f == block_max), cols, n_cols), axis=0).to(tl.int64)
            take = block_max > best  # strictly: an earlier block keeps a tie
            best_col = tl.where(take, block_col, best_col)
            best = tl.where(take, block_max, best)
            nan_col = tl.min(tl.where(mask & (x_f != x_f), cols, n_cols), axis=0).to(tl.int64)
            first_nan = tl.minimum(first_nan, nan_col)
        m, d, smooth_acc = _online_block(
            x_raw, mask, cols, m, d, smooth_acc, shift, weight_ptr, softcap,
            HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, COMPUTE_DTYPE,
        )  # fmt: skip
    if RETURN_ARGMAX:
        tl.store(argmax_ptr + row, tl.where(first_nan < n_cols, first_nan, best_col))

    # Per-row scalars in fp64 (a few flops per row), so that each meets the data with a single rounding.
    # m and log(d) stay apart: rounding lse = m + log(d) first would put ulp(lse) / 2 into every exp(x - lse).
    d64 = d.to(tl.float64)
    log_d = tl.log(d64)
    m64 = m.to(tl.float64)
    lse = m64 + log_d
    nll = (m64 - x_y.to(tl.float64)) + log_d
    nll_shift = (m64 - shift.to(tl.float64)) + log_d  # nll itself unless x_y = -inf
    ce = _row_loss(nll, nll_shift, smooth_acc, w_y, eps, w_total, n_cols, HAS_SMOOTHING)
    z_row = zs * lse * lse
    if TOKEN_SCALING:  # Liger-Kernel's token scaling: the row's loss and gradient times p_y, held constant
        p_y = tl.exp(-nll)
        ce = ce * p_y
        z_row = z_row * p_y
        if COMPUTE_GRAD:
            p_ce = p_ce * p_y
            p_z = p_z * p_y
            coef_c = (coef_c64 * p_y).to(COMPUTE_DTYPE)
            coef_y = (coef_y64 * p_y).to(COMPUTE_DTYPE)
    # unscaled: the reduction kernel divides the sums by the denominators once, as torch does
    tl.store(loss_ptr + row, ce)
    tl.store(z_loss_ptr + row, z_row)

    if COMPUTE_GRAD:
        coef_p = ((p_ce + p_z * lse) / d64).to(COMPUTE_DTYPE)
        m_c = m.to(COMPUTE_DTYPE)
        # pass 2: gradient (each element is read before the same thread overwrites it, so in place is safe)
        for start in range(0, n_cols, BLOCK_SIZE):
            cols = start + tl.arange(0, BLOCK_SIZE)
            mask = cols < n_cols
            x_raw = tl.load(logits_row + cols, mask=mask, other=0.0, eviction_policy=PASS2_POLICY)
            _grad_block(
                x_raw, mask, cols, grad_row, y, m_c, coef_p, coef_c, coef_y, weight_ptr, softcap,
                HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, COMPUTE_DTYPE, STORE_POLICY, STORE_CACHE,
            )  # fmt: skip


def looped_row_settings(n_cols: int, device: torch.device, fp64_math: bool = False) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for a kernel that streams one long row (a vocabulary) in column blocks.

    GPU: blocks of up to CE_MAX_BLOCK columns, 32 warps for blocks of 16384 or more (one row per program, one
    program per SM). CPU interpreter: blocks of at most 512 columns, so that the tests' odd vocabularies (131,
    1031) cover both the one-block and the multi-block (online) paths.
    """
    cap = (CE_MAX_BLOCK_FP64_MATH if fp64_math else CE_MAX_BLOCK) if device.type == "cuda" else 512
    block = min(cap, next_power_of_2(max(n_cols, 1)))
    warps = 32 if block >= 16384 else 16 if block >= 4096 else 8 if block >= 1024 else 4
    if fp64_math:
        warps = min(warps, 16)
    if device.type == "cuda" and CE_WARPS is not None:
        warps = CE_WARPS
    return block, warps


def resident_kernel_runs(logits: torch.Tensor, weight: torch.Tensor | None, softcap: float | None) -> bool:
    """Whether ``launch_cross_entropy`` runs the resident (Hopper, Gluon) kernel on these logits."""
    return tuning.CE_RESIDENT and resident.resident_supported(logits, weight, softcap)


def launch_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    grad: torch.Tensor | None,
    loss_rows: torch.Tensor,
    z_rows: torch.Tensor,
    stats: torch.Tensor,
    *,
    ignore_index: int,
    mean: bool,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    grad_scale: torch.Tensor | None = None,
    state: torch.Tensor | None = None,
    argmax: torch.Tensor | None = None,
    token_scaling: bool = False,
) -> None:
    """Run the kernel on (N, V) logits (unit column stride): unscaled per-row cross-entropy and z-loss into
    ``loss_rows``/``z_rows`` (fp64), and the gradient of the reduced loss (``mean``: terms divided by the
    denominators in ``stats``; rows multiplied by ``grad_scale``) into ``grad`` (may be ``logits``) unless
    None. ``state`` ((N, 4) fp64, only where ``resident_kernel_runs``, with ``grad``): each row's max and
    gradient coefficients, for the same gradient of logits recomputed later (fused_linear_cross_entropy).
    ``argmax`` ((N,) int64): each row's argmax of the logits, -1 on ignored rows; ``token_scaling``: each
    row's loss and gradient times its target's probability (detached). Either runs the looped kernel."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    extras = argmax is not None or token_scaling
    if not extras and resident_kernel_runs(logits, weight, softcap):
        slots, reg_cols = resident.resident_layout(n_cols)
        warps = resident.resident_warps(n_cols)
        grad_arg = grad if grad is not None else logits
        resident._cross_entropy_resident_kernel[(n_rows,)](
            logits, logits.stride(0), grad_arg, grad_arg.stride(0), target, loss_rows, z_rows,
            grad_scale if grad_scale is not None else loss_rows, stats,
            state if state is not None else loss_rows, n_cols, ignore_index,
            *split_f64(label_smoothing), *split_f64(lse_square_scale),
            MEAN=mean, HAS_SMOOTHING=label_smoothing != 0.0, HAS_GRAD_SCALE=grad_scale is not None,
            COMPUTE_GRAD=grad is not None, STORE_STATE=state is not None, SLOT=resident.SLOT,
            NUM_SLOTS=slots, REG_COLS=reg_cols, NUM_WARPS=warps, num_warps=warps,
        )  # fmt: skip
        return
    if state is not None:
        raise ValueError("state= is written only by the resident kernel (see resident_kernel_runs)")
    fp64_math = logits.dtype == torch.float32 and CE_FP32_MATH == "fp64"
    block, warps = looped_row_settings(n_cols, logits.device, fp64_math)
    gpu = logits.device.type == "cuda"
    grad_arg = grad if grad is not None else logits
    _cross_entropy_kernel[(n_rows,)](
        logits,
        logits.stride(0),
        grad_arg,
        grad_arg.stride(0),
        target,
        weight if weight is not None else logits,
        loss_rows,
        z_rows,
        grad_scale if grad_scale is not None else loss_rows,
        stats,
        argmax if argmax is not None else target,
        n_cols,
        ignore_index,
        *split_f64(label_smoothing),
        *split_f64(lse_square_scale),
        *split_f64(softcap if softcap is not None else 1.0),
        MEAN=mean,
        HAS_WEIGHT=weight is not None,
        HAS_SMOOTHING=label_smoothing != 0.0,
        HAS_SOFTCAP=softcap is not None,
        HAS_GRAD_SCALE=grad_scale is not None,
        COMPUTE_GRAD=grad is not None,
        COMPUTE_DTYPE=tl.float64 if fp64_math else tl.float32,
        BLOCK_SIZE=block,
        PASS1_POLICY=CE_PASS1_POLICY if gpu else "",
        PASS2_POLICY=CE_PASS2_POLICY if gpu else "",
        STORE_POLICY=CE_STORE_POLICY if gpu else "",
        STORE_CACHE=CE_STORE_CACHE if gpu else "",
        PASS1_PREFETCH=CE_PASS1_PREFETCH and not fp64_math,  # fp64 math: registers (not measured)
        RETURN_ARGMAX=argmax is not None,
        TOKEN_SCALING=token_scaling,
        num_warps=warps,
    )

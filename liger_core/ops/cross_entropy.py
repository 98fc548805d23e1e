"""Cross-entropy over a vocabulary, with the gradient computed in the forward pass.

For one row ``x`` (V logits), target ``y`` (not ``ignore_index``), class weights ``w`` (all 1 without
``weight``, ``W = sum_c w_c``), label smoothing ``eps``, z-loss scale ``zs``; optional softcap first,
``x <- softcap * tanh(x_raw / softcap)``::

    lse    = m + log(d),  m = max_c x_c,  d = sum_c exp(x_c - m)  (online: running max + rescaled sum)
    loss   = (1 - eps) * w_y * (lse - x_y)  +  eps / V * sum_c w_c * (lse - x_c)  +  zs * lse^2
    dx_c   = [(1 - eps) * w_y + eps / V * W] * p_c  -  (1 - eps) * w_y * [c == y]  -  eps / V * w_c
             + 2 * zs * lse * p_c,                p_c = exp(x_c - m) / d
    dx_raw = dx * (1 - tanh^2(x_raw / softcap))                    (softcap only)

Reductions (torch's): ``sum``; ``mean`` divides the cross-entropy terms by ``sum_i w_{y_i}`` over the
non-ignored rows (the row count without weights) and the z-loss terms by the non-ignored row count, as IEEE
division does (nothing to average over: NaN, as torch's 0 / 0); ``none`` keeps one loss per row. Ignored rows
are never read: loss 0 and gradient 0. The loss is fp32 whatever the logits' dtype.

Non-finite logits give torch's results (non-ignored rows): a row with a NaN or +inf logit, or only -inf ones,
has a NaN loss and gradient; a -inf logit has probability 0, and one at the target makes the loss +inf (with
label smoothing, any -inf logit does) while the gradient stays finite.

Kernels, in launch order (no host sync between them):

1. ``_target_stats_kernel`` (one program): non-ignored rows, their class-weight sum, the smallest and largest
   non-ignored target, the sum of all class weights, into a small fp64 buffer on the device. The reduction's
   denominators are read from it by the next kernels, so nothing waits for the host.
2. ``_cross_entropy_kernel`` (one program per row): pass 1 streams the row in column blocks once for the
   running max, the rescaled sum of exponentials, the smoothing sum and the loss; pass 2 reads it again and
   writes the gradient, optionally into the logits buffer itself. Pass-1 loads are marked evict-last and
   pass-2 loads and the stores evict-first, so that pass 2 finds the row in L2 (the rows in flight, one per
   SM, 33 MB at V = 128k bf16, fit in it): HBM sees about one read and one write of the logits. Per-element
   math in fp32 for 16-bit logits and in fp64 for fp32 logits (never less exact than eager fp32 that way),
   per-row scalars in fp64, one rounding to the gradient's dtype (the logits').
3. ``_reduce_losses_kernel``: the per-row fp64 terms summed (and divided) in fp64, one rounding to the fp32
   loss.

The target range is copied to pinned host memory right after kernel 1 (an event marks it), and the host
waits for that event only once kernels 2 and 3 are queued, then raises a ValueError for a target outside
[0, V) (the kernels clamp such an index, so they never read out of bounds): the GPU never idles for the
check, and the host's next work (the backward) overlaps the loss kernel. ``check_targets=False`` skips it, and
so does a CUDA-graph capture (no host read-back is possible there).
Backward only multiplies the stored gradient by ``grad_output`` (a kernel that returns at once where
``grad_output`` is exactly 1, so a plain ``loss.backward()`` costs no pass over memory). fp16 logits are the
exception: their gradient entries are mostly subnormal, which that second rounding would lose (a loss scaler's
2^16 then multiplies the loss), so for fp16 the forward pass computes only the losses and backward runs kernel
2 with ``grad_output`` inside the one rounding (one more read of the logits).

On Hopper GPUs, kernel 2 for 16-bit logits of up to 131072 classes (no class weights, no softcap) is the Gluon
kernel of ``_cross_entropy_resident``, which keeps the row in shared memory and registers between the passes.
"""

from __future__ import annotations

import math
import struct

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_same_device,
    check_shape,
    check_tensor,
    launcher,
    use_triton,
)
from liger_core.loss_options import CrossEntropyOptions
from liger_core.loss_options import resolve as resolve_options
from liger_core.ops import _cross_entropy_resident as resident
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import cdiv, next_power_of_2, num_sms

REDUCTIONS = ("mean", "sum", "none")

# Launch knobs of the cross-entropy kernel on a GPU (module globals so that benchmarks/variants_ce.py can
# compare settings in one GPU call). Columns per block and warps: see ``looped_row_settings``.
# 16384 with the pass-1 prefetch (H100, 8192 x 128256 bf16, benchmarks/ce_kernel_study.py: 1.710 ms, 53
# registers; 32768 columns with the prefetch spill: 1.914; 32768 without it 1.751)
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
# 16-bit logits on Hopper with rows of up to resident.RESIDENT_MAX_COLS columns: the Gluon kernel that keeps
# the row in shared memory and registers between the passes (``_cross_entropy_resident``)
CE_RESIDENT = True
CE_FP32_MATH = (
    "fp64"  # per-element math for fp32 logits: "fp64" (exact, see the kernel) or "fp32" (a benchmark)
)
# stats layout (fp64): non-ignored rows, their target-weight sum, min and max non-ignored target, weight total
_N_STATS = 5
# Start of a running max over logits: the lowest finite fp32, not -inf. While every logit so far is -inf the
# sum of exp(x - m) is then 0 (exp(-inf)), where exp(-inf - -inf) would make it NaN (and the row's later
# finite logits with it); a row of -inf logits only is still NaN in the end (-inf - log(0)), as torch's.
RUNNING_MAX_START = tl.constexpr(-3.4028234663852886e38)


# ----------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _f64(hi, lo):
    """An fp64 host scalar passed as two fp32 kernel arguments (``split_f64``): hi + lo, exact to ~48 bits.
    Triton types Python float arguments as fp32, which would round e.g. lse_square_scale=1e-3 by 5e-8."""
    return tl.cast(hi, tl.float64) + tl.cast(lo, tl.float64)


@triton.jit
def _tanh_and_sech2(u):
    """(tanh(u), 1 - tanh(u)^2) in u's precision (fp32 or fp64) without libdevice (the interpreter has none).

    |u| >= 0.3: e = exp(-2|u|) <= 0.55, tanh = (1 - e) / (1 + e) and sech^2 = 4e / (1 + e)^2, both free of
    cancellation and exact (+-1, 0) for huge |u|. |u| < 0.3: odd Taylor polynomial to u^13 (truncation error
    < 1e-10 relative), since 1 - e would cancel there.
    """
    a = tl.abs(u)
    e = tl.exp(-2.0 * a)
    inv = 1.0 / (1.0 + e)
    t_big = (1.0 - e) * inv
    sech2_big = 4.0 * e * inv * inv
    u2 = u * u
    poly = -1382.0 / 155925.0 + u2 * (21844.0 / 6081075.0)
    poly = 62.0 / 2835.0 + u2 * poly
    poly = -17.0 / 315.0 + u2 * poly
    poly = 2.0 / 15.0 + u2 * poly
    poly = -1.0 / 3.0 + u2 * poly
    t_small = u + u * u2 * poly
    small = a < 0.3
    t = tl.where(small, t_small, tl.where(u < 0.0, -t_big, t_big))
    sech2 = tl.where(small, 1.0 - t_small * t_small, sech2_big)
    return t, sech2


@triton.jit
def _softcap(x, softcap, COMPUTE_DTYPE: tl.constexpr):
    """(softcap * tanh(x / softcap), 1 - tanh^2(x / softcap)) in COMPUTE_DTYPE."""
    t, sech2 = _tanh_and_sech2(x.to(COMPUTE_DTYPE) / softcap)
    return softcap * t, sech2


@triton.jit
def _target_stats_kernel(
    target_ptr,
    weight_ptr,
    stats_ptr,  # (5,) fp64 out: n_valid, sum of w[y] over them, min y, max y (non-ignored), sum of all w
    n_rows,
    n_classes,
    ignore_index,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """One program: the reduction's denominators and the target range (checked on the host afterwards)."""
    n_valid = tl.zeros([BLOCK_SIZE], tl.int64)
    weight_sum = tl.zeros([BLOCK_SIZE], tl.float64)
    lo = tl.full([BLOCK_SIZE], 2**62, tl.int64)
    hi = tl.full([BLOCK_SIZE], -(2**62), tl.int64)
    for start in range(0, n_rows, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        in_bounds = offs < n_rows
        y = tl.load(target_ptr + offs, mask=in_bounds, other=0).to(tl.int64)
        valid = in_bounds & (y != ignore_index)
        n_valid += valid.to(tl.int64)
        lo = tl.where(valid, tl.minimum(lo, y), lo)
        hi = tl.where(valid, tl.maximum(hi, y), hi)
        if HAS_WEIGHT:
            in_range = valid & (y >= 0) & (y < n_classes)
            weight_sum += tl.load(weight_ptr + y, mask=in_range, other=0.0).to(tl.float64)
    count = tl.sum(n_valid, 0).to(tl.float64)
    tl.store(stats_ptr + 0, count)
    tl.store(stats_ptr + 2, tl.min(lo, 0).to(tl.float64))
    tl.store(stats_ptr + 3, tl.max(hi, 0).to(tl.float64))
    if HAS_WEIGHT:
        tl.store(stats_ptr + 1, tl.sum(weight_sum, 0))
        total = tl.zeros([BLOCK_SIZE], tl.float64)
        for start in range(0, n_classes, BLOCK_SIZE):
            offs = start + tl.arange(0, BLOCK_SIZE)
            total += tl.load(weight_ptr + offs, mask=offs < n_classes, other=0.0).to(tl.float64)
        tl.store(stats_ptr + 4, tl.sum(total, 0))
    else:
        tl.store(stats_ptr + 1, count)
        tl.store(stats_ptr + 4, tl.cast(n_classes, tl.float64))


@triton.jit
def _online_block(
    x_raw, mask, cols, m, d, smooth_acc, x_y, weight_ptr, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
):  # fmt: skip
    """Pass 1 on one block: running max m (fp32: any shift works, it only has to be the same in both passes),
    rescaled sum d of exp(x - m), smoothing sum of w_c * (x_c - s) for a finite shift s (the target logit, or
    the row's first one: large logits then do not cancel in W * lse - sum_c w_c * x_c; ``smoothing_shift``).
    Callers load masked-off lanes as -inf (exp gives 0 there without a select per element; softcap maps -inf
    to -softcap, so that case selects) and start m at RUNNING_MAX_START."""
    x = x_raw.to(COMPUTE_DTYPE)
    x_masked = x
    if HAS_SOFTCAP:
        x, _ = _softcap(x, softcap, COMPUTE_DTYPE)
        x_masked = tl.where(mask, x, -float("inf"))
    m_new = tl.maximum(m, tl.max(x_masked, 0).to(tl.float32))
    d = d * tl.exp((m - m_new).to(COMPUTE_DTYPE)) + tl.sum(tl.exp(x_masked - m_new.to(COMPUTE_DTYPE)), 0)
    if HAS_SMOOTHING:
        if HAS_WEIGHT:
            w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
            smooth_acc += tl.sum(tl.where(mask, w * (x - x_y), 0.0), 0)
        else:
            smooth_acc += tl.sum(tl.where(mask, x - x_y, 0.0), 0)
    return m_new, d, smooth_acc


@triton.jit
def smoothing_shift(x):
    """The shift of the smoothing sum: the logit ``x`` itself, or 0 where it is -inf (x_c - x would be
    inf - inf = NaN at c, where the smoothed loss is +inf, as torch's: -eps / V * log p_c = +inf)."""
    return tl.where(x == -float("inf"), 0.0, x)


@triton.jit
def _grad_values(
    x_raw, mask, cols, y, m_c, coef_p, coef_c, coef_y, weight_ptr, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
):  # fmt: skip
    """dx_c = coef_p * exp(x_c - m) - coef_c * w_c - coef_y * [c == y] (then times the softcap's sech^2), in
    COMPUTE_DTYPE. Blocks of one row (``cols`` 1-D), or 2-D tiles with classes along axis 0 (``cols`` of shape
    (BLOCK, 1); ``y`` and the coefficients one per column)."""
    x = x_raw.to(COMPUTE_DTYPE)
    if HAS_SOFTCAP:
        x, sech2 = _softcap(x, softcap, COMPUTE_DTYPE)
    dx = coef_p * tl.exp(x - m_c)
    if HAS_SMOOTHING:
        if HAS_WEIGHT:
            dx -= coef_c * tl.load(weight_ptr + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        else:
            dx -= coef_c
    dx = tl.where(cols == y, dx - coef_y, dx)
    if HAS_SOFTCAP:
        dx = dx * sech2
    return dx


@triton.jit
def _grad_block(
    x_raw, mask, cols, grad_row, y, m_c, coef_p, coef_c, coef_y, weight_ptr, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr, STORE_POLICY: tl.constexpr, STORE_CACHE: tl.constexpr,
):  # fmt: skip
    """Pass 2 on one block of a row: ``_grad_values``, stored with one rounding."""
    dx = _grad_values(
        x_raw, mask, cols, y, m_c, coef_p, coef_c, coef_y, weight_ptr, softcap,
        HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, COMPUTE_DTYPE,
    )  # fmt: skip
    tl.store(
        grad_row + cols, dx.to(grad_row.dtype.element_ty), mask=mask,
        cache_modifier=STORE_CACHE, eviction_policy=STORE_POLICY,
    )  # fmt: skip


@triton.jit
def _grad_coefs(
    stats_ptr, grad_scale_ptr, row, w_y, eps, zs, w_total, n_classes,
    MEAN: tl.constexpr, HAS_GRAD_SCALE: tl.constexpr,
):  # fmt: skip
    """The row's gradient coefficients that do not depend on its max and sum, fp64: (p_ce, p_z, coef_c,
    coef_y) with ``coef_p = (p_ce + p_z * lse) / d`` (see the module doc's dx_c)."""
    g = tl.cast(1.0, tl.float64)
    if HAS_GRAD_SCALE:
        g = tl.load(grad_scale_ptr + row).to(tl.float64)
    ce_s = g
    z_s = g
    if MEAN:  # IEEE division, as torch's mean: a target-weight sum of 0 makes the row's gradient NaN
        ce_s = g / tl.load(stats_ptr + 1)
        z_s = g / tl.load(stats_ptr + 0)
    p_ce = ce_s * ((1.0 - eps) * w_y + eps / n_classes * w_total)
    return p_ce, z_s * 2.0 * zs, ce_s * eps / n_classes, ce_s * (1.0 - eps) * w_y


@triton.jit
def _row_loss(nll, nll_shift, smooth_acc, w_y, eps, w_total, n_classes, HAS_SMOOTHING: tl.constexpr):
    """Unscaled cross-entropy of a row, fp64: ``(1 - eps) w_y nll`` plus the smoothing term, where
    ``sum_c w_c (lse - x_c) = W (lse - s) - sum_c w_c (x_c - s)`` for the shift s of the smoothing sum
    (``nll_shift = lse - s``)."""
    ce = (1.0 - eps) * w_y * nll
    if HAS_SMOOTHING:
        ce += eps / n_classes * (w_total * nll_shift - smooth_acc.to(tl.float64))
    return ce


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
):  # fmt: skip
    # int64 row offsets: rows * V passes 2^31 at 16k tokens x 128k vocabulary
    row = tl.program_id(0).to(tl.int64)
    logits_row = logits_ptr + row * logits_row_stride
    grad_row = grad_ptr + row * grad_row_stride
    y = tl.load(target_ptr + row).to(tl.int64)

    if y == ignore_index:
        tl.store(loss_ptr + row, 0.0)
        tl.store(z_loss_ptr + row, 0.0)
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
        p_ce, p_z, coef_c, coef_y = _grad_coefs(
            stats_ptr, grad_scale_ptr, row, w_y, eps, zs, w_total, n_cols, MEAN, HAS_GRAD_SCALE
        )
        coef_c = coef_c.to(COMPUTE_DTYPE)
        coef_y = coef_y.to(COMPUTE_DTYPE)

    # pass 1 (see _online_block); with PASS1_PREFETCH the next block's load is issued before this block's
    # two block-wide reductions, so loads stay in flight while they run
    m = tl.full([], RUNNING_MAX_START, tl.float32)
    d = tl.cast(0.0, COMPUTE_DTYPE)
    smooth_acc = tl.cast(0.0, COMPUTE_DTYPE)
    offs = tl.arange(0, BLOCK_SIZE)
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
        m, d, smooth_acc = _online_block(
            x_raw, mask, cols, m, d, smooth_acc, shift, weight_ptr, softcap,
            HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, COMPUTE_DTYPE,
        )  # fmt: skip

    # Per-row scalars in fp64 (a few flops per row), so that each meets the data with a single rounding.
    # m and log(d) stay apart: rounding lse = m + log(d) first would put ulp(lse) / 2 into every exp(x - lse).
    d64 = d.to(tl.float64)
    log_d = tl.log(d64)
    m64 = m.to(tl.float64)
    lse = m64 + log_d
    nll = (m64 - x_y.to(tl.float64)) + log_d
    nll_shift = (m64 - shift.to(tl.float64)) + log_d  # nll itself unless x_y = -inf
    ce = _row_loss(nll, nll_shift, smooth_acc, w_y, eps, w_total, n_cols, HAS_SMOOTHING)
    # unscaled: the reduction kernel divides the sums by the denominators once, as torch does
    tl.store(loss_ptr + row, ce)
    tl.store(z_loss_ptr + row, zs * lse * lse)

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


@triton.jit
def _reduce_losses_kernel(
    ce_rows_ptr,
    z_rows_ptr,
    stats_ptr,
    loss_ptr,  # out, in the loss dtype: (N,) for NONE, else a scalar (the z-loss included)
    z_ptr,  # out: the z-loss part, reduced the same way
    n_rows,
    MEAN: tl.constexpr,
    NONE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Per-row fp64 terms -> the loss: summed and divided in fp64, one rounding to the output dtype. NONE: one
    block of rows per program; else one program. Mean with nothing to average over (denominator 0) gives NaN,
    as torch's 0 / 0 (``with_denominator`` maps a given denominator of 0 to inf: 0)."""
    if NONE:
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < n_rows
        ce = tl.load(ce_rows_ptr + offs, mask=mask, other=0.0)
        z = tl.load(z_rows_ptr + offs, mask=mask, other=0.0)
        tl.store(loss_ptr + offs, (ce + z).to(loss_ptr.dtype.element_ty), mask=mask)
        tl.store(z_ptr + offs, z.to(z_ptr.dtype.element_ty), mask=mask)
    else:
        ce_acc = tl.zeros([BLOCK_SIZE], tl.float64)
        z_acc = tl.zeros([BLOCK_SIZE], tl.float64)
        for start in range(0, n_rows, BLOCK_SIZE):
            offs = start + tl.arange(0, BLOCK_SIZE)
            mask = offs < n_rows
            ce_acc += tl.load(ce_rows_ptr + offs, mask=mask, other=0.0)
            z_acc += tl.load(z_rows_ptr + offs, mask=mask, other=0.0)
        ce = tl.sum(ce_acc, 0)
        z = tl.sum(z_acc, 0)
        if MEAN:
            ce = ce / tl.load(stats_ptr + 1)
            z = z / tl.load(stats_ptr + 0)
        tl.store(loss_ptr, (ce + z).to(loss_ptr.dtype.element_ty))
        tl.store(z_ptr, z.to(z_ptr.dtype.element_ty))


@fast_launch
@triton.jit
def _scale_rows_kernel(
    x_ptr, x_row_stride, n_rows, n_cols, scale_ptr, scale_row_stride, BLOCK_SIZE: tl.constexpr
):
    """x[row, :] *= scale[row * scale_row_stride] (stride 0: one scalar), in fp32; nothing where it is 1.

    A persistent grid walks the (row, column block) tiles; with a scalar scale of exactly 1 (a plain
    ``loss.backward()``) every program returns after one load."""
    if (scale_row_stride == 0) & (tl.load(scale_ptr).to(tl.float32) == 1.0):
        return
    n_col_blocks = tl.cdiv(n_cols, BLOCK_SIZE)
    for tile in range(tl.program_id(0), n_rows * n_col_blocks, tl.num_programs(0)):
        row = tile // n_col_blocks
        s = tl.load(scale_ptr + row * scale_row_stride).to(tl.float32)
        if s != 1.0:
            cols = (tile - row * n_col_blocks) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
            mask = cols < n_cols
            ptrs = x_ptr + row.to(tl.int64) * x_row_stride + cols
            x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            tl.store(ptrs, (x * s).to(x_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------------------
# Host-side pieces shared with fused_linear_cross_entropy
# ----------------------------------------------------------------------------------------------------------


def _to_f32(x: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def split_f64(x: float) -> tuple[float, float]:
    """(hi, lo) fp32 values with hi + lo == x to ~48 bits: how an fp64 scalar reaches a kernel (``_f64``)."""
    hi = _to_f32(x)
    return hi, (_to_f32(x - hi) if math.isfinite(hi) else 0.0)


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


def check_targets_host(target: torch.Tensor, ignore_index: int, n_classes: int) -> None:
    """ValueError if a target is neither ignore_index nor in [0, n_classes) (the CPU reference path)."""
    if torch.compiler.is_compiling():  # a host sync (data-dependent branch): torch.compile cannot trace it
        return
    valid = target != ignore_index
    if bool(valid.any()):
        lo, hi = int(target[valid].min()), int(target[valid].max())
        raise_if_out_of_range(lo, hi, ignore_index, n_classes)


def raise_if_out_of_range(lo: int, hi: int, ignore_index: int, n_classes: int) -> None:
    if lo < 0 or hi >= n_classes:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"target contains class index {bad}, outside [0, {n_classes}) (the vocabulary size) and not "
            f"ignore_index={ignore_index}"
        )


def target_stats(
    target: torch.Tensor, weight: torch.Tensor | None, ignore_index: int, n_classes: int
) -> torch.Tensor:
    """Launch ``_target_stats_kernel``: a (5,) fp64 device tensor (see its doc); no host sync."""
    stats = torch.empty(_N_STATS, dtype=torch.float64, device=target.device)
    _target_stats_kernel[(1,)](
        target,
        weight if weight is not None else stats,
        stats,
        target.numel(),
        n_classes,
        ignore_index,
        HAS_WEIGHT=weight is not None,
        BLOCK_SIZE=1024 if target.device.type == "cuda" else 64,
        num_warps=4,
    )
    return stats


def denominator_tensor(
    denominator: torch.Tensor | float | None, reduction: str, device: torch.device
) -> torch.Tensor | None:
    """``denominator`` as a 0-dim fp64 tensor on ``device`` (no host sync), or a ValueError naming it."""
    if denominator is None:
        return None
    if reduction != "sum":
        raise ValueError(f"denominator divides a sum: it needs reduction='sum', got reduction={reduction!r}")
    if torch.is_tensor(denominator):
        if denominator.numel() != 1 or denominator.is_complex() or denominator.dtype == torch.bool:
            raise ValueError(
                f"denominator must be a real scalar tensor, got shape {tuple(denominator.shape)} "
                f"and dtype {denominator.dtype}"
            )
        return denominator.detach().to(device=device, dtype=torch.float64).reshape(())
    if isinstance(denominator, bool) or not isinstance(denominator, (int, float)):
        raise ValueError(f"denominator={denominator!r} must be a number or a 0-dim tensor")
    if not (math.isfinite(denominator) and denominator >= 0):  # 0: loss 0, as a tensor 0 gives
        raise ValueError(f"denominator={denominator!r} must be finite and not negative")
    return torch.full((), float(denominator), dtype=torch.float64, device=device)


def with_denominator(stats: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """A copy of ``stats`` whose mean denominators (n_valid for the z-loss, the target-weight sum for the
    cross-entropy) are ``denominator`` (0-dim fp64, on stats' device): a "mean" then computes
    ``sum / denominator`` with the division folded into the gradient before it is rounded. A denominator of 0
    is stored as inf, so that the loss and the gradients are 0 (the kernels divide as IEEE does, which is
    torch's NaN for a mean over nothing). A copy, so that a target check started on ``stats`` still reads its
    own count; no host sync."""
    out = stats.clone()
    out[:2] = torch.where(denominator == 0, torch.inf, denominator)
    return out


def start_target_check(stats: torch.Tensor) -> object:
    """Start reading the stats back without stalling the stream: on CUDA a non-blocking copy into pinned
    memory and an event, right after the stats kernel. ``finish_target_check`` waits for that event only,
    after the big kernels are queued: the host then waits for the stats, not for the loss kernels, and
    what it does next (returning, launching the backward) overlaps them.

    None (no check) while the stream is being captured into a CUDA graph (``torch.cuda.graph``,
    ``torch.compile(mode="reduce-overhead")``): a capture cannot wait for the device, and a replay would not
    re-run a host check anyway. The kernels clamp any target index, so a replay never reads out of bounds."""
    if stats.device.type != "cuda":
        return stats
    if torch.cuda.is_current_stream_capturing():
        return None
    host = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
    host.copy_(stats, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def finish_target_check(pending: object, ignore_index: int, n_classes: int) -> None:
    """The host sync of a forward: ValueError if a non-ignored target lies outside [0, n_classes)."""
    if isinstance(pending, tuple):
        host, event = pending
        event.synchronize()
        values = host.tolist()
    else:
        values = pending.tolist()
    n_valid, _, lo, hi, _ = values
    if n_valid:
        raise_if_out_of_range(int(lo), int(hi), ignore_index, n_classes)


def resident_kernel_runs(logits: torch.Tensor, weight: torch.Tensor | None, softcap: float | None) -> bool:
    """Whether ``launch_cross_entropy`` runs the resident (Hopper, Gluon) kernel on these logits."""
    return CE_RESIDENT and resident.resident_supported(logits, weight, softcap)


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
) -> None:
    """Run the kernel on (N, V) logits (unit column stride): unscaled per-row cross-entropy and z-loss into
    ``loss_rows``/``z_rows`` (fp64), and the gradient of the reduced loss (``mean``: terms divided by the
    denominators in ``stats``; rows multiplied by ``grad_scale``) into ``grad`` (may be ``logits``) unless
    None. ``state`` ((N, 4) fp64, only where ``resident_kernel_runs``, with ``grad``): each row's max and
    gradient coefficients, for the same gradient of logits recomputed later (fused_linear_cross_entropy)."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    if resident_kernel_runs(logits, weight, softcap):
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
        num_warps=warps,
    )


def reduce_losses(
    loss_rows: torch.Tensor, z_rows: torch.Tensor, stats: torch.Tensor, reduction: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, z_loss) in fp32 from the kernel's unscaled fp64 per-row terms (the loss includes the z-loss):
    one kernel, no host sync."""
    n_rows = loss_rows.numel()
    none = reduction == "none"
    shape = (n_rows,) if none else ()
    loss = torch.empty(shape, dtype=torch.float32, device=loss_rows.device)
    z = torch.empty(shape, dtype=torch.float32, device=loss_rows.device)
    if none and n_rows == 0:
        return loss, z
    block = 1024 if loss_rows.device.type == "cuda" else 64
    _reduce_losses_kernel[(cdiv(n_rows, block) if none else 1,)](
        loss_rows, z_rows, stats, loss, z, n_rows, MEAN=reduction == "mean", NONE=none, BLOCK_SIZE=block
    )
    return loss, z


def scale_rows_(x: torch.Tensor, scale: torch.Tensor) -> None:
    """In place: ``x (R, C) *= scale`` (a scalar, or one value per row), with no pass over memory where the
    scale is exactly 1 (no host sync needed to find out)."""
    if x.numel() == 0:
        return
    if x.dim() == 1:
        x = x.unsqueeze(0)
    n_rows, n_cols = x.shape
    assert x.stride(1) == 1
    scale_row_stride = 0 if scale.numel() == 1 else 1
    if scale_row_stride:
        assert scale.numel() == n_rows and scale.is_contiguous()
    block = min(4096, next_power_of_2(n_cols))
    n_tiles = n_rows * cdiv(n_cols, block)
    grid = (min(n_tiles, 8 * num_sms(x.device)),)
    _scale_rows_kernel[grid](
        x, x.stride(0), n_rows, n_cols, scale, scale_row_stride, BLOCK_SIZE=block,
        num_warps=8 if block >= 2048 else 4,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile; the host sync of the target check stays inside them). The autograd
# Functions call them through ``dispatch.launcher``: the custom op while torch.compile traces, the plain
# ``*_impl`` in eager mode (the dispatcher's host time per call is tens of microseconds).
# ----------------------------------------------------------------------------------------------------------


def _forward_impl(
    logits,
    target,
    weight,
    grad,
    ignore_index,
    reduction,
    label_smoothing,
    lse_square_scale,
    softcap,
    check_targets,
    denominator=None,
    grad_scale=None,
):
    n_cols = logits.shape[1]
    if denominator is not None:  # reduction "sum" divided by it: a "mean" over the given count
        reduction = "mean"
    stats = target_stats(target, weight if label_smoothing != 0.0 or reduction == "mean" else None,
                         ignore_index, n_cols)  # fmt: skip
    pending = start_target_check(stats) if check_targets else None
    if denominator is not None:
        stats = with_denominator(stats, denominator)
    loss_rows = torch.empty(logits.shape[0], dtype=torch.float64, device=logits.device)
    z_rows = torch.empty_like(loss_rows)
    launch_cross_entropy(
        logits,
        target,
        weight,
        grad,
        loss_rows,
        z_rows,
        stats,
        ignore_index=ignore_index,
        mean=reduction == "mean",
        label_smoothing=label_smoothing,
        lse_square_scale=lse_square_scale,
        softcap=softcap,
        grad_scale=grad_scale,
    )
    loss, z = reduce_losses(loss_rows, z_rows, stats, reduction)
    if pending is not None:  # after the launches: the GPU works while the host waits for the stats
        finish_target_check(pending, ignore_index, n_cols)
    return loss, z


def _fake_losses(logits, reduction):
    shape = (logits.shape[0],) if reduction == "none" else ()
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.float32)


def _cross_entropy_fwd_impl(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    compute_grad: bool,
    check_targets: bool = True,
    denominator: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, z_loss, grad) with the gradient in a new buffer (empty when ``compute_grad`` is False)."""
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format) if compute_grad else None
    loss, z = _forward_impl(
        logits,
        target,
        weight,
        grad,
        ignore_index,
        reduction,
        label_smoothing,
        lse_square_scale,
        softcap,
        check_targets,
        denominator,
    )
    return loss, z, grad if grad is not None else logits.new_empty(0)


_cross_entropy_fwd = torch.library.custom_op(
    "liger_core::cross_entropy_fwd", _cross_entropy_fwd_impl, mutates_args=()
)


@_cross_entropy_fwd.register_fake
def _(
    logits,
    target,
    weight,
    ignore_index,
    reduction,
    label_smoothing,
    lse_square_scale,
    softcap,
    compute_grad,
    check_targets=True,
    denominator=None,
):
    grad = (
        torch.empty_like(logits, memory_format=torch.contiguous_format)
        if compute_grad
        else logits.new_empty(0)
    )
    return (*_fake_losses(logits, reduction), grad)


def _cross_entropy_fwd_inplace_impl(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    check_targets: bool = True,
    denominator: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, z_loss); overwrites ``logits`` with the gradient (declared as a mutation, so autograd's version
    counter flags any other use of the old values in backward)."""
    return _forward_impl(
        logits,
        target,
        weight,
        logits,
        ignore_index,
        reduction,
        label_smoothing,
        lse_square_scale,
        softcap,
        check_targets,
        denominator,
    )


_cross_entropy_fwd_inplace = torch.library.custom_op(
    "liger_core::cross_entropy_fwd_inplace", _cross_entropy_fwd_inplace_impl, mutates_args=("logits",)
)


@_cross_entropy_fwd_inplace.register_fake
def _(
    logits,
    target,
    weight,
    ignore_index,
    reduction,
    label_smoothing,
    lse_square_scale,
    softcap,
    check_targets=True,
    denominator=None,
):
    return _fake_losses(logits, reduction)


def _scale_rows_impl(x: torch.Tensor, scale: torch.Tensor) -> None:
    """``x *= scale`` in place: a scalar scale, or one per row of a 2-D ``x``; free where the scale is 1."""
    scale_rows_(x, scale.contiguous())


_scale_rows = torch.library.custom_op("liger_core::scale_rows_", _scale_rows_impl, mutates_args=("x",))


@_scale_rows.register_fake
def _(x, scale):
    return None


def _grad_in_backward_impl(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    grad_loss: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    denominator: torch.Tensor | None,
    grad: torch.Tensor,
) -> None:
    """The gradient with ``grad_loss`` folded in before its one rounding, written into ``grad`` (may be
    ``logits``): the kernel again, with per-row gradient scales (the losses it computes are discarded)."""
    scale = grad_loss.reshape(-1).to(torch.float64)
    scale = scale.expand(logits.shape[0]) if scale.numel() == 1 else scale
    scale = scale.contiguous()  # the kernel reads one value per row at unit stride
    _forward_impl(
        logits, target, weight, grad, ignore_index, reduction, label_smoothing, lse_square_scale, softcap,
        False, denominator, grad_scale=scale,
    )  # fmt: skip


_grad_in_backward = torch.library.custom_op(
    "liger_core::cross_entropy_grad_", _grad_in_backward_impl, mutates_args=("grad",)
)


@_grad_in_backward.register_fake
def _(logits, target, weight, grad_loss, ignore_index, reduction, label_smoothing, lse_square_scale, softcap,
      denominator, grad):  # fmt: skip
    return None


# ----------------------------------------------------------------------------------------------------------
# Autograd and the functional entry point
# ----------------------------------------------------------------------------------------------------------


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        logits,
        target,
        weight,
        ignore_index,
        reduction,
        label_smoothing,
        lse_square_scale,
        softcap,
        inplace,
        check_targets,
        denominator=None,
    ):
        args = (target, weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap)
        ctx.grad_consumed = False
        if logits.dtype == torch.float16:
            # fp16: most gradient entries of a reduced loss (p / N) are subnormal, and scaling a stored
            # gradient by grad_output in backward would round them twice (a loss scaler's 2^16 then
            # multiplies what the first rounding lost; benchmarks/NOTES.md, session 10). So the forward
            # pass computes the losses only, and backward runs the kernel with grad_output folded in: one
            # more read of the logits, eager's single rounding.
            loss, z, _ = launcher(_cross_entropy_fwd, _cross_entropy_fwd_impl)(
                logits, *args, False, check_targets, denominator
            )
            ctx.grad_in_backward = (args, denominator, inplace and not torch.compiler.is_compiling())
            ctx.save_for_backward(logits)
            ctx.mark_non_differentiable(z)
            return loss, z
        ctx.grad_in_backward = None
        # under torch.compile the traced graph stays functional (the compiler plans its own buffers)
        if inplace and not torch.compiler.is_compiling():
            loss, z = launcher(_cross_entropy_fwd_inplace, _cross_entropy_fwd_inplace_impl)(
                logits, *args, check_targets, denominator
            )
            # the logits now hold the gradient: autograd refuses any later use of the old values (another
            # node that saved them) with its "modified by an inplace operation" error
            torch.autograd.graph.increment_version(logits)
            grad = logits
        else:
            loss, z, grad = launcher(_cross_entropy_fwd, _cross_entropy_fwd_impl)(
                logits, *args, True, check_targets, denominator
            )
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(z)
        return loss, z

    @staticmethod
    def backward(ctx, grad_loss, _grad_z):
        if ctx.grad_consumed:
            raise RuntimeError(
                "cross_entropy: the stored gradient was consumed by the first backward (scaled in place); "
                "backward through it twice (retain_graph=True) is not supported"
            )
        if ctx.grad_in_backward is not None:
            (logits,) = ctx.saved_tensors
            args, denominator, inplace = ctx.grad_in_backward
            # in place, the logits become the gradient: a second backward would read it as logits
            ctx.grad_consumed = inplace
            grad = logits if inplace else torch.empty_like(logits, memory_format=torch.contiguous_format)
            target, weight, *options = args
            launcher(_grad_in_backward, _grad_in_backward_impl)(
                logits, target, weight, grad_loss, *options, denominator, grad
            )
            if inplace:  # another node that saved these logits must not read the gradient as logits
                torch.autograd.graph.increment_version(logits)
            return grad.detach(), *(None,) * 10
        ctx.grad_consumed = True
        (grad,) = ctx.saved_tensors
        launcher(_scale_rows, _scale_rows_impl)(grad, grad_loss)
        return grad.detach(), *(None,) * 10


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    return_z_loss: bool = False,
    *,
    options: CrossEntropyOptions | None = None,
    inplace_backward: bool = False,
    check_targets: bool = True,
    denominator: torch.Tensor | float | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of ``logits (..., V)`` (any strides) against class indices ``target (...)``, as
    ``torch.nn.functional.cross_entropy`` (class ``weight``, ``ignore_index``, ``label_smoothing``,
    ``reduction``), plus z-loss ``lse_square_scale * logsumexp(logits)^2`` per non-ignored token and Gemma-2
    logit softcapping ``softcap * tanh(logits / softcap)`` applied first.

    The gradient is computed in the forward pass (fp32 math, one rounding to the logits dtype); backward only
    scales it by ``grad_output``, per token for ``reduction="none"``. fp16 logits: computed in backward
    instead, with ``grad_output`` inside its one rounding (see the module doc).

    ``denominator`` (a number >= 0 or a 0-dim tensor, with ``reduction="sum"``): the sum divided by it, as
    Hugging Face's causal-LM loss divides by ``num_items_in_batch``; the division is in the stored gradient
    before its rounding and in the loss before its (dividing the returned loss would round both again).

    Returns the loss in fp32 whatever the logits' dtype (as Hugging Face's loss on upcast logits; a bf16 loss
    would carry a relative error of ~2e-3), or ``(loss, z_loss)`` when ``return_z_loss``: ``z_loss`` is the
    z-loss part of ``loss``, reduced the same way, for logging (it carries no gradient; ``loss`` already
    includes it). The gradient has the logits' dtype.

    ``reduction="mean"`` with nothing to average (no rows, every target ignored, or all non-ignored targets
    of class weight 0) gives torch's NaN (0 / 0); the gradient is then 0 where every target is ignored and
    NaN in non-ignored rows of class weight 0, as torch's. Non-finite logits: see the module doc.

    Departures from torch, on purpose:
      - ignored rows are never read: their gradient is 0 even where their logits hold NaN or +inf (torch's
        log_softmax backward multiplies their zero gradient by exp(NaN) there).
      - ``denominator=0`` gives a loss of 0 and zero gradients (Hugging Face's division would give NaN).
      - the z-loss is not multiplied by class weights; ``mean`` divides it by the non-ignored token count.

    ``inplace_backward=True`` writes the gradient into the logits buffer during the forward pass (fp16:
    during backward), ~0 extra memory instead of one logits-sized buffer. The caller promises that nothing
    reads ``logits`` afterwards: their values are gone (autograd's version counter still raises if another
    autograd node saved them).
    Use it where the logits are a temporary made for this loss (e.g. an fp32 upcast); the default never
    modifies ``logits``, nor does a call whose logits' rows share memory (an expanded tensor: the gradient
    then goes to a buffer of its own).

    Targets must lie in [0, V) or equal ``ignore_index``: a ValueError otherwise, found on the device and
    read back with one host sync after the kernels are queued. ``check_targets=False`` skips that sync for
    callers whose targets are known to be valid; an out-of-range target then gets a meaningless loss and
    gradient for its row (the kernel clamps the index: never an out-of-bounds access).

    ``options``: the seven loss options (``weight`` to ``return_z_loss``) as one ``CrossEntropyOptions``,
    instead of the keywords (which then keep their defaults).
    """
    options = resolve_options(
        options, weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss
    )
    weight, ignore_index, reduction = options.weight, options.ignore_index, options.reduction
    check_tensor("logits", logits, min_ndim=1)
    check_tensor("target", target, dtypes=INDEX_DTYPES)
    check_shape("target", target, tuple(logits.shape[:-1]), "target must have the shape of logits[..., 0]")
    vocab = logits.shape[-1]
    if vocab == 0:
        raise ValueError("logits has a vocabulary (last) dimension of size 0")
    if weight is not None:
        check_tensor("weight", weight, dtypes=FLOAT_DTYPES + (torch.float64,))
        check_shape("weight", weight, (vocab,), "one weight per class")
    check_same_device("logits", logits, target=target, weight=weight)
    denominator = denominator_tensor(denominator, reduction, logits.device)

    if not use_triton(logits):
        check_targets_host(target.reshape(-1), ignore_index, vocab)  # same ValueError as the kernel path
        return reference.cross_entropy(logits, target, options=options, denominator=denominator)

    out_shape = target.shape
    logits2d = logits.reshape(-1, vocab)
    if logits2d.stride(1) != 1:
        logits2d = logits2d.contiguous()
    target1d = target.reshape(-1)
    if not target1d.is_contiguous():
        target1d = target1d.contiguous()
    if weight is not None:
        weight = weight.contiguous()
    if inplace_backward and logits2d.shape[0] > 1 and logits2d.stride(0) < vocab:
        # rows that share memory (e.g. an expanded tensor): the gradient of one would overwrite another's
        # logits, so it goes to a buffer of its own
        inplace_backward = False
    check_targets = bool(check_targets)
    if torch.is_grad_enabled() and logits.requires_grad:
        loss, z = CrossEntropyFunction.apply(
            logits2d, target1d, weight, *options.row_options(), inplace_backward, check_targets, denominator
        )
    else:  # no gradient wanted: one read of the logits, nothing written
        loss, z, _ = launcher(_cross_entropy_fwd, _cross_entropy_fwd_impl)(
            logits2d, target1d, weight, *options.row_options(), False, check_targets, denominator
        )
    if reduction == "none":
        loss, z = loss.view(out_shape), z.view(out_shape)
    return (loss, z) if options.return_z_loss else loss

"""Cross-entropy row math shared by the ops that compute a cross-entropy over a vocabulary row
(``cross_entropy``, ``fused_linear_cross_entropy``, ``fused_linear_logprobs``,
``fused_linear_logprob_loss``): the fp64-from-two-fp32 scalars, softcap, the online max / rescaled-sum
block update, the gradient block, the row loss, the target-stats kernel and the host checks built on it,
the loss reduction and the in-place row scaling of stored gradients. The formulas are in
``cross_entropy``'s module docstring.
"""

from __future__ import annotations

import math
import struct

import torch
import triton
import triton.language as tl

from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import cdiv, next_power_of_2, num_sms

REDUCTIONS = ("mean", "sum", "none")

# stats layout (fp64): non-ignored rows, their target-weight sum, min and max non-ignored target, weight total
_N_STATS = 5
# Start of a running max over logits: the lowest finite fp32, not -inf. While every logit so far is -inf the
# sum of exp(x - m) is then 0 (exp(-inf)), where exp(-inf - -inf) would make it NaN (and the row's later
# finite logits with it); a row of -inf logits only is still NaN in the end (-inf - log(0)), as torch's.
RUNNING_MAX_START = tl.constexpr(-3.4028234663852886e38)


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


def _to_f32(x: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def split_f64(x: float) -> tuple[float, float]:
    """(hi, lo) fp32 values with hi + lo == x to ~48 bits: how an fp64 scalar reaches a kernel (``_f64``)."""
    hi = _to_f32(x)
    return hi, (_to_f32(x - hi) if math.isfinite(hi) else 0.0)


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


def _scale_rows_impl(x: torch.Tensor, scale: torch.Tensor) -> None:
    """``x *= scale`` in place: a scalar scale, or one per row of a 2-D ``x``; free where the scale is 1."""
    scale_rows_(x, scale.contiguous())


_scale_rows = torch.library.custom_op("liger_core::scale_rows_", _scale_rows_impl, mutates_args=("x",))


@_scale_rows.register_fake
def _(x, scale):
    return None

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
non-ignored rows (the row count without weights) and the z-loss terms by the non-ignored row count;
``none`` keeps one loss per row. Ignored rows have loss 0 and gradient 0.

One program per row streams the row in column blocks, twice: pass 1 reads it once for the running max, the
rescaled sum of exponentials, the smoothing sum and the loss; pass 2 reads it again (mostly from L2: the
rows in flight fit in it) and writes the gradient, optionally into the logits buffer itself. Per-element math
in fp32 for 16-bit logits and in fp64 for fp32 logits (never less exact than eager fp32 that way), per-row
scalars in fp64, one rounding to the output dtype. Backward only multiplies the stored gradient by
``grad_output`` (a kernel that returns at once where ``grad_output`` is exactly 1, so a plain
``loss.backward()`` costs no pass over memory).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_choice,
    check_same_device,
    check_shape,
    check_tensor,
    launcher,
    use_triton,
)

REDUCTIONS = ("mean", "sum", "none")


# ----------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------


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
    n_cols,
    ignore_index,
    label_smoothing,
    lse_square_scale,
    softcap,
    ce_denom,  # the cross-entropy terms' denominator: sum of target weights for mean, else 1 (0: scale 0)
    z_denom,  # the z-loss terms' denominator: non-ignored rows for mean, else 1 (0: scale 0)
    weight_total,  # sum of all class weights (V without weights)
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_GRAD_SCALE: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    # per-element math: fp32 for 16-bit logits (its error is far below their rounding); fp64 for fp32 logits,
    # whose fp32 exp (GPU ex2.approx, numpy's 0.6 ulp rms) and extra roundings would double eager's error
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
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

    # the target logit is read before pass 2 can overwrite it
    x_y = tl.load(logits_row + y).to(COMPUTE_DTYPE)
    if HAS_SOFTCAP:
        x_y, _ = _softcap(x_y, softcap, COMPUTE_DTYPE)
    w_y = 1.0
    if HAS_WEIGHT:
        w_y = tl.load(weight_ptr + y).to(tl.float64)

    # pass 1: running max m (any shift works: it only has to be the same in both passes), sum d of
    # exp(x - m), smoothing sum of w_c * (x_c - x_y) (shifted by x_y so that large logits do not cancel in
    # W * lse - sum_c w_c * x_c)
    m = -float("inf")
    d = tl.cast(0.0, COMPUTE_DTYPE)
    smooth_acc = tl.cast(0.0, COMPUTE_DTYPE)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(logits_row + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        if HAS_SOFTCAP:
            x, _ = _softcap(x, softcap, COMPUTE_DTYPE)
        x_masked = tl.where(mask, x, -float("inf"))
        m_new = tl.maximum(m, tl.max(x_masked, 0).to(tl.float32))
        d = d * tl.exp((m - m_new).to(COMPUTE_DTYPE)) + tl.sum(tl.exp(x_masked - m_new.to(COMPUTE_DTYPE)), 0)
        m = m_new
        if HAS_SMOOTHING:
            if HAS_WEIGHT:
                w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
                smooth_acc += tl.sum(tl.where(mask, w * (x - x_y), 0.0), 0)
            else:
                smooth_acc += tl.sum(tl.where(mask, x - x_y, 0.0), 0)

    # Per-row scalars in fp64 (a few flops per row), so that each meets the data with a single rounding.
    # m and log(d) stay apart: rounding lse = m + log(d) first would put ulp(lse) / 2 into every exp(x - lse).
    d64 = d.to(tl.float64)
    log_d = tl.log(d64)
    m64 = m.to(tl.float64)
    lse = m64 + log_d
    nll = (m64 - x_y.to(tl.float64)) + log_d
    eps = tl.cast(label_smoothing, tl.float64)
    w_total = tl.cast(weight_total, tl.float64)
    zs = tl.cast(lse_square_scale, tl.float64)
    ce = (1.0 - eps) * w_y * nll
    if HAS_SMOOTHING:
        # sum_c w_c * (lse - x_c) = W * (lse - x_y) - sum_c w_c * (x_c - x_y)
        ce += eps / n_cols * (w_total * nll - smooth_acc.to(tl.float64))
    # unscaled: the host divides the sums by the denominators once, as torch does
    tl.store(loss_ptr + row, ce)
    tl.store(z_loss_ptr + row, zs * lse * lse)

    if COMPUTE_GRAD:
        g = 1.0
        if HAS_GRAD_SCALE:
            g = tl.load(grad_scale_ptr + row).to(tl.float64)
        ce_denom64 = tl.cast(ce_denom, tl.float64)
        z_denom64 = tl.cast(z_denom, tl.float64)
        ce_s = tl.where(ce_denom64 != 0.0, g / tl.where(ce_denom64 != 0.0, ce_denom64, 1.0), 0.0)
        z_s = tl.where(z_denom64 != 0.0, g / tl.where(z_denom64 != 0.0, z_denom64, 1.0), 0.0)
        # dx_c = coef_p * exp(x_c - m) - coef_c * w_c - coef_y * [c == y]   (p_c = exp(x_c - m) / d)
        coef_p = ((ce_s * ((1.0 - eps) * w_y + eps / n_cols * w_total) + z_s * 2.0 * zs * lse) / d64).to(
            COMPUTE_DTYPE
        )
        coef_y = (ce_s * (1.0 - eps) * w_y).to(COMPUTE_DTYPE)
        coef_c = (ce_s * eps / n_cols).to(COMPUTE_DTYPE)
        m_c = m.to(COMPUTE_DTYPE)
        # pass 2: gradient (each element is read before the same thread overwrites it, so in place is safe)
        for start in range(0, n_cols, BLOCK_SIZE):
            cols = start + tl.arange(0, BLOCK_SIZE)
            mask = cols < n_cols
            x = tl.load(logits_row + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
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
            tl.store(grad_row + cols, dx.to(grad_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scale_rows_kernel(x_ptr, x_row_stride, n_cols, scale_ptr, scale_row_stride, BLOCK_SIZE: tl.constexpr):
    """x[row, :] *= scale[row * scale_row_stride] (stride 0: one scalar), in fp32; nothing when it is 1."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.load(scale_ptr + row * scale_row_stride).to(tl.float32)
    if s != 1.0:
        cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        ptrs = x_ptr + row * x_row_stride + cols
        x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(ptrs, (x * s).to(x_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------------------
# Host-side pieces shared with fused_linear_cross_entropy
# ----------------------------------------------------------------------------------------------------------


def looped_row_settings(n_cols: int, device: torch.device) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for a kernel that streams one long row (a vocabulary) in column blocks.

    GPU: blocks of up to 32768 columns with 32 warps, one row per program. CPU interpreter: blocks of at most
    512 columns, so that the tests' odd vocabularies (131, 1031) cover both the one-block and the multi-block
    (online) paths. TODO(lead): move to ops/_launch.py once its pending edits land; tune on the H100.
    """
    cap = 32768 if device.type == "cuda" else 512
    block = min(cap, triton.next_power_of_2(max(n_cols, 1)))
    warps = 32 if block >= 16384 else 16 if block >= 4096 else 8 if block >= 1024 else 4
    return block, warps


def target_stats(
    target: torch.Tensor, weight: torch.Tensor | None, ignore_index: int, n_classes: int
) -> tuple[int, float]:
    """(non-ignored rows, sum of their class weights) of a 1-D target; ValueError if a target is out of range.

    This costs one small reduction over the targets (min/max, count, weight sum) and one host sync; it is the
    price of a clear ValueError instead of an out-of-bounds read (a device-side crash) in the kernel.
    """
    valid = target != ignore_index
    safe = torch.where(valid, target, 0)
    if target.numel():
        lo, hi = torch.aminmax(safe)
    else:
        lo = hi = safe.new_zeros(())
    parts = [lo.double(), hi.double(), valid.sum().double()]
    if weight is not None:
        parts.append((weight.double()[safe.clamp(0, n_classes - 1)] * valid).sum())
    stats = torch.stack(parts).tolist()
    lo, hi, n_valid = int(stats[0]), int(stats[1]), int(stats[2])
    if lo < 0 or hi >= n_classes:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"target contains class index {bad}, outside [0, {n_classes}) (the vocabulary size) and not "
            f"ignore_index={ignore_index}"
        )
    weight_sum = stats[3] if weight is not None else float(n_valid)
    return n_valid, weight_sum


def reduction_denominators(reduction: str, n_valid: int, weight_sum: float) -> tuple[float, float]:
    """(cross-entropy, z-loss) denominators of the reduction: ``mean`` divides the cross-entropy terms by the
    target weights' sum and the z-loss terms by the non-ignored rows; others by 1. A denominator of 0 (nothing
    to average over) scales the gradient by 0: loss 0, zero gradients, where torch gives NaN."""
    if reduction != "mean":
        return 1.0, 1.0
    return weight_sum, float(n_valid)


def reduce_rows(
    ce_rows: torch.Tensor, z_rows: torch.Tensor, reduction: str, n_valid: int, weight_sum: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, z_loss) in float64 from the kernel's unscaled fp64 per-row terms (the loss includes the z-loss).

    Summed and divided in float64 (N values: free), so that the only rounding after the per-row terms is the
    caller's final cast to the output dtype.
    """
    if reduction == "none":
        return ce_rows + z_rows, z_rows
    ce, z = ce_rows.sum(), z_rows.sum()
    if reduction == "mean":
        # nothing to average over (all ignored, or all target weights 0): 0, where torch gives NaN
        ce = ce / weight_sum if weight_sum != 0 else torch.zeros_like(ce)
        z = z / n_valid if n_valid else torch.zeros_like(z)
    return ce + z, z


def launch_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    grad: torch.Tensor | None,
    loss_rows: torch.Tensor,
    z_rows: torch.Tensor,
    *,
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    ce_denom: float,
    z_denom: float,
    weight_total: float,
    grad_scale: torch.Tensor | None = None,
) -> None:
    """Run the kernel on (N, V) logits (unit column stride): unscaled per-row cross-entropy and z-loss into
    ``loss_rows``/``z_rows`` (fp64), and the gradient of the reduced loss (terms divided by ``ce_denom``/
    ``z_denom``, rows multiplied by ``grad_scale``) into ``grad`` (may be ``logits`` itself) unless None."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    block, warps = looped_row_settings(n_cols, logits.device)
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
        n_cols,
        ignore_index,
        float(label_smoothing),
        float(lse_square_scale),
        float(softcap) if softcap is not None else 1.0,
        float(ce_denom),
        float(z_denom),
        float(weight_total),
        HAS_WEIGHT=weight is not None,
        HAS_SMOOTHING=label_smoothing != 0.0,
        HAS_SOFTCAP=softcap is not None,
        COMPUTE_DTYPE=tl.float64 if logits.dtype == torch.float32 else tl.float32,
        HAS_GRAD_SCALE=grad_scale is not None,
        COMPUTE_GRAD=grad is not None,
        BLOCK_SIZE=block,
        num_warps=warps,
    )


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
    # columns per program: large blocks, and at most 65535 of them (the grid's second axis limit)
    block = max(min(4096, triton.next_power_of_2(n_cols)), triton.next_power_of_2(triton.cdiv(n_cols, 65535)))
    _scale_rows_kernel[(n_rows, triton.cdiv(n_cols, block))](
        x, x.stride(0), n_cols, scale, scale_row_stride, BLOCK_SIZE=block, num_warps=8 if block >= 2048 else 4
    )


# ----------------------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile; the host sync of the target check stays inside them). The autograd
# Functions call them through ``dispatch.launcher``: the custom op while torch.compile traces, the plain
# ``*_impl`` in eager mode (the dispatcher's host time per call is tens of microseconds).
# ----------------------------------------------------------------------------------------------------------


def _forward_impl(
    logits, target, weight, grad, ignore_index, reduction, label_smoothing, lse_square_scale, softcap
):
    n_rows, n_cols = logits.shape
    n_valid, weight_sum = target_stats(target, weight, ignore_index, n_cols)
    ce_denom, z_denom = reduction_denominators(reduction, n_valid, weight_sum)
    weight_total = float(weight.double().sum()) if weight is not None and label_smoothing != 0.0 else n_cols
    loss_rows = torch.empty(n_rows, dtype=torch.float64, device=logits.device)
    z_rows = torch.empty(n_rows, dtype=torch.float64, device=logits.device)
    launch_cross_entropy(
        logits,
        target,
        weight,
        grad,
        loss_rows,
        z_rows,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        lse_square_scale=lse_square_scale,
        softcap=softcap,
        ce_denom=ce_denom,
        z_denom=z_denom,
        weight_total=weight_total,
    )
    loss, z = reduce_rows(loss_rows, z_rows, reduction, n_valid, weight_sum)
    return loss.to(logits.dtype), z.to(logits.dtype)


def _fake_losses(logits, reduction):
    shape = (logits.shape[0],) if reduction == "none" else ()
    return logits.new_empty(shape), logits.new_empty(shape)


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, z_loss, grad) with the gradient in a new buffer (empty when ``compute_grad`` is False)."""
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format) if compute_grad else None
    loss, z = _forward_impl(
        logits, target, weight, grad, ignore_index, reduction, label_smoothing, lse_square_scale, softcap
    )
    return loss, z, grad if grad is not None else logits.new_empty(0)


_cross_entropy_fwd = torch.library.custom_op(
    "liger_core::cross_entropy_fwd", _cross_entropy_fwd_impl, mutates_args=()
)


@_cross_entropy_fwd.register_fake
def _(
    logits, target, weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap, compute_grad
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, z_loss); overwrites ``logits`` with the gradient (declared as a mutation, so autograd's version
    counter flags any other use of the old values in backward)."""
    return _forward_impl(
        logits, target, weight, logits, ignore_index, reduction, label_smoothing, lse_square_scale, softcap
    )


_cross_entropy_fwd_inplace = torch.library.custom_op(
    "liger_core::cross_entropy_fwd_inplace", _cross_entropy_fwd_inplace_impl, mutates_args=("logits",)
)


@_cross_entropy_fwd_inplace.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap):
    return _fake_losses(logits, reduction)


def _scale_rows_impl(x: torch.Tensor, scale: torch.Tensor) -> None:
    """``x *= scale`` in place: a scalar scale, or one per row of a 2-D ``x``; free where the scale is 1."""
    scale_rows_(x, scale.contiguous())


_scale_rows = torch.library.custom_op("liger_core::scale_rows_", _scale_rows_impl, mutates_args=("x",))


@_scale_rows.register_fake
def _(x, scale):
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
    ):
        args = (target, weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap)
        # under torch.compile the traced graph stays functional (the compiler plans its own buffers)
        if inplace and not torch.compiler.is_compiling():
            loss, z = launcher(_cross_entropy_fwd_inplace, _cross_entropy_fwd_inplace_impl)(logits, *args)
            # the logits now hold the gradient: autograd refuses any later use of the old values (another
            # node that saved them) with its "modified by an inplace operation" error
            torch.autograd.graph.increment_version(logits)
            grad = logits
        else:
            loss, z, grad = launcher(_cross_entropy_fwd, _cross_entropy_fwd_impl)(logits, *args, True)
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(z)
        ctx.grad_consumed = False
        return loss, z

    @staticmethod
    def backward(ctx, grad_loss, _grad_z):
        if ctx.grad_consumed:
            raise RuntimeError(
                "cross_entropy: the stored gradient was consumed by the first backward (scaled in place); "
                "backward through it twice (retain_graph=True) is not supported"
            )
        ctx.grad_consumed = True
        (grad,) = ctx.saved_tensors
        launcher(_scale_rows, _scale_rows_impl)(grad, grad_loss)
        return grad.detach(), None, None, None, None, None, None, None, None


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
    inplace_backward: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of ``logits (..., V)`` against class indices ``target (...)``, as
    ``torch.nn.functional.cross_entropy`` (class ``weight``, ``ignore_index``, ``label_smoothing``,
    ``reduction``), plus z-loss ``lse_square_scale * logsumexp(logits)^2`` per non-ignored token and Gemma-2
    logit softcapping ``softcap * tanh(logits / softcap)`` applied first.

    The gradient is computed in the forward pass (fp32 math, one rounding to the logits dtype); backward only
    scales it by ``grad_output``, per token for ``reduction="none"``.

    Returns the loss in the logits dtype (fp32 under autocast, as torch's autocast policy for cross_entropy),
    or ``(loss, z_loss)`` when ``return_z_loss``: ``z_loss`` is the z-loss part of ``loss``, reduced the same
    way, for logging (it carries no gradient; ``loss`` already includes it).

    Departures from torch, on purpose:
      - ``reduction="mean"`` with nothing to average (every target ignored, or all non-ignored targets of
        class weight 0) returns 0 with zero gradients, where torch returns NaN (0 / 0).
      - the z-loss is not multiplied by class weights; ``mean`` divides it by the non-ignored token count.

    ``inplace_backward=True`` writes the gradient into the logits buffer during the forward pass (~0 extra
    memory instead of one logits-sized buffer). The caller promises that nothing reads ``logits`` afterwards:
    their values are gone (autograd's version counter still raises if another autograd node saved them).
    Use it where the logits are a temporary made for this loss (e.g. an fp32 upcast); the default never
    modifies ``logits``. Targets must lie in [0, V) or equal ``ignore_index`` (checked on the host: one small
    reduction and one sync).
    """
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
    check_choice("reduction", reduction, REDUCTIONS)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing={label_smoothing} must lie in [0, 1]")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap={softcap} must be positive (or None)")
    if not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    options = (
        ignore_index,
        reduction,
        float(label_smoothing),
        float(lse_square_scale),
        float(softcap) if softcap is not None else None,
    )

    if not use_triton(logits):
        target_stats(target.reshape(-1), weight, ignore_index, vocab)  # same ValueError as the kernel path
        return reference.cross_entropy(logits, target, weight, *options, return_z_loss)

    out_shape = target.shape
    logits2d = logits.reshape(-1, vocab)
    if logits2d.stride(1) != 1:
        logits2d = logits2d.contiguous()
    target1d = target.reshape(-1)
    if weight is not None:
        weight = weight.contiguous()
    if torch.is_grad_enabled() and logits.requires_grad:
        loss, z = CrossEntropyFunction.apply(logits2d, target1d, weight, *options, inplace_backward)
    else:  # no gradient wanted: one read of the logits, nothing written
        loss, z, _ = launcher(_cross_entropy_fwd, _cross_entropy_fwd_impl)(
            logits2d, target1d, weight, *options, False
        )
    if reduction == "none":
        loss, z = loss.view(out_shape), z.view(out_shape)
    if torch.is_autocast_enabled(logits.device.type):
        loss, z = loss.float(), z.float()
    return (loss, z) if return_z_loss else loss

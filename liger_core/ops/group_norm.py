"""GroupNorm over ``x`` of shape (N, C, *): the C channels split into ``num_groups`` groups, each (sample,
group) normalised over its channels and positions, then a per-channel affine::

    n     = (C / G) * S                       (S: the product of the trailing dimensions)
    mean  = sum(x) / n,   var = sum((x - mean)**2) / n,   rstd = 1 / sqrt(var + eps)   (per sample and group)
    xhat  = (x - mean) * rstd
    y     = xhat * w[c] + b[c]                (evaluated as torch does: x * (rstd w) + (b - mean rstd w))

Backward (``g = dy * w[c]``)::

    dx    = rstd * (g - sum(g) / n - xhat * sum(g * xhat) / n)
          = rstd * g + c2 * x + c3            (torch's form: c2 = (sum(g) mean - sum(g x)) rstd**3 / n,
                                               c3 = -c2 mean - sum(g) rstd / n)
    dw[c] = sum over samples and positions of dy * xhat,   db[c] = sum of dy

Kernels: one program per (sample, group), looping over its channels and over blocks of positions (any group
size); the forward makes three passes (sum, centred sum of squares, y), the backward two (the two sums with
the per-(sample, channel) dw and db partials, then dx); the partials are summed over samples afterwards.
Precision: fp32 in the kernels for 16-bit data; fp64 sums and saved statistics for fp32 data or an fp32
weight (whose gradient is fp32).

The reference implementation is ``torch.nn.functional.group_norm`` (``liger_core.reference.group_norm``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import check_same_device, check_shape, check_tensor, launcher, use_triton
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import next_power_of_2
from liger_core.ops._norm_math import widen
from liger_core.sharding import is_dtensor

# Positions per block: a group is read in blocks of at most this many positions of one channel.
GROUP_NORM_BLOCK = 1024


@fast_launch
@triton.jit
def _group_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    n_groups,
    channels_per_group,
    n_positions,
    x_sample_stride,
    x_channel_stride,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
    PRECISE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # (sample, group); int64: offsets pass 2^31 for large activations
    sample = row // n_groups
    first_channel = (row % n_groups) * channels_per_group
    x_base = x_ptr + sample * x_sample_stride + first_channel * x_channel_stride
    y_base = y_ptr + (sample * n_groups * channels_per_group + first_channel) * n_positions  # y contiguous
    offs = tl.arange(0, BLOCK)
    n = channels_per_group * n_positions
    total = widen(tl.zeros([BLOCK], dtype=tl.float32), PRECISE)
    for ch in range(0, channels_per_group):
        for start in range(0, n_positions, BLOCK):
            pos = start + offs
            x = tl.load(x_base + ch * x_channel_stride + pos, mask=pos < n_positions, other=0.0)
            total += widen(x.to(tl.float32), PRECISE)
    mean = tl.sum(total, axis=0) / n
    centred = widen(tl.zeros([BLOCK], dtype=tl.float32), PRECISE)
    for ch in range(0, channels_per_group):
        for start in range(0, n_positions, BLOCK):
            pos = start + offs
            mask = pos < n_positions
            x = widen(
                tl.load(x_base + ch * x_channel_stride + pos, mask=mask, other=0.0).to(tl.float32), PRECISE
            )
            d = tl.where(mask, x - mean, 0.0)
            centred += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(centred, axis=0) / n + eps)
    tl.store(mean_ptr + row, mean.to(mean_ptr.dtype.element_ty))
    tl.store(rstd_ptr + row, rstd.to(rstd_ptr.dtype.element_ty))
    for ch in range(0, channels_per_group):
        # torch's form, y = x * scale + shift: the same NaN / inf where a weight or bias is non-finite (the
        # cancellation of x * scale against mean * scale costs nothing at this precision)
        scale = rstd
        if HAS_WEIGHT:
            scale = rstd * widen(tl.load(w_ptr + first_channel + ch).to(tl.float32), PRECISE)
        shift = -mean * scale
        if HAS_BIAS:
            shift += widen(tl.load(b_ptr + first_channel + ch).to(tl.float32), PRECISE)
        for start in range(0, n_positions, BLOCK):
            pos = start + offs
            mask = pos < n_positions
            x = widen(
                tl.load(x_base + ch * x_channel_stride + pos, mask=mask, other=0.0).to(tl.float32), PRECISE
            )
            y = x * scale + shift
            if y_ptr.dtype.element_ty != tl.float64:
                y = y.to(tl.float32)  # fp64 -> 16-bit goes through fp32, as torch's cast does
            tl.store(y_base + ch * n_positions + pos, y.to(y_ptr.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _group_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,  # (N, C): per sample and channel, sum over positions of dy * xhat
    db_partial_ptr,  # (N, C): of dy
    n_groups,
    channels_per_group,
    n_positions,
    x_sample_stride,
    x_channel_stride,
    dy_sample_stride,
    dy_channel_stride,
    HAS_WEIGHT: tl.constexpr,
    BLOCK: tl.constexpr,
    PRECISE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    sample = row // n_groups
    first_channel = (row % n_groups) * channels_per_group
    n_channels = n_groups * channels_per_group
    x_base = x_ptr + sample * x_sample_stride + first_channel * x_channel_stride
    dy_base = dy_ptr + sample * dy_sample_stride + first_channel * dy_channel_stride
    dx_base = dx_ptr + (sample * n_channels + first_channel) * n_positions  # dx contiguous
    offs = tl.arange(0, BLOCK)
    n = channels_per_group * n_positions
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    # sum(g) and sum(g x) of the group, as torch sums them: per channel sums of dy and dy * x times w[c]
    total_g = tl.sum(widen(tl.zeros([BLOCK], dtype=tl.float32), PRECISE), axis=0)
    total_gx = total_g
    for ch in range(0, channels_per_group):
        dw_acc = widen(tl.zeros([BLOCK], dtype=tl.float32), PRECISE)
        db_acc = widen(tl.zeros([BLOCK], dtype=tl.float32), PRECISE)
        dyx_acc = widen(tl.zeros([BLOCK], dtype=tl.float32), PRECISE)
        for start in range(0, n_positions, BLOCK):
            pos = start + offs
            mask = pos < n_positions
            x = widen(
                tl.load(x_base + ch * x_channel_stride + pos, mask=mask, other=0.0).to(tl.float32), PRECISE
            )
            dy = tl.load(dy_base + ch * dy_channel_stride + pos, mask=mask, other=0.0)
            dy = widen(dy.to(tl.float32), PRECISE)
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
            dw_acc += dy * xhat
            db_acc += dy
            dyx_acc += dy * x
        db_c = tl.sum(db_acc, axis=0)
        dyx_c = tl.sum(dyx_acc, axis=0)
        tl.store(dw_partial_ptr + sample * n_channels + first_channel + ch, tl.sum(dw_acc, axis=0))
        tl.store(db_partial_ptr + sample * n_channels + first_channel + ch, db_c)
        if HAS_WEIGHT:
            w = widen(tl.load(w_ptr + first_channel + ch).to(tl.float32), PRECISE)
            db_c = db_c * w
            dyx_c = dyx_c * w
        total_g += db_c
        total_gx += dyx_c
    # torch's form of dx = rstd (g - mean(g) - xhat mean(g xhat)): dx = rstd g + c2 x + c3, so that a
    # non-finite weight gives NaN / inf where torch's backward does
    c2 = (total_g * mean - total_gx) * rstd * rstd * rstd / n
    c3 = -c2 * mean - total_g * rstd / n
    for ch in range(0, channels_per_group):
        for start in range(0, n_positions, BLOCK):
            pos = start + offs
            mask = pos < n_positions
            x = widen(
                tl.load(x_base + ch * x_channel_stride + pos, mask=mask, other=0.0).to(tl.float32), PRECISE
            )
            dy = tl.load(dy_base + ch * dy_channel_stride + pos, mask=mask, other=0.0)
            dy = widen(dy.to(tl.float32), PRECISE)
            g = dy
            if HAS_WEIGHT:
                g = dy * widen(tl.load(w_ptr + first_channel + ch).to(tl.float32), PRECISE)
            dx = rstd * g + c2 * x + c3
            if dx_ptr.dtype.element_ty != tl.float64:
                dx = dx.to(tl.float32)
            tl.store(dx_base + ch * n_positions + pos, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _channels_view(t: torch.Tensor) -> torch.Tensor:
    """(N, C, S) view with unit position stride (a copy only when no such view exists)."""
    t3 = t.reshape(t.shape[0], t.shape[1], math.prod(t.shape[2:]))
    return t3 if t3.stride(-1) == 1 or t3.shape[-1] == 1 else t3.contiguous()


def _precise(x: torch.Tensor, w: torch.Tensor | None) -> bool:
    """fp64 sums and statistics: for fp32 data, and for 16-bit data with an fp32 weight (whose gradient is
    then an fp32 result of long sums over xhat, as precise as the saved statistics)."""
    return x.dtype == torch.float32 or (w is not None and w.dtype == torch.float32)


def _output_dtype(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None) -> torch.dtype:
    """torch's: x's dtype (its mixed-precision GroupNorm keeps the input dtype for fp32 parameters)."""
    return x.dtype


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces a patched
# model through them without graph breaks; eager mode calls the plain implementations (``dispatch.launcher``).
# x and dy arrive as (N, C, S) views with unit position stride; y and dx are written contiguous.
def _group_norm_fwd_impl(
    x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None, num_groups: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n_samples, n_channels, n_positions = x.shape
    precise = _precise(x, w)
    stats_dtype = torch.float64 if precise else torch.float32
    y = torch.empty((n_samples, n_channels, n_positions), dtype=_output_dtype(x, w, b), device=x.device)
    mean = torch.empty((n_samples, num_groups), dtype=stats_dtype, device=x.device)
    rstd = torch.empty((n_samples, num_groups), dtype=stats_dtype, device=x.device)
    if y.numel() == 0:
        return y, mean, rstd
    block = min(GROUP_NORM_BLOCK, next_power_of_2(n_positions))
    _group_norm_fwd_kernel[(n_samples * num_groups,)](
        x, x if w is None else w, x if b is None else b, y, mean, rstd, num_groups, n_channels // num_groups,
        n_positions, x.stride(0), x.stride(1), eps, HAS_WEIGHT=w is not None, HAS_BIAS=b is not None,
        BLOCK=block, PRECISE=precise, num_warps=4 if block <= 512 else 8,
    )  # fmt: skip
    return y, mean, rstd


def _group_norm_bwd_impl(
    dy: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    num_groups: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db), dw and db as fp32 (fp64 for fp32 data) per-channel sums; the caller casts them."""
    n_samples, n_channels, n_positions = x.shape
    precise = _precise(x, w)
    partial_dtype = torch.float64 if precise else torch.float32
    dx = torch.empty((n_samples, n_channels, n_positions), dtype=x.dtype, device=x.device)
    dw = torch.zeros((n_samples, n_channels), dtype=partial_dtype, device=x.device)
    db = torch.zeros((n_samples, n_channels), dtype=partial_dtype, device=x.device)
    if x.numel() > 0:
        block = min(GROUP_NORM_BLOCK, next_power_of_2(n_positions))
        _group_norm_bwd_kernel[(n_samples * num_groups,)](
            dy, x, x if w is None else w, mean, rstd, dx, dw, db, num_groups, n_channels // num_groups,
            n_positions, x.stride(0), x.stride(1), dy.stride(0), dy.stride(1), HAS_WEIGHT=w is not None,
            BLOCK=block, PRECISE=precise, num_warps=4 if block <= 512 else 8,
        )  # fmt: skip
    return dx, dw.sum(0), db.sum(0)


_group_norm_fwd = torch.library.custom_op("liger_core::group_norm_fwd", _group_norm_fwd_impl, mutates_args=())
_group_norm_bwd = torch.library.custom_op("liger_core::group_norm_bwd", _group_norm_bwd_impl, mutates_args=())


@_group_norm_fwd.register_fake
def _(x, w, b, num_groups, eps):
    stats = torch.float64 if _precise(x, w) else torch.float32
    y = x.new_empty(x.shape, dtype=_output_dtype(x, w, b))
    return (
        y,
        x.new_empty((x.shape[0], num_groups), dtype=stats),
        x.new_empty((x.shape[0], num_groups), dtype=stats),
    )


@_group_norm_bwd.register_fake
def _(dy, x, w, mean, rstd, num_groups):
    precise = _precise(x, w)
    partial = torch.float64 if precise else torch.float32
    return (
        x.new_empty(x.shape),
        x.new_empty(x.shape[1], dtype=partial),
        x.new_empty(x.shape[1], dtype=partial),
    )


class GroupNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, num_groups: int, eps: float):
        y, mean, rstd = launcher(_group_norm_fwd, _group_norm_fwd_impl)(x, w, b, num_groups, eps)
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.num_groups = num_groups
        ctx.b_dtype = None if b is None else b.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        bwd = launcher(_group_norm_bwd, _group_norm_bwd_impl)
        dx, dw, db = bwd(_channels_view(dy), x, w, mean, rstd, ctx.num_groups)
        dw = None if w is None else dw.to(w.dtype)
        db = None if ctx.b_dtype is None else db.to(ctx.b_dtype)
        return dx, dw, db, None, None


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """GroupNorm of ``x`` (N, C, *) in ``num_groups`` groups of channels (module doc), with
    ``torch.nn.functional.group_norm``'s arguments and result.

    Args:
        x: ``(N, C, *)``, any strides (copied where the positions of a channel are not contiguous).
        num_groups: a positive divisor of C.
        weight, bias: ``(C,)`` or None.
    """
    if any(is_dtensor(t) for t in (x, weight, bias) if t is not None):
        raise TypeError("x, weight and bias must be plain tensors (DTensors are not supported here)")
    check_tensor("x", x, min_ndim=2)
    n_channels = x.shape[1]
    if not isinstance(num_groups, int) or isinstance(num_groups, bool) or num_groups <= 0:
        raise ValueError(f"num_groups={num_groups!r} must be a positive int")
    if n_channels % num_groups:
        raise ValueError(
            f"num_groups={num_groups} must divide the number of channels x.shape[1]={n_channels}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            check_tensor(name, p, ndim=1)
            check_shape(name, p, (n_channels,), f"{name} must have one value per channel of x")
    check_same_device("x", x, weight=weight, bias=bias)
    if not use_triton(x):
        return reference.group_norm(x, num_groups, weight, bias, eps)
    w = None if weight is None else weight.contiguous()
    b = None if bias is None else bias.contiguous()
    y = GroupNormFunction.apply(_channels_view(x), w, b, num_groups, float(eps))
    return y.view(x.shape)

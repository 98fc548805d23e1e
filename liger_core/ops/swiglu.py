"""SwiGLU activation: ``y = silu(a) * b`` (Llama MLP: ``down(silu(gate(x)) * up(x))``), and its clamped,
scaled variant (gpt-oss experts).

Math (all in fp32 inside the kernel, one rounding to the output dtype)::

    s  = sigmoid(a),   silu(a) = a * s
    y  = a * s * b
    da = dy * b * s * (1 + a * (1 - s))
    db = dy * a * s

``s`` comes from ``m = sigmoid(-|a|)`` (``_activation_math``): silu is ``a - a m`` or ``a m``, one rounding
fewer than ``a * s`` and no cancellation in ``1 - s``.

The variant (``alpha``, ``limit``, ``up_offset``; gpt-oss's ``_apply_gate``)::

    g  = min(a, limit),  u = clamp(b, -limit, limit)      (no clamp when limit is None)
    s  = sigmoid(alpha g)
    y  = g s (u + up_offset)
    da = dy (u + up_offset) (s + alpha g s (1 - s))   where a <= limit, else 0
    db = dy g s                                         where -limit <= b <= limit, else 0

(the gradient masks are torch.clamp's: the boundary itself passes the gradient, NaN does not).

``swiglu_packed(gate_up)`` takes the projection's output with gate and up in one tensor, as MoE experts
compute it (gate the first half of the last dimension, or the even columns with ``interleaved=True``), and
reads both halves in place: no copies of the two halves in forward, and the backward writes the gradient of
``gate_up`` directly.

Nothing is saved for backward but the inputs: the backward kernel recomputes ``s`` (one extra exp per element
is free in a bandwidth-bound kernel). Minimal HBM traffic: forward reads a, b and writes y (3 tensors);
backward reads dy, a, b and writes da, db (5 tensors).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import check_same_device, check_shape, check_tensor, launcher, use_triton
from liger_core.ops._activation_math import (
    gradients_in_saved_inputs,
    sigmoid_from_m,
    sigmoid_of_minus_abs,
    times_sigmoid,
    use_inplace_backward,
)
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import cdiv, elementwise_settings


@triton.jit
def _source_offsets(offsets, n_cols, row_stride, col_step, PACKED: tl.constexpr):
    """Where output element ``offsets`` reads a and b: the same flat index, or (packed) row * row_stride +
    col * col_step, with b's pointer already at the first up column."""
    if PACKED:
        return (offsets // n_cols) * row_stride + (offsets % n_cols) * col_step
    return offsets


@triton.jit
def _clamp(a, b, limit, CLAMP: tl.constexpr):
    """gate = min(a, limit), up = clamp(b, -limit, limit); NaN stays NaN (as torch.clamp)."""
    if CLAMP:
        a = tl.where(a > limit, limit, a)
        b = tl.where(b > limit, limit, tl.where(b < -limit, -limit, b))
    return a, b


@fast_launch
@triton.jit
def _swiglu_fwd_kernel(
    a_ptr, b_ptr, y_ptr, n_elements, n_cols, row_stride, col_step, alpha, limit, up_offset,
    PACKED: tl.constexpr, VARIANT: tl.constexpr, CLAMP: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    # int64 offsets: n_elements can pass 2^31 (16384 tokens x 14336 x 10 microbatches does)
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    src = _source_offsets(offsets, n_cols, row_stride, col_step, PACKED)
    a = tl.load(a_ptr + src, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + src, mask=mask, other=0.0).to(tl.float32)
    if VARIANT:
        g, u = _clamp(a, b, limit, CLAMP)
        y = times_sigmoid(g, sigmoid_of_minus_abs(alpha * g)) * (u + up_offset)
    else:
        y = times_sigmoid(a, sigmoid_of_minus_abs(a)) * b
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _swiglu_bwd_kernel(
    dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr, y_ptr, n_elements, n_cols, row_stride, col_step, alpha, limit,
    up_offset, STORE_Y: tl.constexpr, PACKED: tl.constexpr, VARIANT: tl.constexpr, CLAMP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """da, db (at a's and b's positions); with STORE_Y also the forward's y (bit-identical: same math), for
    ``glu_down_proj`` whose backward needs y for the down projection's weight gradient instead of keeping it
    from the forward."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    src = _source_offsets(offsets, n_cols, row_stride, col_step, PACKED)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + src, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + src, mask=mask, other=0.0).to(tl.float32)
    if VARIANT:
        g, u = _clamp(a, b, limit, CLAMP)
        x = alpha * g  # alpha > 0: x has g's sign
        m = sigmoid_of_minus_abs(x)
        glu = times_sigmoid(g, m)
        up = u + up_offset
        # d/dg [g s(alpha g)] = s + alpha g s (1 - s), and s (1 - s) = m (1 - m)
        da = dy * up * (sigmoid_from_m(x, m) + x * (m * (1.0 - m)))
        db = dy * glu
        if CLAMP:
            da = tl.where(a <= limit, da, 0.0)
            db = tl.where((b >= -limit) & (b <= limit), db, 0.0)
        y = glu * up
    else:
        m = sigmoid_of_minus_abs(a)
        silu = times_sigmoid(a, m)
        # s (1 + a (1 - s)) = s + a s (1 - s), and s (1 - s) = m (1 - m)
        da = dy * b * (sigmoid_from_m(a, m) + a * (m * (1.0 - m)))
        db = dy * silu
        y = silu * b
    tl.store(da_ptr + src, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + src, db.to(db_ptr.dtype.element_ty), mask=mask)
    if STORE_Y:
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def _grid_settings(n: int) -> tuple[int, int, int]:
    block, warps = elementwise_settings(n)
    return cdiv(n, block), block, warps


def _variant_flags(alpha: float, limit: float | None, up_offset: float) -> tuple[bool, bool, float]:
    """(VARIANT, CLAMP, limit as a float) for the kernels."""
    clamp = limit is not None
    return clamp or alpha != 1.0 or up_offset != 0.0, clamp, float(limit) if clamp else 0.0


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces a patched
# model through them without graph breaks; the autograd Function below composes them, and in eager mode calls
# the plain implementations (``dispatch.launcher``: the dispatcher's host time per call is as long as the
# kernel at small shapes).
def swiglu_fwd_impl(
    a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, limit: float | None = None, up_offset: float = 0.0
) -> torch.Tensor:
    y = torch.empty_like(a)
    n = a.numel()
    if n:
        variant, clamp, lim = _variant_flags(alpha, limit, up_offset)
        grid, block, warps = _grid_settings(n)
        _swiglu_fwd_kernel[(grid,)](
            a, b, y, n, 1, 1, 1, float(alpha), lim, float(up_offset), PACKED=False, VARIANT=variant,
            CLAMP=clamp, BLOCK_SIZE=block, num_warps=warps,
        )  # fmt: skip
    return y


def _swiglu_bwd_impl(
    dy: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: float = 1.0,
    limit: float | None = None,
    up_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    da = torch.empty_like(a)
    db = torch.empty_like(b)
    swiglu_bwd_inplace_impl(dy, a, b, da, db, alpha=alpha, limit=limit, up_offset=up_offset)
    return da, db


def swiglu_bwd_inplace_impl(
    dy: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    da: torch.Tensor,
    db: torch.Tensor,
    y: torch.Tensor | None = None,
    *,
    alpha: float = 1.0,
    limit: float | None = None,
    up_offset: float = 0.0,
) -> None:
    """Writes da, db (and y, the forward output, when given); ``da is a``, ``db is b`` and ``y is dy`` are
    allowed: each element is read before it is written, by the same program."""
    n = a.numel()
    if n:
        variant, clamp, lim = _variant_flags(alpha, limit, up_offset)
        grid, block, warps = _grid_settings(n)
        _swiglu_bwd_kernel[(grid,)](
            dy, a, b, da, db, dy if y is None else y, n, 1, 1, 1, float(alpha), lim, float(up_offset),
            STORE_Y=y is not None, PACKED=False, VARIANT=variant, CLAMP=clamp, BLOCK_SIZE=block,
            num_warps=warps,
        )  # fmt: skip


_swiglu_fwd = torch.library.custom_op("liger_core::swiglu_fwd", swiglu_fwd_impl, mutates_args=())
_swiglu_bwd = torch.library.custom_op("liger_core::swiglu_bwd", _swiglu_bwd_impl, mutates_args=())


@_swiglu_fwd.register_fake
def _(a, b, alpha=1.0, limit=None, up_offset=0.0):
    return torch.empty_like(a)


@_swiglu_bwd.register_fake
def _(dy, a, b, alpha=1.0, limit=None, up_offset=0.0):
    return torch.empty_like(a), torch.empty_like(b)


def _swiglu_bwd_over_inputs_impl(
    dy: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: float = 1.0,
    limit: float | None = None,
    up_offset: float = 0.0,
) -> None:
    swiglu_bwd_inplace_impl(dy, a, b, a, b, alpha=alpha, limit=limit, up_offset=up_offset)


# Eager only (see SwiGLUFunction); registered so a graph that does hold it knows a and b are overwritten.
_swiglu_bwd_over_inputs = torch.library.custom_op(
    "liger_core::swiglu_bwd_over_inputs", _swiglu_bwd_over_inputs_impl, mutates_args=("a", "b")
)


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        a: torch.Tensor,
        b: torch.Tensor,
        inplace_backward: bool,
        alpha: float = 1.0,
        limit: float | None = None,
        up_offset: float = 0.0,
    ) -> torch.Tensor:
        a = a.contiguous()
        b = b.contiguous()
        ctx.inplace_backward = use_inplace_backward(inplace_backward, a, b)
        ctx.variant = (alpha, limit, up_offset)
        ctx.save_for_backward(a, b)
        return launcher(_swiglu_fwd, swiglu_fwd_impl)(a, b, alpha, limit, up_offset)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        a, b = ctx.saved_tensors
        dy = dy.contiguous()
        if ctx.inplace_backward:
            launcher(_swiglu_bwd_over_inputs, _swiglu_bwd_over_inputs_impl)(dy, a, b, *ctx.variant)
            return (*gradients_in_saved_inputs(a, b), None, None, None, None)
        return (*launcher(_swiglu_bwd, _swiglu_bwd_impl)(dy, a, b, *ctx.variant), None, None, None, None)


def _check_variant(alpha: float, limit: float | None, up_offset: float) -> None:
    for name, value in (("alpha", alpha), ("up_offset", up_offset), ("limit", limit)):
        if value is None and name == "limit":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TypeError(f"{name} must be a finite number, got {value!r}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be > 0 (or None: no clamp), got {limit}")


def swiglu(
    a: torch.Tensor,
    b: torch.Tensor,
    inplace_backward: bool = False,
    *,
    alpha: float = 1.0,
    limit: float | None = None,
    up_offset: float = 0.0,
) -> torch.Tensor:
    """``silu(a) * b`` for tensors of any (equal) shape; exact fp32 math, one rounding to the input dtype.

    With ``alpha``, ``limit`` or ``up_offset`` (gpt-oss's clamped SwiGLU): ``g * sigmoid(alpha * g) * (u +
    up_offset)`` with ``g = a.clamp(max=limit)``, ``u = b.clamp(-limit, limit)`` (module docstring).

    ``inplace_backward=True`` writes the gradients into the memory of ``a`` and ``b`` during backward (as
    liger-kernel always does), saving two tensors of a's size at the backward's peak. Only for callers that
    own ``a`` and ``b`` and never read them after the op, e.g. ``swiglu(gate_proj(x), up_proj(x), True)``
    (what LigerSwiGLUMLP and the patched MLP forwards do): after backward they hold ``da`` and ``db``. A
    second backward through the same graph then raises autograd's "modified by an inplace operation" error
    instead of using the overwritten values. Ignored under torch.compile (its own memory planning applies)
    and when ``a`` and ``b`` share storage.
    """
    check_tensor("a", a)
    check_tensor("b", b)
    check_shape("b", b, tuple(a.shape), "b must match a")
    if b.dtype != a.dtype:
        raise TypeError(f"b has dtype {b.dtype} but a has dtype {a.dtype}; they must match")
    check_same_device("a", a, b=b)
    _check_variant(alpha, limit, up_offset)
    if not use_triton(a):
        return reference.swiglu(a, b, alpha=alpha, limit=limit, up_offset=up_offset)
    return SwiGLUFunction.apply(a, b, bool(inplace_backward), float(alpha), limit, float(up_offset))


# ----------------------------------------------------------------------------------------------------------
# Packed gate/up: one [..., 2I] tensor in, [..., I] out
# ----------------------------------------------------------------------------------------------------------


def _packed_args(x: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, int, int, int]:
    """(b's view: a pointer at the first up element, n_cols, row_stride, col_step) of a contiguous x."""
    n_cols = x.shape[-1] // 2
    if interleaved:
        return x[..., 1:], n_cols, x.shape[-1], 2
    return x[..., n_cols:], n_cols, x.shape[-1], 1


def _swiglu_packed_fwd_impl(
    x: torch.Tensor, interleaved: bool, alpha: float, limit: float | None, up_offset: float
) -> torch.Tensor:
    y = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    n = y.numel()
    if n:
        b, n_cols, row_stride, col_step = _packed_args(x, interleaved)
        variant, clamp, lim = _variant_flags(alpha, limit, up_offset)
        grid, block, warps = _grid_settings(n)
        _swiglu_fwd_kernel[(grid,)](
            x, b, y, n, n_cols, row_stride, col_step, float(alpha), lim, float(up_offset), PACKED=True,
            VARIANT=variant, CLAMP=clamp, BLOCK_SIZE=block, num_warps=warps,
        )  # fmt: skip
    return y


def _swiglu_packed_bwd_impl(
    dy: torch.Tensor, x: torch.Tensor, interleaved: bool, alpha: float, limit: float | None, up_offset: float
) -> torch.Tensor:
    dx = torch.empty_like(x)
    n = dy.numel()
    if n:
        b, n_cols, row_stride, col_step = _packed_args(x, interleaved)
        db = _packed_args(dx, interleaved)[0]
        variant, clamp, lim = _variant_flags(alpha, limit, up_offset)
        grid, block, warps = _grid_settings(n)
        _swiglu_bwd_kernel[(grid,)](
            dy, x, b, dx, db, dy, n, n_cols, row_stride, col_step, float(alpha), lim, float(up_offset),
            STORE_Y=False, PACKED=True, VARIANT=variant, CLAMP=clamp, BLOCK_SIZE=block, num_warps=warps,
        )  # fmt: skip
    return dx


_swiglu_packed_fwd = torch.library.custom_op(
    "liger_core::swiglu_packed_fwd", _swiglu_packed_fwd_impl, mutates_args=()
)
_swiglu_packed_bwd = torch.library.custom_op(
    "liger_core::swiglu_packed_bwd", _swiglu_packed_bwd_impl, mutates_args=()
)


@_swiglu_packed_fwd.register_fake
def _(x, interleaved, alpha, limit, up_offset):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@_swiglu_packed_bwd.register_fake
def _(dy, x, interleaved, alpha, limit, up_offset):
    return torch.empty_like(x)


class SwiGLUPackedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, interleaved: bool, alpha: float, limit: float | None, up_offset: float):
        x = x.contiguous()
        ctx.args = (interleaved, alpha, limit, up_offset)
        ctx.save_for_backward(x)
        return launcher(_swiglu_packed_fwd, _swiglu_packed_fwd_impl)(x, *ctx.args)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx = launcher(_swiglu_packed_bwd, _swiglu_packed_bwd_impl)(dy.contiguous(), x, *ctx.args)
        return dx, None, None, None, None


def swiglu_packed(
    gate_up: torch.Tensor,
    *,
    interleaved: bool = False,
    alpha: float = 1.0,
    limit: float | None = None,
    up_offset: float = 0.0,
) -> torch.Tensor:
    """``swiglu(gate, up, ...)`` of one tensor holding both: gate = the first half of the last dimension and
    up = the second (``interleaved=False``, ``gate_up.chunk(2, -1)``), or gate = the even and up = the odd
    columns (``interleaved=True``, ``gate_up[..., ::2], gate_up[..., 1::2]``). Returns ``[..., I]`` for a
    ``[..., 2I]`` input; the backward writes the gradient of ``gate_up`` in one pass."""
    check_tensor("gate_up", gate_up, min_ndim=1)
    if gate_up.shape[-1] % 2:
        raise ValueError(
            f"gate_up's last dimension must be even (gate and up halves), got {gate_up.shape[-1]}"
        )
    _check_variant(alpha, limit, up_offset)
    if not use_triton(gate_up):
        gate, up = (gate_up[..., ::2], gate_up[..., 1::2]) if interleaved else gate_up.chunk(2, dim=-1)
        return reference.swiglu(gate, up, alpha=alpha, limit=limit, up_offset=up_offset)
    return SwiGLUPackedFunction.apply(gate_up, bool(interleaved), float(alpha), limit, float(up_offset))

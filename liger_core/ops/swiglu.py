"""SwiGLU activation: ``y = silu(a) * b`` (Llama MLP: ``down(silu(gate(x)) * up(x))``).

Math (all in fp32 inside the kernel, one rounding to the output dtype)::

    s  = sigmoid(a),   silu(a) = a * s
    y  = a * s * b
    da = dy * b * s * (1 + a * (1 - s))
    db = dy * a * s

``s`` comes from ``m = sigmoid(-|a|)`` (``_activation_math``): silu is ``a - a m`` or ``a m``, one rounding
fewer than ``a * s`` and no cancellation in ``1 - s``.

Nothing is saved for backward but the inputs ``a`` and ``b``: the backward kernel recomputes ``s`` (one extra
exp per element is free in a bandwidth-bound kernel). Minimal HBM traffic: forward reads a, b and writes y
(3 tensors); backward reads dy, a, b and writes da, db (5 tensors).
"""

from __future__ import annotations

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


@fast_launch
@triton.jit
def _swiglu_fwd_kernel(a_ptr, b_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    # int64 offsets: n_elements can pass 2^31 (16384 tokens x 14336 x 10 microbatches does)
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = times_sigmoid(a, sigmoid_of_minus_abs(a)) * b
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _swiglu_bwd_kernel(
    dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr, y_ptr, n_elements, STORE_Y: tl.constexpr, BLOCK_SIZE: tl.constexpr
):
    """da, db; with STORE_Y also the forward's y (bit-identical: same math), for ``glu_down_proj`` whose
    backward needs y for the down projection's weight gradient instead of keeping it from the forward."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    m = sigmoid_of_minus_abs(a)
    silu = times_sigmoid(a, m)
    # s (1 + a (1 - s)) = s + a s (1 - s), and s (1 - s) = m (1 - m)
    da = dy * b * (sigmoid_from_m(a, m) + a * (m * (1.0 - m)))
    db = dy * silu
    tl.store(da_ptr + offsets, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offsets, db.to(db_ptr.dtype.element_ty), mask=mask)
    if STORE_Y:
        tl.store(y_ptr + offsets, (silu * b).to(y_ptr.dtype.element_ty), mask=mask)


def _grid_settings(n: int) -> tuple[int, int, int]:
    block, warps = elementwise_settings(n)
    return cdiv(n, block), block, warps


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces a patched
# model through them without graph breaks; the autograd Function below composes them, and in eager mode calls
# the plain implementations (``dispatch.launcher``: the dispatcher's host time per call is as long as the
# kernel at small shapes).
def _swiglu_fwd_impl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(a)
    n = a.numel()
    if n:
        grid, block, warps = _grid_settings(n)
        _swiglu_fwd_kernel[(grid,)](a, b, y, n, BLOCK_SIZE=block, num_warps=warps)
    return y


def _swiglu_bwd_impl(dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    da = torch.empty_like(a)
    db = torch.empty_like(b)
    _swiglu_bwd_inplace_impl(dy, a, b, da, db)
    return da, db


def _swiglu_bwd_inplace_impl(
    dy: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    da: torch.Tensor,
    db: torch.Tensor,
    y: torch.Tensor | None = None,
) -> None:
    """Writes da, db (and y, the forward output, when given); ``da is a``, ``db is b`` and ``y is dy`` are
    allowed: each element is read before it is written, by the same program."""
    n = a.numel()
    if n:
        grid, block, warps = _grid_settings(n)
        _swiglu_bwd_kernel[(grid,)](
            dy, a, b, da, db, dy if y is None else y, n, STORE_Y=y is not None, BLOCK_SIZE=block,
            num_warps=warps,
        )  # fmt: skip


_swiglu_fwd = torch.library.custom_op("liger_core::swiglu_fwd", _swiglu_fwd_impl, mutates_args=())
_swiglu_bwd = torch.library.custom_op("liger_core::swiglu_bwd", _swiglu_bwd_impl, mutates_args=())


@_swiglu_fwd.register_fake
def _(a, b):
    return torch.empty_like(a)


@_swiglu_bwd.register_fake
def _(dy, a, b):
    return torch.empty_like(a), torch.empty_like(b)


def _swiglu_bwd_over_inputs_impl(dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    _swiglu_bwd_inplace_impl(dy, a, b, a, b)


# Eager only (see SwiGLUFunction); registered so a graph that does hold it knows a and b are overwritten.
_swiglu_bwd_over_inputs = torch.library.custom_op(
    "liger_core::swiglu_bwd_over_inputs", _swiglu_bwd_over_inputs_impl, mutates_args=("a", "b")
)


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, inplace_backward: bool) -> torch.Tensor:
        a = a.contiguous()
        b = b.contiguous()
        ctx.inplace_backward = use_inplace_backward(inplace_backward, a, b)
        ctx.save_for_backward(a, b)
        return launcher(_swiglu_fwd, _swiglu_fwd_impl)(a, b)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        a, b = ctx.saved_tensors
        dy = dy.contiguous()
        if ctx.inplace_backward:
            launcher(_swiglu_bwd_over_inputs, _swiglu_bwd_over_inputs_impl)(dy, a, b)
            return (*gradients_in_saved_inputs(a, b), None)
        return (*launcher(_swiglu_bwd, _swiglu_bwd_impl)(dy, a, b), None)


def swiglu(a: torch.Tensor, b: torch.Tensor, inplace_backward: bool = False) -> torch.Tensor:
    """``silu(a) * b`` for tensors of any (equal) shape; exact fp32 math, one rounding to the input dtype.

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
    if not use_triton(a):
        return reference.swiglu(a, b)
    return SwiGLUFunction.apply(a, b, bool(inplace_backward))

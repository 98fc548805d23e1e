"""GeGLU activation: ``y = gelu(a, approximate) * b`` (Gemma MLP: ``down(gelu_tanh(gate(x)) * up(x))``).

Math (all in fp32 inside the kernel, one rounding to the output dtype)::

    approximate="tanh":  u = sqrt(2/pi) * (a + 0.044715 a^3)
                         gelu(a)  = 0.5 a (1 + tanh(u)) = a * s,          s = sigmoid(2u)
                         gelu'(a) = s + a * 2 s (1 - s) * sqrt(2/pi) * (1 + 3 * 0.044715 a^2)
    approximate="none":  gelu(a)  = 0.5 a (1 + erf(a / sqrt(2)))
                         gelu'(a) = 0.5 (1 + erf(a / sqrt(2))) + a * exp(-a^2 / 2) / sqrt(2 pi)
    y  = gelu(a) * b
    da = dy * b * gelu'(a)
    db = dy * gelu(a)

``1 + tanh(u) = 2 sigmoid(2u)`` is used because it is portable (the Triton interpreter has no libdevice tanh)
and more accurate: s and 1 - s both come from one ``exp(-|2u|)`` (never overflows) with full relative
accuracy, so there is no cancellation in ``1 + tanh(u)`` for negative a nor in ``1 - s`` for positive a
(see ``_gelu_tanh_parts``).
Nothing is saved for backward but the inputs ``a`` and ``b``; the backward kernel recomputes gelu.
Minimal HBM traffic: forward reads a, b and writes y (3 tensors); backward reads dy, a, b and writes da, db
(5 tensors).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import (
    check_choice,
    check_same_device,
    check_shape,
    check_tensor,
    launcher,
    use_triton,
)
from liger_core.ops._activation_math import (
    gradients_in_saved_inputs,
    sigmoid_from_m,
    sigmoid_of_minus_abs,
    times_sigmoid,
    use_inplace_backward,
)
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import cdiv, elementwise_settings

APPROXIMATIONS = ("tanh", "none")

# Globals read by kernels are tl.constexpr instances (an annotation alone leaves a plain float, which
# triton 3.6 refuses to compile on the GPU).
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_GELU_CUBIC = tl.constexpr(0.044715)
_SQRT_HALF = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
# |a| beyond which sigmoid(2u) is exactly 0 or 1 in fp32 (|2u| > 140 from |a| = 12 on): clamping u's argument
# there changes no result and keeps a^3 (inf past 7e12) and 0 * inf out of the math
_TANH_SATURATION = tl.constexpr(20.0)


@triton.jit
def _gelu_tanh_parts(a):
    """For the tanh GELU: (gelu(a), m, 2u'(a)), m = sigmoid(-|2u|) = min(s, 1 - s), s = sigmoid(2u).

    2u has a's sign, so s = 1 - m for a >= 0 and s = m for a < 0 (``_activation_math``), and gelu = a * s is
    ``a - a * m`` (one rounding next to a, where eager's 0.5 a (1 + tanh(u)) takes several) or ``a * m`` (no
    cancellation, where eager's 1 + tanh(u) cancels catastrophically). a is clamped to +-_TANH_SATURATION
    inside u only.
    """
    a_c = tl.minimum(tl.maximum(a, -_TANH_SATURATION), _TANH_SATURATION)
    a_sq = a_c * a_c
    two_u = 2.0 * _SQRT_2_OVER_PI * a_c * (1.0 + _GELU_CUBIC * a_sq)
    m = sigmoid_of_minus_abs(two_u)
    gelu = times_sigmoid(a, m)
    d_two_u = 2.0 * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * a_sq)
    return gelu, m, d_two_u


@triton.jit
def _gelu(a, TANH: tl.constexpr):
    """gelu(a) in fp32 for an fp32 tensor a."""
    if TANH:
        gelu, _, _ = _gelu_tanh_parts(a)
    else:
        gelu = a * (0.5 * (1.0 + tl.math.erf(a * _SQRT_HALF)))
    return gelu


@triton.jit
def _gelu_and_grad(a, TANH: tl.constexpr):
    """(gelu(a), gelu'(a)) in fp32 for an fp32 tensor a."""
    if TANH:
        gelu, m, d_two_u = _gelu_tanh_parts(a)
        s = sigmoid_from_m(a, m)
        # s (1 - s) = m (1 - m) on both sides
        grad = s + a * (m * (1.0 - m)) * d_two_u
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(a * _SQRT_HALF))
        gelu = a * cdf
        grad = cdf + a * tl.exp(-0.5 * a * a) * _INV_SQRT_2PI
    return gelu, grad


@fast_launch
@triton.jit
def _geglu_fwd_kernel(a_ptr, b_ptr, y_ptr, n_elements, TANH: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    # int64 offsets: n_elements can pass 2^31
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    gelu = _gelu(a, TANH)
    tl.store(y_ptr + offsets, (gelu * b).to(y_ptr.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _geglu_bwd_kernel(
    dy_ptr,
    a_ptr,
    b_ptr,
    da_ptr,
    db_ptr,
    y_ptr,
    n_elements,
    TANH: tl.constexpr,
    STORE_Y: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """da, db; with STORE_Y also the forward's y (same math), for ``glu_down_proj``."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    gelu, gelu_grad = _gelu_and_grad(a, TANH)
    tl.store(da_ptr + offsets, (dy * b * gelu_grad).to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offsets, (dy * gelu).to(db_ptr.dtype.element_ty), mask=mask)
    if STORE_Y:
        tl.store(y_ptr + offsets, (gelu * b).to(y_ptr.dtype.element_ty), mask=mask)


def _grid_settings(n: int) -> tuple[int, int, int]:
    block, warps = elementwise_settings(n)
    return cdiv(n, block), block, warps


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces a patched
# model through them without graph breaks; the autograd Function below composes them, and in eager mode calls
# the plain implementations (``dispatch.launcher``: the dispatcher's host time per call is as long as the
# kernel at small shapes).
def geglu_fwd_impl(a: torch.Tensor, b: torch.Tensor, approximate: str) -> torch.Tensor:
    y = torch.empty_like(a)
    n = a.numel()
    if n:
        grid, block, warps = _grid_settings(n)
        _geglu_fwd_kernel[(grid,)](a, b, y, n, TANH=approximate == "tanh", BLOCK_SIZE=block, num_warps=warps)
    return y


def geglu_bwd_into(
    dy: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    da: torch.Tensor,
    db: torch.Tensor,
    approximate: str,
    y: torch.Tensor | None = None,
) -> None:
    """Writes da, db (and y, the forward output, when given); ``da is a``, ``db is b`` and ``y is dy`` are
    allowed: each element is read before it is written, by the same program."""
    n = a.numel()
    if n:
        grid, block, warps = _grid_settings(n)
        _geglu_bwd_kernel[(grid,)](
            dy, a, b, da, db, dy if y is None else y, n, TANH=approximate == "tanh", STORE_Y=y is not None,
            BLOCK_SIZE=block, num_warps=warps,
        )  # fmt: skip


def _geglu_bwd_impl(
    dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, approximate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    da = torch.empty_like(a)
    db = torch.empty_like(b)
    geglu_bwd_into(dy, a, b, da, db, approximate)
    return da, db


def _geglu_bwd_over_inputs_impl(dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, approximate: str) -> None:
    geglu_bwd_into(dy, a, b, a, b, approximate)


_geglu_fwd = torch.library.custom_op("liger_core::geglu_fwd", geglu_fwd_impl, mutates_args=())
_geglu_bwd = torch.library.custom_op("liger_core::geglu_bwd", _geglu_bwd_impl, mutates_args=())
# Eager only (see GeGLUFunction); registered so a graph that does hold it knows a and b are overwritten.
_geglu_bwd_over_inputs = torch.library.custom_op(
    "liger_core::geglu_bwd_over_inputs", _geglu_bwd_over_inputs_impl, mutates_args=("a", "b")
)


@_geglu_fwd.register_fake
def _(a, b, approximate):
    return torch.empty_like(a)


@_geglu_bwd.register_fake
def _(dy, a, b, approximate):
    return torch.empty_like(a), torch.empty_like(b)


class GeGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, a: torch.Tensor, b: torch.Tensor, approximate: str, inplace_backward: bool
    ) -> torch.Tensor:
        a = a.contiguous()
        b = b.contiguous()
        ctx.inplace_backward = use_inplace_backward(inplace_backward, a, b)
        ctx.save_for_backward(a, b)
        ctx.approximate = approximate
        return launcher(_geglu_fwd, geglu_fwd_impl)(a, b, approximate)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        a, b = ctx.saved_tensors
        dy = dy.contiguous()
        if ctx.inplace_backward:
            launcher(_geglu_bwd_over_inputs, _geglu_bwd_over_inputs_impl)(dy, a, b, ctx.approximate)
            return (*gradients_in_saved_inputs(a, b), None, None)
        return (*launcher(_geglu_bwd, _geglu_bwd_impl)(dy, a, b, ctx.approximate), None, None)


def geglu(
    a: torch.Tensor, b: torch.Tensor, approximate: str = "tanh", inplace_backward: bool = False
) -> torch.Tensor:
    """``gelu(a, approximate=approximate) * b`` for tensors of any (equal) shape; ``approximate`` is "tanh"
    (Gemma's ``gelu_pytorch_tanh``) or "none" (erf GELU). Exact fp32 math, one rounding to the input dtype.

    ``inplace_backward=True`` writes da, db over ``a`` and ``b`` in backward (as liger-kernel always does):
    only for callers that never read a and b after the op; see ``liger_core.ops.swiglu`` for the contract.
    """
    check_tensor("a", a)
    check_tensor("b", b)
    check_shape("b", b, tuple(a.shape), "b must match a")
    if b.dtype != a.dtype:
        raise TypeError(f"b has dtype {b.dtype} but a has dtype {a.dtype}; they must match")
    check_same_device("a", a, b=b)
    check_choice("approximate", approximate, APPROXIMATIONS)
    if not use_triton(a):
        return reference.geglu(a, b, approximate)
    return GeGLUFunction.apply(a, b, approximate, bool(inplace_backward))

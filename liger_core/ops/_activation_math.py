"""Pieces shared by the gated activations (SwiGLU, GeGLU): an accurate, overflow-free sigmoid (Triton) and the
in-place backward's bookkeeping (Python).

``sigmoid(x) = 1 / (1 + exp(-x))`` evaluated literally loses accuracy twice: ``1 - sigmoid(x)`` (needed by the
derivative) cancels for large x, and ``a * sigmoid(x)`` rounds ``sigmoid(x)`` near 1 before the product. With
``m = sigmoid(-|x|) = t / (1 + t)``, ``t = exp(-|x|)`` in (0, 1] (never overflows), ``m`` has full relative
accuracy and both ``sigmoid(x)`` and ``1 - sigmoid(x)`` are ``m`` or ``1 - m`` (>= 1/2: one benign rounding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def sigmoid_of_minus_abs(x):
    """m = sigmoid(-|x|) = min(sigmoid(x), 1 - sigmoid(x)), fp32, full relative accuracy."""
    t = tl.exp(-tl.abs(x))
    return t / (1.0 + t)


@triton.jit
def times_sigmoid(a, m):
    """``a * sigmoid(x)`` given ``m = sigmoid_of_minus_abs(x)`` for an x with a's sign (x = a for SiLU, x = 2u
    for the tanh GELU): ``a - a * m`` for a >= 0 (one rounding next to a), ``a * m`` for a < 0.

    Where m is 0 (sigmoid(x) is exactly 1) the result is a itself: for a = +inf that is +inf, as torch's
    ``a / (1 + exp(-a))`` gives, where ``a - a * m`` would be inf - inf * 0 = NaN. a = -inf gives
    -inf * 0 = NaN, as torch does."""
    a_m = a * m
    return tl.where(a >= 0.0, tl.where(m > 0.0, a - a_m, a), a_m)


@triton.jit
def sigmoid_from_m(a, m):
    """``sigmoid(x)`` given ``m = sigmoid_of_minus_abs(x)`` for an x with a's sign."""
    return tl.where(a >= 0.0, 1.0 - m, m)


# ----------------------------------------------------------------------------------------------------------
# In-place backward (``inplace_backward=True``): da, db are written over the saved a, b.
# ----------------------------------------------------------------------------------------------------------


def use_inplace_backward(requested: bool, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the backward may write da, db over the (contiguous) a, b it saves.

    Not under torch.compile: the traced backward stays functional and the compiler plans its own buffers.
    Not when a and b share storage (``swiglu(x, x)``, or views of one buffer): then da and db would land in
    one place.
    """
    if not requested or torch.compiler.is_compiling():
        return False
    return a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


def gradients_in_saved_inputs(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) once the backward kernel has written them over the saved ``a`` and ``b``.

    The version bump makes autograd refuse any later use of the old values (a second backward through the
    graph, another node that saved a or b) with its "modified by an inplace operation" error. ``detach()``
    hands autograd new tensor objects on the same memory, which AccumulateGrad can adopt without a copy.
    """
    torch.autograd.graph.increment_version(a)
    torch.autograd.graph.increment_version(b)
    return a.detach(), b.detach()

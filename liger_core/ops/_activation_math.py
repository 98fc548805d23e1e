"""Triton math shared by the gated activations (SwiGLU, GeGLU): an accurate, overflow-free sigmoid.

``sigmoid(x) = 1 / (1 + exp(-x))`` evaluated literally loses accuracy twice: ``1 - sigmoid(x)`` (needed by the
derivative) cancels for large x, and ``a * sigmoid(x)`` rounds ``sigmoid(x)`` near 1 before the product. With
``m = sigmoid(-|x|) = t / (1 + t)``, ``t = exp(-|x|)`` in (0, 1] (never overflows), ``m`` has full relative
accuracy and both ``sigmoid(x)`` and ``1 - sigmoid(x)`` are ``m`` or ``1 - m`` (>= 1/2: one benign rounding).
"""

from __future__ import annotations

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
    for the tanh GELU): ``a - a * m`` for a >= 0 (one rounding next to a), ``a * m`` for a < 0."""
    a_m = a * m
    return tl.where(a >= 0.0, a - a_m, a_m)


@triton.jit
def sigmoid_from_m(a, m):
    """``sigmoid(x)`` given ``m = sigmoid_of_minus_abs(x)`` for an x with a's sign."""
    return tl.where(a >= 0.0, 1.0 - m, m)

"""Gated activation + down projection: ``y = (act(a) * b) @ W.T + bias`` without keeping ``act(a) * b``.

The MLP of Llama-, Qwen-, Mistral- and Gemma-style models is ``down(act(gate(x)) * up(x))``. Run as three
autograd nodes, it keeps four tensors of the intermediate size alive at the start of the MLP's backward: the
activation's inputs ``a = gate(x)`` and ``b = up(x)``, the product ``h = act(a) * b`` (saved by the down
projection for its weight gradient) and the incoming ``dh``. With gradient checkpointing that is the peak of
the whole step (the backward of the first layer, every parameter gradient already allocated); without it,
``h`` is one more intermediate-sized tensor saved per layer. This op saves ``a`` and ``b`` only and
recomputes ``h`` inside the activation's backward kernel, which writes it over ``dh`` once ``dh`` is read::

    forward:   node 1 records a, b and W for backward and computes nothing
               node 2: h = act(a) * b (kernel, temporary), y = h @ W.T + bias (cuBLAS); saves nothing
    backward:  dh = dy @ W             (cuBLAS)
               da, db, h = kernel(dh, a, b)     da over a, db over b, h over dh (read before written)
               dW = dy.T @ h,  dbias = sum(dy)  (cuBLAS)

Peak in the backward: three intermediate-sized tensors instead of four, for one extra write of ``h`` (a tenth
of the MLP backward's bytes). Under non-reentrant activation checkpointing the forward's recomputation stops
once node 1 has recorded its tensors: it reruns the gate and up projections, not the product or the GEMM.
The backward kernel computes ``h`` with the forward kernel's math, so ``dW`` is what the unfused composition
gives. ``a`` and ``b`` are overwritten with their gradients (the ``inplace_backward``
contract of ``liger_core.ops.swiglu``): only for callers that own them, e.g. ``glu_down_proj(gate(x), up(x),
down.weight)``; when they share storage (one fused gate_up projection) the gradients get their own memory.
Under torch.compile the op is the plain composition (the compiler plans memory itself).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from liger_core import reference
from liger_core.dispatch import check_choice, check_same_device, check_shape, check_tensor, use_triton
from liger_core.ops._activation_math import gradients_in_saved_inputs, use_inplace_backward
from liger_core.ops.geglu import APPROXIMATIONS, geglu, geglu_bwd_into, geglu_fwd_impl
from liger_core.ops.swiglu import swiglu, swiglu_bwd_inplace_impl, swiglu_fwd_impl

ACTIVATIONS = ("swiglu", "geglu")


def _product(a: torch.Tensor, b: torch.Tensor, activation: str, approximate: str) -> torch.Tensor:
    if activation == "swiglu":
        return swiglu_fwd_impl(a, b)
    return geglu_fwd_impl(a, b, approximate)


def _backward_kernel(dh, a, b, da, db, activation: str, approximate: str) -> None:
    """da, db from dh; the forward product written over dh."""
    if activation == "swiglu":
        swiglu_bwd_inplace_impl(dh, a, b, da, db, y=dh)
    else:
        geglu_bwd_into(dh, a, b, da, db, approximate, y=dh)


class _GradientMailbox:
    """What the two nodes pass each other outside autograd (see GLUProductFunction): the activation's inputs
    forward (node 1 to node 2, dropped as soon as node 2 has read them) and dy backward (node 2 to node 1)."""

    __slots__ = ("a", "b", "activation", "approximate", "dy")

    def __init__(self, activation: str, approximate: str) -> None:
        self.activation, self.approximate = activation, approximate
        self.a: torch.Tensor | None = None
        self.b: torch.Tensor | None = None
        self.dy: torch.Tensor | None = None


class GLUProductFunction(torch.autograd.Function):
    """Node 1: records a, b and the down projection's weight, and computes every gradient of the op. Its
    forward computes nothing: it returns an empty token that links it to node 2 and leaves a and b in the
    mailbox, from which node 2 computes h = act(a) * b and the down projection.

    Two nodes so that the saved tensors are recorded *before* any work: under non-reentrant activation
    checkpointing the recomputation stops at the last saved tensor of the region, so the product and the GEMM
    (which only the discarded recomputed forward would use) are skipped, as the GEMM is for ``nn.Linear``,
    which records its saved inputs before computing."""

    @staticmethod
    def forward(ctx, a, b, weight, bias, mailbox):
        ctx.inplace = use_inplace_backward(True, a, b)
        ctx.has_bias = bias is not None
        ctx.mailbox = mailbox
        ctx.save_for_backward(a, b, weight)
        mailbox.a, mailbox.b = a, b
        return a.new_empty(0)

    @staticmethod
    def backward(ctx, _grad_token):
        # _grad_token is node 2's placeholder; the real incoming gradient is its dy
        mailbox = ctx.mailbox
        dy2, mailbox.dy = mailbox.dy, None
        if dy2 is None:  # the output was not used by the loss
            return None, None, None, None, None
        a, b, weight = ctx.saved_tensors
        dh = torch.mm(dy2, weight)  # (tokens, intermediate), in the layout of a
        if ctx.inplace:
            da, db = a, b
        else:
            da, db = torch.empty_like(a), torch.empty_like(b)
        _backward_kernel(dh, a, b, da, db, mailbox.activation, mailbox.approximate)
        if ctx.inplace:
            da, db = gradients_in_saved_inputs(a, b)
        grad_weight = grad_bias = None
        if ctx.needs_input_grad[2]:
            grad_weight = torch.mm(dy2.t(), dh)  # dh now holds the product h
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grad_bias = dy2.sum(0)
        return da.view(a.shape), db.view(b.shape), grad_weight, grad_bias, None


class DownProjFunction(torch.autograd.Function):
    """Node 2: h = act(a) * b from the mailbox, y = h @ W.T + bias; saves nothing. Its backward hands dy to
    node 1 through the mailbox and returns an empty gradient for the token."""

    @staticmethod
    def forward(ctx, token, weight, bias, mailbox):
        # read and drop a and b: a reference kept here would keep them alive past checkpointing
        a, b, mailbox.a, mailbox.b = mailbox.a, mailbox.b, None, None
        ctx.mailbox = mailbox
        h = _product(a, b, mailbox.activation, mailbox.approximate)
        return F.linear(h, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        dy2 = dy.reshape(-1, dy.shape[-1])
        ctx.mailbox.dy = dy2 if dy2.is_contiguous() else dy2.contiguous()
        return dy.new_empty(0), None, None, None


def glu_down_proj(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "swiglu",
    approximate: str = "none",
) -> torch.Tensor:
    """``F.linear(act(a) * b, weight, bias)`` with ``act`` silu (``activation="swiglu"``) or gelu
    (``"geglu"``, ``approximate`` "tanh" or "none"), keeping only ``a`` and ``b`` for backward (see the
    module docstring). ``a``, ``b``: (..., I), same dtype as ``weight`` (O, I) and ``bias`` (O,). After
    backward ``a`` and ``b`` hold their gradients: pass tensors nothing else reads (the outputs of the gate
    and up projections)."""
    check_tensor("a", a, min_ndim=1)
    check_tensor("b", b)
    check_shape("b", b, tuple(a.shape), "b must match a")
    check_tensor("weight", weight, ndim=2)
    check_shape(
        "weight", weight, (weight.shape[0], a.shape[-1]), "weight is (out, in) with in = a's last dim"
    )
    for name, t in (("b", b), ("weight", weight)):
        if t.dtype != a.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but a has dtype {a.dtype}; they must match")
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
        check_shape("bias", bias, (weight.shape[0],), "bias has one entry per output feature")
        if bias.dtype != a.dtype:
            raise TypeError(f"bias has dtype {bias.dtype} but a has dtype {a.dtype}; they must match")
    check_same_device("a", a, b=b, weight=weight, bias=bias)
    check_choice("activation", activation, ACTIVATIONS)
    check_choice("approximate", approximate, APPROXIMATIONS)
    if not use_triton(a):
        h = reference.swiglu(a, b) if activation == "swiglu" else reference.geglu(a, b, approximate)
        return F.linear(h, weight, bias)
    if torch.compiler.is_compiling():
        h = swiglu(a, b) if activation == "swiglu" else geglu(a, b, approximate)
        return F.linear(h, weight, bias)
    a = a.contiguous()
    b = b.contiguous()
    mailbox = _GradientMailbox(activation, approximate)
    token = GLUProductFunction.apply(a, b, weight, bias, mailbox)
    return DownProjFunction.apply(token, weight, bias, mailbox)

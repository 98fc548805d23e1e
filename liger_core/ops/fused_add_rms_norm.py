"""Residual add + RMSNorm in one pass (the pattern between the blocks of every pre-norm decoder layer)::

    s = x + residual                 (rounded to the input dtype, as eager's add)
    y = s * rstd * (offset + w)      (rms_norm's math and HF roundings, by ``casting_mode``)

returning ``(y, s)``. Backward takes the gradients of both outputs: ``dx = dresidual = ds + drms_norm(dy)``
(added in fp32 and rounded once), ``dw = sum over rows of dy * s * rstd``.

HBM traffic: forward reads x, residual (+ w) and writes y, s and rstd; backward reads dy, ds, s, rstd (+ w)
and writes one gradient (the same tensor goes to x and residual) and one partial row of dw per program.
Kernels and math: ``liger_core.ops._residual_rms_math``.
Reference: ``liger_core.reference.fused_add_rms_norm``.
"""

from __future__ import annotations

import torch

from liger_core import reference
from liger_core.dispatch import (
    check_choice,
    check_same_device,
    check_shape,
    check_tensor,
    launcher,
    use_triton,
)
from liger_core.ops import _residual_rms_math as residual_rms
from liger_core.ops._norm_math import as_shape, rows_view
from liger_core.reference.fused_add_rms_norm import CASTING_MODES, output_dtype
from liger_core.sharding import any_dtensor, check_not_zero3_partitioned, is_dtensor


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces a patched
# model through them without graph breaks; in eager mode the autograd Function calls the plain
# implementations (``dispatch.launcher``). Inputs arrive as 2-D rows with unit column stride, w contiguous.
def _fused_add_rms_norm_fwd_impl(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float, offset: float, casting_mode: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y_dtype = output_dtype(x.dtype, w.dtype, casting_mode)
    y, s, rstd = residual_rms.forward(x, residual, w, y_dtype, eps, offset, casting_mode == "llama")
    return y, s, rstd


def _fused_add_rms_norm_bwd_impl(
    dy: torch.Tensor,
    ds: torch.Tensor | None,
    s: torch.Tensor,
    w: torch.Tensor,
    rstd: torch.Tensor,
    offset: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw = residual_rms.backward(dy, ds, s, w, rstd, offset)
    return dx, dw


_fused_add_rms_norm_fwd = torch.library.custom_op(
    "liger_core::fused_add_rms_norm_fwd", _fused_add_rms_norm_fwd_impl, mutates_args=()
)
_fused_add_rms_norm_bwd = torch.library.custom_op(
    "liger_core::fused_add_rms_norm_bwd", _fused_add_rms_norm_bwd_impl, mutates_args=()
)


@_fused_add_rms_norm_fwd.register_fake
def _(x, residual, w, eps, offset, casting_mode):
    y = x.new_empty(x.shape, dtype=output_dtype(x.dtype, w.dtype, casting_mode))
    return y, x.new_empty(x.shape), x.new_empty(x.shape[0], dtype=torch.float32)


@_fused_add_rms_norm_bwd.register_fake
def _(dy, ds, s, w, rstd, offset):
    return s.new_empty(s.shape), torch.empty_like(w)


class FusedAddRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, w, eps: float, offset: float, casting_mode: str):
        fwd = launcher(_fused_add_rms_norm_fwd, _fused_add_rms_norm_fwd_impl)
        y, s, rstd = fwd(x, residual, w, eps, offset, casting_mode)
        ctx.save_for_backward(s, w, rstd)
        ctx.offset = offset
        ctx.set_materialize_grads(False)  # an unused s (or y) brings no gradient: nothing to read for it
        return y, s

    @staticmethod
    def backward(ctx, dy, ds):
        s, w, rstd = ctx.saved_tensors
        if dy is None:  # only s used: its gradient passes to x and residual, the weight gets none
            return ds, ds, None, None, None, None
        bwd = launcher(_fused_add_rms_norm_bwd, _fused_add_rms_norm_bwd_impl)
        dx, dw = bwd(rows_view(dy), None if ds is None else rows_view(ds), s, w, rstd, ctx.offset)
        # one tensor for both inputs: autograd copies a gradient before accumulating into it when it is shared
        return dx, dx, dw, None, None, None


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual, weight), x + residual)`` in one pass (module doc).

    Args:
        x: ``(..., n)``, e.g. a block's output; any strides (rows without unit column stride are copied).
        residual: x's shape and dtype, the residual stream.
        weight: ``(n,)``, used as ``offset + weight``.
        casting_mode: "llama" (LlamaRMSNorm and most models), "gemma" (GemmaRMSNorm: use ``offset=1.0``) or
            "none", as ``liger_core.ops.rms_norm``.

    Returns:
        ``(y, s)``: the normalised rows (dtype: x's for "gemma", ``promote_types(x.dtype, weight.dtype)``
        otherwise) and the new residual ``s = x + residual`` (x's dtype), both of x's shape.
    """
    if is_dtensor(x) or is_dtensor(residual):
        raise TypeError("x and residual must be plain tensors (DTensor activations are not supported here)")
    if any_dtensor(weight):  # an FSDP2 weight outside its unit's forward: gather it (gradient flows back)
        weight = weight.full_tensor()
    check_not_zero3_partitioned(weight=weight)
    check_tensor("x", x, min_ndim=1)
    check_tensor("residual", residual)
    check_tensor("weight", weight, ndim=1)
    check_shape("residual", residual, tuple(x.shape), "residual must have the shape of x")
    if residual.dtype != x.dtype:
        raise TypeError(f"residual has dtype {residual.dtype}; expected x's dtype {x.dtype}")
    check_shape("weight", weight, (x.shape[-1],), "weight must match the last dimension of x")
    check_same_device("x", x, residual=residual, weight=weight)
    check_choice("casting_mode", casting_mode, CASTING_MODES)
    if x.shape[-1] == 0:
        raise ValueError("x has an empty last dimension; RMSNorm needs at least one element per row")
    if not use_triton(x):
        return reference.fused_add_rms_norm(x, residual, weight, eps, offset, casting_mode)
    residual_rms.check_row_fits(x.shape[-1])
    if not weight.is_contiguous():
        weight = weight.contiguous()  # the kernels read it with unit stride; dw flows back through the copy
    # the Function works on rows; the caller's shape is a view taken outside it, so a model may modify the
    # outputs in place (a view made inside a custom Function may not be)
    y, s = FusedAddRMSNormFunction.apply(
        rows_view(x), rows_view(residual), weight, float(eps), float(offset), casting_mode
    )
    return as_shape(y, x.shape), as_shape(s, x.shape)

"""RMSNorm without a weight: ``y = x * rstd``, ``rstd = 1 / sqrt(mean(x**2) + eps)`` over the last dimension,
computed in fp32 (fp64 row statistics for fp32 data) and rounded once to x's dtype, as HF's norms without a
scale do (Gemma4's ``with_scale=False``, Gemma3n's value norm).

Backward: ``dx = rstd * (dy - xn * sum(dy * xn) / n)`` with ``xn = x * rstd``. HBM traffic: forward reads x
and writes y and rstd; backward reads dy, x and rstd and writes dx (no weight to read or reduce).
Kernels and math: ``liger_core.ops._residual_rms_math``.
Reference: ``liger_core.reference.rms_norm_no_weight``.
"""

from __future__ import annotations

import torch

from liger_core import reference
from liger_core.dispatch import check_tensor, launcher, use_triton
from liger_core.ops import _residual_rms_math as residual_rms
from liger_core.ops._norm_math import as_shape, rows_view
from liger_core.sharding import is_dtensor


# Kernel launchers are torch.library custom ops (with fake implementations), as in the other ops: no graph
# break under torch.compile; eager mode calls the plain implementations. Inputs: 2-D rows, unit column stride.
def _rms_norm_no_weight_fwd_impl(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    y, _, rstd = residual_rms.forward(x, None, None, x.dtype, eps, 0.0, False)
    return y, rstd


def _rms_norm_no_weight_bwd_impl(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    dx, _ = residual_rms.backward(dy, None, x, None, rstd, 0.0)
    return dx


_rms_norm_no_weight_fwd = torch.library.custom_op(
    "liger_core::rms_norm_no_weight_fwd", _rms_norm_no_weight_fwd_impl, mutates_args=()
)
_rms_norm_no_weight_bwd = torch.library.custom_op(
    "liger_core::rms_norm_no_weight_bwd", _rms_norm_no_weight_bwd_impl, mutates_args=()
)


@_rms_norm_no_weight_fwd.register_fake
def _(x, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape[0], dtype=torch.float32)


@_rms_norm_no_weight_bwd.register_fake
def _(dy, x, rstd):
    return x.new_empty(x.shape)


class RMSNormNoWeightFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, eps: float):
        y, rstd = launcher(_rms_norm_no_weight_fwd, _rms_norm_no_weight_fwd_impl)(x, eps)
        ctx.save_for_backward(x, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, rstd = ctx.saved_tensors
        return launcher(_rms_norm_no_weight_bwd, _rms_norm_no_weight_bwd_impl)(rows_view(dy), x, rstd), None


def rms_norm_no_weight(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of ``x`` over its last dimension without a weight (module doc); y has x's shape and dtype.

    ``x``: ``(..., n)``, any strides (rows without unit column stride are copied).
    """
    if is_dtensor(x):
        raise TypeError("x must be a plain tensor (DTensor activations are not supported here)")
    check_tensor("x", x, min_ndim=1)
    if x.shape[-1] == 0:
        raise ValueError("x has an empty last dimension; RMSNorm needs at least one element per row")
    if not use_triton(x):
        return reference.rms_norm_no_weight(x, eps)
    residual_rms.check_row_fits(x.shape[-1])
    # the Function works on rows; the caller's shape is a view taken outside it (in-place use of y allowed)
    return as_shape(RMSNormNoWeightFunction.apply(rows_view(x), float(eps)), x.shape)

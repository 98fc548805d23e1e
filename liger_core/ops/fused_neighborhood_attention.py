"""1-D neighborhood attention (liger-kernel's ``liger_fused_neighborhood_attention``, after Hassani et al.;
arXiv 2504.16922), forward and backward.

Math, for query, key, value of shape (B, H, L, D), window half-width h = kernel_size // 2, dilation d::

    S_ij = scale * q_i . k_j
    P_ij = softmax over the visible keys of row i, 0 elsewhere;  visible: |j - i| <= h d, (j - i) mod d = 0
    O    = P V

The window is clipped at the sequence ends (a query near an end sees fewer keys, as in liger-kernel).
Backward: dV = P^T dO; dP = dO V^T; dS_ij = scale * P_ij (dP_ij - sum_k dP_ik P_ik) on the visible keys;
dQ = dS K; dK = dS^T Q.

What runs where: the masked, scaled softmax and its backward (``ops._masked_softmax_math``: float64 math for
fp32 tensors, fp32 for 16-bit ones, the scale applied in that precision) are Triton kernels; the four
matmuls (Q K^T, P V and the gradients' ones) are ``torch.matmul`` (cuBLAS on GPU). liger-kernel writes
those matmuls as Triton kernels too; both materialise the (B, H, L, L) score and probability matrices.
A row whose visible scores are all -inf gives a zero output row and zero gradients instead of NaN.
"""

from __future__ import annotations

import math

import torch

from liger_core import reference
from liger_core.dispatch import check_same_device, check_tensor, launcher, use_triton
from liger_core.ops._masked_softmax_math import NEIGHBORHOOD, masked_softmax_bwd, masked_softmax_fwd


def _nbhd_softmax_fwd_impl(x: torch.Tensor, scale: float, half_span: int, dilation: int) -> torch.Tensor:
    return masked_softmax_fwd(x, scale, NEIGHBORHOOD, half_span, dilation)


def _nbhd_softmax_bwd_impl(
    dy: torch.Tensor, y: torch.Tensor, scale: float, half_span: int, dilation: int
) -> torch.Tensor:
    return masked_softmax_bwd(dy, y, scale, NEIGHBORHOOD, half_span, dilation)


_nbhd_softmax_fwd = torch.library.custom_op(
    "liger_core::nbhd_softmax_fwd", _nbhd_softmax_fwd_impl, mutates_args=()
)
_nbhd_softmax_bwd = torch.library.custom_op(
    "liger_core::nbhd_softmax_bwd", _nbhd_softmax_bwd_impl, mutates_args=()
)


@_nbhd_softmax_fwd.register_fake
def _(x, scale, half_span, dilation):
    return x.new_empty(x.shape)


@_nbhd_softmax_bwd.register_fake
def _(dy, y, scale, half_span, dilation):
    return y.new_empty(y.shape)


class FusedNeighborhoodAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, kernel_size: int, dilation: int, scale: float) -> torch.Tensor:
        b, h, n, _ = query.shape
        half_span = (kernel_size // 2) * dilation
        scores = torch.matmul(query, key.transpose(-1, -2)).view(b * h * n, n)
        probs = launcher(_nbhd_softmax_fwd, _nbhd_softmax_fwd_impl)(scores, scale, half_span, dilation)
        probs = probs.view(b, h, n, n)
        ctx.save_for_backward(query, key, value, probs)
        ctx.args = (scale, half_span, dilation)
        return torch.matmul(probs, value)

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        query, key, value, probs = ctx.saved_tensors
        b, h, n, _ = query.shape
        d_value = torch.matmul(probs.transpose(-1, -2), d_out)
        d_probs = torch.matmul(d_out, value.transpose(-1, -2)).view(b * h * n, n)
        d_scores = launcher(_nbhd_softmax_bwd, _nbhd_softmax_bwd_impl)(
            d_probs, probs.view(b * h * n, n), *ctx.args
        ).view(b, h, n, n)
        d_query = torch.matmul(d_scores, key)
        d_key = torch.matmul(d_scores.transpose(-1, -2), query)
        return d_query, d_key, d_value, None, None, None


def check_fna_args(query, key, value, kernel_size, dilation, scale) -> float:
    """The argument checks of ``fused_neighborhood_attention``; returns the scale to use."""
    check_tensor("query", query, ndim=4)
    for name, t in (("key", key), ("value", value)):
        check_tensor(name, t, ndim=4)
        if t.shape != query.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected query's {tuple(query.shape)}")
        if t.dtype != query.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}; expected query's dtype {query.dtype}")
    check_same_device("query", query, key=key, value=value)
    if isinstance(kernel_size, bool) or not isinstance(kernel_size, int):
        raise TypeError(f"kernel_size must be an int, got {type(kernel_size).__name__}")
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be a positive odd int, got {kernel_size}")
    if isinstance(dilation, bool) or not isinstance(dilation, int):
        raise TypeError(f"dilation must be an int, got {type(dilation).__name__}")
    if dilation < 1:
        raise ValueError(f"dilation must be >= 1, got {dilation}")
    if scale is None:
        return 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite float or None, got {scale!r}")
    return float(scale)


def fused_neighborhood_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kernel_size: int = 7,
    dilation: int = 1,
    scale: float | None = None,
) -> torch.Tensor:
    """Neighborhood attention (the module doc) of (B, H, L, D) query, key and value: each query attends to
    the keys within ``kernel_size // 2`` dilated steps of its position. ``scale`` defaults to 1/sqrt(D).
    Result (B, H, L, D) in query's dtype."""
    scale = check_fna_args(query, key, value, kernel_size, dilation, scale)
    if not use_triton(query):
        return reference.fused_neighborhood_attention(query, key, value, kernel_size, dilation, scale)
    return FusedNeighborhoodAttentionFunction.apply(query, key, value, kernel_size, dilation, scale)

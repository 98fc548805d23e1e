"""Multi-token attention's score mixing (Golovneva et al. 2025, arXiv 2504.00927; liger-kernel's
``liger_multi_token_attention``), forward and backward.

Math, for scores S of shape (B, C_in, L, L) (query rows, key columns) and a conv2d weight W, bias b::

    P   = softmax_causal(S)          row softmax over the keys j <= i (0 above the diagonal);
                                     sparse=True: sparsemax over those keys instead
    Y   = conv2d(P, W, b, stride, padding, dilation, groups)
    out = Y with 0 above the diagonal (col > row) of each output matrix

Backward: dY = dout with 0 above the diagonal; dP, dW, db from conv2d's backward; dS_j = P_j (dP_j - sum_k
dP_k P_k) on the causal keys, 0 above the diagonal (sparsemax: its own backward on the support).

What runs where: the causal softmax and its backward, and the output / gradient masks, are Triton kernels
(``ops._masked_softmax_math``, float64 math for fp32 tensors, fp32 for 16-bit ones); the convolution and its
input / weight gradients are ``torch.nn.functional.conv2d`` (cuDNN on GPU), as liger-kernel does. The sparse
variant masks with a Triton kernel and calls ``liger_core.ops.sparsemax``.

Masking: liger-kernel fills the future keys with -1e9 before the softmax; here they are excluded exactly
(the same result for any row with a finite visible score). A row whose visible scores are all -inf (a query
masked out upstream) gets P = 0 and dS = 0, where -1e9 would spread it over the future keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from liger_core import reference
from liger_core.dispatch import check_same_device, check_tensor, launcher, use_triton
from liger_core.ops._divergence_math import as_rows
from liger_core.ops._masked_softmax_math import CAUSAL, causal_fill, masked_softmax_bwd, masked_softmax_fwd
from liger_core.ops.sparsemax import sparsemax

IntPair = int | tuple[int, int]


def _causal_softmax_fwd_impl(x: torch.Tensor) -> torch.Tensor:
    return masked_softmax_fwd(x, 1.0, CAUSAL)


def _causal_softmax_bwd_impl(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return masked_softmax_bwd(dy, y, 1.0, CAUSAL)


def _causal_fill_impl(x: torch.Tensor, n_rows_per_matrix: int, fill: float) -> torch.Tensor:
    return causal_fill(x, n_rows_per_matrix, fill)


_causal_softmax_fwd = torch.library.custom_op(
    "liger_core::mta_causal_softmax_fwd", _causal_softmax_fwd_impl, mutates_args=()
)
_causal_softmax_bwd = torch.library.custom_op(
    "liger_core::mta_causal_softmax_bwd", _causal_softmax_bwd_impl, mutates_args=()
)
_causal_fill = torch.library.custom_op("liger_core::mta_causal_fill", _causal_fill_impl, mutates_args=())


@_causal_softmax_fwd.register_fake
def _(x):
    return x.new_empty(x.shape)


@_causal_softmax_bwd.register_fake
def _(dy, y):
    return y.new_empty(y.shape)


@_causal_fill.register_fake
def _(x, n_rows_per_matrix, fill):
    return x.new_empty(x.shape)


class CausalSoftmaxFunction(torch.autograd.Function):
    """Row softmax of each (…, L, L) matrix over the keys j <= i."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor) -> torch.Tensor:
        y = launcher(_causal_softmax_fwd, _causal_softmax_fwd_impl)(as_rows(scores))
        ctx.save_for_backward(y)
        return y.view(scores.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        return launcher(_causal_softmax_bwd, _causal_softmax_bwd_impl)(as_rows(dy), y).view(dy.shape)


class CausalFillFunction(torch.autograd.Function):
    """x with ``fill`` above the diagonal of each (…, R, C) matrix; the gradient is dout with 0 there."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fill: float) -> torch.Tensor:
        ctx.n_rows = x.shape[-2]
        return launcher(_causal_fill, _causal_fill_impl)(as_rows(x), x.shape[-2], fill).view(x.shape)

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        dx = launcher(_causal_fill, _causal_fill_impl)(as_rows(dout), ctx.n_rows, 0.0)
        return dx.view(dout.shape), None


def _check_pair(name: str, value: object, minimum: int) -> None:
    items = value if isinstance(value, tuple) else (value,)
    if not (isinstance(value, int) or (isinstance(value, tuple) and len(value) == 2)) or any(
        isinstance(v, bool) or not isinstance(v, int) for v in items
    ):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if any(v < minimum for v in items):
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


def check_mta_args(scores, weight, bias, stride, padding, dilation, groups, sparse) -> None:
    """The argument checks of ``multi_token_attention`` (shared with its reference path)."""
    check_tensor("scores", scores, ndim=4)
    if scores.shape[-1] != scores.shape[-2]:
        raise ValueError(
            f"scores must be (B, C_in, L, L) with square score matrices, got {tuple(scores.shape)}"
        )
    check_tensor("weight", weight, ndim=4)
    if weight.dtype != scores.dtype:
        raise TypeError(f"weight has dtype {weight.dtype}; expected scores' dtype {scores.dtype}")
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
        if bias.dtype != scores.dtype:
            raise TypeError(f"bias has dtype {bias.dtype}; expected scores' dtype {scores.dtype}")
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias has shape {tuple(bias.shape)}; expected ({weight.shape[0]},) (C_out)")
    check_same_device("scores", scores, weight=weight, bias=bias)
    _check_pair("stride", stride, 1)
    if not (isinstance(padding, str) and padding in ("same", "valid")):
        _check_pair("padding", padding, 0)
    _check_pair("dilation", dilation, 1)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    if scores.shape[1] % groups or weight.shape[0] % groups or weight.shape[1] * groups != scores.shape[1]:
        raise ValueError(
            f"weight has shape {tuple(weight.shape)}; expected (C_out, C_in / groups, kH, kW) with C_in = "
            f"{scores.shape[1]}, groups = {groups} and C_out divisible by groups"
        )
    if not isinstance(sparse, bool):
        raise TypeError(f"sparse must be a bool, got {type(sparse).__name__}")


def multi_token_attention(
    scores: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: IntPair = 1,
    padding: IntPair | str = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    sparse: bool = False,
) -> torch.Tensor:
    """Multi-token attention (the module doc): causal softmax (or sparsemax) of ``scores`` (B, C_in, L, L),
    a 2-D convolution over the (query, key) plane mixing heads C_in -> C_out, and the output's entries above
    the diagonal zeroed. Result (B, C_out, L_out, L_out') in scores' dtype."""
    check_mta_args(scores, weight, bias, stride, padding, dilation, groups, sparse)
    if not use_triton(scores):
        return reference.multi_token_attention(
            scores, weight, bias, stride, padding, dilation, groups, sparse
        )
    if sparse:
        masked = CausalFillFunction.apply(scores, float("-inf"))
        # a row with no finite visible score: sparsemax would give NaN; it is given a finite row here and
        # zeroed after (its gradient is 0 through both fills)
        dead = torch.isneginf(masked).all(dim=-1, keepdim=True)
        probs = sparsemax(masked.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    else:
        probs = CausalSoftmaxFunction.apply(scores)
    out = F.conv2d(probs, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return CausalFillFunction.apply(out, 0.0)

"""Cross-entropy losses as nn.Modules: thin wrappers around liger_core.ops.cross_entropy and
fused_linear_cross_entropy.

``LigerCrossEntropyLoss`` registers its class ``weight`` as a buffer, as ``torch.nn.CrossEntropyLoss``
does, so swapping one for the other keeps the state_dict. ``LigerFusedLinearCrossEntropyLoss.forward`` takes
``(lin_weight, hidden, target, bias)`` in Liger-Kernel's order, for drop-in use; the lm_head weight belongs
to the model and is passed in, the module holds only hyper-parameters (and the optional class weights
``ce_weight`` as a buffer).
"""

from __future__ import annotations

import torch
from torch import nn

from liger_core.ops.cross_entropy import REDUCTIONS, cross_entropy
from liger_core.ops.fused_linear_cross_entropy import fused_linear_cross_entropy


def _check_options(reduction: str, label_smoothing: float, softcap: float | None) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not supported; choose one of {REDUCTIONS}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing={label_smoothing} must lie in [0, 1]")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap={softcap} must be positive (or None)")


class LigerCrossEntropyLoss(nn.Module):
    """``torch.nn.CrossEntropyLoss`` (class indices) with z-loss and softcap, gradient computed in forward.

    The loss is fp32 whatever the logits' dtype (the gradient has the logits' dtype), with torch's semantics
    for a mean over no target (NaN) and non-finite logits (see ``liger_core.ops.cross_entropy``).
    ``inplace_backward=True`` lets the loss overwrite the logits with their gradient (~0 extra memory); only
    for logits that nothing reads after the loss.
    """

    weight: torch.Tensor | None

    def __init__(
        self,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        lse_square_scale: float = 0.0,
        softcap: float | None = None,
        return_z_loss: bool = False,
        *,
        inplace_backward: bool = False,
    ) -> None:
        super().__init__()
        _check_options(reduction, label_smoothing, softcap)
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.lse_square_scale = lse_square_scale
        self.softcap = softcap
        self.return_z_loss = return_z_loss
        self.inplace_backward = inplace_backward

    def forward(
        self, logits: torch.Tensor, target: torch.Tensor, *, denominator: torch.Tensor | float | None = None
    ):
        """``denominator`` (with reduction "sum"): the sum divided by it inside the op, e.g. Hugging Face's
        ``num_items_in_batch`` (see ``liger_core.ops.cross_entropy``)."""
        return cross_entropy(
            logits,
            target,
            self.weight,
            self.ignore_index,
            self.reduction,
            self.label_smoothing,
            self.lse_square_scale,
            self.softcap,
            self.return_z_loss,
            inplace_backward=self.inplace_backward,
            denominator=denominator,
        )

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
            f"label_smoothing={self.label_smoothing}, lse_square_scale={self.lse_square_scale}, "
            f"softcap={self.softcap}, return_z_loss={self.return_z_loss}"
        )


class LigerFusedLinearCrossEntropyLoss(nn.Module):
    """lm_head projection + cross-entropy, never materialising the logits (``fused_linear_cross_entropy``).

    An fp32 loss, gradients at eager's accuracy. ``max_chunk_bytes`` bounds the working memory beside the
    gradients (default: the hidden-state gradient's size, at least 64 MiB); a larger bound is faster (fewer
    GEMM launches and fewer passes over the fp32 dh accumulator), and one that holds fp32 copies of the
    gradients plus 512 MiB of logits selects the fastest exact order
    (``liger_core.ops.fused_linear_cross_entropy``)."""

    ce_weight: torch.Tensor | None

    def __init__(
        self,
        ce_weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        lse_square_scale: float = 0.0,
        softcap: float | None = None,
        return_z_loss: bool = False,
        accum_dtype: torch.dtype | None = None,
        *,
        max_chunk_bytes: int | None = None,
    ) -> None:
        super().__init__()
        _check_options(reduction, label_smoothing, softcap)
        self.register_buffer("ce_weight", ce_weight)
        self.max_chunk_bytes = max_chunk_bytes
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.lse_square_scale = lse_square_scale
        self.softcap = softcap
        self.return_z_loss = return_z_loss
        self.accum_dtype = accum_dtype

    def forward(
        self,
        lin_weight: torch.Tensor,
        hidden: torch.Tensor,
        target: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        denominator: torch.Tensor | float | None = None,
    ):
        """``denominator`` (with reduction "sum"): the sum divided by it inside the op, e.g. Hugging Face's
        ``num_items_in_batch`` (see ``liger_core.ops.fused_linear_cross_entropy``)."""
        return fused_linear_cross_entropy(
            hidden,
            lin_weight,
            target,
            bias,
            self.ignore_index,
            self.reduction,
            self.label_smoothing,
            self.lse_square_scale,
            self.softcap,
            self.return_z_loss,
            self.ce_weight,
            self.accum_dtype,
            max_chunk_bytes=self.max_chunk_bytes,
            denominator=denominator,
        )

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
            f"label_smoothing={self.label_smoothing}, lse_square_scale={self.lse_square_scale}, "
            f"softcap={self.softcap}, return_z_loss={self.return_z_loss}, accum_dtype={self.accum_dtype}, "
            f"max_chunk_bytes={self.max_chunk_bytes}"
        )

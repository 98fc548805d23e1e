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

from liger_core.loss_options import CrossEntropyOptions
from liger_core.ops.cross_entropy import cross_entropy
from liger_core.ops.cross_entropy_tvd import cross_entropy_tvd
from liger_core.ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from liger_core.ops.fused_linear_logprobs import fused_linear_scaled_cross_entropy
from liger_core.ops.vocab_parallel_cross_entropy import vocab_parallel_cross_entropy


class _CrossEntropyOptionsView:
    """The loss options as attributes (``module.reduction``, ...) read from ``module.options``, the
    ``CrossEntropyOptions`` (without class weights: those are the module's buffer) that ``forward`` passes
    whole to the op. Setting an attribute replaces ``options`` by a checked copy."""

    options: CrossEntropyOptions

    def _init_options(self, weight_name: str, weight: torch.Tensor | None, *values) -> None:
        """``options`` from the constructor's ``values`` (the fields of ``CrossEntropyOptions`` after
        ``weight``, in their order); the class weights become the buffer ``weight_name`` (they follow
        ``.to()``), which forward adds to the options it passes."""
        self.options = CrossEntropyOptions(None, *values)
        self.register_buffer(weight_name, weight)

    def _call_options(self, weight: torch.Tensor | None) -> CrossEntropyOptions:
        return self.options if weight is None else self.options.replace(weight=weight)

    def _options_repr(self) -> str:
        o = self.options
        return (
            f"ignore_index={o.ignore_index}, reduction={o.reduction!r}, "
            f"label_smoothing={o.label_smoothing}, lse_square_scale={o.lse_square_scale}, "
            f"softcap={o.softcap}, return_z_loss={o.return_z_loss}"
            + "".join(f", {name}=True" for name in _EXTRA_OPTIONS if getattr(o, name))
        )


def _option_property(name: str) -> property:
    def get(self):
        return getattr(self.options, name)

    def set_(self, value):
        self.options = self.options.replace(**{name: value})

    return property(get, set_, doc=f"``options.{name}``")


# Liger-Kernel's extra outputs and token scaling (see ``CrossEntropyOptions``): keyword-only in the modules
_EXTRA_OPTIONS = ("return_token_accuracy", "return_predicted_tokens", "use_token_scaling")
for _name in (
    "ignore_index", "reduction", "label_smoothing", "lse_square_scale", "softcap", "return_z_loss",
    *_EXTRA_OPTIONS,
):  # fmt: skip
    setattr(_CrossEntropyOptionsView, _name, _option_property(_name))
del _name


class LigerCrossEntropyLoss(_CrossEntropyOptionsView, nn.Module):
    """``torch.nn.CrossEntropyLoss`` (class indices) with z-loss and softcap, gradient computed in forward.

    The loss is fp32 whatever the logits' dtype (the gradient has the logits' dtype), with torch's semantics
    for a mean over no target (NaN) and non-finite logits (see ``liger_core.ops.cross_entropy``).
    ``inplace_backward=True`` lets the loss overwrite the logits with their gradient (~0 extra memory); only
    for logits that nothing reads after the loss. Liger-Kernel's ``return_token_accuracy``,
    ``return_predicted_tokens`` (forward then returns a ``CrossEntropyOutput``) and ``use_token_scaling``:
    see ``liger_core.loss_options.CrossEntropyOptions``.
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
        return_token_accuracy: bool = False,
        return_predicted_tokens: bool = False,
        use_token_scaling: bool = False,
    ) -> None:
        super().__init__()
        self._init_options(
            "weight", weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap,
            return_z_loss, return_token_accuracy, return_predicted_tokens, use_token_scaling,
        )  # fmt: skip
        self.inplace_backward = inplace_backward

    def forward(
        self, logits: torch.Tensor, target: torch.Tensor, *, denominator: torch.Tensor | float | None = None
    ):
        """``denominator`` (with reduction "sum"): the sum divided by it inside the op, e.g. Hugging Face's
        ``num_items_in_batch`` (see ``liger_core.ops.cross_entropy``)."""
        return cross_entropy(
            logits,
            target,
            options=self._call_options(self.weight),
            inplace_backward=self.inplace_backward,
            denominator=denominator,
        )

    def extra_repr(self) -> str:
        return self._options_repr()


class LigerFusedLinearCrossEntropyLoss(_CrossEntropyOptionsView, nn.Module):
    """lm_head projection + cross-entropy, never materialising the logits (``fused_linear_cross_entropy``).

    An fp32 loss, gradients at eager's accuracy. ``max_chunk_bytes`` bounds the working memory beside the
    gradients (default: the hidden-state gradient's size, at least 64 MiB); a larger bound is faster (fewer
    GEMM launches and fewer passes over the fp32 dh accumulator), and one that holds fp32 copies of the
    gradients plus 512 MiB of logits selects the fastest exact order
    (``liger_core.ops.fused_linear_cross_entropy``). Liger-Kernel's ``return_token_accuracy``,
    ``return_predicted_tokens`` (forward then returns a ``CrossEntropyOutput``) and ``use_token_scaling``:
    see ``liger_core.loss_options.CrossEntropyOptions``; ``accum_dtype=torch.float32`` accumulates dW in
    fp32."""

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
        return_token_accuracy: bool = False,
        return_predicted_tokens: bool = False,
        use_token_scaling: bool = False,
    ) -> None:
        super().__init__()
        self._init_options(
            "ce_weight", ce_weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap,
            return_z_loss, return_token_accuracy, return_predicted_tokens, use_token_scaling,
        )  # fmt: skip
        self.max_chunk_bytes = max_chunk_bytes
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
            options=self._call_options(self.ce_weight),
            accum_dtype=self.accum_dtype,
            max_chunk_bytes=self.max_chunk_bytes,
            denominator=denominator,
        )

    def extra_repr(self) -> str:
        return (
            f"{self._options_repr()}, accum_dtype={self.accum_dtype}, max_chunk_bytes={self.max_chunk_bytes}"
        )


class LigerFusedLinearScaledCrossEntropy(nn.Module):
    """Per-token cross-entropy (and entropy) of ``input @ weight.T / temperature``, chunked over tokens
    (``liger_core.ops.fused_linear_scaled_cross_entropy``); forward takes ``(input, weight, target)``."""

    def __init__(self, temperature: float = 1.0, ignore_index: int = -100, return_entropy: bool = False):
        super().__init__()
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"temperature={temperature!r} must be a positive number")
        if not isinstance(return_entropy, bool):
            raise TypeError(f"return_entropy must be a bool, got {type(return_entropy).__name__}")
        self.temperature, self.ignore_index = float(temperature), ignore_index
        self.return_entropy = return_entropy

    def forward(
        self, input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return fused_linear_scaled_cross_entropy(
            input, weight, target, self.temperature, self.ignore_index, self.return_entropy
        )

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, ignore_index={self.ignore_index}, "
            f"return_entropy={self.return_entropy}"
        )


class LigerVocabParallelCrossEntropy(nn.Module):
    """Per-token cross-entropy of logits sharded along the vocabulary across ``tp_group``'s ranks
    (``liger_core.ops.vocab_parallel_cross_entropy``); ``forward(vocab_parallel_logits, target, tp_group=None,
    vocab_start=None)`` returns the unreduced fp32 loss (``reduction="none"``, the only one: the caller owns
    the divisor). No label smoothing."""

    def __init__(self, ignore_index: int = -100, reduction: str = "none") -> None:
        super().__init__()
        if reduction != "none":
            raise ValueError(
                f"reduction={reduction!r}: vocab-parallel cross-entropy returns per-token losses"
            )
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(
        self,
        vocab_parallel_logits: torch.Tensor,
        target: torch.Tensor,
        tp_group: torch.distributed.ProcessGroup | None = None,
        vocab_start: int | None = None,
    ) -> torch.Tensor:
        return vocab_parallel_cross_entropy(
            vocab_parallel_logits, target, vocab_start, tp_group, self.ignore_index
        )

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"


class LigerFusedCETVDLoss(nn.Module):
    """Per-token cross-entropy and total variation distance to a teacher
    (``liger_core.ops.cross_entropy_tvd``): ``forward(student_logits, teacher_logits, target)`` returns
    ``(ce, tvd)``, unreduced fp32, 0 in rows whose target is ``ignore_index``; the caller
    weights and divides them."""

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def forward(
        self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, target: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return cross_entropy_tvd(student_logits, teacher_logits, target, self.ignore_index)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}"

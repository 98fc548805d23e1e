"""Reference fused linear + cross-entropy: the eager code it replaces, which materialises all the logits.

``logits = hidden @ weight.T (+ bias)`` in the input dtype (as ``lm_head``), upcast to fp32 as Hugging Face's
``ForCausalLMLoss`` does, then the reference cross-entropy (``liger_core.reference.cross_entropy``, which
documents its departures from torch, and ``denominator``). The loss is fp32 (float64 for float64 inputs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from liger_core.loss_options import CrossEntropyOptions, CrossEntropyOutput
from liger_core.loss_options import resolve as resolve_options
from liger_core.reference.cross_entropy import cross_entropy


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    return_z_loss: bool = False,
    ce_weight: torch.Tensor | None = None,
    accum_dtype: torch.dtype | None = None,  # signature parity: one unchunked GEMM has nothing to accumulate
    *,
    options: CrossEntropyOptions | None = None,
    chunk_size: int | None = None,  # signature parity: the reference does not chunk
    denominator: torch.Tensor | float | None = None,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    use_token_scaling: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | CrossEntropyOutput:
    """``options``: the loss options as one object (its ``weight`` is ``ce_weight``), instead of the
    keywords."""
    options = resolve_options(
        options, ce_weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap,
        return_z_loss, return_token_accuracy, return_predicted_tokens, use_token_scaling,
    )  # fmt: skip
    logits = F.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return cross_entropy(logits, target, options=options, denominator=denominator)

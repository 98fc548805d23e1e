"""The cross-entropy options, one object that travels whole from the loss modules through the ops to the
references (``liger_core.modules.losses`` -> ``liger_core.ops.cross_entropy`` /
``fused_linear_cross_entropy`` -> ``liger_core.reference``).

The public functions still take each option as a keyword (torch's and Liger-Kernel's signatures); they fold
them into a ``CrossEntropyOptions``, or take one whole through ``options=``. Per-call values that are not
hyper-parameters stay arguments of their own: ``denominator`` (a batch's token count), ``inplace_backward``,
``check_targets``, and FLCE's chunking (``accum_dtype``, ``chunk_size``, ``max_chunk_bytes``).

The post-training losses' options live beside their formulas (``liger_core.losses.grpo.GRPOOptions``,
``liger_core.losses._logps.LogprobHead``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

REDUCTIONS = ("mean", "sum", "none")


@dataclass(frozen=True, eq=False)
class CrossEntropyOptions:
    """torch's ``cross_entropy`` options (class ``weight``, ``ignore_index``, ``reduction``,
    ``label_smoothing``), the z-loss ``lse_square_scale * logsumexp(logits)^2`` per non-ignored token
    (``return_z_loss``: also return that part of the loss), and logit softcapping
    ``softcap * tanh(logits / softcap)`` applied first. Checked once at construction (the errors name the
    option); numbers are stored as Python floats, the form the kernels take.

    Liger-Kernel's extra outputs and scaling: ``return_token_accuracy`` (the fraction of non-ignored tokens
    whose logits' argmax is the target; per token, 1.0 / 0.0, with ``reduction="none"``),
    ``return_predicted_tokens`` (each token's argmax, -1 on ignored tokens), both from the kernel's first
    pass over the logits; ``use_token_scaling``: each token's loss (z-loss included) and gradient times
    ``p_y = softmax(softcapped logits)[target]``, held constant (no gradient through it). With either
    output the functions return a ``CrossEntropyOutput``."""

    weight: torch.Tensor | None = None
    ignore_index: int = -100
    reduction: str = "mean"
    label_smoothing: float = 0.0
    lse_square_scale: float = 0.0
    softcap: float | None = None
    return_z_loss: bool = False
    return_token_accuracy: bool = False
    return_predicted_tokens: bool = False
    use_token_scaling: bool = False

    def __post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction={self.reduction!r} is not supported; choose one of {REDUCTIONS}")
        if not 0.0 <= self.label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing={self.label_smoothing} must lie in [0, 1]")
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"softcap={self.softcap} must be positive (or None)")
        if not isinstance(self.ignore_index, int):
            raise TypeError(f"ignore_index must be an int, got {type(self.ignore_index).__name__}")
        set_field = object.__setattr__  # frozen: normalise once, here
        set_field(self, "label_smoothing", float(self.label_smoothing))
        set_field(self, "lse_square_scale", float(self.lse_square_scale))
        set_field(self, "softcap", None if self.softcap is None else float(self.softcap))
        set_field(self, "return_z_loss", bool(self.return_z_loss))
        for name in ("return_token_accuracy", "return_predicted_tokens", "use_token_scaling"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")

    @property
    def wants_argmax(self) -> bool:
        """Whether the kernel's first pass records each row's argmax."""
        return self.return_token_accuracy or self.return_predicted_tokens

    @property
    def returns_output(self) -> bool:
        """Whether the functions return a ``CrossEntropyOutput`` (else the loss, or ``(loss, z_loss)``)."""
        return self.wants_argmax

    def replace(self, **changes) -> CrossEntropyOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def row_options(self) -> tuple[int, str, float, float, float | None]:
        """``(ignore_index, reduction, label_smoothing, lse_square_scale, softcap)``: the order in which the
        kernels' launchers and custom ops take them."""
        return (self.ignore_index, self.reduction, self.label_smoothing, self.lse_square_scale, self.softcap)


_DEFAULTS = CrossEntropyOptions()
# the field names once, at import: torch.compile cannot trace dataclasses.fields() inside a compiled forward
_FIELD_NAMES = tuple(field.name for field in dataclasses.fields(CrossEntropyOptions))


def resolve(options: CrossEntropyOptions | None, *values) -> CrossEntropyOptions:
    """``options`` when given (then every one of ``values`` must keep its default: one source for each
    option), else the options that ``values`` name. ``values``: the public functions' keywords ``weight,
    ignore_index, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss`` (torch's order,
    which the functions' signatures keep), then optionally ``return_token_accuracy,
    return_predicted_tokens, use_token_scaling``, in the order of the fields."""
    if options is None:
        return CrossEntropyOptions(*values)
    if not isinstance(options, CrossEntropyOptions):
        raise TypeError(f"options must be a CrossEntropyOptions, got {type(options).__name__}")
    changed = [
        name for name, value in zip(_FIELD_NAMES, values) if not _is_default(value, getattr(_DEFAULTS, name))
    ]
    if changed:
        raise TypeError(f"pass {', '.join(changed)} inside options=, not beside it")
    return options


def _is_default(value: object, default: object) -> bool:
    if value is default:
        return True
    return not isinstance(value, torch.Tensor) and default is not None and value == default


class CrossEntropyOutput(NamedTuple):
    """What the cross-entropy functions return when ``return_token_accuracy`` or ``return_predicted_tokens``
    is set (Liger-Kernel's ``CrossEntropyOutput`` fields): the loss, the z-loss (None unless
    ``return_z_loss``), the token accuracy and the predicted tokens (None unless asked for; shaped as the
    loss and the target)."""

    loss: torch.Tensor
    z_loss: torch.Tensor | None = None
    token_accuracy: torch.Tensor | None = None
    predicted_tokens: torch.Tensor | None = None


def finish_outputs(
    options: CrossEntropyOptions,
    loss: torch.Tensor,
    z_loss: torch.Tensor,
    argmax: torch.Tensor | None,
    target: torch.Tensor,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | CrossEntropyOutput:
    """The return convention: the loss, ``(loss, z_loss)`` with ``return_z_loss``, or a
    ``CrossEntropyOutput`` when an extra output is asked for. ``argmax``: the per-token argmax (-1 on
    ignored tokens; any shape with the target's number of elements) when ``options.wants_argmax``."""
    if not options.returns_output:
        return (loss, z_loss) if options.return_z_loss else loss
    accuracy = predicted = None
    if argmax is not None:
        argmax = argmax.reshape(target.shape)
        predicted = argmax.detach() if options.return_predicted_tokens else None
        if options.return_token_accuracy:
            valid = target != options.ignore_index
            correct = (argmax == target) & valid
            if options.reduction == "none":
                accuracy = correct.to(torch.float32)
            else:  # no non-ignored token: 0 (no NaN in a logged metric)
                accuracy = correct.sum().to(torch.float32) / valid.sum().clamp(min=1).to(torch.float32)
    return CrossEntropyOutput(loss, z_loss if options.return_z_loss else None, accuracy, predicted)

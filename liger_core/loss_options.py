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

import torch

REDUCTIONS = ("mean", "sum", "none")


@dataclass(frozen=True, eq=False)
class CrossEntropyOptions:
    """torch's ``cross_entropy`` options (class ``weight``, ``ignore_index``, ``reduction``,
    ``label_smoothing``), the z-loss ``lse_square_scale * logsumexp(logits)^2`` per non-ignored token
    (``return_z_loss``: also return that part of the loss), and logit softcapping
    ``softcap * tanh(logits / softcap)`` applied first. Checked once at construction (the errors name the
    option); numbers are stored as Python floats, the form the kernels take."""

    weight: torch.Tensor | None = None
    ignore_index: int = -100
    reduction: str = "mean"
    label_smoothing: float = 0.0
    lse_square_scale: float = 0.0
    softcap: float | None = None
    return_z_loss: bool = False

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
    ignore_index, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss``, in the order of the
    fields (torch's order, which the functions' signatures keep)."""
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

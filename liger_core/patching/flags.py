"""``KernelFlags``: the one definition of the kernel flags every patch entry point takes, with their defaults.

``apply_liger_kernel``, ``apply_liger_kernel_to``, the generated ``apply_liger_kernel_to_<model_type>`` and
``AutoLigerKernelForCausalLM`` accept exactly these fields as keyword arguments (plus ``strict``); the
trainer plugins read the field names from here to build their configuration keys. The explicit keyword
arguments of the entry points (kept for editor help) are checked against these fields by
``tests/patching/test_patching_api.py``.

Importing this module imports neither torch nor transformers (plugins read it at configuration time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class KernelFlags:
    """Which liger_core kernels to patch in (True) or leave as they are (False).

    ``cross_entropy`` and ``fused_linear_cross_entropy`` replace the same loss, so they are exclusive: turning
    on ``cross_entropy`` needs ``fused_linear_cross_entropy=False`` (``ValueError`` otherwise).

    ``relu_squared``: non-gated MLPs whose activation is ``relu(x)^2`` (transformers' ``relu2``: Nemotron,
    Arcee, Persimmon, ...), ``down(relu(up(x))^2)``, get ``liger_core.ops.relu_squared``.

    Long sequences (off by default; same loss and gradients, less memory, some more time):

    - ``tiled_mlp``: the MLPs patching recognises (gated ones, and non-gated ones with relu^2) run over
      sequence tiles of ``tuning.MLP_TILE_TOKENS`` tokens and are recomputed tile by tile in backward
      (``liger_core.modules.long_context.tiled_mlp``), so one tile's intermediate activations exist at a
      time; with ``swiglu``/``geglu``/``relu_squared`` the tiles run those kernels.
    - ``offload_checkpoints``: under gradient checkpointing, each checkpointed decoder layer's input is kept
      in pinned host memory from its forward to its backward and prefetched back on a side stream
      (``liger_core.modules.long_context.offloaded_checkpoint``). Built models only: class-level patching
      leaves it to ``apply_liger_kernel(model)``.
    """

    rope: bool = True
    rms_norm: bool = True
    swiglu: bool = True
    geglu: bool = True
    relu_squared: bool = True
    moe_experts: bool = True
    layer_norm: bool = True
    cross_entropy: bool = False
    fused_linear_cross_entropy: bool = True
    tiled_mlp: bool = False
    offload_checkpoints: bool = False

    def __post_init__(self) -> None:
        if self.cross_entropy and self.fused_linear_cross_entropy:
            raise ValueError(
                "cross_entropy=True and fused_linear_cross_entropy=True are exclusive: choose one"
            )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The flag names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, bool]:
        """Flag name -> default value."""
        return {f.name: f.default for f in dataclasses.fields(cls)}

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> KernelFlags:
        """The flags named in ``values`` (e.g. an entry point's ``locals()``); other keys are ignored and
        absent flags keep their defaults."""
        return cls(**{name: values[name] for name in cls.names() if name in values})

    def as_dict(self) -> dict[str, bool]:
        return dataclasses.asdict(self)


# Keyword arguments of the patch entry points that are not kernel flags.
PATCH_OPTIONS: tuple[str, ...] = ("strict",)

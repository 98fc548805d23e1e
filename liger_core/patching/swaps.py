"""Swapping one module's forward and undoing it: the bookkeeping every instance patch goes through.

A liger forward is bound into the module's own ``__dict__`` (``types.MethodType``), shadowing the class's
forward for that module only; the value that was in ``__dict__`` before (usually nothing) is recorded on the
model's root module, so ``undo`` restores it exactly. Patched modules are marked with ``_liger_core_kind``;
marked modules are skipped, which makes a second patch call a no-op. Parameters are never touched.

Models that an accelerate ``device_map`` dispatched carry hooks whose wrapper forward lives in ``__dict__``
and calls ``module._old_forward``; there the liger forward replaces ``_old_forward``, keeping the hook.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

from torch import nn

from liger_core.patching.introspect import innermost

_MISSING = object()
_STATE = "_liger_core_swaps"
KIND_MARKER = "_liger_core_kind"


@dataclass
class Swap:
    module: nn.Module
    attr: str  # the __dict__ entry replaced ("forward", "_old_forward" or "_loss_function")
    previous: Any  # what __dict__ held before, or _MISSING
    markers: tuple[str, ...]  # other __dict__ entries this swap added (removed on undo)


def unwrap(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside PEFT (PeftModel -> tuner -> model), DDP/DataParallel, torch.compile."""
    for _ in range(8):
        inner = None
        try:
            from peft import PeftModel
            from peft.tuners.tuners_utils import BaseTuner

            if isinstance(model, PeftModel):
                inner = model.base_model
            elif isinstance(model, BaseTuner):
                inner = model.model
        except ImportError:
            pass
        if inner is None and type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
            inner = model.module
        if inner is None and hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule":
            inner = model._orig_mod
        if not isinstance(inner, nn.Module):
            return model
        model = inner
    return model


def _forward_slot(module: nn.Module) -> str:
    """Where the effective forward lives: accelerate's hook keeps the wrapped one in ``_old_forward``."""
    if getattr(module, "_hf_hook", None) is not None and "_old_forward" in module.__dict__:
        return "_old_forward"
    return "forward"


def swaps_of(root: nn.Module) -> list[Swap]:
    """The swaps recorded on ``root`` (created empty on first use)."""
    if _STATE not in root.__dict__:
        root.__dict__[_STATE] = []
    return root.__dict__[_STATE]


def bind(root: nn.Module, module: nn.Module, fn: Any, kind: str, **markers: Any) -> None:
    """Bind ``fn`` as ``module``'s forward (in its ``__dict__``), set ``markers``, record the undo on root."""
    slot = _forward_slot(module)
    previous = module.__dict__.get(slot, _MISSING)
    for name, value in markers.items():
        module.__dict__[name] = value
    module.__dict__[KIND_MARKER] = kind
    module.__dict__[slot] = types.MethodType(fn, module)
    swaps_of(root).append(Swap(module, slot, previous, (*markers, KIND_MARKER)))


def set_entry(root: nn.Module, module: nn.Module, attr: str, value: Any, kind: str) -> None:
    """Set ``module.__dict__[attr] = value`` and mark the module as ``kind``, recording the undo on root."""
    previous = module.__dict__.get(attr, _MISSING)
    module.__dict__[attr] = value
    module.__dict__[KIND_MARKER] = kind
    swaps_of(root).append(Swap(module, attr, previous, (KIND_MARKER,)))


def set_plain(root: nn.Module, module: nn.Module, attr: str, value: Any) -> None:
    """Set ``module.__dict__[attr] = value`` without a kind marker (a module patched for another kind keeps
    its marker), recording the undo on root."""
    previous = module.__dict__.get(attr, _MISSING)
    module.__dict__[attr] = value
    swaps_of(root).append(Swap(module, attr, previous, ()))


def undo(root: nn.Module, keep: int = 0) -> list[tuple[nn.Module, str | None]]:
    """Undo the swaps recorded on ``root``, newest first, down to the first ``keep`` of them; returns
    (module, kind it was marked with) for each swap undone, in the order undone."""
    swaps = root.__dict__.get(_STATE, [])
    undone = []
    while len(swaps) > keep:
        swap = swaps.pop()
        d = swap.module.__dict__
        undone.append((swap.module, d.get(KIND_MARKER)))
        if swap.previous is _MISSING:
            d.pop(swap.attr, None)
        else:
            d[swap.attr] = swap.previous
        for name in swap.markers:
            d.pop(name, None)
    if not swaps:
        root.__dict__.pop(_STATE, None)
    return undone


def foreign_forward(module: nn.Module) -> bool:
    """True if something other than accelerate already put a forward into this module's ``__dict__``."""
    return "forward" in module.__dict__ and _forward_slot(module) == "forward"


def own_kind(module: nn.Module) -> str | None:
    """The module's own patch marker (not one PEFT's wrappers forward from the module they wrap)."""
    return module.__dict__.get(KIND_MARKER)


def class_forward_is(module: nn.Module, fn: Any) -> bool:
    """True if the module's class forward is ``fn``, directly or inside decorators."""
    forward = type(module).__dict__.get("forward", getattr(type(module), "forward", None))
    return forward is fn or (forward is not None and innermost(forward) is fn)

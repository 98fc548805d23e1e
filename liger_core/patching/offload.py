"""``offload_checkpoints``: checkpointed decoder-layer inputs kept in host memory (built models).

transformers checkpoints a layer (``GradientCheckpointingLayer``) by calling the layer's
``_gradient_checkpointing_func(partial(forward, layer, **kwargs), *args)`` (earlier 5.x releases:
``partial(super().__call__, **kwargs)``, a method bound to the layer), a function that
``gradient_checkpointing_enable()`` assigns to every such layer, before or after patching. So:

- every layer gets the ``_liger_core_offload`` marker (kind ``offload_checkpoints``), recorded for ``revert``;
- the checkpoint functions of the layers are wrapped in ``OffloadingCheckpoint`` now, and again whenever the
  model's ``_set_gradient_checkpointing`` (what ``gradient_checkpointing_enable`` calls) assigns new ones: the
  model gets an instance-level ``_set_gradient_checkpointing`` that calls its class's and then wraps;
- ``OffloadingCheckpoint`` runs ``liger_core.modules.long_context.offloaded_checkpoint`` for a marked layer
  and the function it wraps otherwise, so after ``revert`` (markers gone) a wrapper left in place behaves as
  the function it wraps. It also calls that function for checkpoint options it does not take (keyword args)
  and for a layer whose bound keyword arguments hold a tensor that needs a gradient (offloaded checkpointing
  gives gradients to the positional arguments only).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
from torch import nn

from liger_core.patching.report import PatchReport
from liger_core.patching.swaps import KIND_MARKER, set_entry, set_plain

KIND = "offload_checkpoints"
MARKER = "_liger_core_offload"
_FUNC = "_gradient_checkpointing_func"


def _needs_grad(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.requires_grad
    if isinstance(value, (tuple, list)):
        return any(_needs_grad(v) for v in value)
    if isinstance(value, dict):
        return any(_needs_grad(v) for v in value.values())
    return False


def _layer_of(function: Any) -> Any:
    """The layer a checkpointed call runs: transformers 5.24 passes ``partial(forward, layer, **kwargs)``,
    earlier 5.x releases (5.6, 5.16) ``partial(super().__call__, **kwargs)``, a method bound to the layer."""
    if not isinstance(function, functools.partial):
        return None
    if function.args:
        return function.args[0]
    return getattr(function.func, "__self__", None)


class OffloadingCheckpoint:
    """A layer's checkpoint function: offloaded checkpointing for layers marked ``_liger_core_offload``, the
    wrapped function (``wrapped``) for everything else (module docstring)."""

    def __init__(self, wrapped: Any):
        self.wrapped = wrapped

    def _fallback(self, function, *args, **kwargs):
        if self.wrapped is None:
            return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)
        return self.wrapped(function, *args, **kwargs)

    def __call__(self, function, *args, **kwargs):
        from liger_core.modules.long_context import offloaded_checkpoint

        layer = _layer_of(function)
        marked = isinstance(layer, nn.Module) and layer.__dict__.get(MARKER, False)
        bound = function.keywords if isinstance(function, functools.partial) else {}
        if not marked or kwargs or _needs_grad(bound) or _needs_grad(getattr(function, "args", ())[1:]):
            return self._fallback(function, *args, **kwargs)
        return offloaded_checkpoint(function, *args)


def _checkpointing_layers(root: nn.Module) -> list[tuple[str, nn.Module]]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [(n, m) for n, m in root.named_modules() if isinstance(m, GradientCheckpointingLayer)]


def wrap_checkpoint_functions(root: nn.Module) -> int:
    """Wrap each checkpoint function of the model's modules in ``OffloadingCheckpoint`` (once); how many."""
    wrapped = 0
    for m in root.modules():
        if not hasattr(m, "gradient_checkpointing"):
            continue
        current = m.__dict__.get(_FUNC)
        if not isinstance(current, OffloadingCheckpoint):
            m.__dict__[_FUNC] = OffloadingCheckpoint(current)
            wrapped += 1
    return wrapped


def _set_gradient_checkpointing(self: nn.Module, *args, **kwargs):
    """The class's ``_set_gradient_checkpointing``, then the new checkpoint functions wrapped."""
    result = type(self)._set_gradient_checkpointing(self, *args, **kwargs)
    wrap_checkpoint_functions(self)
    return result


def patch_checkpoint_offload(root: nn.Module, report: PatchReport) -> None:
    layers = _checkpointing_layers(root)
    if not layers:
        report.miss(KIND, "no decoder layer of the model is a transformers GradientCheckpointingLayer")
        return
    for name, layer in layers:
        if layer.__dict__.get(MARKER):
            report.count_already(KIND)
            continue
        if layer.__dict__.get(KIND_MARKER) is not None:
            report.miss(KIND, f"{type(layer).__name__} is patched as {layer.__dict__[KIND_MARKER]}")
            continue
        set_entry(root, layer, MARKER, True, KIND)
        report.count(KIND)
        report.modules[name] = KIND
    for m in root.modules():
        if callable(getattr(type(m), "_set_gradient_checkpointing", None)) and not isinstance(
            m.__dict__.get("_set_gradient_checkpointing"), types.MethodType
        ):
            set_plain(
                root, m, "_set_gradient_checkpointing", types.MethodType(_set_gradient_checkpointing, m)
            )
    wrap_checkpoint_functions(root)

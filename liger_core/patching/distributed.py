"""The lm_head weight under the sharding engines: FSDP2 and DeepSpeed ZeRO-3.

The fused losses read a module's weight without calling the module (``hidden @ lm_head.weight.T`` chunk by
chunk). Both engines gather a module's parameters only around that module's own forward (and again for its
backward), so outside it the weight is a shard: a DTensor under FSDP2, an empty tensor with ``ds_id`` /
``ds_status`` attributes under ZeRO-3. The fix that keeps every engine's bookkeeping intact is to run the loss
*as* the module's forward (``run_with_full_weight``): the engine's pre-forward hook gathers the weight, the
post-forward hook frees it and hooks the loss so that the weight is gathered again for the backward, and the
gradient reaches the sharded parameter the engine's way (FSDP2's reduce-scatter, ZeRO-3's partitioned
gradient hooks). The same pattern as TRL's forward redirection; liger-kernel's FLCE forward does it for FSDP1
only, and its ZeRO-3 users saw the fused loss either fail or fall back to materialised logits.

``deepspeed`` and ``torch.distributed.fsdp`` are never imported here: a ZeRO-3 parameter is recognised by its
attributes, an FSDP2 module through ``sys.modules`` (whoever sharded the model has imported it). Only
``gathered_weights`` (frozen weights: a teacher's lm_head) imports ``deepspeed``, and only when it is given a
partitioned parameter.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from liger_core.sharding import is_dtensor


def is_zero3_param(p: object) -> bool:
    """A DeepSpeed ZeRO-3 parameter (gathered or not): ZeRO-3 gives each one ``ds_id`` and ``ds_status``."""
    return getattr(p, "ds_id", None) is not None and hasattr(p, "ds_status")


def is_fsdp2_module(module: nn.Module) -> bool:
    fsdp = sys.modules.get("torch.distributed.fsdp")  # imported by whoever called fully_shard
    fsdp_module = getattr(fsdp, "FSDPModule", None)
    return fsdp_module is not None and isinstance(module, fsdp_module)


def fsdp2_linear(module: nn.Module) -> nn.Linear | None:
    """``module`` if it is its own FSDP2 unit (``fully_shard(lm_head)``) over a plain nn.Linear, else None.

    Its weight is then a sharded DTensor except inside its own forward, where FSDP's pre-forward hook has
    swapped in the gathered weight. An lm_head inside a parent's FSDP unit needs none of this: its weight is
    gathered for the whole parent forward (a plain tensor then).
    """
    if not is_fsdp2_module(module):
        return None
    fsdp_module = sys.modules["torch.distributed.fsdp"].FSDPModule
    if type(module).__bases__ != (fsdp_module, nn.Linear) or getattr(module, "_hf_hook", None) is not None:
        return None
    return module


def zero3_linear(module: nn.Module) -> nn.Linear | None:
    """``module`` if it is a plain nn.Linear whose parameters DeepSpeed ZeRO-3 manages, else None.

    Whether the weight happens to be gathered right now does not matter: run inside the module's forward,
    ZeRO-3's hooks gather it (and keep a persistent small parameter as it is).
    """
    if type(module) is not nn.Linear or getattr(module, "_hf_hook", None) is not None:
        return None
    if not is_zero3_param(module.weight) or (module.bias is not None and not is_zero3_param(module.bias)):
        return None
    return module


def redirected_linear(module: nn.Module) -> nn.Linear | None:
    """``module`` when its weight is sharded by FSDP2 or ZeRO-3 and it is otherwise a plain nn.Linear: the
    fused loss can use it through ``run_with_full_weight``. None otherwise."""
    return fsdp2_linear(module) or zero3_linear(module)


def call_as_forward(module: nn.Module, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, run as ``module``'s forward so that its forward hooks (and those they add for the
    backward) run around it. ``args`` go through the hooks (FSDP2 casts them to its mixed-precision dtype)."""
    had_own_forward = "forward" in module.__dict__
    own_forward = module.__dict__.get("forward")
    module.forward = fn
    try:
        return module(*args)
    finally:
        if had_own_forward:
            module.forward = own_forward
        else:
            del module.forward


def run_with_full_weight(module: nn.Module, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` where ``module``'s parameters are whole, with gradients flowing to them as the sharding
    engine expects (see the module doc); plain ``fn(*args)`` for a module no engine shards.

    For code that calls a fused loss on a module's weight, e.g. a distillation step::

        loss = run_with_full_weight(
            student.lm_head,
            lambda h: fused_linear_jsd(h, student.lm_head.weight, t_hidden, t_weight, labels),
            student_hidden,
        )

    (a frozen teacher weight can come from ``gathered_weights``). Tensors ``fn`` needs go through ``args``
    when the engine should see them as the module's inputs (FSDP2 casts floating-point inputs to its
    ``param_dtype``).
    """
    sharded = is_fsdp2_module(module) or any(is_zero3_param(p) for p in module.parameters(recurse=False))
    return call_as_forward(module, fn, *args) if sharded else fn(*args)


@contextlib.contextmanager
def gathered_weights(*params: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """Whole copies of ``params`` for the ``with`` block, for weights that need no gradient (a frozen
    teacher's lm_head): ZeRO-3 partitioned parameters are gathered with
    ``deepspeed.zero.GatheredParameters(params, modifier_rank=None)`` (read-only, re-partitioned on exit),
    DTensors are ``full_tensor()``-ed, plain tensors pass through.

    A ZeRO-3 parameter that requires grad while autograd is recording is refused (ValueError): it is
    re-partitioned when the block exits, before the backward needs it; run such a loss with
    ``run_with_full_weight`` instead.
    """
    zero3 = [p for p in params if is_zero3_param(p)]
    for p in zero3:
        if p.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                f"gathered_weights: ZeRO-3 parameter ds_id={p.ds_id} requires grad; a gathered copy is "
                "freed before the backward. Use run_with_full_weight(module, fn, *args) for trainable weights"
            )
    context: contextlib.AbstractContextManager = contextlib.nullcontext()
    if zero3:
        import deepspeed  # only here: a ZeRO-3 parameter exists, so deepspeed is installed

        context = deepspeed.zero.GatheredParameters(zero3, modifier_rank=None)
    with context:
        yield tuple(p.full_tensor() if is_dtensor(p) else p for p in params)

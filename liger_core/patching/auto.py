"""``AutoLigerKernelForCausalLM``: ``AutoModelForCausalLM`` that returns a liger_core-patched model.

Known ``model_type`` (``supported_model_types()``): class-level patching (``apply_liger_kernel_to``) before
loading, so the model is built with liger layers. This is a process-wide side effect: the type's classes
stay patched afterwards, so every model of that type built later in the process, also by plain
``AutoModelForCausalLM`` or ``LlamaForCausalLM(config)``, runs the kernels too.
``revert_model_type(model_type)`` undoes it for models built afterwards; ``class_level=False`` avoids it
(the loaded model alone is patched, per instance, with the same recipe; ``liger_core.revert(model)`` undoes
it).
Unknown ``model_type``: the model is loaded as usual and then patched structurally (``apply_liger_kernel``
on the instance, every swap numerically self-checked), with a warning that names the supported types; if
nothing at all can be patched, ``UnsupportedModelError`` (a ValueError) says so and lists the supported
types. Patch flags (``rope=``, ``rms_norm=``, ..., ``fused_linear_cross_entropy=``, ``strict=``) and
``class_level=`` may be passed with the usual ``from_pretrained`` / ``from_config`` arguments.

With the fused loss (the default), a training forward given ``labels`` returns ``loss`` and
``logits=None``: the logits are never materialised (that is the memory saving). In eval mode, without
labels, or with ``skip_logits=False`` the logits are computed as in transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from liger_core.patching.class_level import apply_liger_kernel_to
from liger_core.patching.flags import PATCH_OPTIONS, KernelFlags
from liger_core.patching.instance import apply_liger_kernel
from liger_core.patching.recipes import RECIPES, recipe_model_types
from liger_core.patching.report import logger

PATCH_FLAGS = (*KernelFlags.names(), *PATCH_OPTIONS)
_CONFIG_KWARGS = ("trust_remote_code", "revision", "cache_dir", "token", "local_files_only", "subfolder")


def _pop_flags(kwargs: dict[str, Any]) -> dict[str, bool]:
    return {name: kwargs.pop(name) for name in PATCH_FLAGS if name in kwargs}


def _pop_class_level(kwargs: dict[str, Any]) -> bool:
    class_level = kwargs.pop("class_level", True)
    if not isinstance(class_level, bool):
        raise TypeError(f"class_level must be True or False, got {class_level!r}")
    return class_level


def _build_patched(
    config: Any, flags: dict[str, bool], build: Callable[[], nn.Module], class_level: bool = True
) -> nn.Module:
    model_type = getattr(config, "model_type", None)
    if model_type in RECIPES and class_level:
        apply_liger_kernel_to(model_type, **flags)
        model = build()
        # What class-level patching cannot do (experts modules, probed on the built model) is patched on the
        # instance; the class-level swaps are found already in place.
        apply_liger_kernel(model, **flags)
        return model
    model = build()
    if model_type in RECIPES:  # class_level=False: this model only, with the recipe
        apply_liger_kernel(model, **flags)
        return model
    logger.warning(
        "liger_core: no recipe for model_type=%r (recipes: %s); patching the loaded model structurally",
        model_type,
        ", ".join(recipe_model_types()),
    )
    apply_liger_kernel(model, **flags)
    return model


class AutoLigerKernelForCausalLM:
    """Use ``from_pretrained`` / ``from_config`` (like ``transformers.AutoModelForCausalLM``); they return a
    transformers model with liger_core's kernels in it.

    Side effects and outputs to know about (module docstring for details):

    - For a ``model_type`` with a recipe the model type's *classes* are patched (``apply_liger_kernel_to``),
      process-wide: every later model of that type runs the kernels too, however it is built.
      ``liger_core.patching.revert_model_type(model.config.model_type)`` undoes that for models built
      afterwards (models already built keep their liger layers). Pass ``class_level=False`` to patch only
      the returned model (per instance; ``liger_core.revert(model)`` undoes it).
    - With the fused loss (default), a training forward with ``labels`` returns ``logits=None``: the loss is
      computed without materialising the logits. Eval-mode forwards, forwards without labels and
      ``model(..., skip_logits=False)`` return the logits as usual.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise OSError(
            "AutoLigerKernelForCausalLM is not instantiated directly: use "
            "AutoLigerKernelForCausalLM.from_pretrained(...) or AutoLigerKernelForCausalLM.from_config(...)"
        )

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: Any, *model_args: Any, **kwargs: Any
    ) -> nn.Module:
        from transformers import AutoConfig, AutoModelForCausalLM

        flags, class_level = _pop_flags(kwargs), _pop_class_level(kwargs)
        config = kwargs.get("config")
        if config is None or isinstance(config, str):
            source = config if isinstance(config, str) else pretrained_model_name_or_path
            config = AutoConfig.from_pretrained(
                source, **{k: kwargs[k] for k in _CONFIG_KWARGS if k in kwargs}
            )
        return _build_patched(
            config,
            flags,
            lambda: AutoModelForCausalLM.from_pretrained(
                pretrained_model_name_or_path, *model_args, **kwargs
            ),
            class_level,
        )

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> nn.Module:
        from transformers import AutoModelForCausalLM

        flags, class_level = _pop_flags(kwargs), _pop_class_level(kwargs)
        return _build_patched(
            config, flags, lambda: AutoModelForCausalLM.from_config(config, **kwargs), class_level
        )

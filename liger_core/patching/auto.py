"""``AutoLigerKernelForCausalLM``: ``AutoModelForCausalLM`` that returns a liger_core-patched model.

Known ``model_type``: class-level patching (``apply_liger_kernel_to``) before loading, so the model is built
with liger layers. Unknown ``model_type``: the model is loaded as usual and then patched structurally
(``apply_liger_kernel`` on the instance, every swap numerically self-checked), with a warning that names the
supported types; if nothing at all can be patched, ``UnsupportedModelError`` (a ValueError) says so and lists
the supported types. Patch flags (``rope=``, ``rms_norm=``, ..., ``fused_linear_cross_entropy=``, ``strict=``)
may be passed with the usual ``from_pretrained`` / ``from_config`` arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from liger_core.patching.class_level import apply_liger_kernel_to
from liger_core.patching.instance import apply_liger_kernel
from liger_core.patching.recipes import RECIPES, recipe_model_types
from liger_core.patching.report import KERNEL_DEFAULTS, logger

PATCH_FLAGS = (*KERNEL_DEFAULTS, "strict")
_CONFIG_KWARGS = ("trust_remote_code", "revision", "cache_dir", "token", "local_files_only", "subfolder")


def _pop_flags(kwargs: dict[str, Any]) -> dict[str, bool]:
    return {name: kwargs.pop(name) for name in PATCH_FLAGS if name in kwargs}


def _build_patched(config: Any, flags: dict[str, bool], build: Callable[[], nn.Module]) -> nn.Module:
    model_type = getattr(config, "model_type", None)
    if model_type in RECIPES:
        apply_liger_kernel_to(model_type, **flags)
        return build()
    model = build()
    logger.warning(
        "liger_core: no recipe for model_type=%r (recipes: %s); patching the loaded model structurally",
        model_type,
        ", ".join(recipe_model_types()),
    )
    apply_liger_kernel(model, **flags)
    return model


class AutoLigerKernelForCausalLM:
    """Use ``from_pretrained`` / ``from_config`` (like ``transformers.AutoModelForCausalLM``)."""

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

        flags = _pop_flags(kwargs)
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
        )

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> nn.Module:
        from transformers import AutoModelForCausalLM

        flags = _pop_flags(kwargs)
        return _build_patched(config, flags, lambda: AutoModelForCausalLM.from_config(config, **kwargs))

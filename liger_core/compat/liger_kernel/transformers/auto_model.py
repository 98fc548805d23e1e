"""Liger-Kernel's ``AutoLigerKernelForCausalLM``, backed by ``liger_core.AutoLigerKernelForCausalLM``.

``from_pretrained`` / ``from_config`` take the patch flags of the model type's
``apply_liger_kernel_to_<model>`` function (its defaults for the flags not given) among the usual
transformers arguments; other arguments go to transformers. A ``model_type`` Liger-Kernel has no function
for is patched with liger_core's defaults (structurally where liger_core has no recipe).
"""

from __future__ import annotations

import inspect
from typing import Any

from liger_core.compat.liger_kernel.transformers.monkey_patch import KNOWN_FLAGS, core_flags, function_for

_CONFIG_KWARGS = ("trust_remote_code", "revision", "cache_dir", "token", "local_files_only", "subfolder")


def _split(model_type: str, kwargs: dict[str, Any]) -> dict[str, bool]:
    """Pop the patch flags from ``kwargs``; liger_core ``KernelFlags`` keywords for them."""
    function = function_for(model_type)
    if function is None:
        given = {name: kwargs.pop(name) for name in KNOWN_FLAGS if name in kwargs}
        if not given:
            return {}
        from liger_core.patching.flags import KernelFlags

        flags = {**KernelFlags.defaults(), **{k: v for k, v in given.items() if k in KernelFlags.names()}}
        if "swiglu" in given:
            flags["moe_experts"] = bool(given["swiglu"])
        return flags
    params = inspect.signature(function).parameters
    values = {name: p.default for name, p in params.items() if name != "model" and p.default is not p.empty}
    for name in list(kwargs):
        if name in params and name != "model":
            values[name] = kwargs.pop(name)
    return core_flags(values)


class AutoLigerKernelForCausalLM:
    """``transformers.AutoModelForCausalLM`` whose models run liger_core's kernels (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise OSError(
            "AutoLigerKernelForCausalLM is not instantiated directly: use "
            "AutoLigerKernelForCausalLM.from_pretrained(...) or AutoLigerKernelForCausalLM.from_config(...)"
        )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *model_args: Any, **kwargs: Any) -> Any:
        from transformers import AutoConfig

        from liger_core.patching.auto import AutoLigerKernelForCausalLM as Core

        config = kwargs.get("config")
        if config is None or isinstance(config, str):
            source = config if isinstance(config, str) else pretrained_model_name_or_path
            config = AutoConfig.from_pretrained(
                source, **{k: kwargs[k] for k in _CONFIG_KWARGS if k in kwargs}
            )
        flags = _split(str(config.model_type), kwargs)
        return Core.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs, **flags)

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> Any:
        from liger_core.patching.auto import AutoLigerKernelForCausalLM as Core

        flags = _split(str(config.model_type), kwargs)
        return Core.from_config(config, **kwargs, **flags)

"""Patch Hugging Face models to run liger_core kernels (see ``recipes.py`` for the per-model table).

- ``apply_liger_kernel(model, **flags) -> PatchReport``: patch one built model (PEFT-wrapped too); exact
  recipe for known ``model_type``s, structural patching (numerically self-checked) for the rest.
- ``revert(model) -> RevertReport`` (what was restored, and what class-level patching still runs).
- What a model runs now: ``is_patched(model)``, ``patched_kinds(model)`` (kind -> count),
  ``patched_modules(model)`` (module name -> kind); ``unwrap(model)``: the Hugging Face model inside PEFT,
  DDP or ``torch.compile`` wrappers (the module those names are relative to).
- liger-kernel beside liger_core: ``liger_kernel_parts(model)`` (what of a model comes from the liger-kernel
  package), ``refuse_liger_kernel(model, flag=..., applied_by=...)`` (stop before patching such a model),
  ``served_by(flag, plugin)`` (the line a plugin logs: which library serves the flag, and versions).
- ``KernelFlags``: the kernel flags every entry point takes, and their defaults.
- ``apply_liger_kernel_to_<model_type>(**flags)`` (one per recipe, generated from the table) and the generic
  ``apply_liger_kernel_to(model_type, **flags)``: class-level, for models built afterwards;
  ``revert_model_type(model_type)``.
- ``AutoLigerKernelForCausalLM.from_pretrained / from_config``.
- ``supported_model_types()``: types with a recipe or patched exactly by the model zoo;
  ``model_coverage(model_type)`` / ``coverage()``: the zoo's record (kernels applied, missing ones and why);
  ``recipe_model_types()``: the types ``apply_liger_kernel_to`` takes.

Flags (``KernelFlags``; all patch kinds): ``rope``, ``rms_norm``, ``swiglu``, ``geglu``, ``relu_squared``,
``moe_experts``, ``layer_norm``, ``cross_entropy``
(default False), ``fused_linear_cross_entropy`` (default True; exclusive with ``cross_entropy``), for long
sequences ``tiled_mlp`` and ``offload_checkpoints`` (default False; see ``KernelFlags``), and
``strict`` (default False): raise ``PatchIncompleteError`` when a kernel that is asked for and that the model
could use was not applied (``PatchReport.missing`` names each with its reason; the call is undone first).
Importing this package imports neither transformers nor Triton.
"""

from __future__ import annotations

import inspect

from liger_core.patching.class_level import apply_liger_kernel_to, revert_model_type
from liger_core.patching.coverage_data import coverage, model_coverage
from liger_core.patching.flags import PATCH_OPTIONS, KernelFlags
from liger_core.patching.instance import (
    apply_liger_kernel,
    is_patched,
    patched_kinds,
    patched_modules,
    revert,
)
from liger_core.patching.peers import liger_kernel_parts, refuse_liger_kernel, served_by
from liger_core.patching.recipes import RECIPES, recipe_model_types, supported_model_types
from liger_core.patching.report import PatchIncompleteError, PatchReport, RevertReport, UnsupportedModelError
from liger_core.patching.swaps import unwrap

__all__ = [
    "AutoLigerKernelForCausalLM",
    "KernelFlags",
    "PatchIncompleteError",
    "PatchReport",
    "RevertReport",
    "UnsupportedModelError",
    "apply_liger_kernel",
    "apply_liger_kernel_to",
    "coverage",
    "is_liger_forward",
    "is_patched",
    "liger_kernel_parts",
    "model_coverage",
    "patched_kinds",
    "patched_modules",
    "recipe_model_types",
    "refuse_liger_kernel",
    "revert",
    "revert_model_type",
    "served_by",
    "supported_model_types",
    "unwrap",
]


def _class_level_signature() -> inspect.Signature:
    """``apply_liger_kernel_to_<model_type>``'s parameters: ``KernelFlags``' fields with their defaults, then
    ``model`` and ``strict``, in this order (positional calls bind to it)."""
    params = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation="bool")
        for name, default in KernelFlags.defaults().items()
    ]
    model = inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
    params.append(model.replace(annotation="nn.Module | None"))
    params += [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False, annotation="bool")
        for name in PATCH_OPTIONS
    ]
    return inspect.Signature(params, return_annotation="PatchReport")


_CLASS_LEVEL_SIGNATURE = _class_level_signature()


def _make_class_level_function(model_type: str):
    def apply(*args, **kwargs) -> PatchReport:
        bound = _CLASS_LEVEL_SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        model, strict = values.pop("model"), values.pop("strict")
        if model is not None:  # Liger-Kernel's calling convention: patch this instance instead
            return apply_liger_kernel(model, strict=strict, **values)
        return apply_liger_kernel_to(model_type, strict=strict, **values)

    apply.__signature__ = _CLASS_LEVEL_SIGNATURE
    apply.__name__ = apply.__qualname__ = f"apply_liger_kernel_to_{model_type}"
    apply.__doc__ = (
        f"Class-level patching of {model_type!r} models built after this call (``model=...``: patch that "
        f"built model instead, as ``apply_liger_kernel`` does). Generated from ``RECIPES[{model_type!r}]``."
    )
    return apply


for _model_type in RECIPES:
    _fn = _make_class_level_function(_model_type)
    globals()[_fn.__name__] = _fn
    __all__.append(_fn.__name__)
del _model_type, _fn


def is_liger_forward(forward: object) -> bool:
    """True if ``forward`` (function or bound method, decorated or not) is liger_core's causal-LM forward."""
    from liger_core.patching.causal_lm import is_causal_lm_forward

    return is_causal_lm_forward(getattr(forward, "__func__", forward))


def __getattr__(name: str):
    if name == "AutoLigerKernelForCausalLM":
        from liger_core.patching.auto import AutoLigerKernelForCausalLM

        return AutoLigerKernelForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

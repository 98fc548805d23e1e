"""Liger-Kernel's ``apply_liger_kernel_to_<model>`` functions, ``_apply_liger_kernel`` and
``_apply_liger_kernel_to_instance``, backed by liger_core's patching.

Each function has Liger-Kernel 0.8.5's parameters and defaults (``_SIGNATURES``). Its flags map onto
``liger_core.patching.KernelFlags``: ``rope``, ``rms_norm``, ``swiglu``, ``geglu``, ``relu_squared``,
``layer_norm``, ``cross_entropy``, ``fused_linear_cross_entropy`` by name; ``swiglu`` also drives
``moe_experts`` (Liger-Kernel patches the experts' SwiGLU with the same flag); a flag the function does not
take is off, as Liger-Kernel leaves those modules alone.

- ``model=<built model>``: that model is patched in place (``liger_core.apply_liger_kernel``; exact recipe for
  the types liger_core has one for, numerically self-checked structural patching otherwise).
- ``model=None``: class-level patching of models built afterwards
  (``liger_core.patching.apply_liger_kernel_to``) for the types with a liger_core recipe
  (``liger_core.patching.recipe_model_types()``); for the other types ``NotImplementedError`` says to pass
  ``model=``.

The functions return liger_core's ``PatchReport`` (Liger-Kernel returns None): what was patched and, by name,
what was not and why.
"""

from __future__ import annotations

import inspect
from typing import Any

from liger_core.compat.liger_kernel._lazy import missing
from liger_core.patching.flags import KernelFlags

_FLCE = (("cross_entropy", False), ("fused_linear_cross_entropy", True))
_LLAMA = (("rope", True), *_FLCE, ("rms_norm", True), ("swiglu", True))
_NO_ROPE = (("rope", False), *_FLCE, ("rms_norm", True), ("swiglu", True))
_GEGLU = (("rope", True), *_FLCE, ("rms_norm", True), ("geglu", True))
_MODEL = ("model", None)
_KWARGS = ("**", None)

# Function suffix -> (config.model_type it patches, parameters in Liger-Kernel 0.8.5's order with defaults).
_SIGNATURES: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {
    "deepseek_v2": ("deepseek_v2", (*_NO_ROPE, _MODEL)),
    "deepseek_v3": ("deepseek_v3", (*_NO_ROPE, _MODEL)),
    "deepseek_v4": ("deepseek_v4", (("rope", False), *_FLCE, ("rms_norm", True), ("swiglu", False), _MODEL)),
    "exaone4": ("exaone4", (*_LLAMA, _MODEL)),
    "falcon_h1": ("falcon_h1", (*_LLAMA, _MODEL)),
    "gemma": ("gemma", (*_GEGLU, _MODEL)),
    "gemma2": ("gemma2", (*_GEGLU, _MODEL)),
    "gemma3": (
        "gemma3",
        (("rope", True), *_FLCE, ("layer_norm", True), ("rms_norm", True), ("geglu", True), _MODEL),
    ),
    "gemma3_text": ("gemma3_text", (*_GEGLU, _MODEL)),
    "gemma4": (
        "gemma4",
        (("rope", False), *_FLCE, ("layer_norm", False), ("rms_norm", True), ("geglu", True), _MODEL),
    ),
    "gemma4_text": ("gemma4_text", (("rope", False), *_FLCE, ("rms_norm", True), ("geglu", True), _MODEL)),
    "glm4": ("glm4", (*_NO_ROPE, _MODEL)),
    "glm4v": ("glm4v", (*_NO_ROPE, _MODEL)),
    "glm4v_moe": ("glm4v_moe", (*_NO_ROPE, _MODEL)),
    "gpt_oss": ("gpt_oss", (("rope", True), *_FLCE, ("rms_norm", True), ("swiglu", False), _MODEL)),
    "granite": (
        "granite",
        (
            ("rope", True),
            ("cross_entropy", True),
            ("fused_linear_cross_entropy", False),
            ("rms_norm", True),
            ("swiglu", True),
            _MODEL,
        ),
    ),  # fmt: skip
    "hunyuan_v1_dense": ("hunyuan_v1_dense", (*_LLAMA, _MODEL)),
    "hunyuan_v1_moe": ("hunyuan_v1_moe", (*_LLAMA, _MODEL)),
    "internvl": ("internvl", (*_FLCE, ("rms_norm", True), ("layer_norm", True), _MODEL, _KWARGS)),
    "llama": ("llama", (*_LLAMA, _MODEL)),
    "llama4": ("llama4", (*_LLAMA, _MODEL, ("layer_norm", True))),
    "llava": ("llava", (*_FLCE, _MODEL, _KWARGS)),
    "ministral": ("ministral", (*_LLAMA, _MODEL)),
    "mistral": ("mistral", (*_LLAMA, _MODEL)),
    "mixtral": ("mixtral", (*_LLAMA, _MODEL)),
    "mllama": (
        "mllama",
        (("rope", True), *_FLCE, ("layer_norm", True), ("rms_norm", True), ("swiglu", True), _MODEL),
    ),
    "muse_glimmer": (
        "muse_glimmer",
        (("rope", True), *_FLCE, ("layer_norm", True), ("rms_norm", True), ("swiglu", True), _MODEL),
    ),
    "nemotron": ("nemotron", (("relu_squared", True), *_FLCE, _MODEL, _KWARGS)),
    "olmo2": ("olmo2", (*_LLAMA, _MODEL)),
    "olmo3": ("olmo3", (*_LLAMA, _MODEL)),
    "paligemma": (
        "paligemma",
        (("rope", True), *_FLCE, ("layer_norm", True), ("rms_norm", True), ("geglu", True), _MODEL),
    ),
    "phi3": ("phi3", (*_LLAMA, _MODEL)),
    "pixtral": ("pixtral", (("rope", True), ("rms_norm", True), ("swiglu", True), _MODEL)),
    "qwen2": ("qwen2", (*_LLAMA, _MODEL)),
    "qwen2_5_vl": ("qwen2_5_vl", (*_LLAMA, _MODEL)),
    "qwen2_vl": (
        "qwen2_vl",
        (("rope", True), *_FLCE, ("rms_norm", True), ("layer_norm", True), ("swiglu", True), _MODEL),
    ),
    "qwen3": ("qwen3", (*_LLAMA, _MODEL)),
    "qwen3_5": ("qwen3_5", (*_NO_ROPE, _MODEL)),
    "qwen3_5_moe": ("qwen3_5_moe", (*_NO_ROPE, _MODEL)),
    "qwen3_moe": ("qwen3_moe", (*_LLAMA, _MODEL)),
    "qwen3_next": ("qwen3_next", (*_NO_ROPE, _MODEL)),
    "qwen3_vl": ("qwen3_vl", (("rope", True), *_FLCE, ("rms_norm", True), ("swiglu", False), _MODEL)),
    "qwen3_vl_moe": ("qwen3_vl_moe", (*_LLAMA, _MODEL)),
    "smollm3": ("smollm3", (*_LLAMA, _MODEL)),
    "smolvlm": ("smolvlm", (*_FLCE, ("rms_norm", True), ("layer_norm", True), _MODEL, _KWARGS)),
}

# model_type -> function suffix, as Liger-Kernel's ``_apply_liger_kernel`` dispatches (text-only sub-configs
# of multimodal models use their parent's function).
MODEL_TYPE_TO_FUNCTION: dict[str, str] = {
    **{model_type: suffix for suffix, (model_type, _) in _SIGNATURES.items()},
    "llama4_text": "llama4",
    "mllama_text_model": "mllama",
    "qwen2_vl_text": "qwen2_vl",
    "qwen2_5_vl_text": "qwen2_5_vl",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen3_vl_text": "qwen3_vl",
    "qwen3_vl_moe_text": "qwen3_vl_moe",
}

# Flags Liger-Kernel's functions take that map onto a KernelFlags field of the same name.
_MAPPED = (
    "rope",
    "rms_norm",
    "swiglu",
    "geglu",
    "relu_squared",
    "layer_norm",
    "cross_entropy",
    "fused_linear_cross_entropy",
)
# Every flag any of the functions takes (``_apply_liger_kernel*`` drop those a model's function lacks).
KNOWN_FLAGS: frozenset[str] = frozenset(
    name for _, params in _SIGNATURES.values() for name, _ in params if name not in ("model", "**")
)


def core_flags(values: dict[str, Any]) -> dict[str, bool]:
    """liger_core ``KernelFlags`` keywords for Liger-Kernel flag values: the mapped flags by name (absent ones
    off), ``moe_experts`` following ``swiglu``."""
    flags = {name: bool(values.get(name, False)) for name in _MAPPED if name in KernelFlags.names()}
    flags["moe_experts"] = flags["swiglu"]
    return flags


def _signature(params: tuple[tuple[str, Any], ...]) -> inspect.Signature:
    out = []
    for name, default in params:
        if name == "**":
            out.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
        else:
            annotation = "PreTrainedModel | None" if name == "model" else "bool"
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
            out.append(inspect.Parameter(name, kind, default=default, annotation=annotation))
    return inspect.Signature(out, return_annotation="PatchReport")


def _patch(suffix: str, model_type: str, values: dict[str, Any]) -> Any:
    from liger_core.patching import apply_liger_kernel, apply_liger_kernel_to, recipe_model_types

    model = values.pop("model", None)
    flags = core_flags(values)
    if model is not None:
        return apply_liger_kernel(model, **flags)
    if model_type not in recipe_model_types():
        raise missing(
            f"class-level patching of {model_type!r} (apply_liger_kernel_to_{suffix} without model=)",
            f"liger_core patches a built {model_type} model: pass model=<the model>.",
        )
    return apply_liger_kernel_to(model_type, **flags)


def _make(suffix: str, model_type: str, params: tuple[tuple[str, Any], ...]):
    signature = _signature(params)
    var_kw = any(name == "**" for name, _ in params)

    def apply(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)  # TypeError naming an argument the function does not take
        bound.apply_defaults()
        values = dict(bound.arguments)
        extra = values.pop("kwargs", {}) if var_kw else {}
        unknown = sorted(set(extra) - (KNOWN_FLAGS - {"relu_squared"}))
        if unknown:
            raise TypeError(f"apply_liger_kernel_to_{suffix}() got unexpected keyword arguments: {unknown}")
        return _patch(suffix, model_type, {**extra, **values})

    apply.__signature__ = signature
    apply.__name__ = apply.__qualname__ = f"apply_liger_kernel_to_{suffix}"
    apply.__module__ = __name__
    apply.__doc__ = (
        f"Liger-Kernel's ``apply_liger_kernel_to_{suffix}``: patch {model_type!r} models with liger_core's "
        "kernels (``model=``: that built model; otherwise class-level, where liger_core has a recipe). "
        "See this module's docstring for the flag mapping."
    )
    return apply


APPLY_FUNCTIONS: dict[str, Any] = {}
for _suffix, (_model_type, _params) in _SIGNATURES.items():
    APPLY_FUNCTIONS[f"apply_liger_kernel_to_{_suffix}"] = globals()[f"apply_liger_kernel_to_{_suffix}"] = (
        _make(_suffix, _model_type, _params)
    )
del _suffix, _model_type, _params


def function_for(model_type: str) -> Any | None:
    """The ``apply_liger_kernel_to_<model>`` function Liger-Kernel uses for ``model_type`` (None if none)."""
    suffix = MODEL_TYPE_TO_FUNCTION.get(model_type)
    return None if suffix is None else APPLY_FUNCTIONS[f"apply_liger_kernel_to_{suffix}"]


def _applicable(function: Any, kwargs: dict[str, Any], caller: str) -> dict[str, Any]:
    """The keyword arguments ``function`` takes, as Liger-Kernel passes them; names that are no flag of any
    patch function raise ``TypeError``."""
    unknown = sorted(set(kwargs) - KNOWN_FLAGS)
    if unknown:
        raise TypeError(f"{caller}() got unexpected keyword arguments: {unknown}")
    params = inspect.signature(function).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def _apply_liger_kernel(model_type: str, **kwargs: Any) -> Any:
    """Class-level patching for ``model_type`` with the flags in ``kwargs`` that its function takes (flags it
    does not take are dropped, as Liger-Kernel does; names that are no flag at all raise ``TypeError``)."""
    function = function_for(model_type)
    if function is None:
        raise missing(f"a Liger-Kernel patch function for model_type={model_type!r}")
    return function(**_applicable(function, kwargs, "_apply_liger_kernel"))


def _apply_liger_kernel_to_instance(model: Any, **kwargs: Any) -> Any:
    """Patch the built ``model`` in place with the flags in ``kwargs`` that its type's function takes. A
    ``model_type`` Liger-Kernel has no function for is patched by liger_core's structural patching with the
    flags given (liger_core's defaults for the rest)."""
    from liger_core.patching import apply_liger_kernel

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    function = function_for(str(model_type))
    if function is not None:
        return function(model=model, **_applicable(function, kwargs, "_apply_liger_kernel_to_instance"))
    unknown = sorted(set(kwargs) - KNOWN_FLAGS)
    if unknown:
        raise TypeError(f"_apply_liger_kernel_to_instance() got unexpected keyword arguments: {unknown}")
    flags = {**KernelFlags.defaults(), **{k: v for k, v in kwargs.items() if k in _MAPPED}}
    if "swiglu" in kwargs:
        flags["moe_experts"] = bool(kwargs["swiglu"])
    return apply_liger_kernel(model, **flags)


__all__ = ["_apply_liger_kernel", "_apply_liger_kernel_to_instance", *APPLY_FUNCTIONS]

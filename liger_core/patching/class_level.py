"""Class-level patching: before a model is built, make its modeling module build liger_core layers.

For a ``model_type`` with a recipe, ``apply_liger_kernel_to(model_type, **flags)``:

- RMSNorm and MLP classes: replaced by generated subclasses (``Liger<Name>``) whose ``forward`` is the shared
  liger forward. Subclasses, not look-alikes: ``__init__``, parameter names, weight initialisation (HF picks
  it by class name, which still contains "RMSNorm") and ``isinstance`` checks are the original class's. They
  are registered with transformers' own hook, ``transformers.monkey_patching.register_patch_mapping``
  (transformers >= 5.3), which swaps them in while ``from_pretrained`` / ``from_config`` build a model; and,
  because that hook does not cover models built by calling the class directly (``LlamaForCausalLM(config)``,
  as Axolotl/TRL test code and the demo do), the modeling module's attribute is swapped too.
- RoPE: the modeling module's ``apply_rotary_pos_emb`` function is replaced (the attention forwards look it up
  at call time). The hook above only maps classes, so this is a plain module-attribute swap.
- Fused linear cross-entropy: ``<Model>ForCausalLM.forward`` is replaced on the class (a model built *before*
  the call is affected too: the forward is looked up on the class at call time).
- Cross-entropy: ``<Model>ForCausalLM._loss_function`` is set on the class (read by HF's ``loss_function``
  property), so only that model class's loss changes, never the process-global ``F.cross_entropy``.

``revert_model_type(model_type)`` restores every attribute and unregisters the mappings.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from liger_core.patching import causal_lm as cl
from liger_core.patching import forwards as fw
from liger_core.patching import rope_variants as rv
from liger_core.patching.flags import KernelFlags
from liger_core.patching.introspect import innermost_function
from liger_core.patching.recipes import RECIPES, MLPSpec, NormSpec, Recipe, recipe_model_types
from liger_core.patching.report import PatchIncompleteError, PatchReport, UnsupportedModelError, logger

_MISSING = object()

# (module name, attribute) -> the original value, for every module attribute swapped
_module_originals: dict[tuple[str, str], Any] = {}
# (class, attribute) -> the value in the class's own __dict__ before (or _MISSING)
_class_originals: dict[tuple[type, str], Any] = {}
# model_type -> keys registered with transformers.monkey_patching.register_patch_mapping
_registered_keys: dict[str, list[str]] = {}
# model_type -> [(module name, attr)] and [(class, attr)] it swapped
_swapped_by_type: dict[str, list[tuple[str, Any]]] = {}


def unsupported_error(model_type: object) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"liger_core has no patching recipe for model_type={model_type!r}. "
        f"Model types with a recipe: {', '.join(recipe_model_types())}. "
        "For other architectures use liger_core.apply_liger_kernel(model) on the built model, which patches "
        "whatever it recognises structurally (and checks each swap numerically)."
    )


def recipe_for(model_type: str) -> Recipe:
    recipe = RECIPES.get(model_type)
    if recipe is None:
        raise unsupported_error(model_type)
    return recipe


def modeling_module(recipe: Recipe) -> ModuleType:
    try:
        return importlib.import_module(recipe.module)
    except ImportError as e:
        raise ImportError(
            f"liger_core: patching {recipe.model_type!r} needs `transformers` with {recipe.module} ({e})"
        ) from e


def original_attr(module: ModuleType, name: str) -> Any:
    """The modeling module's attribute as transformers defined it (also while class-level patching is on)."""
    return _module_originals.get((module.__name__, name), getattr(module, name, None))


# ----------------------------------------------------------------------------------------------------------
# Generated subclasses
# ----------------------------------------------------------------------------------------------------------

_subclass_cache: dict[tuple, type] = {}


def norm_subclass(original: type, spec: NormSpec) -> type:
    key = ("norm", original, spec)
    if key not in _subclass_cache:

        def __init__(self, *args, **kwargs):
            original.__init__(self, *args, **kwargs)
            self._liger_core_kind = "rms_norm"

        _subclass_cache[key] = type(
            f"Liger{original.__name__}",
            (original,),
            {
                "__init__": __init__,
                "forward": fw.rms_norm_forward,
                "_liger_core_norm_spec": spec,
                "__module__": __name__,
                "__doc__": f"{original.__name__} with liger_core.ops.rms_norm ({spec}).",
            },
        )
    return _subclass_cache[key]


def mlp_subclass(original: type, spec: MLPSpec, allowed: frozenset[str], tiled: bool = False) -> type:
    """Each built MLP recognises its activation (from its config); liger runs only for allowed kinds, over
    sequence tiles with ``tiled`` (around the kernel, or around the original forward if its kind is off)."""
    key = ("mlp", original, spec, allowed, tiled)
    if key not in _subclass_cache:

        def __init__(self, *args, **kwargs):
            original.__init__(self, *args, **kwargs)
            resolved = fw.resolve_mlp(self, spec)
            if not isinstance(resolved, fw.ResolvedMLP):
                return
            kernel = resolved.kind in allowed
            if kernel or tiled:
                self._liger_core_mlp_spec = resolved
                self._liger_core_kind = resolved.kind if kernel else "tiled_mlp"
            if tiled:
                self._liger_core_tiled_inner = fw.gated_mlp_forward if kernel else original.forward

        def forward(self, x):
            if getattr(self, "_liger_core_tiled_inner", None) is not None:
                return fw.tiled_mlp_forward(self, x)
            if getattr(self, "_liger_core_mlp_spec", None) is None:
                return original.forward(self, x)
            return fw.gated_mlp_forward(self, x)

        what = f"SwiGLU/GeGLU ({sorted(allowed)})" + (", over sequence tiles" if tiled else "")
        _subclass_cache[key] = type(
            f"Liger{original.__name__}",
            (original,),
            {
                "__init__": __init__,
                "forward": forward,
                "__module__": __name__,
                "__doc__": f"{original.__name__} with liger_core {what}.",
            },
        )
    return _subclass_cache[key]


def lm_spec(recipe: Recipe, module: ModuleType) -> cl.LMSpec:
    return cl.LMSpec(
        softcap_attr=recipe.softcap_attr,
        logits_scaling_attr=recipe.logits_scaling_attr,
        logits_multiplier_attr=recipe.logits_multiplier_attr,
        moe=recipe.moe,
        aux_loss_fn=getattr(module, "load_balancing_loss_func", None) if recipe.moe else None,
    )


# ----------------------------------------------------------------------------------------------------------
# Swapping with memory of the originals
# ----------------------------------------------------------------------------------------------------------


def _swap_module_attr(model_type: str, module: ModuleType, name: str, value: Any) -> None:
    key = (module.__name__, name)
    if key not in _module_originals:
        _module_originals[key] = getattr(module, name)
        _swapped_by_type.setdefault(model_type, []).append(("module", key))
    setattr(module, name, value)


def _swap_class_attr(model_type: str, cls: type, name: str, value: Any) -> None:
    key = (cls, name)
    if key not in _class_originals:
        _class_originals[key] = cls.__dict__.get(name, _MISSING)
        _swapped_by_type.setdefault(model_type, []).append(("class", key))
    setattr(cls, name, value)


def _register_with_transformers(model_type: str, mapping: dict[str, type]) -> None:
    """transformers' own class-replacement hook (>= 5.3); silently absent on older versions.

    Keys are anchored regexes: the hook matches keys with ``re.search`` against every class name in every
    loaded transformers module, and an unanchored "GemmaRMSNorm" would also replace "RecurrentGemmaRMSNorm".
    """
    try:
        import transformers
        from transformers.monkey_patching import register_patch_mapping
    except ImportError:
        return
    # Before 5.23 applying the mappings walks every transformers module and imports every image processor, so
    # without torchvision (the Axolotl / LLaMA-Factory CPU installs) each from_pretrained fails with
    # ModuleNotFoundError. The module-attribute swap above already covers from_pretrained, so skip the hook.
    version = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    if version < (5, 23):
        return
    keys = _registered_keys.setdefault(model_type, [])
    for class_name, replacement in mapping.items():
        key = f"^{class_name}$"
        try:
            register_patch_mapping({key: replacement}, overwrite=key in keys)
        except ValueError:  # someone else registered a replacement for this class: leave theirs in place
            logger.warning(
                "liger_core: transformers already has a patch mapping for %s; not overriding it", class_name
            )
            continue
        if key not in keys:
            keys.append(key)


def apply_liger_kernel_to(
    model_type: str,
    *,
    rope: bool = True,
    rms_norm: bool = True,
    swiglu: bool = True,
    geglu: bool = True,
    relu_squared: bool = True,
    moe_experts: bool = True,
    layer_norm: bool = True,
    cross_entropy: bool = False,
    fused_linear_cross_entropy: bool = True,
    tiled_mlp: bool = False,
    offload_checkpoints: bool = False,
    strict: bool = False,
) -> PatchReport:
    """Class-level patching of ``model_type`` (module docstring); the report counts classes/functions.

    A kernel that is asked for and that the recipe names but could not be applied is in ``report.missing``
    with its reason; ``strict=True`` then raises ``PatchIncompleteError`` after undoing this call's swaps.
    """
    KernelFlags.pick(locals())  # raises ValueError for cross_entropy with the fused loss
    recipe = recipe_for(model_type)
    module = modeling_module(recipe)
    report = PatchReport(model_type=model_type, method="class")
    if moe_experts and recipe.moe:
        # Experts need a probe of the built module (layout, activation): instance patching of the built
        # model does it, so it is not a miss of this call (strict class-level patching must not fail on it).
        report.skip("moe_experts: experts modules are patched on the built model (apply_liger_kernel(model))")
    if offload_checkpoints:
        report.skip("offload_checkpoints: applied to the built model (apply_liger_kernel(model))")
    before = len(_swapped_by_type.get(model_type, []))
    mapping: dict[str, type] = {}

    if rms_norm:
        for spec in recipe.norms:
            original = original_attr(module, spec.class_name)
            if original is None:
                report.miss("rms_norm", f"{recipe.module} has no {spec.class_name}")
                continue
            replacement = norm_subclass(original, spec)
            if getattr(module, spec.class_name) is replacement:
                report.count_already("rms_norm")
                continue
            _swap_module_attr(model_type, module, spec.class_name, replacement)
            mapping[spec.class_name] = replacement
            report.count("rms_norm")

    allowed = frozenset(k for k, on in (("swiglu", swiglu), ("geglu", geglu)) if on)
    if allowed or tiled_mlp:
        for spec in recipe.mlps:
            kinds = [spec.activation] if spec.activation in allowed else []
            kinds += ["tiled_mlp"] if tiled_mlp else []
            original = original_attr(module, spec.class_name)
            if original is None:
                for kind in kinds:
                    report.miss(kind, f"{recipe.module} has no {spec.class_name}")
                continue
            replacement = mlp_subclass(original, spec, allowed, tiled_mlp)
            if getattr(module, spec.class_name) is replacement:
                for kind in kinds:
                    report.count_already(kind)
                continue
            _swap_module_attr(model_type, module, spec.class_name, replacement)
            mapping[spec.class_name] = replacement
            for kind in kinds:
                report.count(kind)

    if rope and recipe.rope:
        if original_attr(module, recipe.rope) is None:
            report.miss("rope", f"{recipe.module} has no {recipe.rope}")
        elif not rope_callers(module, recipe.rope):
            report.miss("rope", f"no class of {recipe.module} calls {recipe.rope} in its forward")
        else:
            replacement = rv.rope_function(recipe.rope_casts_back)
            if getattr(module, recipe.rope) is replacement:
                report.count_already("rope")
            else:
                _swap_module_attr(model_type, module, recipe.rope, replacement)
                report.count("rope")

    causal_lm = original_attr(module, recipe.causal_lm)
    if (fused_linear_cross_entropy or cross_entropy) and causal_lm is None:
        report.miss(
            "fused_linear_cross_entropy" if fused_linear_cross_entropy else "cross_entropy",
            f"{recipe.module} has no {recipe.causal_lm}",
        )
    elif fused_linear_cross_entropy:
        if cl.is_causal_lm_forward(causal_lm.__dict__.get("forward")):
            report.count_already("fused_linear_cross_entropy")
        elif causal_lm.__dict__.get("_loss_function") is not None:
            report.miss(
                "fused_linear_cross_entropy",
                f"{recipe.causal_lm} already uses liger cross_entropy; revert_model_type() to switch",
            )
        else:
            _swap_class_attr(model_type, causal_lm, "_liger_core_lm_spec", lm_spec(recipe, module))
            _swap_class_attr(model_type, causal_lm, cl.ORIGINAL_FORWARD, causal_lm.forward)
            _swap_class_attr(model_type, causal_lm, "forward", cl.causal_lm_forward_for(causal_lm.forward))
            report.count("fused_linear_cross_entropy")
    elif cross_entropy:
        current = causal_lm.__dict__.get("_loss_function")
        if isinstance(current, staticmethod) and current.__func__ is cl.liger_causal_lm_loss:
            report.count_already("cross_entropy")
        elif cl.is_causal_lm_forward(causal_lm.__dict__.get("forward")):
            report.miss(
                "cross_entropy",
                f"{recipe.causal_lm} already uses fused_linear_cross_entropy; revert_model_type() to switch",
            )
        else:
            _swap_class_attr(model_type, causal_lm, "_loss_function", staticmethod(cl.liger_causal_lm_loss))
            report.count("cross_entropy")

    for note in recipe.notes:
        report.skip(note)
    if strict and report.missing:
        _undo_this_call(model_type, before)
        raise PatchIncompleteError(report)
    if mapping:
        _register_with_transformers(model_type, mapping)
    (logger.warning if report.missing else logger.info)("%s", report)
    return report


def rope_callers(module: ModuleType, name: str) -> list[str]:
    """The classes of ``module`` whose forward (under its decorators) looks up its global ``name``."""
    found = []
    for attr, value in vars(module).items():
        if isinstance(value, type) and value.__module__ == module.__name__:
            inner = innermost_function(value.__dict__.get("forward"))
            if inner is not None and name in inner.__code__.co_names and inner.__globals__ is vars(module):
                found.append(attr)
    return found


def _undo_this_call(model_type: str, before: int) -> None:
    """Undo the swaps of ``model_type`` recorded after the first ``before`` (a strict call that failed)."""
    swapped = _swapped_by_type.get(model_type, [])
    while len(swapped) > before:
        _restore(*swapped.pop())


def _restore(where: str, key: tuple) -> None:
    if where == "module":
        module_name, name = key
        setattr(importlib.import_module(module_name), name, _module_originals.pop(key))
    else:
        cls, name = key
        previous = _class_originals.pop(key)
        if previous is _MISSING:
            delattr(cls, name)
        else:
            setattr(cls, name, previous)


def revert_model_type(model_type: str) -> None:
    """Undo ``apply_liger_kernel_to(model_type)``: module and class attributes, hook mappings.

    Models built while the patch was active keep their liger norm/MLP subclasses (their forwards are still
    exact); use ``liger_core.revert(model)`` on instances patched with ``apply_liger_kernel``.
    """
    recipe_for(model_type)
    for where, key in reversed(_swapped_by_type.pop(model_type, [])):
        _restore(where, key)
    keys = _registered_keys.pop(model_type, [])
    if keys:
        from transformers.monkey_patching import get_patch_mapping, unregister_patch_mapping

        present = get_patch_mapping()
        unregister_patch_mapping([k for k in keys if k in present])

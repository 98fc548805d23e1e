"""Instance patching: swap the forwards of one built model (what trainer plugins call).

For each module whose class the model's recipe names, a liger forward is bound into the module's own
``__dict__`` (``types.MethodType``), shadowing the class's forward for that module only; the value that was in
``__dict__`` before (usually nothing) is recorded on the model, so ``revert(model)`` restores it exactly.
Modules are marked with ``_liger_core_kind``; marked modules are skipped, which makes a second call a no-op.
Parameters are never touched, so ``state_dict()`` keys and values are those of the unpatched model.

- RMSNorm / MLP: bound liger forwards. The MLP forward still calls its gate/up/down submodules, so LoRA layers
  and other wrappers on them keep working; PEFT's ``ModulesToSaveWrapper`` holds the original and the
  trainable copies as ordinary submodules, and both are patched.
- RoPE: each attention module whose class forward calls the modeling module's ``apply_rotary_pos_emb`` gets a
  copy of that forward that sees liger's rope under that name (``forwards.forward_with_global``); the modeling
  module itself is not touched, so other models of the same type in the process keep HF's function.
- Loss: the causal-LM gets ``forwards.causal_lm_forward`` (fused linear + cross-entropy), or, with
  ``cross_entropy=True``, its ``loss_function`` (an instance attribute HF provides for this) is set to liger's
  cross-entropy. The process-global ``torch.nn.functional.cross_entropy`` is never replaced.

Models that an accelerate ``device_map`` dispatched carry hooks whose wrapper forward lives in ``__dict__``
and calls ``module._old_forward``; there the liger forward replaces ``_old_forward``, keeping the hook.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

from torch import nn

from liger_core.patching import forwards as fw
from liger_core.patching.class_level import lm_spec, modeling_module, original_attr, unsupported_error
from liger_core.patching.distributed import redirected_linear
from liger_core.patching.recipes import RECIPES, Recipe
from liger_core.patching.report import PatchReport, logger, summarize_reasons

_MISSING = object()
_STATE = "_liger_core_swaps"


@dataclass
class Swap:
    module: nn.Module
    attr: str  # the __dict__ entry replaced ("forward", "_old_forward" or "_loss_function")
    previous: Any  # what __dict__ held before, or _MISSING
    markers: tuple[str, ...]  # other __dict__ entries this swap added (removed on revert)


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


def bind(module: nn.Module, fn: types.FunctionType, kind: str, swaps: list[Swap], **markers: Any) -> None:
    """Bind ``fn`` as ``module``'s forward (in its ``__dict__``), set ``markers``, record the undo."""
    slot = _forward_slot(module)
    previous = module.__dict__.get(slot, _MISSING)
    for name, value in markers.items():
        module.__dict__[name] = value
    module.__dict__["_liger_core_kind"] = kind
    module.__dict__[slot] = types.MethodType(fn, module)
    swaps.append(Swap(module, slot, previous, (*markers, "_liger_core_kind")))


def foreign_forward(module: nn.Module) -> bool:
    """True if something other than accelerate already put a forward into this module's ``__dict__``."""
    return "forward" in module.__dict__ and _forward_slot(module) == "forward"


def own_kind(module: nn.Module) -> str | None:
    """The module's own patch marker (not one PEFT's wrappers forward from the module they wrap)."""
    return module.__dict__.get("_liger_core_kind")


def _swaps(root: nn.Module) -> list[Swap]:
    if _STATE not in root.__dict__:
        root.__dict__[_STATE] = []
    return root.__dict__[_STATE]


# ----------------------------------------------------------------------------------------------------------
# Loss patching (shared with structural patching)
# ----------------------------------------------------------------------------------------------------------


def class_forward_is(module: nn.Module, fn: Any) -> bool:
    return type(module).__dict__.get("forward") is fn or getattr(type(module), "forward", None) is fn


def patch_loss(root: nn.Module, spec: fw.LMSpec, flags: dict[str, bool], report: PatchReport) -> None:
    swaps = _swaps(root)
    kind = own_kind(root)
    class_flce = class_forward_is(root, fw.causal_lm_forward)
    class_ce = getattr(type(root), "_loss_function", None) is fw.liger_causal_lm_loss
    if flags["fused_linear_cross_entropy"]:
        if kind == "fused_linear_cross_entropy" or class_flce:
            report.count_already("fused_linear_cross_entropy")
        elif kind == "cross_entropy" or class_ce:
            report.skip("loss already uses liger cross_entropy; revert() first to switch to the fused loss")
        elif foreign_forward(root):
            report.skip(f"{type(root).__name__} already has an instance-level forward from another library")
        elif fw.fusable_linear(root.lm_head) is None and redirected_linear(root.lm_head) is None:
            report.skip(
                f"fused_linear_cross_entropy: lm_head ({type(root.lm_head).__name__}) is not plain nn.Linear "
                "(LoRA/quantised/offloaded); loss left to the model"
            )
        else:
            bind(root, fw.causal_lm_forward, "fused_linear_cross_entropy", swaps, _liger_core_lm_spec=spec)
            report.count("fused_linear_cross_entropy")
    elif flags["cross_entropy"]:
        if kind == "cross_entropy" or class_ce:
            report.count_already("cross_entropy")
        elif kind == "fused_linear_cross_entropy" or class_flce:
            report.skip(
                "loss already uses fused_linear_cross_entropy; revert() first to switch to cross_entropy"
            )
        else:
            # PreTrainedModel.loss_function is a property whose setter stores `_loss_function` on the instance
            previous = root.__dict__.get("_loss_function", _MISSING)
            root.__dict__["_loss_function"] = fw.liger_causal_lm_loss
            root.__dict__["_liger_core_kind"] = "cross_entropy"
            swaps.append(Swap(root, "_loss_function", previous, ("_liger_core_kind",)))
            report.count("cross_entropy")


# ----------------------------------------------------------------------------------------------------------
# Recipe-driven patching
# ----------------------------------------------------------------------------------------------------------


def _patch_with_recipe(root: nn.Module, recipe: Recipe, flags: dict[str, bool], report: PatchReport) -> None:
    module = modeling_module(recipe)
    swaps = _swaps(root)
    reasons: list[str] = []

    norms = []
    for spec in recipe.norms:
        cls = original_attr(module, spec.class_name)
        if isinstance(cls, type):
            norms.append((cls, spec))
        else:
            report.skip(f"{recipe.module} has no {spec.class_name}")
    mlps = []
    for spec in recipe.mlps:
        cls = original_attr(module, spec.class_name)
        if isinstance(cls, type):
            mlps.append((cls, spec))
        else:
            report.skip(f"{recipe.module} has no {spec.class_name}")

    rope_name = recipe.rope if flags["rope"] else None
    rope_fn = fw.rope_function(recipe.rope_casts_back)
    if rope_name is not None and original_attr(module, rope_name) is None:
        report.skip(f"{recipe.module} has no {rope_name}")
        rope_name = None
    rope_class_level = rope_name is not None and getattr(module, rope_name) is rope_fn

    for m in root.modules():
        if m is root:
            continue
        kind = own_kind(m)
        if kind is not None:
            report.count_already(kind)
            continue
        norm_spec = next((s for c, s in norms if isinstance(m, c)), None)
        mlp_spec = next((s for c, s in mlps if isinstance(m, c)), None)
        if norm_spec is not None:
            if not flags["rms_norm"]:
                continue
            if foreign_forward(m):
                reasons.append(f"{type(m).__name__}: has an instance-level forward from another library")
                continue
            bind(m, fw.rms_norm_forward, "rms_norm", swaps, _liger_core_norm_spec=norm_spec)
            report.count("rms_norm")
        elif mlp_spec is not None:
            resolved = fw.resolve_mlp(m, mlp_spec)
            if isinstance(resolved, str):
                reasons.append(f"{type(m).__name__}: {resolved}")
                continue
            if not flags[resolved.kind]:
                continue
            if foreign_forward(m):
                reasons.append(f"{type(m).__name__}: has an instance-level forward from another library")
                continue
            bind(m, fw.gated_mlp_forward, resolved.kind, swaps, _liger_core_mlp_spec=resolved)
            report.count(resolved.kind)
        elif rope_name is not None:
            forward = type(m).forward
            if not (fw.calls_global(forward, rope_name) and forward.__globals__ is module.__dict__):
                continue
            if rope_class_level:
                report.count_already("rope")
                continue
            if foreign_forward(m):
                reasons.append(f"{type(m).__name__}: has an instance-level forward from another library")
                continue
            bind(m, fw.forward_with_global(forward, rope_name, rope_fn), "rope", swaps)
            report.count("rope")

    causal_lm = original_attr(module, recipe.causal_lm)
    if flags["fused_linear_cross_entropy"] or flags["cross_entropy"]:
        if isinstance(causal_lm, type) and isinstance(root, causal_lm):
            patch_loss(root, lm_spec(recipe, module), flags, report)
        else:
            report.skip(f"loss: the model is a {type(root).__name__}, not a {recipe.causal_lm}")
    for reason in summarize_reasons(reasons):
        report.skip(reason)
    for note in recipe.notes:
        report.skip(note)


def apply_liger_kernel(
    model: nn.Module,
    *,
    rope: bool = True,
    rms_norm: bool = True,
    swiglu: bool = True,
    geglu: bool = True,
    layer_norm: bool = True,
    cross_entropy: bool = False,
    fused_linear_cross_entropy: bool = True,
) -> PatchReport:
    """Patch a built Hugging Face model (or a PEFT/DDP/compiled wrapper of one) in place (module docstring).

    Known ``model_type`` (``supported_model_types()``): exact per-recipe patching. Unknown: structural
    patching (``liger_core.patching.structural``), where each swap is first checked numerically on a probe.
    Raises ``UnsupportedModelError`` only if the type is unknown and nothing could be patched.
    """
    if cross_entropy and fused_linear_cross_entropy:
        raise ValueError("cross_entropy=True and fused_linear_cross_entropy=True are exclusive: choose one")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    flags = dict(
        rope=rope,
        rms_norm=rms_norm,
        swiglu=swiglu,
        geglu=geglu,
        layer_norm=layer_norm,
        cross_entropy=cross_entropy,
        fused_linear_cross_entropy=fused_linear_cross_entropy,
    )
    root = unwrap(model)
    config = getattr(root, "config", None)
    model_type = str(getattr(config, "model_type", None) or type(root).__name__)
    recipe = RECIPES.get(model_type)
    if recipe is not None:
        report = PatchReport(model_type=model_type, method="recipe")
        _patch_with_recipe(root, recipe, flags, report)
    else:
        from liger_core.patching.structural import patch_structurally

        report = PatchReport(model_type=model_type, method="structural")
        patch_structurally(root, flags, report)
        if not report and not any(report.already.values()) and any(flags.values()):
            error = unsupported_error(model_type)
            if report.skipped:
                error.args = (
                    f"{error.args[0]} Structural patching found nothing: {'; '.join(report.skipped)}",
                )
            raise error
    logger.info("%s", report)
    return report


def revert(model: nn.Module) -> None:
    """Restore every forward (and loss function) that ``apply_liger_kernel`` swapped on this model."""
    root = unwrap(model)
    swaps = root.__dict__.pop(_STATE, [])
    for swap in reversed(swaps):
        d = swap.module.__dict__
        if swap.previous is _MISSING:
            d.pop(swap.attr, None)
        else:
            d[swap.attr] = swap.previous
        for name in swap.markers:
            d.pop(name, None)


def is_patched(model: nn.Module) -> bool:
    """True if any module of the model runs a liger_core forward (instance- or class-level patching)."""
    root = unwrap(model)
    if class_forward_is(root, fw.causal_lm_forward) or getattr(type(root), "_loss_function", None) is (
        fw.liger_causal_lm_loss
    ):
        return True
    return any(own_kind(m) is not None for m in root.modules())

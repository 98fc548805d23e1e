"""Instance patching: swap the forwards of one built model (what trainer plugins call).

For each module whose class the model's recipe names, a liger forward is bound into the module's own
``__dict__`` (``swaps.bind``), shadowing the class's forward for that module only; ``revert(model)`` restores
every entry exactly. Parameters are never touched, so ``state_dict()`` keys and values are those of the
unpatched model. Types without a recipe go through ``structural.patch_structurally``.

- RMSNorm / MLP: bound liger forwards. The MLP forward still calls its gate/up/down submodules, so LoRA layers
  and other wrappers on them keep working; PEFT's ``ModulesToSaveWrapper`` holds the original and the
  trainable copies as ordinary submodules, and both are patched.
- RoPE: each attention module whose class forward (the function at the bottom of its decorator chain) calls
  the modeling module's ``apply_rotary_pos_emb`` gets a copy of that forward that sees liger's rope under that
  name, with the decorators rebuilt around it (``forwards.forward_with_global``); the modeling module itself
  is not touched, so other models of the same type in the process keep HF's function.
- Loss: ``loss.patch_loss``.

Every kernel the recipe promises (its flag on) is either applied or named in ``report.missing`` with the
reason; ``strict=True`` turns a non-empty ``missing`` into ``PatchIncompleteError``, after undoing the call.
"""

from __future__ import annotations

from torch import nn

from liger_core.patching import causal_lm as cl
from liger_core.patching import forwards as fw
from liger_core.patching import rope_variants as rv
from liger_core.patching.class_level import lm_spec, modeling_module, original_attr, unsupported_error
from liger_core.patching.experts import patch_experts
from liger_core.patching.flags import KernelFlags
from liger_core.patching.introspect import RewrapError, innermost_function
from liger_core.patching.loss import patch_loss
from liger_core.patching.offload import patch_checkpoint_offload
from liger_core.patching.recipes import RECIPES, Recipe
from liger_core.patching.report import (
    PatchIncompleteError,
    PatchReport,
    RevertReport,
    logger,
    summarize_reasons,
)
from liger_core.patching.structural import bind_mlp, patch_structurally
from liger_core.patching.swaps import (
    bind,
    class_forward_is,
    foreign_forward,
    own_kind,
    swaps_of,
    undo,
    unwrap,
)

__all__ = ["apply_liger_kernel", "is_patched", "patched_kinds", "patched_modules", "revert", "unwrap"]

_FOREIGN = "has an instance-level forward from another library"


def _patch_with_recipe(root: nn.Module, recipe: Recipe, flags: dict[str, bool], report: PatchReport) -> None:
    module = modeling_module(recipe)
    misses: list[tuple[str, str]] = []

    norms = []
    for spec in recipe.norms:
        cls = original_attr(module, spec.class_name)
        if isinstance(cls, type):
            norms.append((cls, spec))
        elif flags["rms_norm"]:
            report.miss("rms_norm", f"{recipe.module} has no {spec.class_name}")
    mlps = []
    for spec in recipe.mlps:
        cls = original_attr(module, spec.class_name)
        if isinstance(cls, type):
            mlps.append((cls, spec))
        elif flags.get(spec.activation):
            report.miss(spec.activation, f"{recipe.module} has no {spec.class_name}")

    rope_name = recipe.rope if flags["rope"] else None
    rope_fn = rv.rope_function(recipe.rope_casts_back)
    if rope_name is not None and original_attr(module, rope_name) is None:
        report.miss("rope", f"{recipe.module} has no {rope_name}")
        rope_name = None
    rope_class_level = rope_name is not None and getattr(module, rope_name) is rope_fn
    rope_callers = 0

    for name, m in root.named_modules():
        if m is root:
            continue
        kind = own_kind(m)
        if kind is not None:
            report.count_already(kind)
            rope_callers += kind == "rope"
            continue
        norm_spec = next((s for c, s in norms if isinstance(m, c)), None)
        mlp_spec = next((s for c, s in mlps if isinstance(m, c)), None)
        if norm_spec is not None:
            if not flags["rms_norm"]:
                continue
            if foreign_forward(m):
                misses.append(("rms_norm", f"{type(m).__name__} {_FOREIGN}"))
                continue
            bind(root, m, fw.rms_norm_forward, "rms_norm", _liger_core_norm_spec=norm_spec)
            report.count("rms_norm")
            report.modules[name] = "rms_norm"
        elif mlp_spec is not None:
            resolved = fw.resolve_mlp(m, mlp_spec)
            if isinstance(resolved, str):
                for kind in (mlp_spec.activation, "tiled_mlp"):
                    if flags.get(kind):
                        misses.append((kind, f"{type(m).__name__}: {resolved}"))
                continue
            kinds = [k for k in (resolved.kind, "tiled_mlp") if flags[k]]
            if not kinds:
                continue
            if foreign_forward(m):
                misses += [(k, f"{type(m).__name__} {_FOREIGN}") for k in kinds]
                continue
            bind_mlp(root, m, resolved, flags, report, name)
        elif rope_name is not None:
            forward = type(m).forward
            inner = innermost_function(forward)
            if inner is None or rope_name not in inner.__code__.co_names:
                continue
            if inner.__globals__ is not module.__dict__:
                continue  # calls a function of that name from another modeling module
            rope_callers += 1
            if rope_class_level:
                report.count_already("rope")
                continue
            if foreign_forward(m):
                misses.append(("rope", f"{type(m).__name__} {_FOREIGN}"))
                continue
            try:
                patched = fw.forward_with_global(forward, rope_name, rope_fn)
            except RewrapError as e:
                misses.append(("rope", f"{type(m).__name__}.forward: {e}"))
                continue
            bind(root, m, patched, "rope")
            report.count("rope")
            report.modules[name] = "rope"
    if rope_name is not None and rope_callers == 0:
        report.miss("rope", f"no module of the model calls {recipe.module}.{rope_name} in its forward")

    causal_lm = original_attr(module, recipe.causal_lm)
    if flags["fused_linear_cross_entropy"] or flags["cross_entropy"]:
        if isinstance(causal_lm, type) and isinstance(root, causal_lm):
            patch_loss(root, lm_spec(recipe, module), flags, report)
        else:
            report.skip(f"loss: the model is a {type(root).__name__}, not a {recipe.causal_lm}")
    for kind in dict.fromkeys(k for k, _ in misses):
        for reason in summarize_reasons([r for k, r in misses if k == kind]):
            report.miss(kind, reason)
    for note in recipe.notes:
        report.skip(note)


def apply_liger_kernel(
    model: nn.Module,
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
    """Patch a built Hugging Face model (or a PEFT/DDP/compiled wrapper of one) in place (module docstring).

    Known ``model_type`` (``recipe_model_types()``): exact per-recipe patching. Unknown: structural
    patching (``liger_core.patching.structural``), where each swap is first checked numerically on a probe.
    Every kernel that is asked for and that the model could use but did not get is in ``report.missing``
    with its reason (and in the logged line).

    Raises ``UnsupportedModelError`` if the type is unknown and nothing could be patched, and, with
    ``strict=True``, ``PatchIncompleteError`` if ``report.missing`` is not empty (the call is undone first).

    With ``fused_linear_cross_entropy`` (the default) a training forward given ``labels`` (or
    ``shift_labels``) returns ``loss`` and ``logits=None``: the fused loss never materialises the logits.
    Eval-mode forwards, forwards without labels and ``model(..., skip_logits=False)`` return the logits as
    transformers does. Only this model changes (its modules' ``__dict__``); ``revert(model)`` undoes it.
    """
    flags = KernelFlags.pick(locals()).as_dict()  # raises ValueError for cross_entropy with the fused loss
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    root = unwrap(model)
    config = getattr(root, "config", None)
    model_type = str(getattr(config, "model_type", None) or type(root).__name__)
    recipe = RECIPES.get(model_type)
    before = len(swaps_of(root))
    if recipe is not None:
        report = PatchReport(model_type=model_type, method="recipe")
        _patch_with_recipe(root, recipe, flags, report)
        patch_experts(root, flags, report)
    else:
        report = PatchReport(model_type=model_type, method="structural")
        patch_structurally(root, flags, report)
    if flags["offload_checkpoints"]:
        patch_checkpoint_offload(root, report)
    if recipe is None:
        if not report and not any(report.already.values()) and any(flags.values()):
            error = unsupported_error(model_type)
            reasons = report.skipped + [f"{k}: {', '.join(r)}" for k, r in report.missing.items()]
            if reasons:
                error.args = (f"{error.args[0]} Structural patching found nothing: {'; '.join(reasons)}",)
            raise error
    if strict and report.missing:
        undo(root, before)
        raise PatchIncompleteError(report)
    if report.missing:
        logger.warning("%s", report)
    else:
        logger.info("%s", report)
    return report


def revert(model: nn.Module) -> RevertReport:
    """Restore every forward (and loss function) that ``apply_liger_kernel`` swapped on this model.

    Returns a ``RevertReport``: ``restored`` (kind -> modules restored), ``modules`` (name -> kind) and
    ``still_patched``, the liger_core forwards left because the model was built from classes that
    class-level patching replaced (``apply_liger_kernel_to_<type>``, ``AutoLigerKernelForCausalLM``), which
    only ``revert_model_type`` and rebuilding remove. Reverting an unpatched model restores nothing (an
    empty, falsy report). Parameters are never touched, so ``state_dict()`` is the same before and after.
    """
    root = unwrap(model)
    config = getattr(root, "config", None)
    model_type = str(getattr(config, "model_type", None) or type(root).__name__)
    # a module's kind marker goes with the first of its swaps undone: read every module's kind before
    kinds = {id(m): own_kind(m) for m in root.modules()}
    undone = undo(root)
    names = {id(m): name for name, m in root.named_modules(remove_duplicate=False)}
    report = RevertReport(model_type=model_type)
    for module, kind in reversed(undone):  # oldest first, one entry per module
        kind = kinds.get(id(module)) or kind or "unknown"
        name = names.get(id(module), type(module).__name__)
        if name not in report.modules:
            report.modules[name] = kind
            report.restored[kind] = report.restored.get(kind, 0) + 1
    report.still_patched = patched_kinds(root)
    logger.info("%s", report)
    return report


def is_patched(model: nn.Module) -> bool:
    """True if any module of the model runs a liger_core forward (instance- or class-level patching)."""
    root = unwrap(model)
    if class_forward_is(root, cl.causal_lm_forward) or getattr(type(root), "_loss_function", None) is (
        cl.liger_causal_lm_loss
    ):
        return True
    return any(own_kind(m) is not None for m in root.modules())


def patched_modules(model: nn.Module) -> dict[str, str]:
    """Qualified module name (relative to the Hugging Face model inside any PEFT/DDP/compile wrapper, "" for
    that model itself) -> the liger_core kind it runs now, for every patched module: instance patching and
    class-level patching's generated classes alike, e.g.
    ``{"model.norm": "rms_norm", "": "fused_linear_cross_entropy"}``.
    """
    root = unwrap(model)
    found: dict[str, str] = {}
    for name, m in root.named_modules():
        kind = own_kind(m)  # the generated classes of class-level patching set it on each instance too
        if m is root and kind is None:
            if class_forward_is(root, cl.causal_lm_forward):
                kind = "fused_linear_cross_entropy"
            elif getattr(type(root), "_loss_function", None) is cl.liger_causal_lm_loss:
                kind = "cross_entropy"
        if kind is not None:
            found[name] = kind
    return found


def patched_kinds(model: nn.Module) -> dict[str, int]:
    """How many modules of the model run each liger_core kind now (``patched_modules`` counted by kind),
    e.g. ``{"rms_norm": 5, "rope": 2, ...}``."""
    counts: dict[str, int] = {}
    for kind in patched_modules(model).values():
        counts[kind] = counts.get(kind, 0) + 1
    return counts

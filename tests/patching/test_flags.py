"""``KernelFlags`` is the one definition of the kernel flags: every public patch entry point accepts exactly
its fields (plus ``strict``) with its defaults; and the public queries of what a model runs now
(``patched_modules``, ``patched_kinds``, ``is_patched``) agree with the patch report, under PEFT too."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from tiny_models import tiny_model

import liger_core
from liger_core.patching import (
    KernelFlags,
    apply_liger_kernel,
    apply_liger_kernel_to,
    is_patched,
    patched_kinds,
    patched_modules,
    recipe_model_types,
    revert,
)
from liger_core.patching.auto import PATCH_FLAGS
from liger_core.patching.flags import PATCH_OPTIONS

_TYPES = recipe_model_types()
FLAG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(KernelFlags)}


def _flag_params(fn, skip: tuple[str, ...]) -> dict[str, object]:
    params = inspect.signature(fn).parameters
    return {n: p.default for n, p in params.items() if n not in skip}


@pytest.mark.parametrize(
    "fn, skip",
    [
        (apply_liger_kernel, ("model",)),
        (apply_liger_kernel_to, ("model_type",)),
        *[(getattr(liger_core.patching, f"apply_liger_kernel_to_{t}"), ("model",)) for t in _TYPES],
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_entry_points_take_exactly_the_kernel_flags(fn, skip):
    assert _flag_params(fn, skip) == {**FLAG_DEFAULTS, "strict": False}


def test_auto_class_pops_exactly_the_kernel_flags():
    assert set(PATCH_FLAGS) == set(FLAG_DEFAULTS) | set(PATCH_OPTIONS)


def test_kernel_flags_defaults_and_exclusive_losses():
    assert KernelFlags.defaults() == FLAG_DEFAULTS and KernelFlags.names() == tuple(FLAG_DEFAULTS)
    assert KernelFlags.pick({"rope": False, "other": 1}) == KernelFlags(rope=False)
    with pytest.raises(ValueError, match="exclusive"):
        KernelFlags(cross_entropy=True)
    with pytest.raises(ValueError, match="exclusive"):
        apply_liger_kernel_to("llama", cross_entropy=True)


def test_generated_function_binds_positional_flags_as_before():
    """``apply_liger_kernel_to_llama(False, ...)``: the first positional argument is ``rope``."""
    model = tiny_model("llama")
    report = liger_core.patching.apply_liger_kernel_to_llama(False, model=model)
    assert "rope" not in report.swapped and report.swapped.get("rms_norm")
    with pytest.raises(TypeError):
        liger_core.patching.apply_liger_kernel_to_llama(no_such_flag=True)


def test_patched_modules_agrees_with_the_report_and_revert():
    model = tiny_model("llama")
    assert patched_modules(model) == {} and patched_kinds(model) == {} and not is_patched(model)
    report = apply_liger_kernel(model)
    modules = patched_modules(model)
    assert {n: k for n, k in modules.items() if n} == {n: k for n, k in report.modules.items() if n}
    assert modules[""] == "fused_linear_cross_entropy"
    counts: dict[str, int] = {}
    for kind in modules.values():
        counts[kind] = counts.get(kind, 0) + 1
    assert patched_kinds(model) == counts and is_patched(model)
    revert(model)
    assert patched_modules(model) == {} and not is_patched(model)


def test_patched_modules_names_are_those_of_the_model_inside_peft():
    peft = pytest.importorskip("peft")
    model = tiny_model("llama")
    apply_liger_kernel(model)
    expected = patched_modules(model)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert patched_modules(wrapped) == expected
    assert liger_core.patching.unwrap(wrapped) is model

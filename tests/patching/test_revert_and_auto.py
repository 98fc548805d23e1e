"""What ``revert`` returns, and the documented side effects of ``AutoLigerKernelForCausalLM``: class-level
patching that outlives the call (and ``class_level=False``, which avoids it), ``logits=None`` in training."""

from __future__ import annotations

import torch
from tiny_models import batch, tiny_config, tiny_model

import liger_core
from liger_core import revert_model_type
from liger_core.patching import RevertReport, apply_liger_kernel_to, is_patched


def test_revert_reports_what_it_restored():
    model = tiny_model("llama")
    patched = liger_core.apply_liger_kernel(model)
    report = liger_core.revert(model)
    assert isinstance(report, RevertReport) and report
    assert report.restored == patched.swapped  # every kind, as many modules as were swapped
    assert report.modules == patched.modules
    assert report.still_patched == {} and not is_patched(model)
    assert str(report).startswith("liger_core: reverted llama: rms_norm x5,")
    again = liger_core.revert(model)  # nothing left: an empty, falsy report (no exception)
    assert not again and again.restored == {} and "nothing to revert" in str(again)


def test_revert_names_what_class_level_patching_left():
    apply_liger_kernel_to("llama")
    try:
        model = tiny_model("llama")  # built from the patched classes
        report = liger_core.revert(model)
        assert not report.restored
        assert report.still_patched.get("rms_norm") == 5 and is_patched(model)
        assert "revert_model_type('llama')" in str(report)
    finally:
        revert_model_type("llama")


def test_auto_class_patches_the_model_type_for_later_models_until_reverted():
    """The documented side effect: for a type with a recipe the classes are patched, so a model built later
    with plain transformers runs the kernels too; revert_model_type ends that for models built afterwards."""
    from transformers import AutoModelForCausalLM

    from liger_core import AutoLigerKernelForCausalLM

    config = tiny_config("qwen3")
    try:
        assert is_patched(AutoLigerKernelForCausalLM.from_config(config))
        assert is_patched(AutoModelForCausalLM.from_config(config))
    finally:
        revert_model_type("qwen3")
    assert not is_patched(AutoModelForCausalLM.from_config(config))


def test_auto_class_level_false_patches_only_the_returned_model():
    from transformers import AutoModelForCausalLM

    from liger_core import AutoLigerKernelForCausalLM

    config = tiny_config("qwen3")
    model = AutoLigerKernelForCausalLM.from_config(config, class_level=False)
    try:
        assert is_patched(model) and model.model.layers[0].self_attn.q_norm._liger_core_kind == "rms_norm"
        assert not is_patched(AutoModelForCausalLM.from_config(config))
        report = liger_core.revert(model)
        assert report.restored["rms_norm"] > 0 and not is_patched(model)
    finally:
        revert_model_type("qwen3")  # a no-op unless the test failed half-way


def test_auto_class_training_forward_returns_no_logits():
    from liger_core import AutoLigerKernelForCausalLM

    model = AutoLigerKernelForCausalLM.from_config(tiny_config("qwen3"), class_level=False)
    ids, labels = batch(1, seq_len=8)
    model.train()
    out = model(input_ids=ids, labels=labels)
    assert out.logits is None and torch.isfinite(out.loss)
    assert model(input_ids=ids, labels=labels, skip_logits=False).logits is not None
    model.eval()
    assert model(input_ids=ids, labels=labels).logits is not None
    for doc in (AutoLigerKernelForCausalLM.__doc__, liger_core.apply_liger_kernel.__doc__):
        assert "logits=None" in doc
    unfused = tiny_model("qwen3")  # the documented way to keep the logits in training
    liger_core.apply_liger_kernel(unfused, fused_linear_cross_entropy=False)
    unfused.train()
    assert unfused(input_ids=ids, labels=labels).logits is not None

"""PEFT-wrapped models: LoRA on attention and MLP projections, ``modules_to_save`` on the norms and the
lm_head. The patched PeftModel must give the unpatched one's loss and adapter/trainable-copy gradients."""

from __future__ import annotations

import pytest
import torch
from tiny_models import batch, tiny_model

import liger_core
from liger_core.patching import is_patched

peft = pytest.importorskip("peft")


def _peft_model():
    base = tiny_model("llama", seed=21)
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"],
        modules_to_save=["lm_head", "norm"],  # "norm" matches every *norm module (PEFT matches name suffixes)
    )
    model = peft.get_peft_model(base, config)
    with torch.no_grad():  # LoRA B starts at zero; make the adapters matter
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    return model


def _step(model, ids, labels):
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_lora_and_modules_to_save():
    ref, model = _peft_model(), _peft_model()
    ids, labels = batch(12, seq_len=8)
    expected, expected_grads = _step(ref, ids, labels)

    report = liger_core.apply_liger_kernel(model)
    # 5 norms, each in a ModulesToSaveWrapper: the frozen original and the trainable copy are both patched
    assert report.swapped == {"rms_norm": 10, "swiglu": 2, "rope": 2, "fused_linear_cross_entropy": 1}, str(
        report
    )
    inner = model.base_model.model
    wrapper = inner.model.norm
    assert type(wrapper).__name__ == "ModulesToSaveWrapper"
    assert wrapper.original_module._liger_core_kind == wrapper.modules_to_save["default"]._liger_core_kind
    assert (
        type(inner.model.layers[0].mlp.gate_proj).__name__ == "Linear"
    )  # LoRA layer kept, called by the MLP
    assert is_patched(model) and is_patched(inner)

    out, grads = _step(model, ids, labels)
    assert out.logits is None
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == expected_grads.keys()
    assert any("lora_A" in n for n in grads) and any("modules_to_save" in n for n in grads)
    for name, g in grads.items():
        torch.testing.assert_close(
            g, expected_grads[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )

    model.eval()
    ref.eval()
    with model.disable_adapter(), ref.disable_adapter(), torch.no_grad():
        # adapters off: the original (frozen) copies run, and they are patched too
        torch.testing.assert_close(
            model(input_ids=ids).logits, ref(input_ids=ids).logits, rtol=1e-5, atol=1e-5
        )

    assert list(model.state_dict()) == list(ref.state_dict())
    liger_core.revert(model)
    assert not is_patched(model)
    assert not any(k.startswith("_liger_core") for m in model.modules() for k in m.__dict__)


def test_lora_on_lm_head_falls_back_to_unfused_loss():
    """A LoRA-wrapped lm_head cannot be fused (the adapter would be bypassed): patching says so and leaves the
    loss to the model, which then still matches the unpatched one."""
    base_ref, base = tiny_model("llama", seed=22), tiny_model("llama", seed=22)
    config = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "lm_head"])
    ref = peft.get_peft_model(base_ref, peft.LoraConfig(**config))
    model = peft.get_peft_model(base, peft.LoraConfig(**config))
    report = liger_core.apply_liger_kernel(model)
    assert "fused_linear_cross_entropy" not in report.swapped
    assert any("lm_head" in s for s in report.missing["fused_linear_cross_entropy"])
    ids, labels = batch(13, seq_len=8)
    expected, _ = _step(ref, ids, labels)
    out, _ = _step(model, ids, labels)
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)


def test_lm_head_wrapped_after_patching_falls_back_with_a_warning():
    """Patched first, LoRA on lm_head added afterwards: the fused forward notices at run time, warns once and
    computes the loss from the logits (through the adapter), still equal to the unpatched model's."""
    from liger_core.patching import causal_lm

    base_ref, base = tiny_model("llama", seed=23), tiny_model("llama", seed=23)
    liger_core.apply_liger_kernel(base)
    config = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["lm_head"])
    ref = peft.get_peft_model(base_ref, peft.LoraConfig(**config))
    model = peft.get_peft_model(base, peft.LoraConfig(**config))
    ids, labels = batch(14, seq_len=6)
    expected, _ = _step(ref, ids, labels)
    causal_lm._warned_unfused.clear()
    with pytest.warns(UserWarning, match="not a plain nn.Linear"):
        out, _ = _step(model, ids, labels)
    assert out.logits is None
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)

"""Every model type in the patching table: the patched model computes what the unpatched one does.

fp32: loss, every parameter gradient and the eval logits match the unpatched model tightly (the kernels do the
same math in fp32, only summation order differs). bf16: measured against a float64 copy of the same
(already-rounded) model, the patched model's errors are no larger than the unpatched bf16 model's.
Each case also checks what was swapped and that ``revert`` gives back the original forwards.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import FLOOR, rel_err
from tiny_models import MODEL_TYPES, batch, tiny_model

import liger_core
from liger_core.patching import RECIPES

# What apply_liger_kernel must swap in each tiny model (2 layers; see tiny_models.py)
EXPECTED = {
    "llama": dict(rms_norm=5, swiglu=2, rope=2),
    "mistral": dict(rms_norm=5, swiglu=2, rope=2),
    "mixtral": dict(rms_norm=5, rope=2, moe_experts=2),
    "qwen2": dict(rms_norm=5, swiglu=2, rope=2),
    "qwen3": dict(rms_norm=9, swiglu=2, rope=2),  # + q_norm, k_norm per layer
    "qwen3_moe": dict(rms_norm=9, swiglu=1, rope=2, moe_experts=1),  # layer 1 is a dense MLP layer
    "gemma": dict(rms_norm=5, geglu=2, rope=2),
    "gemma2": dict(rms_norm=9, geglu=2, rope=2),  # + pre/post feed-forward norms
    "gemma3_text": dict(rms_norm=13, geglu=2, rope=2),  # + q_norm, k_norm
    "phi3": dict(rms_norm=5, swiglu=2, rope=2),
    "granite": dict(rms_norm=5, swiglu=2, rope=2),
    "olmo2": dict(rms_norm=9, swiglu=2, rope=2),  # post-norms + q_norm, k_norm
    "smollm3": dict(rms_norm=5, swiglu=2, rope=2),
}


def test_every_recipe_is_tested():
    assert set(EXPECTED) == set(RECIPES) == set(MODEL_TYPES)


def _train_step(model, ids, labels):
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def _eval_logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def _forward_slots(model):
    return {name: ("forward" in m.__dict__) for name, m in model.named_modules()}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_fp32_matches_unpatched(model_type):
    model = tiny_model(model_type, seed=1)
    ids, labels = batch(seed=2, seq_len=8)
    ref_out, ref_grads = _train_step(model, ids, labels)
    ref_logits = _eval_logits(model, ids)
    slots_before = _forward_slots(model)

    report = liger_core.apply_liger_kernel(model, strict=True)  # every kernel of the recipe, or an error
    expected = dict(EXPECTED[model_type], fused_linear_cross_entropy=1)
    assert report.swapped == expected and not report.missing, str(report)
    assert report and liger_core.patching.is_patched(model)

    out, grads = _train_step(model, ids, labels)
    assert out.logits is None  # training with labels: the fused loss never builds the logits
    torch.testing.assert_close(out.loss, ref_out.loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(
            g, ref_grads[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )
    torch.testing.assert_close(_eval_logits(model, ids), ref_logits, rtol=1e-5, atol=1e-5)

    liger_core.revert(model)
    assert not liger_core.patching.is_patched(model)
    assert _forward_slots(model) == slots_before
    torch.testing.assert_close(_eval_logits(model, ids), ref_logits, rtol=0, atol=0)


def _no_worse(name, ours, eager, ref64, slack):
    e_ours, e_eager = rel_err(ours, ref64), rel_err(eager, ref64)
    assert e_ours <= slack * e_eager + FLOOR[torch.bfloat16], (
        f"{name}: patched bf16 rel. error {e_ours:.3e} > {slack} x unpatched bf16's {e_eager:.3e} (+ floor)"
    )


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_bf16_no_worse_than_unpatched(model_type):
    """Loss, logits and all gradients together within 1.25x the unpatched bf16 model's error vs float64; each
    single gradient within 3x (one small tensor's error is a noisy statistic; a wrong formula is off by
    O(1))."""
    model = tiny_model(model_type, dtype=torch.bfloat16, seed=3)
    model64 = copy.deepcopy(model).double()  # the float64 reference of the same rounded weights
    ids, labels = batch(seed=4, seq_len=8)
    out64, grads64 = _train_step(model64, ids, labels)
    logits64 = _eval_logits(model64, ids)
    out_e, grads_e = _train_step(model, ids, labels)
    logits_e = _eval_logits(model, ids)

    liger_core.apply_liger_kernel(model)
    out_p, grads_p = _train_step(model, ids, labels)
    logits_p = _eval_logits(model, ids)

    assert out_p.loss.dtype == out_e.loss.dtype == torch.float32
    _no_worse("loss", out_p.loss, out_e.loss, out64.loss, 1.25)
    _no_worse("logits", logits_p, logits_e, logits64, 1.25)
    names = sorted(grads64)
    assert sorted(grads_p) == sorted(grads_e) == names

    def flat(g):
        return torch.cat([g[n].double().flatten() for n in names])

    _no_worse("all gradients", flat(grads_p), flat(grads_e), flat(grads64), 1.25)
    for n in names:
        _no_worse(f"grad {n}", grads_p[n], grads_e[n], grads64[n], 3.0)

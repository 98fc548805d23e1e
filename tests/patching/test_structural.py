"""Structural patching of a model type with no recipe (tests/patching/toy_model.py): what matches is swapped,
look-alikes are left alone and reported, and the patched model computes what the original does."""

from __future__ import annotations

import pytest
import torch
from toy_model import ToyConfig, ToyForCausalLM

import liger_core
from liger_core.patching import is_patched
from liger_core.patching.probing import tolerance


def _step(model, ids):
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_structural_patching_swaps_only_what_matches():
    torch.manual_seed(0)
    model = ToyForCausalLM(ToyConfig())
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    rng_state = torch.get_rng_state()
    ref_loss, ref_grads = _step(model, ids)

    torch.set_rng_state(rng_state)
    report = liger_core.apply_liger_kernel(model)
    assert torch.equal(torch.get_rng_state(), rng_state)  # the probes use their own generator
    assert report.method == "structural" and "(structural)" in str(report)
    assert report.swapped == {"rms_norm": 4, "swiglu": 1, "rope": 1, "fused_linear_cross_entropy": 1}, str(
        report
    )
    kinds = {n: m.__dict__.get("_liger_core_kind") for n, m in model.named_modules()}
    assert kinds["model.blocks.0.norm1"] == kinds["model.blocks.1.norm1"] == kinds["model.norm"] == "rms_norm"
    assert kinds["model.blocks.0.norm2"] == "rms_norm"  # Gemma semantics, recognised by the probe
    assert model.model.blocks[0].norm2._liger_core_norm_spec.offset == 1.0
    assert kinds["model.blocks.0.mlp"] == "swiglu" and kinds["model.blocks.0.attn"] == "rope"
    # the look-alikes: kept, and the report says why
    assert kinds["model.blocks.1.norm2"] is None and kinds["model.blocks.1.mlp"] is None
    assert kinds["model.blocks.1.attn"] is None
    # recognised but not reproduced: each a miss of its kind, with the module named
    assert set(report.missing) == {"rms_norm", "swiglu", "rope"}, str(report)
    assert "ToyScaledNorm" in " ".join(report.missing["rms_norm"])
    assert "ToyOddMLP" in " ".join(report.missing["swiglu"])
    assert "scaled_rotary" in " ".join(report.missing["rope"])
    assert "NOT applied" in str(report)

    loss, grads = _step(model, ids)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(
            g, ref_grads[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )

    assert not liger_core.apply_liger_kernel(model)  # idempotent here too
    liger_core.revert(model)
    assert not is_patched(model)


def test_grouped_and_per_head_norms_are_patched_exactly():
    """Qwen4-Exp's grouped RMSNorm (groups of ``group_size`` features, weight over the whole row) and xLSTM's
    multi-head LayerNorm ((..., heads, head_dim) in, (..., heads * head_dim) out): in fp32 both are swapped
    (liger's norms with ``group_size``) and give the same outputs and input/weight gradients; in bf16 each
    is swapped and exact as well, or a miss that names the module."""
    qwen4 = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")
    xlstm = pytest.importorskip("transformers.models.xlstm.modeling_xlstm")
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        root = torch.nn.ModuleDict(
            {
                "grouped": qwen4.Qwen4ExpTextRMSNorm(96, group_size=32, eps=1e-6),
                "heads": xlstm.xLSTMMultiHeadLayerNorm(num_heads=4, head_dim=12, eps=1e-6),
            }
        )
        with torch.no_grad():
            for p in root.parameters():
                p.copy_(torch.randn(p.shape) * 0.5 + 0.5)
        root.to(dtype)
        inputs = {"grouped": torch.randn(3, 5, 96) * 3, "heads": torch.randn(3, 5, 4, 12) * 3}
        inputs = {k: v.to(dtype) for k, v in inputs.items()}

        def run(root=root, inputs=inputs, dtype=dtype):
            out = {}
            for name, x in inputs.items():
                x = x.clone().requires_grad_(True)
                y = root[name](x)
                dy = torch.linspace(-1, 1, y.numel()).view(y.shape).to(dtype)
                out[name] = (y, *torch.autograd.grad(y, (x, root[name].weight), dy))
            return out

        ref = run()
        report = liger_core.apply_liger_kernel(root)
        kinds = {n: m.__dict__.get("_liger_core_kind") for n, m in root.named_modules()}
        if dtype == torch.float32:
            assert kinds == {"": None, "grouped": "rms_norm", "heads": "layer_norm"}, str(report)
            assert root["grouped"]._liger_core_norm_spec.group_size == 32
            assert root["heads"]._liger_core_norm_spec.heads_input
        for name in inputs:
            if kinds[name] is None:
                assert type(root[name]).__name__ in " ".join(sum(report.missing.values(), [])), str(report)
                continue
            for got, want in zip(run()[name], ref[name]):
                # the probe's measure: max error relative to the largest value (rounding differences only)
                scale = want.double().abs().max()
                assert got.dtype == want.dtype and got.shape == want.shape
                assert (got.double() - want.double()).abs().max() <= scale * tolerance(dtype), name
        liger_core.revert(root)


def test_pre_norm_gate_second_mlp_with_dropout_is_patched_exactly():
    """Phi-4 audio's MLP (LayerNorm first, ``up, gate = gate_up(x).chunk(2)``, dropout after act * up and
    after down): swapped to liger's swiglu, and in training with dropout p > 0 the patched forward draws the
    same masks (same calls in the same order): the same output and gradients from the same seed."""
    from transformers.models.phi4_multimodal import modeling_phi4_multimodal as phi4
    from transformers.models.phi4_multimodal.configuration_phi4_multimodal import Phi4MultimodalAudioConfig

    torch.manual_seed(0)
    config = Phi4MultimodalAudioConfig(hidden_size=40, intermediate_size=56, dropout_rate=0.25)
    root = torch.nn.ModuleDict({"mlp": phi4.Phi4MultimodalAudioMLP(config)}).train()
    x0, dy = torch.randn(3, 7, 40), torch.randn(3, 7, 40)

    def run():
        torch.manual_seed(1)
        x = x0.clone().requires_grad_(True)
        y = root["mlp"](x)
        return (y, *torch.autograd.grad(y, (x, *root.parameters()), dy))

    ref = run()
    report = liger_core.apply_liger_kernel(root)
    assert root["mlp"].__dict__.get("_liger_core_kind") == "swiglu", str(report)
    spec = root["mlp"]._liger_core_mlp_spec
    assert spec.gate_second and spec.pre == ("layer_norm",) and spec.dropout == "dropout"
    got = run()
    assert (got[0] == 0).any()  # dropout was active
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    root.eval()
    with torch.no_grad():
        patched = root["mlp"](x0)
        liger_core.revert(root)
        torch.testing.assert_close(patched, root["mlp"](x0), rtol=1e-5, atol=1e-6)

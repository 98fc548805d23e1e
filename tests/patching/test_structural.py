"""Structural patching of a model type with no recipe (tests/patching/toy_model.py): what matches is swapped,
look-alikes are left alone and reported, and the patched model computes what the original does."""

from __future__ import annotations

import torch
from toy_model import ToyConfig, ToyForCausalLM

import liger_core
from liger_core.patching import is_patched


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

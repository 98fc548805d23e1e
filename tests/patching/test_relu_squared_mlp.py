"""Non-gated MLPs with a relu^2 activation (``down(relu(up(x))^2)``: Nemotron, Arcee, NanoChat's fc1/fc2,
Persimmon's dense_h_to_4h/dense_4h_to_h): structural patching swaps them to ``liger_core.ops.relu_squared``
after its probe, the patched model trains as the original does, PEFT's LoRA on the projections keeps
working, ``relu_squared=False`` leaves them alone, and two-Linear MLPs with another activation are not
touched or reported."""

from __future__ import annotations

import pytest
import torch
from tiny_models import batch, tiny_model
from torch import nn

import liger_core
from liger_core.patching import is_patched, patched_modules
from liger_core.patching.probing import tolerance


def _step(model, ids, labels):
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    return out.loss.detach(), {
        n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None
    }


def _assert_same_step(model, reference, ids, labels):
    loss, grads = _step(model, ids, labels)
    ref_loss, ref_grads = _step(reference, ids, labels)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(
            g, ref_grads[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )


def test_nemotron_mlps_run_relu_squared_and_train_as_the_original():
    model, reference = tiny_model("nemotron", seed=5), tiny_model("nemotron", seed=5)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    report = liger_core.apply_liger_kernel(model)
    assert report.method == "structural"
    assert report.swapped.get("relu_squared") == 2 and "relu_squared" not in report.missing, str(report)
    kinds = patched_modules(model)
    assert kinds["model.layers.0.mlp"] == kinds["model.layers.1.mlp"] == "relu_squared"
    spec = model.model.layers[0].mlp._liger_core_mlp_spec
    assert (spec.gate, spec.gate_up, spec.up, spec.down) == (None, None, "up_proj", "down_proj")
    ids, labels = batch(3, seq_len=9)
    _assert_same_step(model, reference, ids, labels)
    # parameters are only read: same names, same values
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], v) for k, v in state.items())
    assert not liger_core.apply_liger_kernel(model)  # a second call patches nothing more
    liger_core.revert(model)
    assert not is_patched(model) and "forward" not in model.model.layers[0].mlp.__dict__


def test_relu_squared_flag_off_and_tiled():
    model = tiny_model("nemotron", seed=6)
    report = liger_core.apply_liger_kernel(model, relu_squared=False)
    assert "relu_squared" not in report.swapped and "relu_squared" not in report.missing, str(report)
    assert "model.layers.0.mlp" not in patched_modules(model)
    liger_core.revert(model)

    reference = tiny_model("nemotron", seed=6)
    report = liger_core.apply_liger_kernel(model, tiled_mlp=True)
    assert report.swapped.get("relu_squared") == 2 and report.swapped.get("tiled_mlp") == 2, str(report)
    ids, labels = batch(4, seq_len=9)
    _assert_same_step(model, reference, ids, labels)


def test_bf16_mlp_is_swapped_and_exact():
    model = tiny_model("nemotron", dtype=torch.bfloat16, seed=7)
    mlp = model.model.layers[0].mlp
    x0 = torch.randn(2, 5, mlp.up_proj.in_features).to(torch.bfloat16)
    dy = torch.randn(2, 5, mlp.down_proj.out_features).to(torch.bfloat16)

    def run():
        x = x0.clone().requires_grad_(True)
        y = mlp(x)
        return (y, *torch.autograd.grad(y, (x, mlp.up_proj.weight, mlp.down_proj.weight), dy))

    ref = run()
    report = liger_core.apply_liger_kernel(model)
    assert mlp.__dict__.get("_liger_core_kind") == "relu_squared", str(report)
    for got, want in zip(run(), ref):
        scale = want.double().abs().max()
        assert got.dtype == want.dtype and got.shape == want.shape
        # the error a rounding difference gives: relu(h)^2 is rounded once, eager rounds relu(h) and h^2
        assert (got.double() - want.double()).abs().max() <= scale * 4 * tolerance(torch.bfloat16)


def test_lora_on_the_projections():
    peft = pytest.importorskip("peft")

    def build():
        base = tiny_model("nemotron", seed=8)
        config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["up_proj", "down_proj"])
        model = peft.get_peft_model(base, config)
        with torch.no_grad():  # LoRA B starts at zero; make the adapters matter
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.1)
        return model

    model, reference = build(), build()
    report = liger_core.apply_liger_kernel(model)
    assert report.swapped.get("relu_squared") == 2, str(report)
    mlp = model.base_model.model.model.layers[0].mlp
    assert type(mlp.up_proj).__name__ == "Linear" and hasattr(mlp.up_proj, "lora_A")  # LoRA layer, called
    ids, labels = batch(9, seq_len=8)
    _assert_same_step(model, reference, ids, labels)
    liger_core.revert(model)
    assert not is_patched(model)


class _PlainMLP(nn.Module):
    def __init__(self, act: nn.Module, names=("fc1", "fc2"), scale: float = 1.0):
        super().__init__()
        self.names, self.scale = names, scale
        setattr(self, names[0], nn.Linear(12, 20))
        setattr(self, names[1], nn.Linear(20, 12))
        self.activation_fn = act

    def forward(self, x):
        return getattr(self, self.names[1])(self.activation_fn(getattr(self, self.names[0])(x)) * self.scale)


class _ReLUSquared(nn.Module):
    def forward(self, x):
        return torch.square(torch.relu(x))


class _GatedReLUSquared(nn.Module):
    """BitNet's layout with relu^2: gated, so not a non-gated MLP (and no GLU kernel has relu^2)."""

    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(12, 20), nn.Linear(12, 20), nn.Linear(20, 12)
        self.act_fn = _ReLUSquared()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_what_is_and_is_not_a_relu_squared_mlp():
    root = nn.ModuleDict(
        {
            "fc": _PlainMLP(_ReLUSquared()),
            "dense": _PlainMLP(_ReLUSquared(), names=("dense_h_to_4h", "dense_4h_to_h")),
            "gelu": _PlainMLP(nn.GELU()),  # no liger kernel for a lone GELU: left alone, not reported
            "relu": _PlainMLP(nn.ReLU()),
            "scaled": _PlainMLP(_ReLUSquared(), scale=1.5),  # not down(relu(up(x))^2): a miss naming it
            "gated": _GatedReLUSquared(),
        }
    )
    x = torch.randn(3, 4, 12)
    ref = {name: m(x) for name, m in root.items()}
    report = liger_core.apply_liger_kernel(root)
    kinds = {n: m.__dict__.get("_liger_core_kind") for n, m in root.items()}
    assert kinds == dict(
        fc="relu_squared", dense="relu_squared", gelu=None, relu=None, scaled=None, gated=None
    )
    assert report.swapped.get("relu_squared") == 2, str(report)
    assert list(report.missing) == ["relu_squared"], str(report)
    assert "_PlainMLP" in " ".join(report.missing["relu_squared"])
    assert not any("GELU" in s or "ReLU()" in s for s in report.skipped), str(report)
    assert any("_GatedReLUSquared" in s for s in report.skipped), str(report)
    with torch.no_grad():
        for name, m in root.items():
            torch.testing.assert_close(m(x), ref[name], rtol=1e-5, atol=1e-6)

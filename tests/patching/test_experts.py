"""moe_experts: transformers' experts modules patched with liger's gated activation after a probe."""

import sys
from pathlib import Path

import pytest
import torch

import liger_core
from liger_core.patching.experts import SPEC_ATTR

sys.path.insert(0, str(Path(__file__).parent))
from zoo import build_tiny  # noqa: E402


def _experts(model):
    return [m for m in model.modules() if SPEC_ATTR in m.__dict__]


def _loss_and_grads(model, ids):
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("implementation", ["eager", "grouped_mm", "batched_mm"])
@pytest.mark.parametrize("model_type", ["gpt_oss", "mixtral"])
def test_experts_patched_and_exact(model_type, implementation):
    ref, model = build_tiny(model_type), build_tiny(model_type)
    for m in (ref, model):
        m.set_experts_implementation(implementation)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    report = liger_core.apply_liger_kernel(model)
    assert report.swapped.get("moe_experts") == 2 and "moe_experts" not in report.missing
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    loss_r, grads_r = _loss_and_grads(ref, ids)
    loss, grads = _loss_and_grads(model, ids)
    torch.testing.assert_close(loss, loss_r, rtol=1e-5, atol=1e-6)
    assert grads.keys() == grads_r.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_r[name], rtol=1e-4, atol=1e-5, msg=name)
    liger_core.revert(model)
    assert not _experts(model) and not any("_apply_gate" in m.__dict__ for m in model.modules())


def test_gpt_oss_spec_is_the_clamped_interleaved_swiglu():
    model = build_tiny("gpt_oss")
    liger_core.apply_liger_kernel(model)
    (spec, *_) = {m.__dict__[SPEC_ATTR] for m in _experts(model)}
    experts = _experts(model)[0]
    assert spec.kind == "swiglu" and spec.interleaved and spec.up_offset == 1.0
    assert spec.alpha == experts.alpha and spec.limit == experts.limit


def test_experts_of_another_activation_are_a_named_miss():
    """A gate the kernels cannot compute (here: clamped after the activation) is reported, not swapped."""
    model = build_tiny("mixtral")
    for m in model.modules():
        if type(m).__name__ == "MixtralExperts":
            m.act_fn = torch.nn.Tanh()
    report = liger_core.apply_liger_kernel(model)
    assert "moe_experts" not in report.swapped
    assert any("MixtralExperts" in r for r in report.missing["moe_experts"])


def test_moe_experts_flag_off():
    model = build_tiny("gpt_oss")
    report = liger_core.apply_liger_kernel(model, moe_experts=False)
    assert "moe_experts" not in report.swapped and "moe_experts" not in report.missing


def test_strict_class_level_patching_leaves_experts_to_the_built_model():
    """Class-level patching cannot probe experts modules; strict class-level patching of a MoE recipe must not
    fail on that, and patching the built model afterwards swaps the experts."""
    from liger_core.patching import apply_liger_kernel_to, revert_model_type

    try:
        report = apply_liger_kernel_to("mixtral", strict=True)
        assert "moe_experts" not in report.missing
        assert any(s.startswith("moe_experts:") for s in report.skipped)
        model = build_tiny("mixtral")
        assert liger_core.apply_liger_kernel(model, strict=True).swapped.get("moe_experts") == 2
    finally:
        revert_model_type("mixtral")


def _longcat_experts(zero_experts):
    from transformers.models.longcat_flash import modeling_longcat_flash as lc

    config = build_tiny("longcat_flash").config
    config.zero_expert_num = zero_experts
    experts = lc.LongcatFlashExperts(config)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
    return torch.nn.ModuleDict({"experts": experts})


def test_identity_experts_patched_and_exact():
    """LongCat-Flash's zero-computation experts (indices from down_proj's expert count on: the token times
    its routing weight): swapped, and exact on a routing that sends tokens to routed and identity experts."""
    root = _longcat_experts(zero_experts=2)
    experts = root["experts"]
    assert experts.gate_up_proj.shape[0] == experts.down_proj.shape[0] + 2
    x = torch.randn(9, experts.hidden_size)
    index = torch.arange(18).remainder(experts.total_experts).view(9, 2)  # every expert, identity ones too
    weights = torch.rand(9, 2)

    def run():
        leaves = [x.clone().requires_grad_(True), weights.clone().requires_grad_(True)]
        y = experts(leaves[0], index, leaves[1])
        return (y, *torch.autograd.grad(y, (*leaves, *experts.parameters()), torch.ones_like(y)))

    ref = run()
    report = liger_core.apply_liger_kernel(root)
    assert report.swapped.get("moe_experts") == 1, str(report)
    assert experts.__dict__[SPEC_ATTR].layout.identity_experts
    for got, want in zip(run(), ref):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_identity_experts_of_other_semantics_are_a_named_miss():
    """Identity experts that are not the token times its weight (here: twice that, by a subclass that adds the
    identity experts' share once more) fail the probe: a miss with its reason (nothing else in this model to
    patch, so the call raises with it)."""
    from liger_core.patching.report import UnsupportedModelError

    root = _longcat_experts(zero_experts=2)
    base = type(root["experts"])

    class DoublingIdentityExperts(base):
        def forward(self, hidden_states, top_k_index, top_k_weights):
            out = super().forward(hidden_states, top_k_index, top_k_weights)
            identity = top_k_index >= self.down_proj.shape[0]
            return out + (top_k_weights * identity).sum(-1, keepdim=True) * hidden_states

    root["experts"].__class__ = DoublingIdentityExperts
    with pytest.raises(UnsupportedModelError, match="DoublingIdentityExperts: forward differs"):
        liger_core.apply_liger_kernel(root)


def _tiny_dbrx():
    """The zoo's tiny DBRX, or a skip where this transformers cannot build and train one (5.0.0's DBRX fails
    on its own config's round trip and in its experts' shapes; the newest release must build it)."""
    import transformers

    try:
        model = build_tiny("dbrx")
        ids = torch.randint(0, 128, (1, 4))
        model(input_ids=ids, labels=ids)
    except Exception as e:  # noqa: BLE001 - only the oldest supported release is allowed to skip here
        pytest.skip(f"transformers {transformers.__version__} cannot build or train a tiny dbrx: {e}")
    return model


def test_dbrx_expert_glu_patched_and_exact():
    """DBRX's experts call ``DbrxExpertGLU(x, w1[e], v1[e], w2[e])`` on flattened [E * I, H] weights: that
    module's forward is swapped (EXPERT_GLU_LAYOUTS) and the model's loss and gradients are unchanged."""
    from liger_core.patching.experts import GLU_SPEC_ATTR

    ref, model = _tiny_dbrx(), build_tiny("dbrx")
    report = liger_core.apply_liger_kernel(model)
    assert report.swapped.get("moe_experts") == 2 and "moe_experts" not in report.missing, str(report)
    assert all(type(m).__name__ == "DbrxExpertGLU" for m in model.modules() if GLU_SPEC_ATTR in m.__dict__)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    loss_r, grads_r = _loss_and_grads(ref, ids)
    loss, grads = _loss_and_grads(model, ids)
    torch.testing.assert_close(loss, loss_r, rtol=1e-5, atol=1e-6)
    assert grads.keys() == grads_r.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_r[name], rtol=1e-4, atol=1e-5, msg=name)
    liger_core.revert(model)
    assert not any(GLU_SPEC_ATTR in m.__dict__ for m in model.modules())


def test_dbrx_expert_glu_of_another_activation_is_a_named_miss():
    model = _tiny_dbrx()
    for m in model.modules():
        if type(m).__name__ == "DbrxExpertGLU":
            m.activation_fn = torch.nn.Tanh()
    report = liger_core.apply_liger_kernel(model)
    assert "moe_experts" not in report.swapped
    assert any("DbrxExpertGLU" in r for r in report.missing["moe_experts"]), str(report)

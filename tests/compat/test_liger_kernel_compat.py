"""``liger_core.compat.liger_kernel``: Liger-Kernel 0.8.5's documented API (names, parameters, defaults,
return structures) on liger_core. The patch functions patch tiny models with the unpatched loss and
gradients; the modules and functions give liger_core's outputs and gradients; the chunked losses return
Liger-Kernel's ``(loss, aux)`` structure with liger_core's loss; arguments Liger-Kernel does not take raise
naming them."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "patching"))  # tiny_models

from tiny_models import VOCAB, batch, tiny_config, tiny_model  # noqa: E402

import liger_core  # noqa: E402
import liger_core.modules as core_modules  # noqa: E402
import liger_core.ops as ops  # noqa: E402
from liger_core.compat.liger_kernel import chunked_loss as C  # noqa: E402
from liger_core.compat.liger_kernel import transformers as T  # noqa: E402
from liger_core.compat.liger_kernel.transformers import functional as F  # noqa: E402
from liger_core.patching import is_patched, patched_kinds, revert_model_type  # noqa: E402

# Liger-Kernel 0.8.5's apply_liger_kernel_to_<model> functions (its documented model list).
LIGER_KERNEL_MODELS = (
    "deepseek_v2", "deepseek_v3", "deepseek_v4", "exaone4", "falcon_h1", "gemma", "gemma2", "gemma3",
    "gemma3_text", "gemma4", "gemma4_text", "glm4", "glm4v", "glm4v_moe", "gpt_oss", "granite",
    "hunyuan_v1_dense", "hunyuan_v1_moe", "internvl", "llama", "llama4", "llava", "ministral", "mistral",
    "mixtral", "mllama", "muse_glimmer", "nemotron", "olmo2", "olmo3", "paligemma", "phi3", "pixtral",
    "qwen2", "qwen2_5_vl", "qwen2_vl", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_moe", "qwen3_next",
    "qwen3_vl", "qwen3_vl_moe", "smollm3", "smolvlm",
)  # fmt: skip


def _train_step(model, ids, labels):
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_step(model, reference, seed=0):
    ids, labels = batch(seed)
    loss, grads = _train_step(model, ids, labels)
    ref_loss, ref_grads = _train_step(reference, ids, labels)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(
            g, ref_grads[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )


# ---------------------------------------------------------------------------------------------- patching


def test_every_liger_kernel_model_has_a_patch_function_with_its_flags():
    for model in LIGER_KERNEL_MODELS:
        function = getattr(T, f"apply_liger_kernel_to_{model}")
        params = inspect.signature(function).parameters
        assert "model" in params and params["model"].default is None, model
        flags = set(params) - {"model", "kwargs"}
        assert flags and flags <= {"rope", "rms_norm", "swiglu", "geglu", "layer_norm", "cross_entropy",
                                   "fused_linear_cross_entropy", "relu_squared"}, model  # fmt: skip
    defaults = {n: p.default for n, p in inspect.signature(T.apply_liger_kernel_to_llama).parameters.items()}
    assert defaults == dict(
        rope=True,
        cross_entropy=False,
        fused_linear_cross_entropy=True,
        rms_norm=True,
        swiglu=True,
        model=None,
    )
    assert inspect.signature(T.apply_liger_kernel_to_granite).parameters["cross_entropy"].default is True


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "mixtral"])
def test_patch_function_on_a_model_keeps_loss_and_gradients(model_type):
    model, reference = tiny_model(model_type), tiny_model(model_type)
    report = getattr(T, f"apply_liger_kernel_to_{model_type}")(model=model)
    assert is_patched(model) and not report.missing
    _assert_same_step(model, reference)


def test_class_level_patch_function_patches_models_built_afterwards():
    reference = tiny_model("qwen2")
    T.apply_liger_kernel_to_qwen2(rms_norm=True, swiglu=False)
    try:
        model = tiny_model("qwen2")
        kinds = patched_kinds(model)
        assert kinds.get("rms_norm") and "swiglu" not in kinds
        _assert_same_step(model, reference)
    finally:
        revert_model_type("qwen2")


def test_flags_map_onto_liger_core_kernel_flags():
    model = tiny_model("llama")
    T.apply_liger_kernel_to_llama(False, False, False, True, False, model)  # positional, Liger-Kernel's order
    assert set(patched_kinds(model)) == {"rms_norm"}
    gemma = tiny_model("gemma")
    T.apply_liger_kernel_to_gemma(model=gemma, geglu=False, rope=False, fused_linear_cross_entropy=False)
    assert set(patched_kinds(gemma)) == {"rms_norm"}
    with pytest.raises(ValueError, match="exclusive"):
        T.apply_liger_kernel_to_granite(fused_linear_cross_entropy=True, model=tiny_model("granite"))


def test_unknown_arguments_raise_naming_them():
    model = tiny_model("llama")
    with pytest.raises(TypeError, match="geglu"):  # Liger-Kernel's Llama function has no geglu flag
        T.apply_liger_kernel_to_llama(geglu=True, model=model)
    with pytest.raises(TypeError, match="flash_attention"):
        T.apply_liger_kernel_to_llava(flash_attention=True, model=model)
    with pytest.raises(TypeError, match="rms_norm_eps"):
        T._apply_liger_kernel("llama", rms_norm_eps=1e-5)
    with pytest.raises(TypeError, match="swiglu_"):
        T._apply_liger_kernel_to_instance(model, swiglu_=True)
    assert not is_patched(model)


def test_apply_to_instance_drops_flags_the_model_does_not_take():
    model, reference = tiny_model("llama"), tiny_model("llama")
    T._apply_liger_kernel_to_instance(model, geglu=True, layer_norm=True, rope=False)  # as Liger-Kernel
    kinds = patched_kinds(model)
    assert kinds.get("rms_norm") and "rope" not in kinds
    _assert_same_step(model, reference)


def test_what_liger_core_cannot_do_raises_naming_it():
    with pytest.raises(NotImplementedError, match="deepseek_v3.*model="):
        T.apply_liger_kernel_to_deepseek_v3()  # no class-level recipe: a built model is needed
    with pytest.raises(NotImplementedError, match="not_a_model"):
        T._apply_liger_kernel("not_a_model")


def test_nemotron_relu_squared_flag():
    """Liger-Kernel's ``relu_squared`` flag of ``apply_liger_kernel_to_nemotron``: liger_core's flag of that
    name (Nemotron's relu^2 MLPs run ``liger_core.ops.relu_squared``); off leaves them alone."""
    model, reference = tiny_model("nemotron", seed=4), tiny_model("nemotron", seed=4)
    report = T.apply_liger_kernel_to_nemotron(model=model)
    assert report.swapped.get("relu_squared") == 2 and "relu_squared" not in report.missing, str(report)
    _assert_same_step(model, reference)
    liger_core.revert(model)
    report = T.apply_liger_kernel_to_nemotron(relu_squared=False, model=model)
    assert "relu_squared" not in patched_kinds(model) and "relu_squared" not in report.missing, str(report)
    liger_core.revert(model)
    T._apply_liger_kernel_to_instance(model, relu_squared=True)
    assert patched_kinds(model).get("relu_squared") == 2


def test_auto_model_takes_the_flags_of_the_model_types_function():
    config = tiny_config("qwen3")
    try:
        model = T.AutoLigerKernelForCausalLM.from_config(config, swiglu=False, rope=False)
        kinds = patched_kinds(model)
        assert kinds.get("rms_norm") and "swiglu" not in kinds and "rope" not in kinds
    finally:
        revert_model_type("qwen3")
    with pytest.raises(OSError):
        T.AutoLigerKernelForCausalLM()


def test_auto_model_from_pretrained_patches_the_loaded_model(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path)
    reference = tiny_model("llama")
    try:
        model = T.AutoLigerKernelForCausalLM.from_pretrained(tmp_path, rope=False, dtype=torch.float32)
        kinds = patched_kinds(model)
        assert kinds.get("rms_norm") and kinds.get("swiglu") and "rope" not in kinds
        _assert_same_step(model, reference)
    finally:
        revert_model_type("llama")


# ---------------------------------------------------------------------------------------------- modules


def _same_forward_backward(ours, theirs, *inputs):
    """Outputs and input/parameter gradients of two modules (same state) on the same inputs are equal."""
    a = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    b = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out_a, out_b = ours(*a), theirs(*b)
    torch.testing.assert_close(out_a, out_b, rtol=0, atol=0)
    g = torch.randn_like(out_a)
    (out_a * g).sum().backward()
    (out_b * g).sum().backward()
    for x, y in zip(a, b):
        if x.requires_grad:
            torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)
    for (n, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=n)


def test_rms_norm_and_layer_norm_modules():
    ours = T.LigerRMSNorm(24, 1e-5, 1.0, "gemma", "zeros", False)  # Liger-Kernel's positional order
    theirs = core_modules.LigerRMSNorm(24, 1e-5, offset=1.0, casting_mode="gemma", init_fn="zeros")
    assert ours.in_place is False and torch.equal(ours.weight, torch.zeros(24))
    with torch.no_grad():
        ours.weight.normal_()
        theirs.weight.copy_(ours.weight)
    _same_forward_backward(ours, theirs, torch.randn(3, 5, 24))
    assert T.LigerRMSNorm(8).in_place is True  # Liger-Kernel's default

    ln = T.LigerLayerNorm(24, bias=True)
    assert ln.eps == 1e-6 and ln.bias is not None and torch.equal(ln.weight, torch.ones(24))
    assert torch.equal(T.LigerLayerNorm(24).bias, torch.zeros(24))  # bias=False: a zero-initialised bias
    core = core_modules.LigerLayerNorm(24, 1e-6)
    core.load_state_dict(ln.state_dict())
    _same_forward_backward(ln, core, torch.randn(7, 24))
    with pytest.raises(NotImplementedError, match="backend"):
        T.LigerLayerNorm(8, backend="other")


def test_mlp_modules():
    from transformers import AutoConfig
    from transformers.models.phi3.modeling_phi3 import Phi3MLP

    config = AutoConfig.for_model("phi3", hidden_size=16, intermediate_size=24, hidden_act="silu")
    ours, hf = T.LigerPhi3SwiGLUMLP(config), Phi3MLP(config)
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(ours(x), hf(x), rtol=1e-5, atol=1e-6)

    block = T.LigerBlockSparseTop2MLP(config)
    expected = block.w2(torch.nn.functional.silu(block.w1(x)) * block.w3(x))
    torch.testing.assert_close(block(x), expected, rtol=1e-5, atol=1e-6)

    llama = tiny_config("llama")
    x = torch.randn(3, llama.hidden_size)
    for ours_cls, core_cls, config in (
        (T.LigerSwiGLUMLP, core_modules.LigerSwiGLUMLP, llama),
        (T.LigerGEGLUMLP, core_modules.LigerGEGLUMLP, tiny_config("gemma")),
    ):
        ours, core = ours_cls(config=config), core_cls(config)
        core.load_state_dict(ours.state_dict())
        _same_forward_backward(ours, core, x)
    moe = T.LigerQwen3MoeSwiGLUMLP(tiny_config("qwen3_moe"))
    assert moe.gate_proj.out_features == tiny_config("qwen3_moe").moe_intermediate_size
    assert T.LigerQwen3MoeSwiGLUMLP(llama, intermediate_size=8).up_proj.out_features == 8


def test_cross_entropy_modules_keep_liger_kernels_argument_order_and_outputs():
    logits, target = torch.randn(9, 33), torch.randint(0, 33, (9,))
    target[2] = -100
    ours = T.LigerCrossEntropyLoss(None, -100, 1e-3, 0.1, "sum", 20.0, True)  # Liger-Kernel's order
    assert (ours.lse_square_scale, ours.label_smoothing, ours.reduction) == (1e-3, 0.1, "sum")
    out = ours(logits, target)
    assert isinstance(out, F.CrossEntropyOutput) and out.token_accuracy is None
    loss, z = ops.cross_entropy(
        logits,
        target,
        reduction="sum",
        label_smoothing=0.1,
        lse_square_scale=1e-3,
        softcap=20.0,
        return_z_loss=True,
    )
    torch.testing.assert_close(out.loss, loss, rtol=0, atol=0)
    torch.testing.assert_close(out.z_loss, z, rtol=0, atol=0)
    plain = T.LigerCrossEntropyLoss()(logits, target)
    assert isinstance(plain, torch.Tensor)
    torch.testing.assert_close(plain, torch.nn.functional.cross_entropy(logits, target), rtol=1e-6, atol=1e-6)

    hidden, weight = torch.randn(9, 16), torch.randn(33, 16)
    flce = T.LigerFusedLinearCrossEntropyLoss(ignore_index=-100, label_smoothing=0.05)
    expected = ops.fused_linear_cross_entropy(hidden, weight, target, label_smoothing=0.05)
    torch.testing.assert_close(flce(weight, hidden, target), expected, rtol=0, atol=0)


def test_options_liger_core_lacks_raise_or_work_once_present():
    logits, target = torch.randn(4, 11), torch.randint(0, 11, (4,))
    for name, call in (
        ("return_token_accuracy", lambda: F.liger_cross_entropy(logits, target, return_token_accuracy=True)),
        (
            "use_token_scaling",
            lambda: F.liger_fused_linear_cross_entropy(
                torch.randn(4, 8), torch.randn(11, 8), target, use_token_scaling=True
            ),
        ),
    ):
        entry = ops.cross_entropy if name == "return_token_accuracy" else ops.fused_linear_cross_entropy
        if name in inspect.signature(entry).parameters:
            assert call() is not None
        else:
            with pytest.raises(NotImplementedError, match=name):
                call()


def test_divergence_modules():
    student = torch.randn(6, 20).log_softmax(-1)
    teacher = torch.randn(6, 20).log_softmax(-1)
    kl = T.LigerKLDIVLoss()  # nn.KLDivLoss's default reduction, "mean"
    assert kl.reduction == "mean"
    torch.testing.assert_close(
        kl(student, teacher.exp()), torch.nn.functional.kl_div(student, teacher.exp()), rtol=1e-5, atol=1e-7
    )
    assert T.LigerKLDIVLoss(1e-10, reduction="sum", log_target=True).log_target is True
    assert T.LigerJSD is core_modules.LigerJSD

    sh, th = torch.randn(6, 8), torch.randn(6, 12)
    sw, tw = torch.randn(20, 8), torch.randn(20, 12)
    ours = T.LigerFusedLinearJSD(jsd_beta=0.3, temperature=2.0)
    theirs = core_modules.LigerFusedLinearJSD(beta=0.3, temperature=2.0)
    torch.testing.assert_close(ours(sh, sw, th, tw), theirs(sh, sw, th, tw), rtol=0, atol=0)
    torch.testing.assert_close(
        F.liger_fused_linear_jsd(sh, sw, th, tw, None, 0.3, -100, 2.0), theirs(sh, sw, th, tw), rtol=0, atol=0
    )


def test_functional_matches_liger_core_ops():
    x, w = torch.randn(5, 16), torch.randn(16)
    torch.testing.assert_close(F.liger_rms_norm(x, w, 1e-6, in_place=False), ops.rms_norm(x, w, 1e-6))
    b = torch.randn(16)
    torch.testing.assert_close(F.liger_layer_norm(x, w, b, 1e-5), ops.layer_norm(x, w, b, 1e-5))
    a, g = torch.randn(4, 10), torch.randn(4, 10)
    torch.testing.assert_close(F.liger_swiglu(a, g), ops.swiglu(a, g))
    torch.testing.assert_close(F.liger_geglu(a, g), ops.geglu(a, g))
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    cos, sin = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    for got, want in zip(T.liger_rotary_pos_emb(q, k, cos, sin), ops.rope(q, k, cos, sin)):
        torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="rotary_dim"):
        F.liger_rope(q, k, cos, sin, rotary_dim=4)
    lp, lq = torch.randn(3, 9).log_softmax(-1), torch.randn(3, 9).log_softmax(-1)
    torch.testing.assert_close(F.liger_jsd(lp, lq, beta=0.2), ops.jsd(lp, lq, beta=0.2))
    torch.testing.assert_close(F.liger_kl_div(lp, lq, log_target=True), ops.kl_div(lp, lq, "mean", True))
    scores, conv_w, conv_b = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4)
    torch.testing.assert_close(
        F.liger_multi_token_attention(scores, conv_w, conv_b, 1, 1, 1, 1, True),
        ops.multi_token_attention(scores, conv_w, conv_b, padding=1, sparse=True),
    )
    module = T.LigerMultiTokenAttention(3, 4, 3, padding=1)
    torch.testing.assert_close(
        module(scores), ops.multi_token_attention(scores, module.weight, module.bias, 1, 1)
    )
    qkv = torch.randn(3, 2, 3, 9, 4)
    torch.testing.assert_close(
        F.liger_fused_neighborhood_attention(*qkv, 3, 2, 0.4),
        ops.fused_neighborhood_attention(*qkv, kernel_size=3, dilation=2, scale=0.4),
    )


def test_classes_liger_core_may_add_are_built_from_liger_core_modules(monkeypatch):
    class Stand(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()
            self.args = args

    monkeypatch.setattr(core_modules, "LigerMLP", Stand, raising=False)
    built = T.LigerMLP(1e-6, True)
    assert isinstance(built, Stand) and built.args == (1e-6, True)
    monkeypatch.delattr(core_modules, "LigerMLP")
    monkeypatch.setitem(sys.modules, "liger_core.modules.LigerMLP", None)
    with pytest.raises(NotImplementedError, match="LigerMLP"):
        T.LigerMLP()
    with pytest.raises(NotImplementedError, match="llama4"):
        T.liger_llama4_text_rotary_pos_emb(None, None, None)


def test_every_public_name_resolves():
    for name in T.__all__:
        assert getattr(T, name) is not None, name
    for name in F.__all__ + C.__all__:
        assert getattr(F if name in F.__all__ else C, name) is not None, name


# ------------------------------------------------------------------------------------------- chunked losses


def _pref_batch(pairs=2, seq=6, hidden=8, vocab=24):
    x = torch.randn(2 * pairs, seq, hidden)
    target = torch.randint(0, vocab, (2 * pairs, seq))
    target[:, :2] = -100  # prompt positions
    w = torch.randn(vocab, hidden) * 0.5
    return x, w, target


def _grads(loss_fn, *tensors):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    loss = loss_fn(*leaves)
    loss = loss[0] if isinstance(loss, tuple) else loss
    loss.backward()
    return loss.detach(), [t.grad for t in leaves]


def test_dpo_returns_liger_kernels_structure_with_liger_cores_loss():
    from liger_core.losses import fused_linear_dpo_loss

    x, w, target = _pref_batch()
    ref_x, ref_w = torch.randn_like(x), torch.randn_like(w)
    dpo = C.LigerFusedLinearDPOLoss(beta=0.2)
    loss, aux = dpo(w, x, target, None, ref_x, ref_w)
    assert len(aux) == 7
    chosen, rejected, chosen_mean, rejected_mean, nll, chosen_r, rejected_r = aux
    assert chosen.shape == rejected.shape == chosen_r.shape == (2,) and chosen_mean.dim() == nll.dim() == 0
    core = lambda h, W: fused_linear_dpo_loss(h, W, target, ref_hidden=ref_x, ref_weight=ref_w, beta=0.2)[0]  # noqa: E731
    want, want_grads = _grads(core, x, w)
    got, got_grads = _grads(lambda h, W: dpo(W, h, target, None, ref_x, ref_w), x, w)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # rewards are beta * (policy - reference) sequence log-probs
    ref_chosen, ref_rejected = C.LigerFusedLinearDPOLoss(use_ref_model=False)(ref_w, ref_x, target)[1][:2]
    torch.testing.assert_close(chosen_r, 0.2 * (chosen - ref_chosen), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rejected_r, 0.2 * (rejected - ref_rejected), rtol=1e-5, atol=1e-5)
    # compute_nll_loss adds alpha times the chosen NLL that aux reports (0 without the term, as Liger-Kernel)
    assert nll == 0
    with_nll = C.LigerFusedLinearDPOLoss(beta=0.2, alpha=0.5, compute_nll_loss=True)
    nll_loss, nll_aux = with_nll(w, x, target, None, ref_x, ref_w)
    assert nll_aux[4] > 0
    torch.testing.assert_close(nll_loss, loss + 0.5 * nll_aux[4], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="ref_input"):
        dpo(w, x, target)


def test_orpo_cpo_simpo_structures():
    from liger_core.losses import fused_linear_cpo_loss, fused_linear_orpo_loss, fused_linear_simpo_loss

    x, w, target = _pref_batch()
    loss, aux = C.LigerFusedLinearORPOLoss(beta=0.3)(w, x, target)
    assert len(aux) == 9 and aux[0].shape == (2,)
    torch.testing.assert_close(loss, fused_linear_orpo_loss(x, w, target, beta=0.3)[0], rtol=0, atol=0)
    torch.testing.assert_close(aux[5], 0.3 * aux[0])  # rewards: beta * average log-probs
    assert bool((aux[0] <= 0).all())  # averages of log-probs

    cpo = C.LigerFusedLinearCPOLoss(beta=0.2, alpha=0.7)
    loss, aux = cpo(w, x, target)
    assert len(aux) == 7
    want = fused_linear_cpo_loss(x, w, target, beta=0.2, cpo_alpha=0.7)[0]
    torch.testing.assert_close(loss, want, rtol=0, atol=0)
    no_nll = C.LigerFusedLinearCPOLoss(beta=0.2, alpha=0.7, compute_nll_loss=False)(w, x, target)[0]
    torch.testing.assert_close(loss, no_nll + 0.7 * aux[4], rtol=1e-5, atol=1e-6)

    simpo = C.LigerFusedLinearSimPOLoss(beta=2.0, gamma=0.4, compute_nll_loss=False)
    loss, aux = simpo(w, x, target)
    assert len(aux) == 7
    want = fused_linear_simpo_loss(x, w, target, beta=2.0, simpo_gamma=0.4, cpo_alpha=0.0)[0]
    torch.testing.assert_close(loss, want, rtol=0, atol=0)
    expected = -torch.nn.functional.logsigmoid(2.0 * (aux[0] - aux[1]) - 0.4).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_kto_structure_and_loss():
    from liger_core.losses import fused_linear_kto_loss

    x, w, target = _pref_batch(pairs=2)
    labels = torch.tensor([True, False, True, False])
    loss, aux = C.LigerFusedLinearKTOLoss(beta=0.1)(x, w, target, None, labels)
    assert len(aux) == 6 and all(a.dim() == 0 for a in aux)
    want = fused_linear_kto_loss(x, w, target, labels, ref_logps=torch.zeros(4), beta=0.1)[0]
    torch.testing.assert_close(loss, want, rtol=0, atol=0)
    torch.testing.assert_close(
        aux[4], 0.1 * aux[0], rtol=1e-5, atol=1e-6
    )  # no reference: rewards = beta logps
    with pytest.raises(ValueError, match="preference_labels"):
        C.LigerFusedLinearKTOLoss()(x, w, target)


def test_grpo_structure_and_loss():
    from liger_core.losses import fused_linear_grpo_loss, grpo_options

    x = torch.randn(3, 5, 8)
    w = torch.randn(20, 8)
    ids = torch.randint(0, 20, (3, 5))
    mask = torch.ones(3, 5)
    mask[0, 3:] = 0
    adv = torch.randn(3)
    ref = torch.randn(3, 5) - 3
    old = torch.randn(3, 5) - 3
    loss, metrics = C.LigerFusedLinearGRPOLoss(beta=0.05)(x, w, ids, mask, adv, None, ref, old)
    assert len(metrics) == 2  # kl, clip ratio
    options = grpo_options(beta=0.05, epsilon_high=0.2, use_bias_correction_kl=False)
    want = fused_linear_grpo_loss(
        x, w, ids, advantages=adv, completion_mask=mask, ref_per_token_logps=ref, old_per_token_logps=old,
        options=options,
    )[0]  # fmt: skip
    torch.testing.assert_close(loss, want, rtol=0, atol=0)
    _, metrics = C.LigerFusedLinearGRPOLoss(beta=0.0)(x, w, ids, mask, adv)
    assert len(metrics) == 1


def test_jsd_distillation_loss():
    student, teacher = torch.randn(2, 4, 8), torch.randn(2, 4, 12)
    sw, tw = torch.randn(VOCAB // 8, 8), torch.randn(VOCAB // 8, 12)
    labels = torch.randint(0, VOCAB // 8, (2, 4))
    labels[0, 0] = -100
    loss_fn = C.LigerFusedLinearJSDLoss(weight_hard_loss=0.3, weight_soft_loss=0.7, beta=0.4, temperature=2.0)
    loss = loss_fn(student, sw, teacher, tw, labels)
    full, soft, hard = C.LigerFusedLinearJSDLoss(0.3, 0.7, 0.4, temperature=2.0, return_soft_hard_loss=True)(
        student, sw, teacher, tw, labels
    )
    torch.testing.assert_close(loss, full, rtol=0, atol=0)
    torch.testing.assert_close(full, 0.3 * hard + 0.7 * soft, rtol=1e-6, atol=1e-7)
    flat = labels.reshape(-1)
    ce = torch.nn.functional.cross_entropy(student.reshape(-1, 8) @ sw.T, flat)
    torch.testing.assert_close(hard, ce, rtol=1e-5, atol=1e-6)
    want_soft = ops.fused_linear_jsd(student.reshape(-1, 8), sw, teacher.reshape(-1, 12), tw, flat, beta=0.4,
                                     temperature=2.0)  # fmt: skip
    torch.testing.assert_close(soft, want_soft, rtol=0, atol=0)


def test_liger_core_is_used_not_reimplemented():
    assert liger_core.apply_liger_kernel is not None  # the patch functions go through liger_core's patching
    model = tiny_model("llama")
    report = T.apply_liger_kernel_to_llama(model=model)
    assert type(report).__name__ == "PatchReport" and report.model_type == "llama"


def test_cosine_similarity_loss_is_liger_cores():
    from liger_core.losses import LigerFusedLinearCosineSimilarityLoss as Core

    torch.manual_seed(0)
    student, weight = torch.randn(2, 5, 8), torch.randn(24, 8)
    teacher, teacher_w = torch.randn(2, 5, 6), torch.randn(30, 6)
    labels = torch.randint(0, 24, (2, 5))
    labels[0, 0] = -100
    kwargs = dict(weight_hard_loss=0.4, weight_soft_loss=0.6, beta=0.3, temperature=2.0)
    compat = C.LigerFusedLinearCosineSimilarityLoss(
        compiled=False, chunk_size=4, return_soft_hard_loss=True, **kwargs
    )
    loss, soft, hard = compat(student, weight, teacher, teacher_w, labels)
    want = Core(return_soft_hard_loss=True, **kwargs)(student, weight, teacher, teacher_w, labels)
    for a, b in zip((loss, soft, hard), want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(loss, 0.4 * hard + 0.6 * soft, rtol=1e-6, atol=0)


def test_vocab_parallel_cross_entropy_single_rank():
    torch.manual_seed(0)
    logits, target = torch.randn(4, 3, 20), torch.randint(0, 20, (4, 3))
    target[0, 0] = -100
    got = T.LigerVocabParallelCrossEntropy()(logits, target)
    want = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    assert got.shape == (4, 3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(NotImplementedError, match="label_smoothing"):
        T.LigerVocabParallelCrossEntropy(label_smoothing=0.1)
    with pytest.raises(ValueError, match="3-D"):
        T.LigerVocabParallelCrossEntropy()(logits[0], target[0])

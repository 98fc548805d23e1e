"""The patching API on Llama-shaped tiny models: idempotence, revert, reports, state_dict round trip, the
fused loss forward's HF contract (logits/loss rules, shift_labels, num_items_in_batch, logits_to_keep,
tuples), cross_entropy=True, attention implementations, instance isolation, class-level patching and the
Auto class."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from tiny_models import batch, tiny_config, tiny_model

import liger_core
from liger_core.patching import PatchReport, UnsupportedModelError, is_patched, revert_model_type
from liger_core.patching import causal_lm as cl
from liger_core.patching import rope_variants as rv
from liger_core.patching.introspect import innermost_function


def _loss_and_grads(model, **inputs):
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    out.loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(a, b, rtol=1e-4, atol=1e-6):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def _liger_markers(model):
    def own(m):
        return sorted(k for k in m.__dict__ if k.startswith("_liger_core") or k == "forward")

    return {n: own(m) for n, m in model.named_modules()}


# ----------------------------------------------------------------------------------------------------------
# idempotence, revert, report, state_dict
# ----------------------------------------------------------------------------------------------------------


def test_second_call_changes_nothing_and_says_already_patched(caplog):
    model = tiny_model("llama")
    with caplog.at_level(logging.INFO, logger="liger_core"):
        first = liger_core.apply_liger_kernel(model)
    assert [r.getMessage() for r in caplog.records] == [str(first)]  # logged once per call
    assert str(first).startswith("liger_core: patched llama: rms_norm x5, swiglu x2, rope x2")
    forwards = {n: m.__dict__.get("forward") for n, m in model.named_modules()}

    second = liger_core.apply_liger_kernel(model)
    assert isinstance(second, PatchReport) and not second and second.swapped == {}
    assert second.already == first.swapped
    assert "already patched" in str(second)
    assert {n: m.__dict__.get("forward") for n, m in model.named_modules()} == forwards


def test_revert_restores_forwards_and_outputs():
    model = tiny_model("llama")
    ids, labels = batch(1, seq_len=8)
    model.eval()
    with torch.no_grad():
        ref = model(input_ids=ids, labels=labels)
    markers = _liger_markers(model)
    liger_core.apply_liger_kernel(model)
    assert _liger_markers(model) != markers
    liger_core.revert(model)
    assert _liger_markers(model) == markers  # no forward, no marker left in any module's __dict__
    assert not is_patched(model)
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=0)
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=0)
    liger_core.revert(model)  # reverting an unpatched model is a no-op
    assert liger_core.apply_liger_kernel(model).swapped["rms_norm"] == 5  # and it can be patched again


def test_flags_select_kinds_and_ce_with_flce_is_rejected():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="exclusive"):
        liger_core.apply_liger_kernel(model, cross_entropy=True)
    report = liger_core.apply_liger_kernel(model, rope=False, swiglu=False, fused_linear_cross_entropy=False)
    assert report.swapped == {"rms_norm": 5}
    report = liger_core.apply_liger_kernel(model)  # the rest can be added later
    assert report.swapped == {"swiglu": 2, "rope": 2, "fused_linear_cross_entropy": 1}
    assert report.already == {"rms_norm": 5}


def test_state_dict_unchanged_and_checkpoint_loads_in_vanilla_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_model("llama", tie_word_embeddings=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params_before = {n: p.data_ptr() for n, p in model.named_parameters()}
    liger_core.apply_liger_kernel(model)
    after = model.state_dict()
    assert list(after) == list(before)
    for k in before:
        assert torch.equal(after[k], before[k]), k
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == params_before  # no parameter re-created

    ids, _ = batch(2, seq_len=8)
    model.save_pretrained(tmp_path)
    vanilla = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not is_patched(vanilla)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            vanilla(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-5
        )


# ----------------------------------------------------------------------------------------------------------
# the fused-linear-cross-entropy forward's contract
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_pair():
    """An unpatched and a patched copy of the same tiny Llama (tied embeddings)."""
    ref = tiny_model("llama", seed=7, tie_word_embeddings=True)
    patched = tiny_model("llama", seed=7, tie_word_embeddings=True)
    liger_core.apply_liger_kernel(patched)
    return ref, patched


def test_logits_rules(llama_pair):
    ref, model = llama_pair
    ids, labels = batch(3, seq_len=6)
    model.train()
    assert model(input_ids=ids, labels=labels).logits is None  # training with labels: no logits
    out = model(input_ids=ids, labels=labels, skip_logits=False)  # asked for them
    ref.train()
    expected = ref(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
    assert model(input_ids=ids).logits is not None  # no labels: logits
    with pytest.raises(ValueError, match="skip_logits"):
        model(input_ids=ids, skip_logits=True)
    model.eval()
    ref.eval()
    with torch.no_grad():  # eval with labels: logits and loss
        out, expected = model(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
        torch.testing.assert_close(out.logits, expected.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
        # logits_to_keep (generation) and return_dict=False
        last = model(input_ids=ids, logits_to_keep=1)
        torch.testing.assert_close(last.logits, expected.logits[:, -1:], rtol=1e-5, atol=1e-5)
        tup = model(input_ids=ids, labels=labels, return_dict=False)
        assert isinstance(tup, tuple)
        torch.testing.assert_close(tup[0], expected.loss, rtol=1e-5, atol=1e-6)


def test_generate_matches_unpatched(llama_pair):
    """Greedy decoding with the KV cache (rope at shifted positions, logits_to_keep=1): the same tokens."""
    ref, model = llama_pair
    ids, _ = batch(9, batch_size=1, seq_len=5)
    expected = ref.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0), expected)


def test_shift_labels_equal_labels(llama_pair):
    _, model = llama_pair
    ids, labels = batch(4, seq_len=6)
    shift = F.pad(labels, (0, 1), value=-100)[:, 1:]
    a, ga = _loss_and_grads(model, input_ids=ids, labels=labels)
    b, gb = _loss_and_grads(model, input_ids=ids, shift_labels=shift)
    assert b.logits is None
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-6, atol=1e-7)
    _assert_grads_close(gb, ga, rtol=1e-5, atol=1e-7)


def test_gradient_accumulation_matches_one_big_batch(llama_pair):
    """Two micro-batches, each divided by the whole batch's token count (HF's num_items_in_batch), give the
    gradients of one step on both; also equal to the unpatched model's, the bug class Liger-Kernel had."""
    ref, model = llama_pair
    ids, labels = batch(5, batch_size=3, seq_len=6)
    labels[2, :4] = -100  # micro-batches with different numbers of target tokens
    n_items = int((labels[:, 1:] != -100).sum())
    full, g_full = _loss_and_grads(model, input_ids=ids, labels=labels)

    model.zero_grad(set_to_none=True)
    total = 0.0
    for part in (slice(0, 1), slice(1, 3)):
        out = model(input_ids=ids[part], labels=labels[part], num_items_in_batch=torch.tensor(n_items))
        out.loss.backward()
        total += out.loss.item()
    g_acc = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    assert total == pytest.approx(full.loss.item(), rel=1e-5)
    _assert_grads_close(g_acc, g_full)

    ref.zero_grad(set_to_none=True)
    ref.train()
    for part in (slice(0, 1), slice(1, 3)):
        ref(
            input_ids=ids[part], labels=labels[part], num_items_in_batch=torch.tensor(n_items)
        ).loss.backward()
    _assert_grads_close(g_acc, {n: p.grad for n, p in ref.named_parameters() if p.grad is not None})


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_attention_implementations(attn):
    ref = tiny_model("llama", seed=9, attn_implementation=attn)
    model = tiny_model("llama", seed=9, attn_implementation=attn)
    assert model.config._attn_implementation == attn
    ids, labels = batch(6, seq_len=8)
    a, ga = _loss_and_grads(ref, input_ids=ids, labels=labels)
    liger_core.apply_liger_kernel(model)
    b, gb = _loss_and_grads(model, input_ids=ids, labels=labels)
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-6)
    _assert_grads_close(gb, ga)


def test_moe_router_aux_loss_is_added():
    """Mixtral with output_router_logits: the fused loss plus router_aux_loss_coef * load-balancing loss."""
    ref = tiny_model("mixtral", seed=15, output_router_logits=True, router_aux_loss_coef=0.5)
    model = tiny_model("mixtral", seed=15, output_router_logits=True, router_aux_loss_coef=0.5)
    liger_core.apply_liger_kernel(model)
    ids, labels = batch(14, seq_len=6)
    a, ga = _loss_and_grads(ref, input_ids=ids, labels=labels)
    b, gb = _loss_and_grads(model, input_ids=ids, labels=labels)
    assert a.aux_loss is not None and b.logits is None and b.router_logits is not None
    torch.testing.assert_close(b.aux_loss, a.aux_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-6)
    _assert_grads_close(gb, ga)


def test_cross_entropy_flag_is_instance_level():
    ref = tiny_model("llama", seed=11)
    model = tiny_model("llama", seed=11)
    global_ce = F.cross_entropy
    report = liger_core.apply_liger_kernel(model, cross_entropy=True, fused_linear_cross_entropy=False)
    assert report.swapped["cross_entropy"] == 1
    assert model.loss_function is cl.liger_causal_lm_loss
    assert F.cross_entropy is global_ce and ref.loss_function is not cl.liger_causal_lm_loss
    ids, labels = batch(7, seq_len=8)
    a, ga = _loss_and_grads(ref, input_ids=ids, labels=labels)
    b, gb = _loss_and_grads(model, input_ids=ids, labels=labels)
    assert b.logits is not None and b.loss.dtype == torch.float32
    torch.testing.assert_close(b.logits, a.logits)  # fp32 logits are the output: never written over
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-6)
    _assert_grads_close(gb, ga)
    switched = liger_core.apply_liger_kernel(model)  # asking for the fused loss now: refused, with a reason
    assert "fused_linear_cross_entropy" not in switched.swapped
    assert any("revert" in s for s in switched.missing["fused_linear_cross_entropy"])
    liger_core.revert(model)
    assert "_loss_function" not in model.__dict__ and model.loss_function is not cl.liger_causal_lm_loss


def test_unfused_loss_overwrites_only_its_own_upcast(monkeypatch):
    """bf16 model, fused_linear_cross_entropy=False: the loss writes its gradient over the fp32 upcast it made
    (one logits-sized buffer less), never over the bf16 logits the model returns; loss and gradients match
    the unpatched model's. (The fp32 model of the test above keeps the copy-free path: no in-place there.)"""
    ref = tiny_model("llama", seed=12).to(torch.bfloat16)
    model = tiny_model("llama", seed=12).to(torch.bfloat16)
    flags = dict(
        rms_norm=False, rope=False, swiglu=False, cross_entropy=True, fused_linear_cross_entropy=False
    )
    liger_core.apply_liger_kernel(model, **flags)  # the loss alone differs from the unpatched model
    calls = []
    op = liger_core.ops.cross_entropy
    monkeypatch.setattr(
        liger_core.ops, "cross_entropy", lambda *a, **k: calls.append(k["inplace_backward"]) or op(*a, **k)
    )
    ids, labels = batch(7, seq_len=8)
    a, ga = _loss_and_grads(ref, input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(29))
    b, gb = _loss_and_grads(model, input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(29))
    assert calls == [True]
    assert b.logits.dtype == torch.bfloat16 and torch.equal(b.logits, a.logits)
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-6)
    _assert_grads_close(gb, ga)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_unfused_loss_peak_memory_cuda():
    """bf16 llama, vocabulary 32000, 2048 tokens, fused_linear_cross_entropy=False: the patched loss's
    fwd+bwd peak is at least one fp32 logits buffer below HF's (its gradient overwrites its own upcast)."""
    ids = torch.randint(3, 32000, (4, 512)).cuda()
    labels = ids.clone()
    peaks = []
    for patched in (False, True):
        model = tiny_model("llama", vocab_size=32000, max_position_embeddings=512)
        model = model.to(device="cuda", dtype=torch.bfloat16)
        if patched:
            flags = dict(rms_norm=False, rope=False, swiglu=False, fused_linear_cross_entropy=False)
            liger_core.apply_liger_kernel(model, cross_entropy=True, **flags)
        _loss_and_grads(model, input_ids=ids, labels=labels)  # warm-up (compiles, allocator caches)
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out, _ = _loss_and_grads(model, input_ids=ids, labels=labels)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        del model, out
    fp32_logits = ids.numel() * 32000 * 4
    assert peaks[1] <= peaks[0] - 0.9 * fp32_logits, (peaks, fp32_logits)


def test_patching_one_instance_leaves_other_models_alone():
    import transformers.models.llama.modeling_llama as modeling_llama

    rope_before = modeling_llama.apply_rotary_pos_emb
    forward_before = modeling_llama.LlamaForCausalLM.forward
    patched, other = tiny_model("llama"), tiny_model("llama")
    liger_core.apply_liger_kernel(patched)
    assert modeling_llama.apply_rotary_pos_emb is rope_before
    assert modeling_llama.LlamaForCausalLM.forward is forward_before
    assert not is_patched(other)
    attn = patched.model.layers[0].self_attn
    patched_code = innermost_function(attn.forward.__func__)
    assert patched_code.__globals__["apply_rotary_pos_emb"] is rv.liger_rotary_pos_emb
    assert attn.forward.__func__.__code__ is type(attn).forward.__code__


def test_torch_compile_traces_the_patched_rope(monkeypatch):
    """torch.compile resolves a function's globals through ``sys.modules[__name__]`` when the globals have a
    ``__name__``: the rope-patched attention forward's globals must not claim to be the modeling module's, or
    dynamo would trace HF's apply_rotary_pos_emb (it failed outright before that was fixed)."""
    model = tiny_model("llama", num_hidden_layers=1)
    liger_core.apply_liger_kernel(model)
    ids, _ = batch(10, batch_size=1, seq_len=6)
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    rope, calls = liger_core.ops.rope, []

    def counting_rope(*args, **kwargs):
        calls.append(1)
        return rope(*args, **kwargs)

    monkeypatch.setattr(liger_core.ops, "rope", counting_rope)
    torch._dynamo.reset()
    with torch.no_grad():
        logits = torch.compile(model, backend="eager")(input_ids=ids).logits
    torch._dynamo.reset()
    assert calls
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------
# class level, generated functions, Auto class, unsupported types
# ----------------------------------------------------------------------------------------------------------


def test_generated_class_level_functions_exist_for_every_recipe():
    for model_type in liger_core.recipe_model_types():
        name = f"apply_liger_kernel_to_{model_type}"
        assert name in liger_core.patching.__all__
        assert getattr(liger_core, name) is getattr(liger_core.patching, name)
        assert callable(getattr(liger_core, name))


def test_class_level_patch_builds_liger_models_and_reverts():
    import transformers.models.llama.modeling_llama as modeling_llama
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    originals = (modeling_llama.LlamaRMSNorm, modeling_llama.LlamaMLP, modeling_llama.apply_rotary_pos_emb)
    ref = tiny_model("llama", seed=13)
    ids, labels = batch(8, seq_len=8)
    a, ga = _loss_and_grads(ref, input_ids=ids, labels=labels)
    try:
        report = liger_core.apply_liger_kernel_to_llama()
        assert report.method == "class"
        assert report.swapped == {"rms_norm": 1, "swiglu": 1, "rope": 1, "fused_linear_cross_entropy": 1}
        assert not liger_core.apply_liger_kernel_to_llama()  # idempotent
        assert modeling_llama.apply_rotary_pos_emb is rv.liger_rotary_pos_emb
        assert cl.is_causal_lm_forward(LlamaForCausalLM.forward)
        try:
            from transformers.monkey_patching import get_patch_mapping

            assert (
                get_patch_mapping()["^LlamaRMSNorm$"] is modeling_llama.LlamaRMSNorm
            )  # transformers' own hook
        except ImportError:  # transformers < 5.3
            pass
        builders = (
            lambda: LlamaForCausalLM(tiny_config("llama")),  # direct construction: module attributes
            lambda: AutoModelForCausalLM.from_config(tiny_config("llama")),  # + transformers' hook
        )
        for build in builders:
            built = build()
            assert type(built.model.norm).__name__ == "LigerLlamaRMSNorm"
            assert (
                isinstance(built.model.norm, originals[0]) and built.model.norm._liger_core_kind == "rms_norm"
            )
            assert built.model.layers[0].mlp._liger_core_kind == "swiglu"
            assert is_patched(built)
        built = tiny_model("llama", seed=13)  # same weights as ref, built patched
        assert list(built.state_dict()) == list(ref.state_dict())
        b, gb = _loss_and_grads(built, input_ids=ids, labels=labels)
        assert b.logits is None
        torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-6)
        _assert_grads_close(gb, ga)
        instance_report = liger_core.apply_liger_kernel(built)  # instance patching sees the class-level work
        assert not instance_report and instance_report.already["rms_norm"] == 5
    finally:
        revert_model_type("llama")
    assert (
        modeling_llama.LlamaRMSNorm,
        modeling_llama.LlamaMLP,
        modeling_llama.apply_rotary_pos_emb,
    ) == originals
    assert "forward" in LlamaForCausalLM.__dict__ and not cl.is_causal_lm_forward(LlamaForCausalLM.forward)
    try:
        from transformers.monkey_patching import get_patch_mapping

        assert "^LlamaRMSNorm$" not in get_patch_mapping()
    except ImportError:
        pass
    assert not is_patched(tiny_model("llama"))


def test_class_level_model_argument_patches_the_instance():
    model = tiny_model("qwen2")
    report = liger_core.apply_liger_kernel_to_qwen2(model=model)
    assert report.method == "recipe" and report.swapped["rms_norm"] == 5
    import transformers.models.qwen2.modeling_qwen2 as modeling_qwen2

    assert not getattr(modeling_qwen2.Qwen2RMSNorm, "_liger_core_norm_spec", None)


def test_auto_class(tmp_path):
    from liger_core import AutoLigerKernelForCausalLM

    try:
        model = AutoLigerKernelForCausalLM.from_config(tiny_config("qwen3"))
        assert is_patched(model) and model.model.layers[0].self_attn.q_norm._liger_core_kind == "rms_norm"
        model.save_pretrained(tmp_path)
        loaded = AutoLigerKernelForCausalLM.from_pretrained(tmp_path, rope=False)
        assert is_patched(loaded)
    finally:
        revert_model_type("qwen3")
    with pytest.raises(OSError, match="from_pretrained"):
        AutoLigerKernelForCausalLM()


class _NothingToPatch(torch.nn.Module):
    """A model of an unknown type with nothing liger_core recognises."""

    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"model_type": "mystery_lm"})()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(x)


def test_unsupported_model_type_messages():
    with pytest.raises(UnsupportedModelError, match=r"mystery_lm.*Model types with a recipe: gemma, gemma2"):
        liger_core.apply_liger_kernel(_NothingToPatch())
    with pytest.raises(UnsupportedModelError, match="Model types with a recipe:.*llama.*smollm3"):
        liger_core.patching.apply_liger_kernel_to("gpt2")
    assert issubclass(UnsupportedModelError, ValueError)
    assert liger_core.recipe_model_types() == sorted(liger_core.patching.RECIPES)
    # supported: the recipes and the types the zoo patched exactly (liger_core/patching/zoo_coverage.json)
    supported = liger_core.supported_model_types()
    assert supported == sorted(set(supported)) and set(liger_core.recipe_model_types()) <= set(supported)
    assert "mystery_lm" not in supported


# ----------------------------------------------------------------------------------------------------------
# the patched forward's signature


def _params(fn) -> list[str]:
    import inspect

    return list(inspect.signature(fn).parameters)


def test_patched_forward_reports_the_class_forwards_signature():
    """The HF Trainer keeps only the dataset columns the forward's signature names (remove_unused_columns):
    a patched forward must name every input of the class forward (a VLM's pixel_values, image_grid_thw)."""
    from transformers import LlamaForCausalLM

    class_params = _params(LlamaForCausalLM.forward)[1:]  # without self
    model = tiny_model("llama")
    liger_core.apply_liger_kernel(model)
    assert cl.is_causal_lm_forward(model.forward.__func__)
    assert _params(model.forward) == class_params
    try:
        liger_core.apply_liger_kernel_to_llama()
        assert cl.is_causal_lm_forward(LlamaForCausalLM.forward)
        assert _params(LlamaForCausalLM.forward)[1:] == class_params
    finally:
        revert_model_type("llama")
    assert _params(LlamaForCausalLM.forward)[1:] == class_params

    def undecorated(self, input_ids=None, pixel_values=None, image_grid_thw=None, labels=None, **kwargs):
        raise AssertionError("replaced")

    forward = cl.causal_lm_forward_for(undecorated)
    assert forward is not cl.causal_lm_forward and cl.is_causal_lm_forward(forward)
    assert _params(forward) == _params(undecorated)
    assert "pixel_values" not in _params(cl.causal_lm_forward)  # the shared function is left as it is


def test_model_coverage_reads_the_zoo_records_as_copies():
    """liger_core/patching/zoo_coverage.json (generated by tests/patching/zoo.py, checked by test_zoo.py)."""
    data = liger_core.patching.coverage()
    assert data["transformers"] and data["types"]["llama"] == liger_core.model_coverage("llama")
    record = liger_core.model_coverage("llama")
    assert record["exact"] and record["method"] == "recipe" and record["swapped"]
    record["exact"] = False  # a copy: the package data is unchanged
    assert liger_core.model_coverage("llama")["exact"]
    assert liger_core.model_coverage("mystery_lm") is None
    exact = {t for t, r in data["types"].items() if r["exact"] and ":" not in t}
    assert exact - {t.split(":")[0] for t, r in data["types"].items() if not r["exact"]} <= set(
        liger_core.supported_model_types()
    )

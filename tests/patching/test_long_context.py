"""Long-sequence flags: ``tiled_mlp`` (MLPs over sequence tiles) and ``offload_checkpoints`` (checkpointed
layer inputs in host memory) give the unpatched model's loss and gradients, and actually do what they say
(tiles: the projections run once per tile; offload: every layer input goes out and comes back)."""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import assert_no_worse_than_eager, devices
from tiny_models import batch, tiny_model

import liger_core
from liger_core import tuning
from liger_core.modules.long_context import (
    OFFLOAD_COUNTS,
    offloaded_checkpoint,
    release_pinned_memory,
    tiled_mlp,
)
from liger_core.patching import (
    apply_liger_kernel,
    apply_liger_kernel_to,
    patched_kinds,
    revert,
    revert_model_type,
)

ONLY = dict(rope=False, rms_norm=False, swiglu=False, geglu=False, fused_linear_cross_entropy=False)


def _step(model, ids, labels):
    model.train()
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _assert_same(got, want, rtol=2e-5):
    loss, grads = got
    want_loss, want_grads = want
    torch.testing.assert_close(loss, want_loss, rtol=rtol, atol=0)
    assert grads.keys() == want_grads.keys()
    for name, g in grads.items():
        scale = want_grads[name].abs().max().item()
        torch.testing.assert_close(g, want_grads[name], rtol=rtol, atol=rtol * scale, msg=name)


def _count_calls(model, suffix: str) -> list[int]:
    calls = [0]
    for name, m in model.named_modules():
        if name.endswith(suffix) and isinstance(m, torch.nn.Linear):
            m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


# ----------------------------------------------------------------------------------------------------------
# tiled_mlp
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernels", [False, True], ids=["tiles-only", "with-kernels"])
def test_tiled_mlp_matches_unpatched(kernels):
    ref, model = tiny_model("llama", seed=3), tiny_model("llama", seed=3)
    ids, labels = batch(5, batch_size=2, seq_len=11)  # 22 tokens: tiles of 5, 5, 5, 5, 2
    want = _step(ref, ids, labels)
    report = apply_liger_kernel(model, tiled_mlp=True, **({} if kernels else ONLY))
    assert report.swapped["tiled_mlp"] == 2 and ("swiglu" in report.swapped) == kernels, str(report)
    calls = _count_calls(model, "layers.0.mlp.gate_proj")
    with tuning.override(mlp_tile_tokens=5):
        got = _step(model, ids, labels)
    assert calls[0] == 5 + 5  # each tile once in forward, once in backward's recompute
    _assert_same(got, want)
    assert patched_kinds(model).get("swiglu" if kernels else "tiled_mlp") == 2
    revert(model)
    _assert_same(_step(model, ids, labels), want)


def test_tiled_mlp_short_input_runs_untiled():
    model = tiny_model("llama", seed=3)
    apply_liger_kernel(model, tiled_mlp=True, **ONLY)
    calls = _count_calls(model, "layers.0.mlp.gate_proj")
    ids, labels = batch(5, batch_size=1, seq_len=6)
    with tuning.override(mlp_tile_tokens=6):
        _step(model, ids, labels)
    assert calls[0] == 1


def test_tiled_mlp_under_lora_and_checkpointing():
    peft = pytest.importorskip("peft")

    def build():
        base = tiny_model("llama", seed=4)
        config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear")
        model = peft.get_peft_model(base, config)
        with torch.no_grad():  # LoRA B starts at zero: make the adapters matter
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.1)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model

    ref, model = build(), build()
    ids, labels = batch(6, batch_size=2, seq_len=9)
    want = _step(ref, ids, labels)
    assert any("lora_B" in n and "mlp" in n for n in want[1])
    apply_liger_kernel(model, tiled_mlp=True)
    with tuning.override(mlp_tile_tokens=4):
        got = _step(model, ids, labels)
    _assert_same(got, want)


def test_tiled_mlp_class_level():
    from transformers.models.llama import modeling_llama

    ids, labels = batch(7, batch_size=2, seq_len=7)
    want = _step(tiny_model("llama", seed=8), ids, labels)
    try:
        report = apply_liger_kernel_to("llama", tiled_mlp=True, **ONLY)
        assert report.swapped.get("tiled_mlp") == 1, str(report)
        model = tiny_model("llama", seed=8)
        assert isinstance(model.model.layers[0].mlp, modeling_llama.LlamaMLP)
        calls = _count_calls(model, "layers.1.mlp.up_proj")
        with tuning.override(mlp_tile_tokens=4):
            got = _step(model, ids, labels)
    finally:
        revert_model_type("llama")
    assert calls[0] == 4 + 4
    _assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_mlp_function_against_float64(dtype):
    """Output, input gradient and weight gradients of a SiLU-gated MLP over 4 tiles, against float64: no
    worse than the untiled MLP in the same dtype."""
    hidden, inter, tokens = 24, 40, 29
    f64 = torch.float64
    ws64 = [torch.randn(inter, hidden, dtype=f64) / 5, torch.randn(inter, hidden, dtype=f64)]
    ws64.append(torch.randn(hidden, inter, dtype=f64) / 6)
    x64 = torch.randn(2, tokens, hidden, dtype=torch.float64)
    dy64 = torch.randn(2, tokens, hidden, dtype=torch.float64)

    def mlp(ws):
        return lambda x: torch.nn.functional.linear(
            torch.nn.functional.silu(x @ ws[0].T) * (x @ ws[1].T), ws[2]
        )

    def run(dt, tiled):
        ws = [w.to(dt, copy=True).requires_grad_(True) for w in ws64]
        x = x64.to(dt, copy=True).requires_grad_(True)
        y = tiled_mlp(mlp(ws), x, ws, tile_tokens=16) if tiled else mlp(ws)(x)
        y.backward(dy64.to(dt))
        return [y, x.grad, *[w.grad for w in ws]]

    ref, eager, ours = run(torch.float64, False), run(dtype, False), run(dtype, True)
    for name, o, e, r in zip(("y", "dx", "dw_gate", "dw_up", "dw_down"), ours, eager, ref):
        assert o.dtype == dtype
        assert_no_worse_than_eager(name, o, e, r)


def test_tiled_mlp_rejects_bad_arguments():
    with pytest.raises(ValueError, match="tile_tokens"):
        tiled_mlp(torch.nn.Identity(), torch.randn(3, 4), [], tile_tokens=0)
    with pytest.raises(TypeError, match="x"):
        tiled_mlp(torch.nn.Identity(), [1.0], [])


# ----------------------------------------------------------------------------------------------------------
# offload_checkpoints
# ----------------------------------------------------------------------------------------------------------


def _checkpointed(seed, **overrides):
    model = tiny_model("llama", seed=seed, **overrides)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("enable_after_patch", [False, True])
def test_offload_checkpoints_matches_and_moves_every_layer_input(enable_after_patch, device):
    # attention dropout: the recompute must draw the forward's masks (random state restored)
    ref = _checkpointed(9, attention_dropout=0.25).to(device)
    ids, labels = (t.to(device) for t in batch(8, batch_size=2, seq_len=10))
    torch.manual_seed(123)
    want = _step(ref, ids, labels)

    model = tiny_model("llama", seed=9, attention_dropout=0.25).to(device)
    if not enable_after_patch:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    report = apply_liger_kernel(model, offload_checkpoints=True, **ONLY)
    assert report.swapped == {"offload_checkpoints": 2}, str(report)
    if enable_after_patch:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for step in range(2):
        OFFLOAD_COUNTS.clear()
        torch.manual_seed(123)
        with tuning.override(checkpoint_offload_min_bytes=0):
            got = _step(model, ids, labels)
        assert OFFLOAD_COUNTS["offloaded"] == 2 and OFFLOAD_COUNTS["fetched"] == 2
        assert OFFLOAD_COUNTS["prefetched"] == 2  # layer 0's input was prefetched by layer 1's backward
        if device == "cuda":  # pinned host buffers: two in the first step, reused in the second
            assert OFFLOAD_COUNTS["pinned_bytes"] == (2 * ids.numel() * 32 * 4 if step == 0 else 0)
        _assert_same(got, want, rtol=1e-6)

    revert(model)  # the wrapper left in the layers calls transformers' checkpoint function again
    OFFLOAD_COUNTS.clear()
    torch.manual_seed(123)
    with tuning.override(checkpoint_offload_min_bytes=0):
        _assert_same(_step(model, ids, labels), want, rtol=1e-6)
    assert not OFFLOAD_COUNTS
    if device == "cuda":
        assert release_pinned_memory() == 2 * ids.numel() * 32 * 4


def test_offload_checkpoints_with_frozen_embeddings_and_all_kernels():
    """LoRA-like: the first layer's input needs no gradient, its parameters do; and every other flag on."""
    ref, model = _checkpointed(10), _checkpointed(10)
    for m in (ref, model):
        m.model.embed_tokens.weight.requires_grad_(False)
    ids, labels = batch(9, batch_size=2, seq_len=12)
    want = _step(ref, ids, labels)
    apply_liger_kernel(model, offload_checkpoints=True, tiled_mlp=True)
    OFFLOAD_COUNTS.clear()
    with tuning.override(checkpoint_offload_min_bytes=0, mlp_tile_tokens=7):
        got = _step(model, ids, labels)
    assert OFFLOAD_COUNTS["offloaded"] == 2
    assert "model.layers.0.self_attn.q_proj.weight" in got[1]
    _assert_same(got, want)


def test_offload_checkpoints_takes_a_layer_call_bound_to_the_layer():
    """transformers 5.6 to 5.16 checkpoint a layer as ``partial(super().__call__, **kwargs)`` (a method bound
    to the layer, no positional layer argument): that call is offloaded too, with the same output and
    gradients as the call itself."""
    model = _checkpointed(12)
    apply_liger_kernel(model, offload_checkpoints=True, **ONLY)
    model.train()
    layer = model.model.layers[0]
    layer.gradient_checkpointing = False  # the bound call below runs the layer's plain forward
    x = torch.randn(2, 6, model.config.hidden_size, requires_grad=True)
    emb = model.model.rotary_emb(x, torch.arange(6)[None].expand(2, -1))
    call = functools.partial(torch.nn.Module.__call__.__get__(layer), position_embeddings=emb)

    def run(fn):
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out = fn(x)
        out = out[0] if isinstance(out, tuple) else out
        out.square().sum().backward()
        grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
        return out.detach(), x.grad.clone(), grads

    want = run(call)
    OFFLOAD_COUNTS.clear()
    with tuning.override(checkpoint_offload_min_bytes=0):
        got = run(lambda t: layer._gradient_checkpointing_func(call, t))
    assert OFFLOAD_COUNTS["offloaded"] == 1 and OFFLOAD_COUNTS["fetched"] == 1
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-7)
    for name, g in got[2].items():
        torch.testing.assert_close(g, want[2][name], rtol=1e-6, atol=1e-7, msg=name)


def test_offload_threshold_keeps_small_inputs_in_place():
    model = _checkpointed(11)
    apply_liger_kernel(model, offload_checkpoints=True, **ONLY)
    OFFLOAD_COUNTS.clear()
    ids, labels = batch(9, batch_size=1, seq_len=5)
    with tuning.override(checkpoint_offload_min_bytes=10**9):
        _step(model, ids, labels)
    assert OFFLOAD_COUNTS["offloaded"] == 0


def test_offloaded_checkpoint_function_without_grad_and_bad_argument():
    x = torch.randn(3, 4)
    assert torch.equal(offloaded_checkpoint(torch.tanh, x), torch.tanh(x))
    with torch.no_grad():
        assert torch.equal(offloaded_checkpoint(torch.tanh, x.requires_grad_()), torch.tanh(x))
    with pytest.raises(TypeError, match="function"):
        offloaded_checkpoint(None, x)


def test_class_level_leaves_offload_to_the_built_model():
    try:
        report = apply_liger_kernel_to("llama", offload_checkpoints=True, **ONLY)
    finally:
        revert_model_type("llama")
    assert any("offload_checkpoints" in s for s in report.skipped) and not report.missing


def test_public_names():
    assert liger_core.patching.KernelFlags().tiled_mlp is False
    assert liger_core.patching.KernelFlags().offload_checkpoints is False

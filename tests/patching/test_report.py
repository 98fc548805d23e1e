"""Patching hides nothing: decorated forwards are seen through, probes compare gradients and never raise,
every kernel asked for is applied or named with its reason, and ``strict=True`` refuses an incomplete
patch."""

from __future__ import annotations

import functools
import types
import warnings

import pytest
import torch
from tiny_models import batch, tiny_model
from torch import nn

import liger_core
from liger_core.patching import PatchIncompleteError, UnsupportedModelError, is_patched
from liger_core.patching import causal_lm as cl
from liger_core.patching import rope_variants as rv
from liger_core.patching.introspect import RewrapError, innermost, rewrap

# ----------------------------------------------------------------------------------------------------------
# Wrapper chains
# ----------------------------------------------------------------------------------------------------------

CALLS: list[str] = []


def counted(tag: str):
    """A functools.wraps decorator that records each call, as transformers' decorators wrap forwards."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            CALLS.append(tag)
            return fn(*args, **kwargs)

        return wrapper

    return decorate


def renames(old: str, new: str):
    """Like transformers' ``deprecate_kwarg``: accept ``old`` for ``new``, with a FutureWarning."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if old in kwargs:
                warnings.warn(f"`{old}` is deprecated, use `{new}`", FutureWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper

    return decorate


def test_rewrap_rebuilds_every_layer_around_the_replacement():
    def base(x):
        return x + 1

    def replacement(x):
        return x * 10

    chain = counted("outer")(counted("inner")(base))
    assert innermost(chain) is base
    CALLS.clear()
    rebuilt = rewrap(chain, replacement)
    assert rebuilt(2) == 20 and CALLS == ["outer", "inner"]
    assert innermost(rebuilt) is replacement and chain(2) == 3  # the original chain is unchanged

    partial = functools.partial(chain, 5)
    assert rewrap(partial, replacement)() == 50

    class Holder:
        def method(self, x):
            return x

    bound = types.MethodType(counted("m")(Holder.method), Holder())
    assert rewrap(bound, lambda self, x: -x)(3) == -3
    assert isinstance(rewrap(staticmethod(chain), replacement), staticmethod)


def _identity(x):
    return x


# __wrapped__ is set, but the wrapper finds `_identity` as a global, not in a closure cell
_GLOBAL_LOOKUP_WRAPPER = functools.wraps(_identity)(lambda x: _identity(x))


def test_rewrap_refuses_a_wrapper_it_cannot_rebuild():
    class CallableWrapper:  # holds the function as an attribute, not in a closure cell
        def __init__(self, fn):
            self.__wrapped__ = fn

        def __call__(self, *args):
            return self.__wrapped__(*args)

    with pytest.raises(RewrapError, match="closure cell"):
        rewrap(_GLOBAL_LOOKUP_WRAPPER, _identity)
    with pytest.raises(RewrapError, match="CallableWrapper"):
        rewrap(CallableWrapper(_identity), _identity)


# ----------------------------------------------------------------------------------------------------------
# A model with decorated forwards, gated/4-D/stop-gradient norms (structural patching)
# ----------------------------------------------------------------------------------------------------------


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rms(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class PlainNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.eps = 1e-6

    def forward(self, x):
        return self.weight * _rms(x.float(), self.eps).to(x.dtype)


class GatedNorm(PlainNorm):
    """``norm(x) * silu(gate)`` (as Qwen3-Next's): patched with the gated kernel, which takes the gate."""

    def forward(self, x, gate=None):
        y = super().forward(x)
        return y if gate is None else y * nn.functional.silu(gate)


class FourDNorm(PlainNorm):
    """A norm that only accepts (batch, heads, seq, dim) input: the probe raises inside it."""

    def forward(self, x):
        if x.dim() != 4:
            raise ValueError("expected 4-D input")
        return super().forward(x)


class CenteredNorm(PlainNorm):
    """``norm(x * (1 + w))``, zero-initialised: equal to Gemma's ``norm(x) * (1 + w)`` only while w == 0."""

    def __init__(self, dim):
        super().__init__(dim)
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return _rms(x.float() * (1.0 + self.weight.float()), self.eps).to(x.dtype)


class StopGradNorm(PlainNorm):
    """PlainNorm's values, but no gradient through the statistics: only gradients tell the two apart."""

    def forward(self, x):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps).detach()
        return self.weight * (xf * rstd).to(x.dtype)


class DecoratedAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    @renames("past", "cache")
    @counted("attention")
    def forward(self, x, cos, sin, cache=None):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).flatten(2))


class Block(nn.Module):
    def __init__(self, hidden, heads, norm_cls):
        super().__init__()
        self.norm1 = PlainNorm(hidden)
        self.attn = DecoratedAttention(hidden, heads)
        self.gated = GatedNorm(hidden)
        self.odd = norm_cls(hidden)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        x = x + self.gated(x, gate=x)
        h = self.odd(x.unsqueeze(1)).squeeze(1) if isinstance(self.odd, FourDNorm) else self.odd(x)
        return x + h


class Stack(nn.Module):
    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.blocks = nn.ModuleList(
            [Block(hidden, heads, cls) for cls in (FourDNorm, CenteredNorm, StopGradNorm)]
        )
        self.head_dim = hidden // heads

    def forward(self, x):
        pos = torch.arange(x.shape[1], dtype=torch.float32)
        inv = 1.0 / 10000 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        emb = torch.cat((torch.outer(pos, inv),) * 2, -1)[None].expand(x.shape[0], -1, -1)
        for block in self.blocks:
            x = block(x, emb.cos(), emb.sin())
        return x


def _loss_and_grads(model, x, dy):
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    y = model(x)
    (y * dy).sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_structural_patching_reports_every_module_it_leaves_and_stays_exact():
    torch.manual_seed(0)
    model = Stack()
    for block in model.blocks:  # a trained centred norm: its weight is no longer zero
        if isinstance(block.odd, CenteredNorm):
            block.odd.weight.data.normal_()
    x, dy = torch.randn(2, 7, 32), torch.randn(2, 7, 32)
    ref = _loss_and_grads(model, x, dy)

    report = liger_core.apply_liger_kernel(model)  # must not raise out of any probe
    kinds = {n: m.__dict__.get("_liger_core_kind") for n, m in model.named_modules()}
    assert report.swapped == {"rms_norm": 3, "rms_norm_gated": 3, "rope": 3}, str(report)
    for i in range(3):
        assert kinds[f"blocks.{i}.norm1"] == "rms_norm" and kinds[f"blocks.{i}.attn"] == "rope"
        assert kinds[f"blocks.{i}.gated"] == "rms_norm_gated" and kinds[f"blocks.{i}.odd"] is None
    assert report.modules["blocks.0.attn"] == "rope"
    missing = " ".join(report.missing["rms_norm"])
    assert "FourDNorm" in missing and "ValueError" in missing
    assert "CenteredNorm" in missing and "StopGradNorm" in missing
    gated = model.blocks[0].gated  # without a gate the module's own forward runs
    h = torch.randn(2, 5, 32)
    torch.testing.assert_close(gated(h), GatedNorm.forward(gated, h))

    CALLS.clear()
    out = _loss_and_grads(model, x, dy)
    assert CALLS.count("attention") == 3  # the decorators of the patched attention forwards still run
    # fp32 rounding differences only: relative to each tensor's largest value (the gated blocks make the
    # gradients span several orders of magnitude)
    for name, got, want in [("y", out[0], ref[0]), ("dx", out[1], ref[1])] + [
        (n, g, ref[2][n]) for n, g in out[2].items()
    ]:
        err = (got - want).abs().max().item() / want.abs().max().item()
        assert err <= 1e-5, f"{name}: relative error {err:.1e}"

    attn = model.blocks[0].attn
    with pytest.warns(FutureWarning, match="past"):  # the renaming decorator kept its behaviour too
        attn(torch.randn(1, 3, 32), *(t[:, :3] for t in _tables(3)), past=None)

    with pytest.raises(PatchIncompleteError, match="rms_norm"):
        liger_core.apply_liger_kernel(Stack(), strict=True)


def _tables(seq, head_dim=8):
    pos = torch.arange(seq, dtype=torch.float32)
    inv = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    emb = torch.cat((torch.outer(pos, inv),) * 2, -1)[None]
    return emb.cos(), emb.sin()


# ----------------------------------------------------------------------------------------------------------
# Real transformers models
# ----------------------------------------------------------------------------------------------------------


def test_strict_refuses_an_incomplete_patch_and_leaves_the_model_as_it_was():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny_model("llama", seed=3), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"])
    )
    with pytest.raises(PatchIncompleteError, match="fused_linear_cross_entropy.*lm_head") as err:
        liger_core.apply_liger_kernel(model, strict=True)
    assert "fused_linear_cross_entropy" in err.value.report.missing
    assert not is_patched(model)
    # turning the kernel that cannot apply off by name makes the strict patch complete
    report = liger_core.apply_liger_kernel(model, strict=True, fused_linear_cross_entropy=False)
    assert report.swapped == {"rms_norm": 5, "swiglu": 2, "rope": 2} and not report.missing


def test_class_level_strict_names_a_missing_class_and_swaps_nothing(monkeypatch):
    import dataclasses

    from transformers.models.llama import modeling_llama

    from liger_core.patching import recipes

    broken = dataclasses.replace(recipes.RECIPES["llama"], norms=(recipes.NormSpec("LlamaRMSNormRenamed"),))
    monkeypatch.setitem(recipes.RECIPES, "llama", broken)
    norm_before, rope_before = modeling_llama.LlamaRMSNorm, modeling_llama.apply_rotary_pos_emb
    with pytest.raises(PatchIncompleteError, match="LlamaRMSNormRenamed"):
        liger_core.apply_liger_kernel_to_llama(strict=True)
    assert modeling_llama.LlamaRMSNorm is norm_before
    assert modeling_llama.apply_rotary_pos_emb is rope_before
    assert not cl.is_causal_lm_forward(modeling_llama.LlamaForCausalLM.forward)


def test_patched_llama_follows_the_installed_cache_argument():
    """The patched forwards pass the key/value cache under the installed release's name (no deprecation
    warning in training or generation) and keep the class forward's decorators (the same warning as the
    unpatched model when a caller uses an old name)."""
    ref, model = tiny_model("llama", seed=4), tiny_model("llama", seed=4)
    report = liger_core.apply_liger_kernel(model, strict=True)
    assert not report.missing
    ids, labels = batch(5, seq_len=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model.train()
        model(input_ids=ids, labels=labels).loss.backward()
        model.eval()
        ref.eval()
        with torch.no_grad():
            out = model.generate(ids[:1, :4], max_new_tokens=4, do_sample=False)
            expected = ref.generate(ids[:1, :4], max_new_tokens=4, do_sample=False)
    assert torch.equal(out, expected)

    decorated = getattr(type(ref).forward, "__wrapped__", None) is not None
    if decorated:  # the installed transformers wraps the forward (5.24: deprecate_kwarg past_key_values)
        with warnings.catch_warnings(record=True) as seen_ref:
            warnings.simplefilter("always")
            ref(input_ids=ids, past_key_values=None)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            model(input_ids=ids, past_key_values=None)
        assert [str(w.message) for w in seen if w.category is FutureWarning] == [
            str(w.message) for w in seen_ref if w.category is FutureWarning
        ]


def half_table_rotary(q, k, cos, sin):
    """gpt-oss's convention: tables one column per frequency, rotation written on the two halves."""

    def rotate(x, c, s):
        first, second = torch.chunk(x, 2, dim=-1)
        return torch.cat((first * c - second * s, second * c + first * s), dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return rotate(q, cos, sin), rotate(k, cos, sin)


class HalfTableAttention(DecoratedAttention):
    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).unbind(2)
        q, k = half_table_rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        y = nn.functional.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True)
        return self.o_proj(y.transpose(1, 2).flatten(2))


def test_rope_with_half_width_tables_is_recognised_and_exact():
    torch.manual_seed(1)
    attn = HalfTableAttention(32, 4)
    pos = torch.arange(7, dtype=torch.float32)
    angles = torch.outer(pos, 1.0 / 10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))[None]
    cos, sin = angles.cos(), angles.sin()  # (1, 7, head_dim / 2)
    x, dy = torch.randn(1, 7, 32), torch.randn(1, 7, 32)

    def run():
        attn.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_(True)
        y = attn(xx, cos, sin)
        (y * dy).sum().backward()
        return y.detach(), xx.grad, attn.qkv.weight.grad.clone()

    ref = run()
    holder = nn.ModuleDict({"attn": attn})  # patching looks at a model's submodules
    report = liger_core.apply_liger_kernel(holder, rms_norm=False, fused_linear_cross_entropy=False)
    assert report.swapped == {"rope": 1} and not report.missing, str(report)
    used = attn.forward.__func__._liger_core_rope
    assert used in (rv.liger_rotary_pos_emb_half_tables, rv.liger_rotary_pos_emb_half_tables_cast_back)
    for got, want in zip(run(), ref):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_patched_kinds_and_a_head_wrapped_after_patching_is_a_miss():
    """What a model runs is public (patched_kinds, is_liger_forward); a LoRA adapter put on lm_head after
    patching shows up as a miss on the next call, and strict then raises without undoing the rest."""
    peft = pytest.importorskip("peft")
    from liger_core.patching import is_liger_forward, patched_kinds

    base = tiny_model("llama", seed=6)
    liger_core.apply_liger_kernel(base)
    kinds = {"rms_norm": 5, "swiglu": 2, "rope": 2, "fused_linear_cross_entropy": 1}
    assert patched_kinds(base) == kinds and is_liger_forward(base.forward)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["lm_head"]))
    report = liger_core.apply_liger_kernel(model)
    assert "lm_head" in " ".join(report.missing["fused_linear_cross_entropy"])
    with pytest.raises(PatchIncompleteError, match="lm_head"):
        liger_core.apply_liger_kernel(model, strict=True)
    assert patched_kinds(model) == kinds  # strict undid only its own call, which swapped nothing


def rope_q_only(q, k=None, cos=None, sin=None, unsqueeze_dim=1):
    """A rotate_half rope whose keys may be left out (as transformers' qwen4_exp indexer calls it)."""
    return apply_rotary_pos_emb(q, q if k is None else k, cos, sin)


class QOnlyRopeAttention(DecoratedAttention):
    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).transpose(1, 2).unbind(2)
        q, k = rope_q_only(q, k, cos, sin)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).flatten(2))


def test_a_rope_function_whose_signature_differs_is_left_alone_with_the_reason():
    """The probe calls (q, k, cos, sin) and would pass; but callers may leave k out: the replacements that
    cannot take that are refused by signature, and the one that can returns q alone where this one returns
    (q, q), which the probe without k finds. The swap is refused before it can break a training step."""
    holder = nn.ModuleDict({"attn": QOnlyRopeAttention(32, 4)})
    with pytest.raises(UnsupportedModelError) as raised:  # nothing else to patch in it
        liger_core.apply_liger_kernel(holder, rms_norm=False, fused_linear_cross_entropy=False)
    message = str(raised.value)
    assert "'k' may be left out" in message
    assert "called without k, rope_q_only returns another structure than the replacement" in message
    assert not is_patched(holder)

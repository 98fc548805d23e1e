import pytest
import torch
from helpers import assert_no_worse_than_eager, leaf
from torch import nn

from liger_core import reference
from liger_core.modules import LigerLayerNorm, LigerRMSNorm, LigerRMSNormForGemma

HIDDEN = 257
SHAPE = (3, 11, HIDDEN)


def _hf_norms():
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm, GemmaRMSNorm


def test_state_dict_keys_match_hf_and_torch():
    llama_norm, gemma_norm = _hf_norms()
    assert LigerRMSNorm(HIDDEN).state_dict().keys() == llama_norm(HIDDEN).state_dict().keys()
    assert LigerRMSNormForGemma(HIDDEN).state_dict().keys() == gemma_norm(HIDDEN).state_dict().keys()
    for bias in (True, False):
        ours, theirs = (
            LigerLayerNorm(HIDDEN, bias=bias).state_dict(),
            nn.LayerNorm(HIDDEN, bias=bias).state_dict(),
        )
        assert ours.keys() == theirs.keys()
        assert all(ours[k].shape == theirs[k].shape for k in ours)


def test_checkpoints_load_both_ways():
    llama_norm, gemma_norm = _hf_norms()
    for ours, theirs in [
        (LigerRMSNorm(HIDDEN), llama_norm(HIDDEN)),
        (LigerRMSNormForGemma(HIDDEN), gemma_norm(HIDDEN)),
        (LigerLayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)),
    ]:
        for p in theirs.parameters():
            p.data.normal_()
        ours.load_state_dict(theirs.state_dict())
        theirs.load_state_dict(ours.state_dict())
        assert all(
            torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values())
        )


def test_initialisation_and_attributes():
    llama_norm, gemma_norm = _hf_norms()
    m = LigerRMSNorm(HIDDEN, eps=1e-5)
    assert torch.equal(m.weight, llama_norm(HIDDEN).weight) and m.variance_epsilon == 1e-5 == m.eps
    g = LigerRMSNormForGemma(HIDDEN)
    assert torch.equal(g.weight, gemma_norm(HIDDEN).weight)  # zeros, used as 1 + w
    assert (g.offset, g.casting_mode, g.in_place) == (1.0, "gemma", False)
    ln, ref = LigerLayerNorm(HIDDEN, eps=1e-6, bias=False), nn.LayerNorm(HIDDEN, eps=1e-6, bias=False)
    assert torch.equal(ln.weight, ref.weight) and ln.bias is None
    assert (ln.normalized_shape, ln.eps) == (ref.normalized_shape, ref.eps)
    m_bf16 = LigerRMSNorm(HIDDEN, dtype=torch.bfloat16)
    assert m_bf16.weight.dtype == torch.bfloat16
    assert "eps=1e-05" in repr(m) and "casting_mode='llama'" in repr(m) and "offset=1.0" in repr(g)
    assert repr(ln) == f"LigerLayerNorm(({HIDDEN},), eps=1e-06, bias=False)"


def test_bad_arguments():
    with pytest.raises(ValueError, match="casting_mode"):
        LigerRMSNorm(HIDDEN, casting_mode="fp8")
    with pytest.raises(ValueError, match="init_fn"):
        LigerRMSNorm(HIDDEN, init_fn="random")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_rms_norm_modules_match_hf(which, dtype):
    """Drop-in: same weights and input -> HF's output and gradients, no less accurate (float64 reference)."""
    llama_norm, gemma_norm = _hf_norms()
    if which == "llama":
        ours, theirs, offset = LigerRMSNorm(HIDDEN), llama_norm(HIDDEN), 0.0
    else:
        ours, theirs, offset = LigerRMSNormForGemma(HIDDEN), gemma_norm(HIDDEN), 1.0
    theirs.weight.data.normal_(mean=1.0 - offset, std=0.2)
    ours.load_state_dict(theirs.state_dict())
    ours.to(dtype)
    theirs.to(dtype)
    x = torch.randn(SHAPE, dtype=torch.float64).to(dtype)
    x_ours, x_hf, x_ref = leaf(x), leaf(x), leaf(x, torch.float64)
    w_ref = leaf(theirs.weight.detach(), torch.float64)

    y, y_hf = ours(x_ours), theirs(x_hf)
    eps = theirs.variance_epsilon if which == "llama" else theirs.eps
    y_ref = reference.rms_norm(x_ref, w_ref, eps, offset, which)
    assert y.dtype == y_hf.dtype
    assert_no_worse_than_eager("y", y, y_hf, y_ref)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x_ours, dy, retain_graph=True)
    (dx_hf,) = torch.autograd.grad(y_hf, x_hf, dy, retain_graph=True)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (x_ref, w_ref), dy.double())
    assert_no_worse_than_eager("dx", dx, dx_hf, dx_ref)
    y.backward(dy)
    y_hf.backward(dy)
    assert_no_worse_than_eager("dw", ours.weight.grad, theirs.weight.grad, dw_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_module_matches_torch(dtype, bias):
    ours, theirs = LigerLayerNorm(HIDDEN, bias=bias), nn.LayerNorm(HIDDEN, bias=bias)
    for p in theirs.parameters():
        p.data.normal_(mean=0.5, std=0.3)
    ours.load_state_dict(theirs.state_dict())
    ours.to(dtype)
    theirs.to(dtype)
    x = (torch.randn(SHAPE, dtype=torch.float64) * 2 + 1).to(dtype)
    x_ours, x_ref = leaf(x), leaf(x, torch.float64)
    ref_params = [leaf(p.detach(), torch.float64) for p in theirs.parameters()]

    y, y_torch = ours(x_ours), theirs(x)
    y_ref = reference.layer_norm(x_ref, ref_params[0], ref_params[1] if bias else None, theirs.eps)
    assert y.dtype == y_torch.dtype == dtype
    assert_no_worse_than_eager("y", y, y_torch, y_ref)
    dy = torch.randn_like(y)
    y.backward(dy)
    y_torch.backward(dy)
    grads_ref = torch.autograd.grad(y_ref, ref_params, dy.double())
    for name, p_ours, p_torch, g_ref in zip(("dw", "db"), ours.parameters(), theirs.parameters(), grads_ref):
        assert_no_worse_than_eager(name, p_ours.grad, p_torch.grad, g_ref)

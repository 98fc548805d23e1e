import pytest
import torch
from helpers import assert_no_worse_than_eager, devices
from transformers import Gemma2Config, GemmaConfig, LlamaConfig
from transformers.models.gemma.modeling_gemma import GemmaMLP
from transformers.models.gemma2.modeling_gemma2 import Gemma2MLP
from transformers.models.llama.modeling_llama import LlamaMLP

from liger_core.modules import LigerGEGLUMLP, LigerSwiGLUMLP

# (hidden, intermediate, tokens): odd sizes on CPU, a Llama-8B-like MLP slice on GPU
SIZES = {"cpu": (48, 88, 37), "cuda": (4096, 14336, 2048)}


def llama_config(device, mlp_bias=False):
    hidden, inter, _ = SIZES[device]
    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=4,
        hidden_act="silu",
        mlp_bias=mlp_bias,
    )


def gemma_config(device):
    hidden, inter, _ = SIZES[device]
    return GemmaConfig(hidden_size=hidden, intermediate_size=inter, hidden_act="gelu_pytorch_tanh")


def check_against_hf(hf_mlp, liger_mlp, device, dtype):
    """Same weights (HF's state_dict loaded into ours); output, input grad and every weight grad vs HF in the
    same dtype and vs a float64 copy of HF's module."""
    assert set(liger_mlp.state_dict()) == set(hf_mlp.state_dict())
    hf_mlp.to(device=device, dtype=dtype)
    liger_mlp.to(device=device, dtype=dtype)
    liger_mlp.load_state_dict(hf_mlp.state_dict())
    ref_mlp = type(hf_mlp)(hf_mlp.config).to(device=device, dtype=torch.float64)
    ref_mlp.load_state_dict(hf_mlp.state_dict())  # the already-rounded weights, upcast

    _, _, tokens = SIZES[device]
    x = torch.randn(2, tokens, hf_mlp.hidden_size, dtype=torch.float64, device=device).to(dtype)
    x_ours, x_hf, x_r = (x.detach().to(dt).requires_grad_() for dt in (dtype, dtype, torch.float64))
    y = liger_mlp(x_ours)
    y_e = hf_mlp(x_hf)
    y_r = ref_mlp(x_r)
    assert y.dtype == dtype and y.shape == y_e.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)

    dy = torch.randn(y.shape, dtype=torch.float64, device=device).to(dtype)
    params = [dict(m.named_parameters()) for m in (liger_mlp, hf_mlp, ref_mlp)]
    names = sorted(params[0])
    g = torch.autograd.grad(y, [x_ours] + [params[0][n] for n in names], dy)
    g_e = torch.autograd.grad(y_e, [x_hf] + [params[1][n] for n in names], dy)
    g_r = torch.autograd.grad(y_r, [x_r] + [params[2][n] for n in names], dy.double())
    for name, a, a_e, a_r in zip(["dx"] + names, g, g_e, g_r):
        assert_no_worse_than_eager(name, a, a_e, a_r)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mlp_bias", [False, True])
def test_swiglu_mlp_matches_llama_mlp(device, dtype, mlp_bias):
    config = llama_config(device, mlp_bias)
    hf = LlamaMLP(config)
    ours = LigerSwiGLUMLP(config)
    assert all(getattr(ours, p).bias is not None for p in ("gate_proj", "up_proj", "down_proj")) == mlp_bias
    check_against_hf(hf, ours, device, dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_geglu_mlp_matches_gemma_mlp(device, dtype):
    config = gemma_config(device)
    ours = LigerGEGLUMLP(config)
    assert ours.approximate == "tanh"
    check_against_hf(GemmaMLP(config), ours, device, dtype)


def test_geglu_mlp_matches_gemma2_mlp():
    """Gemma 2/3 name the activation `hidden_activation`; an erf GELU there must be honoured too."""
    hidden, inter, _ = SIZES["cpu"]
    for activation, approximate in (("gelu_pytorch_tanh", "tanh"), ("gelu", "none")):
        config = Gemma2Config(hidden_size=hidden, intermediate_size=inter, hidden_activation=activation)
        ours = LigerGEGLUMLP(config)
        assert ours.approximate == approximate
        check_against_hf(Gemma2MLP(config), ours, "cpu", torch.float32)


def test_mlp_from_sizes():
    mlp = LigerSwiGLUMLP(16, 40, bias=True)
    assert mlp.gate_proj.weight.shape == (40, 16) and mlp.down_proj.weight.shape == (16, 40)
    assert mlp.up_proj.bias is not None
    mlp = LigerGEGLUMLP(16, 40, approximate="none")
    assert mlp.approximate == "none" and mlp.gate_proj.bias is None
    x = torch.randn(3, 16, requires_grad=True)
    x_h = x.detach().clone().requires_grad_()
    y = mlp(x)
    y_h = mlp.down_proj(torch.nn.functional.gelu(mlp.gate_proj(x_h)) * mlp.up_proj(x_h))
    torch.testing.assert_close(y, y_h)
    y.sum().backward()
    y_h.sum().backward()
    torch.testing.assert_close(x.grad, x_h.grad)


def test_mlp_bad_config():
    with pytest.raises(ValueError, match="hidden_act"):
        LigerSwiGLUMLP(
            LlamaConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, hidden_act="gelu")
        )
    with pytest.raises(ValueError, match="relu"):
        LigerGEGLUMLP(
            GemmaConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, hidden_act="relu")
        )
    with pytest.raises(ValueError, match="intermediate_size"):
        LigerSwiGLUMLP(8)
    with pytest.raises(TypeError, match="hidden_size"):
        LigerSwiGLUMLP(object())
    with pytest.raises(ValueError, match="approximate"):
        LigerGEGLUMLP(8, 16, approximate="erf")


@pytest.mark.parametrize("mlp_class", [LigerSwiGLUMLP, LigerGEGLUMLP])
def test_mlp_writes_activation_grads_over_projections(mlp_class):
    """The modules take the in-place backward: gate_proj's and up_proj's outputs receive their gradients in
    their own memory (no extra intermediate-sized tensors), and those gradients are the exact ones (the
    HF comparisons above run through the same path)."""
    mlp = mlp_class(24, 40)
    outputs = {}
    for name in ("gate_proj", "up_proj"):
        getattr(mlp, name).register_forward_hook(lambda m, i, o, name=name: outputs.__setitem__(name, o))
    x = torch.randn(3, 5, 24, requires_grad=True)
    y = mlp(x)
    gate, up = outputs["gate_proj"], outputs["up_proj"]
    d_gate, d_up = torch.autograd.grad(y, (gate, up), torch.randn_like(y))
    assert d_gate.data_ptr() == gate.data_ptr() and d_up.data_ptr() == up.data_ptr()

import importlib
import inspect

import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, assert_same_nonfinite, leaf, noncontiguous

from liger_core import reference
from liger_core.modules.norms import LigerRMSNormGated
from liger_core.ops import rms_norm_gated

EPS = 1e-6
# small odd shapes with >= ~20 rows (a row's rstd error is shared by the whole row)
SHAPES = [(3, 7, 96), (37, 257)]
# (casting_mode, norm_before_gate, activation, groups): Qwen3-Next, Kimi/Bailing, Mamba2, FalconH1-like
SETTINGS = [
    ("llama", True, "silu", 1),
    ("gemma", True, "sigmoid", 1),
    ("llama", False, "silu", 4),
    ("gemma", False, "silu", 2),
    ("gemma", True, "silu", 2),
    ("llama", True, "sigmoid", 1),
]


def _settings_kwargs(mode, nbg, act, groups, n):
    group_size = n // groups if n % groups == 0 else n
    return dict(activation=act, casting_mode=mode, norm_before_gate=nbg, group_size=group_size)


def _inputs(shape, dtype, w_dtype=None, device="cpu"):
    x = (torch.randn(shape, dtype=torch.float64, device=device) * 2).to(dtype)
    gate = (torch.randn(shape, dtype=torch.float64, device=device) * 2).to(dtype)
    w = (1 + 0.2 * torch.randn(shape[-1], dtype=torch.float64, device=device)).to(w_dtype or dtype)
    return x, gate, w


def _check(x, gate, w, kwargs, dy=None):
    """y, dx, dgate, dw of the kernel vs the float64 reference, no worse than eager (the reference in the
    inputs' dtypes, i.e. the HF code); the gradients reach strided inputs in their shapes."""
    x_e, g_e, w_e = (t.detach().clone().requires_grad_() for t in (x, gate, w))
    x_r, g_r, w_r = (leaf(t, torch.float64) for t in (x, gate, w))
    x, gate, w = (t.detach().requires_grad_() for t in (x, gate, w))
    y = rms_norm_gated(x, gate, w, EPS, **kwargs)
    y_e = reference.rms_norm_gated(x_e, g_e, w_e, EPS, **kwargs)
    y_r = reference.rms_norm_gated(x_r, g_r, w_r, EPS, **kwargs)
    assert y.dtype == y_e.dtype and y.shape == x.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)
    if dy is None:
        dy = torch.randn(y.shape, dtype=torch.float64, device=y.device).to(y.dtype)
    grads = torch.autograd.grad(y, (x, gate, w), dy)
    grads_e = torch.autograd.grad(y_e, (x_e, g_e, w_e), dy)
    grads_r = torch.autograd.grad(y_r, (x_r, g_r, w_r), dy.double())
    for name, g, g_e, g_r, t in zip(("dx", "dgate", "dw"), grads, grads_e, grads_r, (x, gate, w)):
        assert g.dtype == t.dtype and g.shape == t.shape
        assert_no_worse_than_eager(name, g, g_e, g_r)
    return y, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode,nbg,act,groups", SETTINGS)
def test_rms_norm_gated_matches_float64(dtype, mode, nbg, act, groups, poison_empty):
    for shape in SHAPES:
        _check(*_inputs(shape, dtype), _settings_kwargs(mode, nbg, act, groups, shape[-1]))


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16)])
@pytest.mark.parametrize("mode,nbg,act,groups", SETTINGS[:3])
def test_rms_norm_gated_mixed_and_half_dtypes(x_dtype, w_dtype, mode, nbg, act, groups):
    """fp32 weights with bf16 activations (HF's output dtype and roundings follow), and fp16."""
    shape = SHAPES[1]
    _check(*_inputs(shape, x_dtype, w_dtype), _settings_kwargs(mode, nbg, act, groups, shape[-1]))


def test_rms_norm_gated_offset_and_many_tiles_per_program(tune):
    """offset + w (1 + w weights), and a persistent backward grid whose programs loop over several tiles."""
    tune(norm_tile_elements=64)
    x, gate, w = _inputs((45, 33), torch.float32)
    for nbg in (True, False):
        _check(x, gate, w - 1, dict(casting_mode="llama", norm_before_gate=nbg, offset=1.0))


def _hf_module(cls_path, n, dtype, options, **kwargs):
    """The HF module and the options that reproduce it in the installed transformers."""
    module_name, cls_name = cls_path.rsplit(".", 1)
    # a model newer than the installed transformers skips (CI accepts that only on the oldest release)
    cls = getattr(pytest.importorskip(f"transformers.models.{module_name}"), cls_name)
    if "group_size" in kwargs and "group_size" not in inspect.signature(cls.__init__).parameters:
        # releases before grouped Mamba2 norms normalise the whole row as one group
        kwargs = {k: v for k, v in kwargs.items() if k != "group_size"}
        options = dict(options, group_size=None)
    module = cls(n, eps=EPS, **kwargs).to(dtype)
    with torch.no_grad():
        module.weight.copy_(1 + 0.2 * torch.randn(n))
    return module, options


# (HF class, constructor kwargs, our options): each setting against the HF module itself
HF_CLASSES = [
    ("qwen3_next.modeling_qwen3_next.Qwen3NextRMSNormGated", {}, dict(casting_mode="llama")),
    ("qwen3_5.modeling_qwen3_5.Qwen3_5RMSNormGated", {}, dict(activation="silu", casting_mode="llama")),
    ("qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeRMSNormGated", {}, dict(casting_mode="llama")),
    ("olmo_hybrid.modeling_olmo_hybrid.OlmoHybridRMSNormGated", {}, dict(casting_mode="llama")),
    ("kimi_linear.modeling_kimi_linear.KimiLinearRMSNormGated", {},
     dict(activation="sigmoid", casting_mode="gemma")),
    ("bailing_hybrid.modeling_bailing_hybrid.BailingHybridRMSNormGated", {},
     dict(activation="sigmoid", casting_mode="gemma")),
    ("lara_mini.modeling_lara_mini.LaraMiniRMSNormGated", {}, dict(activation="silu", casting_mode="gemma")),
    ("mamba2.modeling_mamba2.MambaRMSNormGated", {"group_size": 32},
     dict(casting_mode="llama", norm_before_gate=False, group_size=32)),
    ("falcon_h1.modeling_falcon_h1.FalconH1RMSNormGated", {"n_groups": 3, "norm_before_gate": False},
     dict(casting_mode="gemma", norm_before_gate=False, group_size=32)),
    ("falcon_h1.modeling_falcon_h1.FalconH1RMSNormGated", {"n_groups": 3, "norm_before_gate": True},
     dict(casting_mode="gemma", norm_before_gate=True, group_size=32)),
]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "cls_path,hf_kwargs,options", HF_CLASSES, ids=[c[0].rsplit(".", 1)[1] for c in HF_CLASSES]
)
def test_rms_norm_gated_reproduces_hf(dtype, cls_path, hf_kwargs, options):
    """The reference is the HF module bit for bit (output and its autograd gradients), and the kernel rounds
    at the same points: in bf16 it differs only where a last-bit difference of the fp32 rstd flips a
    rounding."""
    pytest.importorskip("transformers")
    n = 96
    module, options = _hf_module(cls_path, n, dtype, options, **hf_kwargs)
    x, gate, _ = _inputs((5, 9, n), dtype)
    x, gate = leaf(x), leaf(gate)
    y_hf = module(x, gate)
    y_ref = reference.rms_norm_gated(x, gate, module.weight, EPS, **options)
    assert y_ref.dtype == y_hf.dtype and torch.equal(y_ref, y_hf)
    dy = torch.randn_like(y_hf)
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            torch.autograd.grad(y_hf, (x, gate, module.weight), dy),
            torch.autograd.grad(y_ref, (x, gate, module.weight), dy),
        )
    )
    with torch.no_grad():
        y = rms_norm_gated(x, gate, module.weight, EPS, **options)
    assert y.dtype == y_hf.dtype
    if dtype == torch.float32:  # fp32: a few ulps (rstd and the activation are evaluated differently)
        torch.testing.assert_close(y, y_hf, rtol=4e-7, atol=1e-7)
    else:
        assert (y != y_hf).float().mean().item() < 0.01
    # the module wrapper with the same options, on the HF module's weight
    ours = LigerRMSNormGated(n, EPS, dtype=dtype, **options)
    with torch.no_grad():
        ours.weight.copy_(module.weight)
        assert torch.equal(ours(x, gate), y)


def test_rms_norm_gated_module_without_gate_is_rms_norm():
    x = torch.randn(4, 16)
    module = LigerRMSNormGated(16, norm_before_gate=False)
    assert torch.allclose(module(x), reference.rms_norm(x, module.weight, EPS), atol=1e-6)
    with pytest.raises(ValueError, match="gate"):
        LigerRMSNormGated(16, group_size=8)(x)


# ----------------------------------------------------------------------------------------------------------
# Strided arguments, non-finite values and empty inputs on both paths (Triton interpreter, reference).
# ----------------------------------------------------------------------------------------------------------


def _transposed(t):
    dims = list(reversed(range(t.dim())))
    return t.permute(dims).contiguous().permute(dims)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
@pytest.mark.parametrize("mode,nbg,act,groups", SETTINGS[:3])
def test_rms_norm_gated_strided_arguments(path_device, dtype, how, mode, nbg, act, groups):
    shape = (3, 7, 96)
    strided = noncontiguous if how == "step2" else _transposed
    x, gate, w = _inputs(shape, dtype, device=path_device)
    w_strided = noncontiguous(w) if how == "step2" else torch.stack((w, w), 1)[:, 1]
    dy_dtype = dtype
    dy = strided(torch.randn(shape, dtype=torch.float64, device=path_device).to(dy_dtype))
    _check(strided(x), strided(gate), w_strided, _settings_kwargs(mode, nbg, act, groups, 96), dy=dy)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target", ["x", "gate", "w"])
@pytest.mark.parametrize("mode,nbg,act,groups", SETTINGS[:4])
def test_rms_norm_gated_nonfinite_inputs_follow_eager(path_device, dtype, target, mode, nbg, act, groups):
    """+-inf and NaN in x, gate or w: y, dx, dgate and dw are NaN / +-inf where HF's eager code gives them."""
    shape = (37, 64)
    kwargs = _settings_kwargs(mode, nbg, act, groups, shape[-1])
    tensors = dict(zip(("x", "gate", "w"), _inputs(shape, dtype, device=path_device)))
    flat = tensors[target].view(-1)
    positions = torch.randperm(flat.numel(), device=path_device)[:3]
    flat[positions] = torch.tensor([INF, -INF, NAN], dtype=dtype, device=path_device)
    x_e, g_e, w_e = (leaf(t) for t in tensors.values())
    x_r, g_r, w_r = (leaf(t, torch.float64) for t in tensors.values())
    x, gate, w = (leaf(t) for t in tensors.values())
    y = rms_norm_gated(x, gate, w, EPS, **kwargs)
    y_e = reference.rms_norm_gated(x_e, g_e, w_e, EPS, **kwargs)
    y_r = reference.rms_norm_gated(x_r, g_r, w_r, EPS, **kwargs)
    assert_same_nonfinite("y", y, y_e, y_r)
    assert not torch.isfinite(y_e).all()
    dy = torch.randn(shape, dtype=torch.float64, device=path_device).to(y.dtype)
    grads = torch.autograd.grad(y, (x, gate, w), dy)
    grads_e = torch.autograd.grad(y_e, (x_e, g_e, w_e), dy)
    grads_r = torch.autograd.grad(y_r, (x_r, g_r, w_r), dy.double())
    for name, g, g_e, g_r in zip(("dx", "dgate", "dw"), grads, grads_e, grads_r):
        assert_same_nonfinite(name, g, g_e, g_r)


@pytest.mark.parametrize("shape", [(0, 48), (0, 5, 48)])
@pytest.mark.parametrize("mode,nbg,act,groups", SETTINGS[:3])
def test_rms_norm_gated_empty_rows_like_eager(path_device, shape, mode, nbg, act, groups):
    kwargs = _settings_kwargs(mode, nbg, act, groups, shape[-1])
    tensors = _inputs(shape, torch.bfloat16, torch.float32, device=path_device)
    x, gate, w = (leaf(t) for t in tensors)
    x_e, g_e, w_e = (leaf(t) for t in tensors)
    y = rms_norm_gated(x, gate, w, EPS, **kwargs)
    y_e = reference.rms_norm_gated(x_e, g_e, w_e, EPS, **kwargs)
    assert y.dtype == y_e.dtype and y.shape == y_e.shape == x.shape
    dy = torch.randn(y.shape, device=path_device).to(y.dtype)
    grads = torch.autograd.grad(y, (x, gate, w), dy)
    grads_e = torch.autograd.grad(y_e, (x_e, g_e, w_e), dy)
    for g, g_e in zip(grads, grads_e):
        assert g.dtype == g_e.dtype and g.shape == g_e.shape and torch.equal(g, g_e)
    assert not grads[2].any()


def test_rms_norm_gated_custom_ops_pass_opcheck():
    mod = importlib.import_module("liger_core.ops.rms_norm_gated")
    x, gate, w = _inputs((5, 32), torch.float32)
    for nbg in (True, False):
        args = (x, gate, w, EPS, 0.5, 16, "silu", "llama", nbg)
        torch.library.opcheck(mod._rms_norm_gated_fwd, args)
        _, rstd = mod._rms_norm_gated_fwd(*args)
        torch.library.opcheck(
            mod._rms_norm_gated_bwd, (torch.randn(5, 32), x, gate, w, rstd, 0.5, 16, "silu", nbg)
        )


def test_rms_norm_gated_bad_input():
    x, gate, w = _inputs((4, 8), torch.float32)
    with pytest.raises(TypeError, match="x"):
        rms_norm_gated(x.long(), gate, w)
    with pytest.raises(TypeError, match="gate"):
        rms_norm_gated(x, gate.double(), w)
    with pytest.raises(TypeError, match="gate"):
        rms_norm_gated(x, None, w)
    with pytest.raises(ValueError, match="gate"):
        rms_norm_gated(x, gate[:, :7], w)
    with pytest.raises(TypeError, match="weight"):
        rms_norm_gated(x, gate, w.double())
    with pytest.raises(ValueError, match="weight"):
        rms_norm_gated(x, gate, torch.randn(9))
    with pytest.raises(ValueError, match="gate"):
        rms_norm_gated(x, gate.to("meta"), w)
    with pytest.raises(ValueError, match="activation"):
        rms_norm_gated(x, gate, w, activation="gelu")
    with pytest.raises(ValueError, match="casting_mode"):
        rms_norm_gated(x, gate, w, casting_mode="none")
    for bad in (3, 0, -8, 8.0):
        with pytest.raises(ValueError, match="group_size"):
            rms_norm_gated(x, gate, w, group_size=bad)
    with pytest.raises(ValueError, match="x"):
        rms_norm_gated(torch.randn(4, 0), torch.randn(4, 0), torch.randn(0))

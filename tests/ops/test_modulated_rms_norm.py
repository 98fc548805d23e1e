import importlib

import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, assert_same_nonfinite, leaf, strided

from liger_core import reference
from liger_core.modules.norm_variants import LigerModulatedRMSNorm
from liger_core.ops import modulated_rms_norm

EPS = 1e-6
SHAPE = (4, 7, 40)
# per token, per sample (B, H), one shared row
MOD_SHAPES = [(4, 7, 40), (4, 40), (40,)]
NAMES = ("dx", "dw", "dscale", "dshift")


def _inputs(dtype, mod_shape, w_dtype=None, weight=True, shift=True, shape=SHAPE, device="cpu"):
    def randn(*s, std=1.0):
        return torch.randn(s, dtype=torch.float64, device=device) * std

    x = (randn(*shape) * 2).to(dtype)
    w = (1 + randn(shape[-1], std=0.2)).to(w_dtype or dtype) if weight else None
    scale = randn(*mod_shape, std=0.3).to(dtype)
    sh = randn(*mod_shape, std=0.3).to(dtype) if shift else None
    return x, w, scale, sh


def _check(x, w, scale, shift, mode, offset=0.0, dy=None, layout=None):
    """y and the gradients of x, weight, scale, shift vs float64, no worse than eager (the reference in the
    inputs' dtypes)."""
    ts = (x, w, scale, shift)

    def copy(t, dtype=None):
        if t is None:
            return None
        if layout is not None and dtype is None and t.numel() > 1:
            return strided(t, layout).requires_grad_()
        return leaf(t, dtype)

    ins, ins_e, ins_r = [copy(t) for t in ts], [copy(t) for t in ts], [copy(t, torch.float64) for t in ts]
    ins = [None if t is None else t.detach().requires_grad_() for t in ts]
    y = modulated_rms_norm(*ins, EPS, offset, mode)
    y_e = reference.modulated_rms_norm(*ins_e, EPS, offset, mode)
    y_r = reference.modulated_rms_norm(*ins_r, EPS, offset, mode)
    assert y.dtype == y_e.dtype and y.shape == x.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)
    if dy is None:
        dy = torch.randn(y.shape, dtype=torch.float64, device=y.device).to(y.dtype)
    sel = [i for i, t in enumerate(ins) if t is not None]
    grads = torch.autograd.grad(y, [ins[i] for i in sel], dy)
    grads_e = torch.autograd.grad(y_e, [ins_e[i] for i in sel], dy)
    grads_r = torch.autograd.grad(y_r, [ins_r[i] for i in sel], dy.double())
    for i, g, g_e, g_r in zip(sel, grads, grads_e, grads_r):
        assert g.dtype == ins[i].dtype and g.shape == ins[i].shape
        assert_no_worse_than_eager(NAMES[i], g, g_e, g_r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode,offset", [("llama", 0.0), ("gemma", 1.0), ("none", 0.0)])
@pytest.mark.parametrize("mod_shape", MOD_SHAPES)
def test_modulated_rms_norm_matches_float64(dtype, mode, offset, mod_shape, poison_empty):
    x, w, scale, shift = _inputs(dtype, mod_shape)
    _check(x, w - offset, scale, shift, mode, offset)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weight,shift", [(False, True), (True, False), (False, False)])
def test_modulated_rms_norm_without_weight_or_shift(dtype, weight, shift):
    for mod_shape in MOD_SHAPES[:2]:
        _check(*_inputs(dtype, mod_shape, weight=weight, shift=shift), "llama")


def test_modulated_rms_norm_mixed_dtypes_and_many_tiles(tune):
    """An fp32 weight with bf16 activations, and a backward grid whose programs loop over several tiles."""
    _check(*_inputs(torch.bfloat16, (4, 40), torch.float32), "llama")
    tune(norm_tile_elements=64)
    _check(*_inputs(torch.float32, (4, 40)), "gemma")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
def test_modulated_rms_norm_strided_arguments(path_device, dtype, how):
    x, w, scale, shift = _inputs(dtype, (4, 40), device=path_device)
    dy = strided(torch.randn(SHAPE, dtype=torch.float64, device=path_device).to(dtype), how)
    _check(*(strided(t, how) for t in (x, w, scale, shift)), "llama", dy=dy, layout=how)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target", ["x", "w", "scale", "shift"])
def test_modulated_rms_norm_nonfinite_inputs_follow_eager(path_device, dtype, target):
    """+-inf / NaN (and +-1e4 in x): y and the gradients NaN / +-inf where the eager code gives them."""
    tensors = dict(zip(("x", "w", "scale", "shift"), _inputs(dtype, (4, 40), device=path_device)))
    tensors["x"].view(-1)[:2] = torch.tensor([1e4, -1e4], dtype=dtype, device=path_device)
    flat = tensors[target].view(-1)
    flat[torch.randperm(flat.numel(), device=path_device)[:3]] = torch.tensor(
        [INF, -INF, NAN], dtype=dtype, device=path_device
    )
    ins_e = [leaf(t) for t in tensors.values()]
    ins_r = [leaf(t, torch.float64) for t in tensors.values()]
    ins = [leaf(t) for t in tensors.values()]
    y = modulated_rms_norm(*ins, EPS)
    y_e, y_r = reference.modulated_rms_norm(*ins_e, EPS), reference.modulated_rms_norm(*ins_r, EPS)
    assert_same_nonfinite("y", y, y_e, y_r)
    assert not torch.isfinite(y_e).all()
    dy = torch.randn(SHAPE, dtype=torch.float64, device=path_device).to(dtype)
    grads = torch.autograd.grad(y, ins, dy)
    grads_e = torch.autograd.grad(y_e, ins_e, dy)
    grads_r = torch.autograd.grad(y_r, ins_r, dy.double())
    for name, g, g_e, g_r in zip(NAMES, grads, grads_e, grads_r):
        assert_same_nonfinite(name, g, g_e, g_r)


@pytest.mark.parametrize("mod_shape", [(1, 40), (40,)])
def test_modulated_rms_norm_empty_rows_like_eager(path_device, mod_shape):
    shape = (0, 40)  # 0 rows of x: any count of modulation rows divides them
    tensors = _inputs(torch.bfloat16, mod_shape, torch.float32, shape=shape, device=path_device)
    ins, ins_e = [leaf(t) for t in tensors], [leaf(t) for t in tensors]
    y, y_e = modulated_rms_norm(*ins), reference.modulated_rms_norm(*ins_e)
    assert y.dtype == y_e.dtype and y.shape == y_e.shape
    dy = torch.randn(shape, device=path_device).to(y.dtype)
    for g, g_e in zip(torch.autograd.grad(y, ins, dy), torch.autograd.grad(y_e, ins_e, dy)):
        assert g.dtype == g_e.dtype and g.shape == g_e.shape and torch.equal(g, g_e)


def test_modulated_rms_norm_module():
    m = LigerModulatedRMSNorm(40, eps=1e-5)
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    x, _, scale, shift = _inputs(torch.float32, (4, 40))
    torch.testing.assert_close(
        m(x, scale, shift), reference.modulated_rms_norm(x, m.weight, scale, shift, 1e-5)
    )
    assert LigerModulatedRMSNorm(40, elementwise_affine=False).weight is None


def test_modulated_rms_norm_custom_ops_pass_opcheck():
    mod = importlib.import_module("liger_core.ops.modulated_rms_norm")
    x, w, scale, shift = _inputs(torch.float32, (5, 32), shape=(10, 32))
    for ww, sh in ((w, shift), (None, None)):
        torch.library.opcheck(mod._modulated_rms_norm_fwd, (x, ww, scale, sh, EPS, 0.0, "llama"))
        _, rstd = mod._modulated_rms_norm_fwd(x, ww, scale, sh, EPS, 0.0, "llama")
        args = (torch.randn(10, 32), x, ww, scale, sh is not None, rstd, 0.0, "llama")
        torch.library.opcheck(mod._modulated_rms_norm_bwd, args)


def test_modulated_rms_norm_bad_input():
    x, w, scale, shift = _inputs(torch.float32, (4, 40))
    with pytest.raises(TypeError, match="x"):
        modulated_rms_norm(x.long(), w, scale, shift)
    with pytest.raises(TypeError, match="scale"):
        modulated_rms_norm(x, w, None, shift)
    with pytest.raises(ValueError, match="scale"):
        modulated_rms_norm(x, w, torch.randn(3, 40), shift)
    with pytest.raises(ValueError, match="scale"):
        modulated_rms_norm(x, w, torch.randn(4, 39), shift)
    with pytest.raises(ValueError, match="shift"):
        modulated_rms_norm(x, w, scale, torch.randn(40))
    with pytest.raises(ValueError, match="weight"):
        modulated_rms_norm(x, torch.ones(39), scale, shift)
    with pytest.raises(ValueError, match="casting_mode"):
        modulated_rms_norm(x, w, scale, shift, casting_mode="float")
    with pytest.raises(ValueError, match="scale"):
        modulated_rms_norm(x, w, scale.to("meta"), shift)
    with pytest.raises(ValueError, match="x"):
        modulated_rms_norm(torch.randn(4, 0), None, torch.randn(1, 0))

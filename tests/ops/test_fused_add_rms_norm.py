import importlib

import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, assert_same_nonfinite, leaf, strided

from liger_core import reference
from liger_core.ops import fused_add_rms_norm

EPS = 1e-6
SHAPES = [(3, 7, 96), (37, 123)]  # small odd shapes with >= ~20 rows
MODES = [("llama", 0.0), ("gemma", 1.0), ("none", 0.0)]


def _inputs(shape, dtype, w_dtype=None, device="cpu", offset=0.0):
    x = (torch.randn(shape, dtype=torch.float64, device=device) * 2).to(dtype)
    r = (torch.randn(shape, dtype=torch.float64, device=device) * 3).to(dtype)
    w = (1 - offset + 0.2 * torch.randn(shape[-1], dtype=torch.float64, device=device)).to(w_dtype or dtype)
    return x, r, w


def _check(x, r, w, mode, offset, dy=None, ds=None, layout=None):
    """y, s, dx, dresidual, dw of the kernel vs the float64 reference, no worse than eager (the reference in
    the inputs' dtypes: HF's add then its RMSNorm); the gradients reach strided inputs in their shapes."""
    x_e, r_e, w_e = (leaf(t) if layout is None else strided(t, layout).requires_grad_() for t in (x, r, w))
    x_r, r_r, w_r = (leaf(t, torch.float64) for t in (x, r, w))
    x, r, w = (t.detach().requires_grad_() for t in (x, r, w))
    y, s = fused_add_rms_norm(x, r, w, EPS, offset, mode)
    y_e, s_e = reference.fused_add_rms_norm(x_e, r_e, w_e, EPS, offset, mode)
    y_r, s_r = reference.fused_add_rms_norm(x_r, r_r, w_r, EPS, offset, mode)
    assert y.dtype == y_e.dtype and y.shape == x.shape and s.dtype == x.dtype and s.shape == x.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)
    assert_no_worse_than_eager("s", s, s_e, s_r)
    if dy is None:
        dy = torch.randn(y.shape, dtype=torch.float64, device=y.device).to(y.dtype)
    if ds is None:
        ds = torch.randn(s.shape, dtype=torch.float64, device=s.device).to(s.dtype)
    grads = torch.autograd.grad((y, s), (x, r, w), (dy, ds))
    grads_e = torch.autograd.grad((y_e, s_e), (x_e, r_e, w_e), (dy, ds))
    grads_r = torch.autograd.grad((y_r, s_r), (x_r, r_r, w_r), (dy.double(), ds.double()))
    for name, g, g_e, g_r, t in zip(("dx", "dresidual", "dw"), grads, grads_e, grads_r, (x, r, w)):
        assert g.dtype == t.dtype and g.shape == t.shape
        assert_no_worse_than_eager(name, g, g_e, g_r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode,offset", MODES)
def test_fused_add_rms_norm_matches_float64(dtype, mode, offset, poison_empty):
    for shape in SHAPES:
        _check(*_inputs(shape, dtype, offset=offset), mode, offset)


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16)])
@pytest.mark.parametrize("mode,offset", MODES[:2])
def test_fused_add_rms_norm_mixed_and_half_dtypes(x_dtype, w_dtype, mode, offset):
    """An fp32 weight with bf16 activations (HF's output dtype follows), and fp16."""
    _check(*_inputs(SHAPES[1], x_dtype, w_dtype, offset=offset), mode, offset)


def test_fused_add_rms_norm_many_tiles_per_program(tune):
    """A persistent backward grid whose programs loop over several tiles of several rows."""
    tune(norm_tile_elements=64)
    _check(*_inputs((45, 33), torch.float32), "llama", 0.0)


def test_fused_add_rms_norm_one_output_used():
    """Only y used (s dropped: no gradient of s reaches backward), or only s used: the gradients of the
    parts that are used, as eager's."""
    x, r, w = _inputs((19, 40), torch.float32)
    for used in (0, 1):
        ins, ins_e = [leaf(t) for t in (x, r, w)], [leaf(t) for t in (x, r, w)]
        out = fused_add_rms_norm(*ins, EPS)[used]
        out_e = reference.fused_add_rms_norm(*ins_e, EPS)[used]
        dout = torch.randn_like(out)
        (out * dout).sum().backward()
        (out_e * dout).sum().backward()
        for t, t_e in zip(ins, ins_e):
            if used == 1 and t is ins[2]:
                assert t.grad is None and t_e.grad is None
                continue
            torch.testing.assert_close(t.grad, t_e.grad, rtol=1e-5, atol=1e-6)


def test_fused_add_rms_norm_leaf_gradients_are_separate():
    """x and residual get the same gradient values from one buffer: accumulating more into one leaf's .grad
    leaves the other's alone."""
    x, r, w = (leaf(t) for t in _inputs((9, 24), torch.float32))
    y, s = fused_add_rms_norm(x, r, w)
    (y.sum() + s.sum()).backward()
    assert torch.equal(x.grad, r.grad)
    r_grad = r.grad.clone()
    y, s = fused_add_rms_norm(x, r.detach(), w)
    y.sum().backward()  # a second step accumulates into x.grad only
    assert torch.equal(r.grad, r_grad) and not torch.equal(x.grad, r.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
@pytest.mark.parametrize("mode,offset", MODES[:2])
def test_fused_add_rms_norm_strided_arguments(path_device, dtype, how, mode, offset):
    """x, residual, weight and both incoming gradients non-contiguous."""
    x, r, w = (strided(t, how) for t in _inputs((3, 7, 48), dtype, device=path_device, offset=offset))
    dy = strided(torch.randn((3, 7, 48), dtype=torch.float64, device=path_device).to(dtype), how)
    ds = strided(torch.randn((3, 7, 48), dtype=torch.float64, device=path_device).to(dtype), how)
    _check(x, r, w, mode, offset, dy=dy, ds=ds, layout=how)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target", ["x", "residual", "w"])
@pytest.mark.parametrize("mode,offset", MODES[:2])
def test_fused_add_rms_norm_nonfinite_inputs_follow_eager(path_device, dtype, target, mode, offset):
    """+-inf and NaN in x, residual or w (and +-1e4 values): y, s and the gradients are NaN / +-inf where
    eager's add + RMSNorm gives them, and no worse than eager elsewhere."""
    shape = (37, 64)
    tensors = dict(zip(("x", "residual", "w"), _inputs(shape, dtype, device=path_device, offset=offset)))
    tensors["x"].view(-1)[:2] = torch.tensor([1e4, -1e4], dtype=dtype, device=path_device)
    flat = tensors[target].view(-1)
    positions = torch.randperm(flat.numel(), device=path_device)[:3]
    flat[positions] = torch.tensor([INF, -INF, NAN], dtype=dtype, device=path_device)
    x_e, r_e, w_e = (leaf(t) for t in tensors.values())
    x_r, r_r, w_r = (leaf(t, torch.float64) for t in tensors.values())
    x, r, w = (leaf(t) for t in tensors.values())
    y, s = fused_add_rms_norm(x, r, w, EPS, offset, mode)
    y_e, s_e = reference.fused_add_rms_norm(x_e, r_e, w_e, EPS, offset, mode)
    y_r, s_r = reference.fused_add_rms_norm(x_r, r_r, w_r, EPS, offset, mode)
    assert_same_nonfinite("y", y, y_e, y_r)
    assert_same_nonfinite("s", s, s_e, s_r)
    assert not torch.isfinite(y_e).all()
    dy = torch.randn(shape, dtype=torch.float64, device=path_device).to(y.dtype)
    ds = torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype)
    grads = torch.autograd.grad((y, s), (x, r, w), (dy, ds))
    grads_e = torch.autograd.grad((y_e, s_e), (x_e, r_e, w_e), (dy, ds))
    grads_r = torch.autograd.grad((y_r, s_r), (x_r, r_r, w_r), (dy.double(), ds.double()))
    for name, g, g_e, g_r in zip(("dx", "dresidual", "dw"), grads, grads_e, grads_r):
        assert_same_nonfinite(name, g, g_e, g_r)


@pytest.mark.parametrize("shape", [(0, 48), (0, 5, 48)])
def test_fused_add_rms_norm_empty_rows_like_eager(path_device, shape):
    tensors = _inputs(shape, torch.bfloat16, torch.float32, device=path_device)
    x, r, w = (leaf(t) for t in tensors)
    x_e, r_e, w_e = (leaf(t) for t in tensors)
    y, s = fused_add_rms_norm(x, r, w, EPS)
    y_e, s_e = reference.fused_add_rms_norm(x_e, r_e, w_e, EPS)
    assert y.dtype == y_e.dtype and y.shape == y_e.shape == x.shape and s.shape == x.shape
    dy = torch.randn(y.shape, device=path_device).to(y.dtype)
    ds = torch.randn(s.shape, device=path_device).to(s.dtype)
    grads = torch.autograd.grad((y, s), (x, r, w), (dy, ds))
    grads_e = torch.autograd.grad((y_e, s_e), (x_e, r_e, w_e), (dy, ds))
    for g, g_e in zip(grads, grads_e):
        assert g.dtype == g_e.dtype and g.shape == g_e.shape and torch.equal(g, g_e)
    assert not grads[2].any()


def test_fused_add_rms_norm_custom_ops_pass_opcheck():
    mod = importlib.import_module("liger_core.ops.fused_add_rms_norm")
    x, r, w = _inputs((5, 32), torch.float32)
    torch.library.opcheck(mod._fused_add_rms_norm_fwd, (x, r, w, EPS, 0.5, "llama"))
    _, s, rstd = mod._fused_add_rms_norm_fwd(x, r, w, EPS, 0.5, "llama")
    for ds in (torch.randn(5, 32), None):
        torch.library.opcheck(mod._fused_add_rms_norm_bwd, (torch.randn(5, 32), ds, s, w, rstd, 0.5))


def test_fused_add_rms_norm_bad_input():
    x, r, w = _inputs((4, 8), torch.float32)
    with pytest.raises(TypeError, match="x"):
        fused_add_rms_norm(x.long(), r, w)
    with pytest.raises(TypeError, match="residual"):
        fused_add_rms_norm(x, None, w)
    with pytest.raises(TypeError, match="residual"):
        fused_add_rms_norm(x, r.bfloat16(), w)
    with pytest.raises(ValueError, match="residual"):
        fused_add_rms_norm(x, r[:, :7], w)
    with pytest.raises(ValueError, match="residual"):
        fused_add_rms_norm(x, r.to("meta"), w)
    with pytest.raises(TypeError, match="weight"):
        fused_add_rms_norm(x, r, w.double())
    with pytest.raises(ValueError, match="weight"):
        fused_add_rms_norm(x, r, torch.randn(9))
    with pytest.raises(ValueError, match="casting_mode"):
        fused_add_rms_norm(x, r, w, casting_mode="float")
    with pytest.raises(ValueError, match="x"):
        fused_add_rms_norm(torch.randn(4, 0), torch.randn(4, 0), torch.randn(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rms_norm_module_reproduces_llama_norm_of_the_sum(dtype):
    """LigerFusedAddRMSNorm(h, residual) = (LlamaRMSNorm(h + residual), h + residual), against float64."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from liger_core.modules import LigerFusedAddRMSNorm

    hf, ours = llama.LlamaRMSNorm(40, eps=EPS), LigerFusedAddRMSNorm(40, eps=EPS)
    with torch.no_grad():
        hf.weight.normal_(1.0, 0.2)
    ours.load_state_dict(hf.state_dict())
    hf, ours = hf.to(dtype), ours.to(dtype)
    x, r, _ = _inputs((6, 5, 40), dtype)
    y, s = ours(x, r)
    s_e = x + r
    y_e = hf(s_e)
    y_r = reference.fused_add_rms_norm(x.double(), r.double(), hf.weight.double(), EPS)[0]
    assert y.dtype == y_e.dtype and torch.equal(s, s_e)
    assert_no_worse_than_eager("y", y, y_e, y_r)

import importlib

import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, assert_same_nonfinite, leaf, strided

from liger_core import reference
from liger_core.modules.norm_variants import LigerPolyNorm
from liger_core.ops import poly_norm

EPS = 1e-6
SHAPES = [(3, 7, 96), (37, 123), (21, 5)]


def _inputs(shape, dtype, w_dtype=None, bias_shape=(), device="cpu"):
    x = torch.randn(shape, dtype=torch.float64, device=device).to(dtype)
    w = (torch.rand(3, dtype=torch.float64, device=device) + 0.2).to(w_dtype or dtype)
    b = torch.randn(bias_shape, dtype=torch.float64, device=device).to(w_dtype or dtype)
    return x, w, b


def _check(x, w, b, dy=None, layout=None):
    """y, dx, dw, db of the kernel vs the float64 reference, no worse than eager (PolyCom's module in the
    inputs' dtypes)."""
    x_e, w_e, b_e = (
        leaf(t) if layout is None or t.dim() == 0 else strided(t, layout).requires_grad_() for t in (x, w, b)
    )
    x_r, w_r, b_r = (leaf(t, torch.float64) for t in (x, w, b))
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    y, y_e, y_r = (
        poly_norm(x, w, b, EPS),
        reference.poly_norm(x_e, w_e, b_e, EPS),
        reference.poly_norm(x_r, w_r, b_r, EPS),
    )
    assert y.dtype == y_e.dtype and y.shape == x.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)
    if dy is None:
        dy = torch.randn(y.shape, dtype=torch.float64, device=y.device).to(y.dtype)
    grads = torch.autograd.grad(y, (x, w, b), dy)
    grads_e = torch.autograd.grad(y_e, (x_e, w_e, b_e), dy)
    grads_r = torch.autograd.grad(y_r, (x_r, w_r, b_r), dy.double())
    for name, g, g_e, g_r, t in zip(("dx", "dw", "db"), grads, grads_e, grads_r, (x, w, b)):
        assert g.dtype == t.dtype and g.shape == t.shape
        assert_no_worse_than_eager(name, g, g_e, g_r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias_shape", [(), (1,)])
def test_poly_norm_matches_float64(dtype, bias_shape, poison_empty):
    for shape in SHAPES:
        _check(*_inputs(shape, dtype, bias_shape=bias_shape))


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16)])
@pytest.mark.parametrize("bias_shape", [(), (1,)])
def test_poly_norm_mixed_and_half_dtypes(x_dtype, w_dtype, bias_shape):
    """fp32 parameters with bf16 activations (y: bf16 with a 0-dim bias, fp32 with a (1,) bias, as eager)."""
    _check(*_inputs(SHAPES[1], x_dtype, w_dtype, bias_shape))


def test_poly_norm_many_tiles_per_program(tune):
    tune(norm_tile_elements=64)
    _check(*_inputs((45, 33), torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
def test_poly_norm_strided_arguments(path_device, dtype, how):
    shape = (3, 7, 48)
    x, w, b = _inputs(shape, dtype, device=path_device)
    dy = strided(torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype), how)
    _check(strided(x, how), strided(w, how), b, dy=dy, layout=how)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target", ["x", "w", "b"])
def test_poly_norm_nonfinite_inputs_follow_eager(path_device, dtype, target):
    """+-inf / NaN in x (and +-30, whose cube stays finite), or a non-finite weight or bias: NaN / +-inf where
    eager's module gives them."""
    shape = (37, 64)
    tensors = dict(zip(("x", "w", "b"), _inputs(shape, dtype, device=path_device)))
    tensors["x"].view(-1)[:2] = torch.tensor([30.0, -30.0], dtype=dtype, device=path_device)
    flat = tensors[target].view(-1)
    values = [INF, -INF, NAN][: flat.numel()]
    flat[torch.randperm(flat.numel(), device=path_device)[: len(values)]] = torch.tensor(
        values, dtype=dtype, device=path_device
    )
    x_e, w_e, b_e = (leaf(t) for t in tensors.values())
    x_r, w_r, b_r = (leaf(t, torch.float64) for t in tensors.values())
    x, w, b = (leaf(t) for t in tensors.values())
    y, y_e, y_r = (
        poly_norm(x, w, b, EPS),
        reference.poly_norm(x_e, w_e, b_e, EPS),
        reference.poly_norm(x_r, w_r, b_r, EPS),
    )
    assert_same_nonfinite("y", y, y_e, y_r)
    assert not torch.isfinite(y_e).all()
    dy = torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype)
    grads = torch.autograd.grad(y, (x, w, b), dy)
    grads_e = torch.autograd.grad(y_e, (x_e, w_e, b_e), dy)
    grads_r = torch.autograd.grad(y_r, (x_r, w_r, b_r), dy.double())
    for name, g, g_e, g_r in zip(("dx", "dw", "db"), grads, grads_e, grads_r):
        assert_same_nonfinite(name, g, g_e, g_r)


@pytest.mark.parametrize("shape", [(0, 48), (0, 5, 48)])
def test_poly_norm_empty_rows_like_eager(path_device, shape):
    tensors = _inputs(shape, torch.bfloat16, torch.float32, device=path_device)
    x, w, b = (leaf(t) for t in tensors)
    x_e, w_e, b_e = (leaf(t) for t in tensors)
    y, y_e = poly_norm(x, w, b), reference.poly_norm(x_e, w_e, b_e)
    assert y.dtype == y_e.dtype and y.shape == y_e.shape
    dy = torch.randn(shape, device=path_device).to(y.dtype)
    for g, g_e in zip(torch.autograd.grad(y, (x, w, b), dy), torch.autograd.grad(y_e, (x_e, w_e, b_e), dy)):
        assert g.dtype == g_e.dtype and g.shape == g_e.shape and torch.equal(g, g_e)


def test_poly_norm_module():
    """LigerPolyNorm: liger-kernel's initial values and parameter names, the functional op's values."""
    m = LigerPolyNorm(eps=1e-5)
    assert (
        torch.equal(m.weight.detach(), torch.full((3,), 1 / 3)) and m.bias.shape == () and m.bias.item() == 1
    )
    x = torch.randn(4, 5, 32)
    torch.testing.assert_close(m(x), reference.poly_norm(x, m.weight, m.bias, 1e-5))
    assert LigerPolyNorm(bias_shape=(1,)).bias.shape == (1,)
    with pytest.raises(ValueError, match="bias_shape"):
        LigerPolyNorm(bias_shape=(2,))


def test_poly_norm_custom_ops_pass_opcheck():
    mod = importlib.import_module("liger_core.ops.poly_norm")
    x, w, b = _inputs((5, 32), torch.float32)
    torch.library.opcheck(mod._poly_norm_fwd, (x, w, b, EPS))
    _, r = mod._poly_norm_fwd(x, w, b, EPS)
    torch.library.opcheck(mod._poly_norm_bwd, (torch.randn(5, 32), x, w, b, r))


def test_poly_norm_bad_input():
    x, w, b = _inputs((4, 8), torch.float32)
    with pytest.raises(TypeError, match="x"):
        poly_norm(x.long(), w, b)
    with pytest.raises(TypeError, match="weight"):
        poly_norm(x, None, b)
    with pytest.raises(ValueError, match="weight"):
        poly_norm(x, torch.randn(4), b)
    with pytest.raises(TypeError, match="bias"):
        poly_norm(x, w, 1.0)
    with pytest.raises(ValueError, match="bias"):
        poly_norm(x, w, torch.randn(2))
    with pytest.raises(ValueError, match="weight"):
        poly_norm(x, w.to("meta"), b)
    with pytest.raises(ValueError, match="x"):
        poly_norm(torch.randn(4, 0), w, b)

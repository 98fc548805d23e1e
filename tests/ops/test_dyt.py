import importlib

import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, assert_same_nonfinite, leaf, strided

from liger_core import reference
from liger_core.modules.norm_variants import LigerDyT
from liger_core.ops import dyt

# odd widths; 2500 spans three column blocks of the kernels
SHAPES = [(3, 7, 96), (37, 123), (5, 2500)]
NAMES = ("dx", "dalpha", "dgamma", "dbeta")


def _inputs(shape, dtype, p_dtype=None, device="cpu", beta=True, saturated=True):
    x = (torch.randn(shape, dtype=torch.float64, device=device) * 3).to(dtype)
    if saturated:
        # values around tanh's series / exponential switch (|alpha x| = 1/16), tiny and saturated ones
        special = torch.tensor([1e-9, -1e-5, 0.125, -0.126, 0.124, 30.0, -1e4], dtype=torch.float64)
        if x.numel() >= special.numel():
            x.view(-1)[: special.numel()] = special.to(device=device, dtype=dtype)
    else:
        x = x.clamp(-4, 4)
    p = p_dtype or dtype
    alpha = torch.tensor([0.5], dtype=torch.float64, device=device).to(p)
    gamma = (1 + 0.3 * torch.randn(shape[-1], dtype=torch.float64, device=device)).to(p)
    b = (0.3 * torch.randn(shape[-1], dtype=torch.float64, device=device)).to(p) if beta else None
    return x, alpha, gamma, b


def _check(x, alpha, gamma, beta, dy=None, layout=None):
    """y and the gradients of x, alpha, gamma, beta vs the float64 reference, no worse than eager (the DyT
    module's code in the inputs' dtypes)."""
    ts = [t for t in (x, alpha, gamma, beta) if t is not None]
    ins_e = [leaf(t) if layout is None or t.numel() == 1 else strided(t, layout).requires_grad_() for t in ts]
    ins_r = [leaf(t, torch.float64) for t in ts]
    ins = [t.detach().requires_grad_() for t in ts]
    y, y_e, y_r = dyt(*ins), reference.dyt(*ins_e), reference.dyt(*ins_r)
    assert y.dtype == y_e.dtype and y.shape == x.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)
    if dy is None:
        dy = torch.randn(y.shape, dtype=torch.float64, device=y.device).to(y.dtype)
    grads = torch.autograd.grad(y, ins, dy)
    grads_e = torch.autograd.grad(y_e, ins_e, dy)
    grads_r = torch.autograd.grad(y_r, ins_r, dy.double())
    for name, g, g_e, g_r, t in zip(NAMES, grads, grads_e, grads_r, ins):
        assert g.dtype == t.dtype and g.shape == t.shape
        assert_no_worse_than_eager(name, g, g_e, g_r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", [True, False])
def test_dyt_matches_float64(dtype, beta, poison_empty):
    for shape in SHAPES:
        _check(*_inputs(shape, dtype, beta=beta))


@pytest.mark.parametrize("x_dtype,p_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16)])
def test_dyt_mixed_and_half_dtypes(x_dtype, p_dtype):
    """fp32 parameters with bf16 activations (eager computes and returns fp32), and fp16."""
    _check(*_inputs(SHAPES[1], x_dtype, p_dtype))


def test_dyt_many_tiles_per_program(tune):
    tune(norm_tile_elements=64)
    _check(*_inputs((45, 33), torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
def test_dyt_strided_arguments(path_device, dtype, how):
    shape = (3, 7, 48)
    x, alpha, gamma, beta = _inputs(shape, dtype, device=path_device)
    dy = strided(torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype), how)
    ts = [alpha if t is alpha else strided(t, how) for t in (x, alpha, gamma, beta)]  # alpha: one element
    _check(*ts, dy=dy, layout=how)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target", ["x", "alpha", "gamma", "beta"])
def test_dyt_nonfinite_inputs_follow_eager(path_device, dtype, target):
    """+-inf / NaN in x or a parameter: y and the gradients NaN / +-inf where eager's autograd gives them
    (tanh(+-inf) = +-1 with a zero slope; its alpha gradient 0 * inf = NaN, as eager's). An infinite gamma
    is tested off saturation: where tanh rounds to +-1 in x's dtype, eager's slope 1 - t**2 is exactly 0 (NaN
    from inf * 0) while the kernel's is the true tiny slope (inf, as the float64 reference gives)."""
    shape = (37, 64)
    inputs = _inputs(shape, dtype, device=path_device, saturated=target != "gamma")
    tensors = dict(zip(("x", "alpha", "gamma", "beta"), inputs))
    flat = tensors[target].view(-1)
    values = [INF, -INF, NAN][: flat.numel()]
    flat[torch.randperm(flat.numel(), device=path_device)[: len(values)]] = torch.tensor(
        values, dtype=dtype, device=path_device
    )
    ins_e = [leaf(t) for t in tensors.values()]
    ins_r = [leaf(t, torch.float64) for t in tensors.values()]
    ins = [leaf(t) for t in tensors.values()]
    y, y_e, y_r = dyt(*ins), reference.dyt(*ins_e), reference.dyt(*ins_r)
    assert_same_nonfinite("y", y, y_e, y_r)
    dy = torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype)
    grads = torch.autograd.grad(y, ins, dy)
    grads_e = torch.autograd.grad(y_e, ins_e, dy)
    grads_r = torch.autograd.grad(y_r, ins_r, dy.double())
    for name, g, g_e, g_r in zip(NAMES, grads, grads_e, grads_r):
        assert_same_nonfinite(name, g, g_e, g_r)


@pytest.mark.parametrize("shape", [(0, 48), (0, 5, 48)])
def test_dyt_empty_rows_like_eager(path_device, shape):
    tensors = _inputs(shape, torch.bfloat16, torch.float32, device=path_device)
    ins, ins_e = [leaf(t) for t in tensors], [leaf(t) for t in tensors]
    y, y_e = dyt(*ins), reference.dyt(*ins_e)
    assert y.dtype == y_e.dtype and y.shape == y_e.shape
    dy = torch.randn(shape, device=path_device).to(y.dtype)
    for g, g_e in zip(torch.autograd.grad(y, ins, dy), torch.autograd.grad(y_e, ins_e, dy)):
        assert g.dtype == g_e.dtype and g.shape == g_e.shape and torch.equal(g, g_e)


def test_dyt_module():
    """LigerDyT: the DyT module's parameter names and initial values, the functional op's values."""
    m = LigerDyT(32, init_alpha=0.8)
    assert [n for n, _ in m.named_parameters()] == ["alpha", "gamma", "beta"]
    assert m.alpha.shape == (1,) and m.alpha.item() == pytest.approx(0.8)
    x = torch.randn(4, 5, 32)
    torch.testing.assert_close(m(x), reference.dyt(x, m.alpha, m.gamma, m.beta))
    assert LigerDyT(32, beta=False).beta is None


def test_dyt_custom_ops_pass_opcheck():
    mod = importlib.import_module("liger_core.ops.dyt")
    x, alpha, gamma, beta = _inputs((5, 32), torch.float32)
    for b in (beta, None):
        torch.library.opcheck(mod._dyt_fwd, (x, alpha, gamma, b))
    torch.library.opcheck(mod._dyt_bwd, (torch.randn(5, 32), x, alpha, gamma))


def test_dyt_bad_input():
    x, alpha, gamma, beta = _inputs((4, 8), torch.float32)
    with pytest.raises(TypeError, match="x"):
        dyt(x.long(), alpha, gamma, beta)
    with pytest.raises(ValueError, match="alpha"):
        dyt(x, torch.ones(2), gamma, beta)
    with pytest.raises(ValueError, match="alpha"):
        dyt(x, torch.tensor(0.5), gamma, beta)
    with pytest.raises(ValueError, match="gamma"):
        dyt(x, alpha, torch.ones(9), beta)
    with pytest.raises(ValueError, match="beta"):
        dyt(x, alpha, gamma, torch.ones(9))
    with pytest.raises(TypeError, match="beta"):
        dyt(x, alpha, gamma, beta.double())
    with pytest.raises(ValueError, match="gamma"):
        dyt(x, alpha, gamma.to("meta"), beta)
    with pytest.raises(ValueError, match="x"):
        dyt(torch.randn(4, 0), alpha, torch.ones(0))

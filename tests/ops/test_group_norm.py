import importlib

import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, assert_same_nonfinite, leaf, strided

from liger_core import reference
from liger_core.modules.norm_variants import LigerGroupNorm
from liger_core.ops import group_norm

EPS = 1e-5
# (shape, groups): images, (N, C) rows, 1-D sequences; one group, one channel per group
CASES = [((2, 6, 4, 5), 3), ((9, 6), 3), ((2, 4, 37), 2), ((2, 3, 9), 1), ((2, 6, 11), 6)]
NAMES = ("dx", "dw", "db")


def _inputs(shape, dtype, p_dtype=None, device="cpu", affine=True):
    x = (torch.randn(shape, dtype=torch.float64, device=device) * 2 + 1).to(dtype)
    p = p_dtype or dtype
    w = (1 + 0.3 * torch.randn(shape[1], dtype=torch.float64, device=device)).to(p) if affine else None
    b = (0.3 * torch.randn(shape[1], dtype=torch.float64, device=device)).to(p) if affine else None
    return x, w, b


def _check(x, groups, w, b, dy=None, layout=None):
    """y, dx, dw, db of the kernels vs the float64 reference, no worse than eager (torch's group_norm)."""
    ts = [t for t in (x, w, b) if t is not None]
    ins_e = [leaf(t) if layout is None else strided(t, layout).requires_grad_() for t in ts]
    ins_r = [leaf(t, torch.float64) for t in ts]
    ins = [t.detach().requires_grad_() for t in ts]

    def call(fn, ts):
        return fn(ts[0], groups, *ts[1:])

    y, y_e, y_r = call(group_norm, ins), call(reference.group_norm, ins_e), call(reference.group_norm, ins_r)
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
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_matches_float64(dtype, affine, poison_empty):
    for shape, groups in CASES:
        x, w, b = _inputs(shape, dtype, affine=affine)
        _check(x, groups, w, b)


@pytest.mark.parametrize("x_dtype,p_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16)])
def test_group_norm_mixed_and_half_dtypes(x_dtype, p_dtype):
    """fp32 parameters with bf16 activations (torch keeps the input dtype), and fp16."""
    for shape, groups in CASES[:3]:
        x, w, b = _inputs(shape, x_dtype, p_dtype)
        _check(x, groups, w, b)


def test_group_norm_positions_in_several_blocks(monkeypatch):
    """Channels whose positions span several blocks of the kernels' loops (a partial last block)."""
    mod = importlib.import_module("liger_core.ops.group_norm")
    monkeypatch.setattr(mod, "GROUP_NORM_BLOCK", 16)
    x, w, b = _inputs((2, 6, 7, 5), torch.float32)
    _check(x, 3, w, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
def test_group_norm_strided_arguments(path_device, dtype, how):
    shape = (3, 8, 5, 6)
    x, w, b = _inputs(shape, dtype, device=path_device)
    dy = strided(torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype), how)
    _check(*(strided(t, how) for t in (x,)), 4, strided(w, how), strided(b, how), dy=dy, layout=how)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target", ["x", "w", "b"])
def test_group_norm_nonfinite_inputs_follow_eager(path_device, dtype, target):
    """+-inf / NaN in x (and +-1e4) or in a parameter: NaN / +-inf where torch's group_norm gives them."""
    shape = (4, 8, 9)
    tensors = dict(zip(("x", "w", "b"), _inputs(shape, dtype, device=path_device)))
    tensors["x"].view(-1)[:2] = torch.tensor([1e4, -1e4], dtype=dtype, device=path_device)
    flat = tensors[target].view(-1)
    flat[torch.randperm(flat.numel(), device=path_device)[:3]] = torch.tensor(
        [INF, -INF, NAN], dtype=dtype, device=path_device
    )
    ins_e = [leaf(t) for t in tensors.values()]
    ins_r = [leaf(t, torch.float64) for t in tensors.values()]
    ins = [leaf(t) for t in tensors.values()]
    y = group_norm(ins[0], 4, *ins[1:])
    y_e, y_r = reference.group_norm(ins_e[0], 4, *ins_e[1:]), reference.group_norm(ins_r[0], 4, *ins_r[1:])
    assert_same_nonfinite("y", y, y_e, y_r)
    assert not torch.isfinite(y_e).all()
    dy = torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype)
    grads = torch.autograd.grad(y, ins, dy)
    grads_e = torch.autograd.grad(y_e, ins_e, dy)
    grads_r = torch.autograd.grad(y_r, ins_r, dy.double())
    for name, g, g_e, g_r in zip(NAMES, grads, grads_e, grads_r):
        assert_same_nonfinite(name, g, g_e, g_r)


@pytest.mark.parametrize("shape", [(0, 6, 5), (0, 6)])
def test_group_norm_empty_like_eager(path_device, shape):
    tensors = _inputs(shape, torch.float32, device=path_device)
    ins, ins_e = [leaf(t) for t in tensors], [leaf(t) for t in tensors]
    y, y_e = group_norm(ins[0], 3, *ins[1:]), reference.group_norm(ins_e[0], 3, *ins_e[1:])
    assert y.dtype == y_e.dtype and y.shape == y_e.shape
    dy = torch.randn(shape, device=path_device)
    for g, g_e in zip(torch.autograd.grad(y, ins, dy), torch.autograd.grad(y_e, ins_e, dy)):
        assert g.dtype == g_e.dtype and g.shape == g_e.shape and torch.equal(g, g_e)


def test_group_norm_module_matches_nn_group_norm():
    ours, torch_m = LigerGroupNorm(3, 6, eps=1e-4), torch.nn.GroupNorm(3, 6, eps=1e-4)
    assert list(ours.state_dict()) == list(torch_m.state_dict())
    with torch.no_grad():
        torch_m.weight.normal_(), torch_m.bias.normal_()
    ours.load_state_dict(torch_m.state_dict())
    x = torch.randn(2, 6, 10)
    torch.testing.assert_close(ours(x), torch_m(x))
    assert LigerGroupNorm(2, 4, affine=False).weight is None
    with pytest.raises(ValueError, match="num_groups"):
        LigerGroupNorm(4, 6)


def test_group_norm_custom_ops_pass_opcheck():
    mod = importlib.import_module("liger_core.ops.group_norm")
    x, w, b = _inputs((2, 4, 3), torch.float32)
    for ww, bb in ((w, b), (None, None)):
        torch.library.opcheck(mod._group_norm_fwd, (x, ww, bb, 2, EPS))
        _, mean, rstd = mod._group_norm_fwd(x, ww, bb, 2, EPS)
        torch.library.opcheck(mod._group_norm_bwd, (torch.randn(2, 4, 3), x, ww, mean, rstd, 2))


def test_group_norm_bad_input():
    x, w, b = _inputs((2, 6, 5), torch.float32)
    with pytest.raises(TypeError, match="x"):
        group_norm(x.long(), 3, w, b)
    with pytest.raises(ValueError, match="x"):
        group_norm(torch.randn(6), 3)
    with pytest.raises(ValueError, match="num_groups"):
        group_norm(x, 4, w, b)
    with pytest.raises(ValueError, match="num_groups"):
        group_norm(x, 0, w, b)
    with pytest.raises(ValueError, match="weight"):
        group_norm(x, 3, torch.ones(5), b)
    with pytest.raises(TypeError, match="bias"):
        group_norm(x, 3, w, b.double())
    with pytest.raises(ValueError, match="bias"):
        group_norm(x, 3, w, b.to("meta"))

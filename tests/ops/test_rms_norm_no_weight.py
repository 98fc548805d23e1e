import importlib

import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, assert_same_nonfinite, leaf, strided

from liger_core import reference
from liger_core.modules.norm_variants import LigerRMSNormNoWeight
from liger_core.ops import rms_norm_no_weight

EPS = 1e-6
SHAPES = [(3, 7, 96), (37, 123), (21, 5)]


def _check(x, dy=None, layout=None):
    x_e = leaf(x) if layout is None else strided(x, layout).requires_grad_()
    x_r = leaf(x, torch.float64)
    x = x.detach().requires_grad_()
    y, y_e, y_r = (
        rms_norm_no_weight(x, EPS),
        reference.rms_norm_no_weight(x_e, EPS),
        reference.rms_norm_no_weight(x_r, EPS),
    )
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)
    if dy is None:
        dy = torch.randn(y.shape, dtype=torch.float64, device=y.device).to(y.dtype)
    (dx,), (dx_e,), (dx_r,) = (
        torch.autograd.grad(o, i, g) for o, i, g in ((y, x, dy), (y_e, x_e, dy), (y_r, x_r, dy.double()))
    )
    assert dx.dtype == x.dtype and dx.shape == x.shape
    assert_no_worse_than_eager("dx", dx, dx_e, dx_r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_no_weight_matches_float64(dtype, poison_empty):
    for shape in SHAPES:
        _check((torch.randn(shape, dtype=torch.float64) * 3).to(dtype))


def test_rms_norm_no_weight_many_tiles_per_program(tune):
    tune(norm_tile_elements=64)
    _check(torch.randn(45, 33))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
def test_rms_norm_no_weight_strided_arguments(path_device, dtype, how):
    shape = (3, 7, 48)
    x = strided(torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype), how)
    dy = strided(torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype), how)
    _check(x, dy=dy, layout=how)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_no_weight_nonfinite_inputs_follow_eager(path_device, dtype):
    shape = (37, 64)
    x = torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype)
    x.view(-1)[:2] = torch.tensor([1e4, -1e4], dtype=dtype, device=path_device)
    x.view(-1)[torch.randperm(x.numel(), device=path_device)[:3]] = torch.tensor(
        [INF, -INF, NAN], dtype=dtype, device=path_device
    )
    x_e, x_r, x = leaf(x), leaf(x, torch.float64), leaf(x)
    y, y_e, y_r = (
        rms_norm_no_weight(x, EPS),
        reference.rms_norm_no_weight(x_e, EPS),
        reference.rms_norm_no_weight(x_r, EPS),
    )
    assert_same_nonfinite("y", y, y_e, y_r)
    assert not torch.isfinite(y_e).all()
    dy = torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype)
    dx, dx_e, dx_r = (
        torch.autograd.grad(o, i, g)[0] for o, i, g in ((y, x, dy), (y_e, x_e, dy), (y_r, x_r, dy.double()))
    )
    assert_same_nonfinite("dx", dx, dx_e, dx_r)


@pytest.mark.parametrize("shape", [(0, 48), (0, 5, 48)])
def test_rms_norm_no_weight_empty_rows_like_eager(path_device, shape):
    x = leaf(torch.randn(shape, device=path_device).to(torch.bfloat16))
    x_e = leaf(x)
    y, y_e = rms_norm_no_weight(x), reference.rms_norm_no_weight(x_e)
    assert y.dtype == y_e.dtype and y.shape == y_e.shape
    dy = torch.randn(shape, device=path_device).to(y.dtype)
    dx, dx_e = torch.autograd.grad(y, x, dy)[0], torch.autograd.grad(y_e, x_e, dy)[0]
    assert dx.dtype == dx_e.dtype and torch.equal(dx, dx_e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_no_weight_module_reproduces_gemma4(dtype):
    """Gemma4RMSNorm(with_scale=False) (its value norm): same output and input gradient as HF's module."""
    gemma4 = pytest.importorskip("transformers.models.gemma4.modeling_gemma4")
    hf = gemma4.Gemma4RMSNorm(48, eps=1e-6, with_scale=False)
    ours = LigerRMSNormNoWeight(48, eps=1e-6)
    x = (torch.randn(5, 9, 48, dtype=torch.float64) * 2).to(dtype)
    x_e, x_r, x = leaf(x), leaf(x, torch.float64), leaf(x)
    # HF's .float() would bring a float64 input down to fp32: the ground truth is the float64 reference
    y, y_e, y_r = ours(x), hf(x_e), reference.rms_norm_no_weight(x_r, 1e-6)
    assert_no_worse_than_eager("y", y, y_e, y_r)
    dy = torch.randn(y.shape, dtype=torch.float64).to(dtype)
    dx, dx_e, dx_r = (
        torch.autograd.grad(o, i, g)[0] for o, i, g in ((y, x, dy), (y_e, x_e, dy), (y_r, x_r, dy.double()))
    )
    assert_no_worse_than_eager("dx", dx, dx_e, dx_r)
    assert list(ours.state_dict()) == list(hf.state_dict()) == []


def test_rms_norm_no_weight_custom_ops_pass_opcheck():
    mod = importlib.import_module("liger_core.ops.rms_norm_no_weight")
    x = torch.randn(5, 32)
    torch.library.opcheck(mod._rms_norm_no_weight_fwd, (x, EPS))
    _, rstd = mod._rms_norm_no_weight_fwd(x, EPS)
    torch.library.opcheck(mod._rms_norm_no_weight_bwd, (torch.randn(5, 32), x, rstd))


def test_rms_norm_no_weight_bad_input():
    with pytest.raises(TypeError, match="x"):
        rms_norm_no_weight(torch.randn(4, 8).long())
    with pytest.raises(TypeError, match="x"):
        rms_norm_no_weight([1.0])
    with pytest.raises(ValueError, match="x"):
        rms_norm_no_weight(torch.randn(()))
    with pytest.raises(ValueError, match="x"):
        rms_norm_no_weight(torch.randn(4, 0))

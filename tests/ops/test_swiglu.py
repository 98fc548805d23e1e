import pytest
import torch
from helpers import assert_no_worse_than_eager, devices, leaf, noncontiguous

from liger_core import reference
from liger_core.ops import swiglu

SHAPES = {"cpu": [(3, 7, 123), (5, 257), (2, 1031)], "cuda": [(4, 2048, 14336), (3, 1001, 11008)]}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
def test_swiglu_matches_float64(device, dtype, layout, poison_empty):
    for shape in SHAPES[device]:
        a64 = torch.randn(shape, dtype=torch.float64, device=device) * 3
        b64 = torch.randn(shape, dtype=torch.float64, device=device)
        make = noncontiguous if layout == "noncontiguous" else (lambda t: t)
        a, b = leaf(make(a64.to(dtype))), leaf(make(b64.to(dtype)))
        a_e, b_e = leaf(a), leaf(b)
        a_r, b_r = leaf(a, torch.float64), leaf(b, torch.float64)

        y = swiglu(a, b)
        y_e = reference.swiglu(a_e, b_e)
        y_r = reference.swiglu(a_r, b_r)
        assert y.dtype == dtype and y.shape == a.shape
        assert_no_worse_than_eager("y", y, y_e, y_r)

        dy = torch.randn(shape, dtype=torch.float64, device=device).to(dtype)
        da, db = torch.autograd.grad(y, (a, b), dy)
        da_e, db_e = torch.autograd.grad(y_e, (a_e, b_e), dy)
        da_r, db_r = torch.autograd.grad(y_r, (a_r, b_r), dy.double())
        assert_no_worse_than_eager("da", da, da_e, da_r)
        assert_no_worse_than_eager("db", db, db_e, db_r)


@pytest.mark.parametrize("device", devices())
def test_swiglu_extreme_values(device):
    a = torch.tensor([-1e4, -80.0, -1.0, 0.5, 80.0, 1e4], device=device).repeat(37).reshape(6, 37)
    b = torch.randn_like(a)
    a, b = leaf(a), leaf(b)
    y = swiglu(a, b)
    a_r, b_r = leaf(a, torch.float64), leaf(b, torch.float64)
    y_r = reference.swiglu(a_r, b_r)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), y_r, rtol=1e-6, atol=1e-6)
    da, db = torch.autograd.grad(y.sum(), (a, b))
    da_r, db_r = torch.autograd.grad(y_r.sum(), (a_r, b_r))
    assert torch.isfinite(da).all() and torch.isfinite(db).all()
    torch.testing.assert_close(da.double(), da_r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(db.double(), db_r, rtol=1e-5, atol=1e-6)


def test_swiglu_bad_input():
    a = torch.randn(4, 8)
    with pytest.raises(ValueError, match="b"):
        swiglu(a, torch.randn(4, 9))
    with pytest.raises(TypeError, match="b"):
        swiglu(a, torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="a"):
        swiglu(a.long(), a.long())
    with pytest.raises(TypeError, match="a"):
        swiglu([1.0], a)

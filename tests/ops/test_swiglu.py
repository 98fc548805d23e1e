import pytest
import torch
import torch.nn.functional as F
from helpers import (
    assert_no_worse_than_eager,
    check_gated_empty,
    check_gated_nonfinite,
    check_gated_strided,
    devices,
    leaf,
    noncontiguous,
)

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


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
def test_swiglu_inplace_backward(device, dtype, layout):
    """inplace_backward=True: the same gradients, bit for bit, written over a and b (contiguous inputs) or
    over the op's private contiguous copies (then the caller's a and b keep their values)."""
    shape = SHAPES[device][1]
    make = noncontiguous if layout == "noncontiguous" else (lambda t: t)
    a0 = leaf((torch.randn(shape, dtype=torch.float64, device=device) * 3).to(dtype))
    b0 = leaf(torch.randn(shape, dtype=torch.float64, device=device).to(dtype))
    dy = torch.randn(shape, dtype=torch.float64, device=device).to(dtype)
    da_copy, db_copy = torch.autograd.grad(swiglu(a0, b0), (a0, b0), dy)

    a, b = make(a0.detach() * 1), make(b0.detach() * 1)  # what gate_proj(x), up_proj(x) hand over
    a.requires_grad_(), b.requires_grad_()
    a_before, b_before = a.detach().clone(), b.detach().clone()
    y = swiglu(a, b, inplace_backward=True)
    assert torch.equal(y, swiglu(a0, b0))
    da, db = torch.autograd.grad(y, (a, b), dy)
    assert torch.equal(da, da_copy) and torch.equal(db, db_copy)
    if layout == "contiguous":  # the gradients live in a's and b's memory
        assert da.data_ptr() == a.data_ptr() and db.data_ptr() == b.data_ptr()
        assert torch.equal(a.detach(), da_copy)
    else:
        assert torch.equal(a.detach(), a_before) and torch.equal(b.detach(), b_before)

    a_r, b_r = leaf(a0, torch.float64), leaf(b0, torch.float64)
    da_r, db_r = torch.autograd.grad(reference.swiglu(a_r, b_r), (a_r, b_r), dy.double())
    a_e, b_e = leaf(a0), leaf(b0)
    da_e, db_e = torch.autograd.grad(reference.swiglu(a_e, b_e), (a_e, b_e), dy)
    assert_no_worse_than_eager("da", da, da_e, da_r)
    assert_no_worse_than_eager("db", db, db_e, db_r)


def test_swiglu_inplace_backward_refuses_stale_inputs():
    """After an in-place backward a and b hold the gradients: a second backward through the graph fails
    loudly instead of computing from them; a and b in one buffer fall back to separate gradients."""
    a, b = leaf(torch.randn(5, 33) * 3), leaf(torch.randn(5, 33))
    y = swiglu(a * 1, b * 1, inplace_backward=True)
    y.backward(torch.ones_like(y), retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):
        y.backward(torch.ones_like(y))

    x = leaf(torch.randn(7, 19) * 3)
    x_r = leaf(x, torch.float64)
    x_before = x.detach().clone()
    y = swiglu(x * 1, x * 1, inplace_backward=True)
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    (dx_r,) = torch.autograd.grad(reference.swiglu(x_r, x_r), x_r, torch.ones_like(x_r))
    torch.testing.assert_close(dx.double(), dx_r, rtol=1e-5, atol=1e-6)
    assert torch.equal(x.detach(), x_before)
    h = x.detach() * 1  # one tensor as both arguments
    h.requires_grad_()
    (dh,) = torch.autograd.grad(swiglu(h, h, inplace_backward=True), h, torch.ones_like(h))
    torch.testing.assert_close(dh.double(), dx_r, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------
# Any strides, non-finite values and empty inputs, on every path: the Triton kernels (interpreter on CPU, or
# the GPU) and the pure-PyTorch reference path.
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
@pytest.mark.parametrize("inplace_backward", [False, True])
def test_swiglu_strided_arguments(path_device, dtype, how, inplace_backward):
    """a, b and the incoming gradient non-contiguous: y, da and db no worse than eager on the same views, the
    gradients in the views' shapes, and the caller's a and b untouched (the in-place backward writes over
    the op's own contiguous copies)."""
    shape = SHAPES[path_device][0]
    check_gated_strided(
        lambda a, b: swiglu(a, b, inplace_backward), reference.swiglu, shape, dtype, path_device, how
    )


# bf16 as fp32: eager's silu(a), rounded to bf16 before the product, is inf/NaN exactly where the kernel's is
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf * 0
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_nonfinite_inputs_follow_eager(path_device, dtype):
    """+-inf and NaN in a and b: y, da and db are NaN / +-inf where ``F.silu(a) * b`` and its autograd give
    them (silu(+inf) = +inf, silu(-inf) = NaN, 0 * inf = NaN, ...), and exact elsewhere."""
    check_gated_nonfinite(swiglu, lambda a, b: F.silu(a) * b, dtype, path_device)


@pytest.mark.parametrize("shape", [(0, 45), (0, 5, 45)])
@pytest.mark.parametrize("inplace_backward", [False, True])
def test_swiglu_empty_like_eager(path_device, shape, inplace_backward):
    """0 rows: the same empty y, da and db as eager on every path."""
    check_gated_empty(
        lambda a, b: swiglu(a, b, inplace_backward), lambda a, b: F.silu(a) * b, shape, path_device
    )

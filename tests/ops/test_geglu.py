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
from liger_core.ops import geglu

SHAPES = {"cpu": [(3, 7, 123), (5, 257), (2, 1031)], "cuda": [(4, 2048, 16384), (3, 1001, 11008)]}
APPROXIMATIONS = ["tanh", "none"]


def check_against_eager(a, b, approximate):
    a, b = leaf(a), leaf(b)
    a_e, b_e = leaf(a), leaf(b)
    a_r, b_r = leaf(a, torch.float64), leaf(b, torch.float64)
    y = geglu(a, b, approximate)
    y_e = reference.geglu(a_e, b_e, approximate)
    y_r = reference.geglu(a_r, b_r, approximate)
    assert y.dtype == a.dtype and y.shape == a.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)
    dy = torch.randn(a.shape, dtype=torch.float64, device=a.device).to(a.dtype)
    da, db = torch.autograd.grad(y, (a, b), dy)
    da_e, db_e = torch.autograd.grad(y_e, (a_e, b_e), dy)
    da_r, db_r = torch.autograd.grad(y_r, (a_r, b_r), dy.double())
    assert_no_worse_than_eager("da", da, da_e, da_r)
    assert_no_worse_than_eager("db", db, db_e, db_r)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_geglu_matches_float64(device, dtype, layout, approximate, poison_empty):
    make = noncontiguous if layout == "noncontiguous" else (lambda t: t)
    for shape in SHAPES[device]:
        # scale 3: most of the gate lies in gelu's curved region, and a tail in both saturated ones
        a = make((torch.randn(shape, dtype=torch.float64, device=device) * 3).to(dtype))
        b = make(torch.randn(shape, dtype=torch.float64, device=device).to(dtype))
        check_against_eager(a, b, approximate)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_geglu_fp16(device, approximate):
    shape = SHAPES[device][1]
    a = (torch.randn(shape, dtype=torch.float64, device=device) * 3).half()
    b = torch.randn(shape, dtype=torch.float64, device=device).half()
    check_against_eager(a, b, approximate)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_geglu_negative_tail(approximate):
    """a in [-9, -2]: gelu(a) is a tiny difference (1 + tanh(u) or 1 + erf) in the eager formula; the kernel
    must be at least as accurate there, in value and in gradient."""
    a = -2.0 - 7.0 * torch.rand(3001, dtype=torch.float64)
    b = torch.randn(3001, dtype=torch.float64)
    check_against_eager(a.float(), b.float(), approximate)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_geglu_extreme_values(device, approximate):
    values = [-1e4, -80.0, -10.0, -1.0, 0.5, 10.0, 80.0, 1e4]
    a = torch.tensor(values, device=device).repeat(37).reshape(8, 37)
    b = torch.randn_like(a)
    a, b = leaf(a), leaf(b)
    y = geglu(a, b, approximate)
    a_r, b_r = leaf(a, torch.float64), leaf(b, torch.float64)
    y_r = reference.geglu(a_r, b_r, approximate)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), y_r, rtol=1e-6, atol=1e-6)
    da, db = torch.autograd.grad(y.sum(), (a, b))
    da_r, db_r = torch.autograd.grad(y_r.sum(), (a_r, b_r))
    assert torch.isfinite(da).all() and torch.isfinite(db).all()
    torch.testing.assert_close(da.double(), da_r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(db.double(), db_r, rtol=1e-5, atol=1e-6)


def test_geglu_beyond_bf16_scale_stays_finite():
    """|a| near bf16's limit: a^3 overflows fp32, the sigmoid saturates, and nothing turns into NaN."""
    a = leaf(torch.tensor([-3e38, -1e20, -1e13, 1e13, 1e20, 3e38]))
    b = leaf(torch.ones(6))
    y = geglu(a, b)
    torch.testing.assert_close(y, torch.where(a > 0, a, 0.0).detach())
    (da,) = torch.autograd.grad(y.sum(), (a,))
    torch.testing.assert_close(da, (a > 0).float())


def test_geglu_empty():
    a = leaf(torch.empty(0, 5))
    y = geglu(a, torch.empty(0, 5))
    assert y.shape == (0, 5)
    (da,) = torch.autograd.grad(y.sum(), (a,))
    assert da.shape == (0, 5)


def test_geglu_bad_input():
    a = torch.randn(4, 8)
    with pytest.raises(ValueError, match="b"):
        geglu(a, torch.randn(4, 9))
    with pytest.raises(TypeError, match="b"):
        geglu(a, torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="a"):
        geglu(a.long(), a.long())
    with pytest.raises(TypeError, match="a"):
        geglu([1.0], a)
    with pytest.raises(ValueError, match="approximate"):
        geglu(a, a, approximate="erf")
    with pytest.raises(ValueError, match="b"):
        geglu(a, a.to("meta"))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_geglu_inplace_backward(device, dtype, approximate):
    """inplace_backward=True: the out-of-place gradients bit for bit, written over a and b; a second backward
    through the graph then fails loudly; a and b in one buffer still get correct, separate gradients."""
    shape = SHAPES[device][1]
    a0 = leaf((torch.randn(shape, dtype=torch.float64, device=device) * 3).to(dtype))
    b0 = leaf(torch.randn(shape, dtype=torch.float64, device=device).to(dtype))
    dy = torch.randn(shape, dtype=torch.float64, device=device).to(dtype)
    y_copy = geglu(a0, b0, approximate)
    da_copy, db_copy = torch.autograd.grad(y_copy, (a0, b0), dy)

    a, b = (t.detach() * 1 for t in (a0, b0))  # what gate_proj(x), up_proj(x) hand over
    a.requires_grad_(), b.requires_grad_()
    y = geglu(a, b, approximate, inplace_backward=True)
    assert torch.equal(y, y_copy)
    da, db = torch.autograd.grad(y, (a, b), dy, retain_graph=True)
    assert torch.equal(da, da_copy) and torch.equal(db, db_copy)
    assert da.data_ptr() == a.data_ptr() and db.data_ptr() == b.data_ptr()
    with pytest.raises(RuntimeError, match="inplace"):
        torch.autograd.grad(y, (a, b), dy)

    h = a0.detach() * 1
    h.requires_grad_()
    h_r = leaf(h, torch.float64)
    (dh,) = torch.autograd.grad(geglu(h, h, approximate, inplace_backward=True), h, dy)
    (dh_r,) = torch.autograd.grad(reference.geglu(h_r, h_r, approximate), h_r, dy.double())
    h_e = leaf(h)
    (dh_e,) = torch.autograd.grad(reference.geglu(h_e, h_e, approximate), h_e, dy)
    assert_no_worse_than_eager("dh", dh, dh_e, dh_r)


# ----------------------------------------------------------------------------------------------------------
# Any strides, non-finite values and empty inputs, on every path: the Triton kernels (interpreter on CPU, or
# the GPU) and the pure-PyTorch reference path.
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("inplace_backward", [False, True])
def test_geglu_strided_arguments(path_device, dtype, how, approximate, inplace_backward):
    """a, b and the incoming gradient non-contiguous: y, da and db no worse than eager on the same views, the
    gradients in the views' shapes, and the caller's a and b untouched (the in-place backward writes over
    the op's own contiguous copies)."""
    shape = SHAPES[path_device][0]
    check_gated_strided(
        lambda a, b: geglu(a, b, approximate, inplace_backward),
        lambda a, b: reference.geglu(a, b, approximate),
        shape,
        dtype,
        path_device,
        how,
    )


# bf16 as fp32: eager's gelu(a), rounded to bf16 before the product, is inf/NaN exactly where the kernel's is
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf * 0
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_geglu_nonfinite_inputs_follow_eager(path_device, dtype, approximate):
    """+-inf and NaN in a and b: y, da and db are NaN / +-inf where ``F.gelu(a, approximate) * b`` and its
    autograd give them (gelu(+inf) = +inf, gelu(-inf) = NaN, gelu'(+-inf) = NaN, 0 * inf = NaN, ...), and
    exact elsewhere."""
    a, b, y_e = check_gated_nonfinite(
        lambda a, b: geglu(a, b, approximate),
        lambda a, b: reference.geglu(a, b, approximate),
        dtype,
        path_device,
    )
    # the oracle is torch's own composition, but for the erf GELU of +inf (see liger_core.reference.geglu)
    y_torch = F.gelu(a, approximate=approximate) * b
    same = ~(torch.isposinf(a) & (approximate == "none"))
    torch.testing.assert_close(y_e[same], y_torch[same], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("shape", [(0, 45), (0, 5, 45)])
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("inplace_backward", [False, True])
def test_geglu_empty_like_eager(path_device, shape, approximate, inplace_backward):
    """0 rows: the same empty y, da and db as eager on every path."""
    check_gated_empty(
        lambda a, b: geglu(a, b, approximate, inplace_backward),
        lambda a, b: F.gelu(a, approximate=approximate) * b,
        shape,
        path_device,
    )

"""softmax: torch.softmax(x, dim) in Triton, forward and backward, vs the float64 reference of the same inputs
and no worse than eager in the same dtype."""

import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, assert_same_nonfinite, devices, leaf, strided

from liger_core import reference
from liger_core.modules import LigerSoftmax
from liger_core.ops import softmax

SHAPES = {"cpu": [((37, 131), -1), ((3, 5, 67), 1), ((2, 3001), -1)], "cuda": [((4096, 128256), -1)]}


def check(x, dim, dy_layout=None):
    x, x_e, x_r = leaf(x), leaf(x), leaf(x, torch.float64)
    y, y_e, y_r = softmax(x, dim), reference.softmax(x_e, dim), reference.softmax(x_r, dim)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)
    dy = torch.randn(x.shape, dtype=torch.float64, device=x.device).to(x.dtype)
    if dy_layout is not None:
        dy = dy_layout(dy)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_e,) = torch.autograd.grad(y_e, x_e, dy)
    (dx_r,) = torch.autograd.grad(y_r, x_r, dy.double())
    assert dx.shape == x.shape and dx.dtype == x.dtype
    assert_no_worse_than_eager("dx", dx, dx_e, dx_r)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_softmax_matches_float64(device, dtype, poison_empty):
    for shape, dim in SHAPES[device]:
        check((torch.randn(shape, dtype=torch.float64, device=device) * 4).to(dtype), dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_strided(path_device, dtype, how, dim):
    """x and dy non-contiguous (NaN between the elements a stride-blind kernel would read), softmax over
    either dimension."""
    x = strided((torch.randn(9, 41, dtype=torch.float64) * 4).to(device=path_device, dtype=dtype), how)
    check(x, dim, dy_layout=lambda t: strided(t, how))


def test_softmax_extreme_rows(path_device):
    """Logits of +-1e4 (the exponent range of a naive exp), a masked vocabulary (-inf, even in a whole leading
    block: rows of 20011 take two column blocks, on CPU too) and rows that are 1 element long."""
    x = torch.randn(6, 20011, dtype=torch.float64) * 3
    x[0, ::5] = 1e4
    x[1, :17000] = -INF
    x[4, 18000] = 30.0  # the running max moves in the second block
    x[2] = -1e4
    x[2, 7] = 0.0
    x[3, 1::2] = -INF
    check(x.float().to(path_device), -1)
    check(torch.randn(7, 1).to(path_device), -1)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_nonfinite_follow_eager(path_device, dtype):
    """A row all -inf (0 / 0), rows holding +inf or NaN: NaN rows where torch's softmax has them, the other
    rows no worse than eager; gradients likewise."""
    x = torch.randn(8, 37, dtype=torch.float64) * 3
    x[0] = -INF
    x[1, 5] = INF
    x[2, 9] = NAN
    x[3, :20] = -INF
    x = x.to(device=path_device, dtype=dtype)
    x, x_e, x_r = leaf(x), leaf(x), leaf(x, torch.float64)
    y, y_e, y_r = softmax(x), reference.softmax(x_e, -1), reference.softmax(x_r, -1)
    assert_same_nonfinite("y", y, y_e, y_r)
    dy = torch.randn(x.shape, dtype=torch.float64).to(device=path_device, dtype=dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_e,) = torch.autograd.grad(y_e, x_e, dy)
    (dx_r,) = torch.autograd.grad(y_r, x_r, dy.double())
    assert_same_nonfinite("dx", dx, dx_e, dx_r)


@pytest.mark.parametrize("shape, dim", [((0, 45), -1), ((4, 0), -1), ((3, 0, 5), 1), ((), 0)])
def test_softmax_empty_and_scalar_like_eager(path_device, shape, dim):
    x = leaf(torch.randn(shape, device=path_device))
    x_e = leaf(x)
    y, y_e = softmax(x, dim), torch.softmax(x_e, dim)
    assert y.shape == y_e.shape and torch.equal(y, y_e)
    dy = torch.randn(shape, device=path_device)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_e,) = torch.autograd.grad(y_e, x_e, dy)
    assert dx.shape == dx_e.shape and torch.allclose(dx, dx_e)


def test_softmax_module():
    x = torch.randn(5, 3, 17)
    torch.testing.assert_close(LigerSoftmax()(x), softmax(x), rtol=0, atol=0)
    torch.testing.assert_close(LigerSoftmax(dim=1)(x), softmax(x, 1), rtol=0, atol=0)
    assert "dim=1" in repr(LigerSoftmax(dim=1))


def test_softmax_bad_input():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="x"):
        softmax([1.0, 2.0])
    with pytest.raises(TypeError, match="x"):
        softmax(x.long())
    with pytest.raises(ValueError, match="dim"):
        softmax(x, 2)
    with pytest.raises(TypeError, match="dim"):
        softmax(x, 1.0)


def test_softmax_compiles_without_graph_break():
    """torch.compile(fullgraph=True) traces the op (its custom ops are opaque in the graph): the same values
    and gradients as eager."""
    torch._dynamo.reset()
    inputs = [torch.randn(5, 37)]

    def fn(x):
        return softmax(x, 0)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for run in (compiled, fn):
        leaves = [leaf(t) for t in inputs]
        y = run(*leaves)
        grads = torch.autograd.grad(y, leaves, torch.ones_like(y))
        if run is compiled:
            want = (y, grads)
    assert torch.equal(want[0], y) and all(torch.equal(a, b) for a, b in zip(want[1], grads))

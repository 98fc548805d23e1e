"""sparsemax: the simplex projection along any dim in Triton, forward and backward, vs the float64 reference
composition (sort, cumulative sums) of the same inputs and no worse than it in the same dtype."""

import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, assert_same_nonfinite, devices, leaf, strided

from liger_core import dispatch, reference
from liger_core.modules import LigerSparsemax
from liger_core.ops import sparsemax

SHAPES = {"cpu": [((37, 131), -1), ((3, 5, 67), 1), ((2, 3001), -1)], "cuda": [((4096, 32000), -1)]}


def check(x, dim, dy_layout=None):
    x, x_e, x_r = leaf(x), leaf(x), leaf(x, torch.float64)
    y, y_e, y_r = sparsemax(x, dim), reference.sparsemax(x_e, dim), reference.sparsemax(x_r, dim)
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
    return y


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [3.0, 0.01])
def test_sparsemax_matches_float64(device, dtype, scale, poison_empty):
    """Scale 3: a support of a few entries per row; scale 0.01: nearly uniform rows, supports of most of the
    row (long prefix sums)."""
    for shape, dim in SHAPES[device]:
        x = (torch.randn(shape, dtype=torch.float64, device=device) * scale).to(dtype)
        y = check(x, dim)
        # a distribution per row, with exact zeros off the support
        sums = y.double().sum(dim)
        assert torch.allclose(sums, torch.ones_like(sums), atol=2e-2 if dtype != torch.float32 else 1e-5)
        assert (y >= 0).all() and ((y == 0).any() or scale < 1)  # scale 3: some entries outside the support


def test_sparsemax_long_rows_span_blocks(path_device):
    """Rows of 20011 entries take two column blocks (on CPU too): the prefix sums carry across them, with the
    support reaching into the second block (a nearly uniform row) or not."""
    x = torch.randn(4, 20011, dtype=torch.float64) * 1e-5
    x[1] *= 1e5
    # 17000 entries near 1 fill the first block: the rest (0.99) are outside the support only because the
    # first block's sum carries into the second block's prefix sums
    x[2, :17000] = 1.0 + x[2, :17000]
    x[2, 17000:] = 0.99 + x[2, 17000:]
    y = check(x.float().to(path_device), -1)
    assert (y[2, 17000:] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
@pytest.mark.parametrize("dim", [-1, 0])
def test_sparsemax_strided(path_device, dtype, how, dim):
    x = strided((torch.randn(9, 41, dtype=torch.float64) * 2).to(device=path_device, dtype=dtype), how)
    check(x, dim, dy_layout=lambda t: strided(t, how))


def test_sparsemax_ties_and_extremes(path_device):
    """Exact ties at the top (uniform rows: every entry 1/V), one dominant entry (one-hot), +-1e4 values and
    -inf entries (never in the support)."""
    x = torch.randn(6, 37, dtype=torch.float64)
    x[0] = 0.25
    x[1, 3] = 50.0
    x[2, ::3] = 1e4
    x[3, ::2] = -INF
    x[4] = -1e4
    x[4, :5] = -1e4 + 0.125
    y = check(x.float().to(path_device), -1)
    torch.testing.assert_close(y[0], torch.full_like(y[0], 1 / 37))
    assert y[1, 3] == 1 and y[1].sum() == 1
    assert (y[3, ::2] == 0).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparsemax_nonfinite(path_device, dtype):
    """A +inf or NaN entry: y NaN / 0 where the reference composition has them (module doc), other rows
    exact; dx NaN in those rows only."""
    x = torch.randn(6, 23, dtype=torch.float64) * 2
    x[1, 4] = INF
    x[3, 7] = NAN
    x = x.to(device=path_device, dtype=dtype)
    x, x_e, x_r = leaf(x), leaf(x), leaf(x, torch.float64)
    y, y_e, y_r = sparsemax(x), reference.sparsemax(x_e), reference.sparsemax(x_r)
    assert_same_nonfinite("y", y, y_e, y_r)
    dy = torch.randn(x.shape, dtype=torch.float64).to(device=path_device, dtype=dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    bad = torch.zeros(6, dtype=torch.bool)
    bad[[1, 3]] = True
    assert torch.isfinite(dx[~bad]).all()
    if dispatch.use_triton(x):  # the reference path's autograd passes finite values there (module doc)
        assert torch.isnan(dx[bad]).all()
    (dx_r,) = torch.autograd.grad(y_r, x_r, dy.double())
    (dx_e,) = torch.autograd.grad(y_e, x_e, dy)
    assert_no_worse_than_eager("dx", dx[~bad], dx_e[~bad], dx_r[~bad])


@pytest.mark.parametrize("shape, dim", [((0, 45), -1), ((4, 0), -1), ((3, 0, 5), 1), ((), 0)])
def test_sparsemax_empty_and_scalar(path_device, shape, dim):
    x = leaf(torch.randn(shape, device=path_device))
    x_e = leaf(x)
    y, y_e = sparsemax(x, dim), reference.sparsemax(x_e, dim)
    assert y.shape == y_e.shape == shape
    torch.testing.assert_close(y, y_e)  # a 0-dim x: 1, exact in the kernel's float64, 1 - ulp in eager's fp32
    dy = torch.randn(shape, device=path_device)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_e,) = torch.autograd.grad(y_e, x_e, dy)
    assert dx.shape == shape and torch.allclose(dx, dx_e)


def test_sparsemax_module():
    x = torch.randn(5, 3, 17)
    torch.testing.assert_close(LigerSparsemax()(x), sparsemax(x), rtol=0, atol=0)
    torch.testing.assert_close(LigerSparsemax(dim=1)(x), sparsemax(x, 1), rtol=0, atol=0)
    assert "dim=1" in repr(LigerSparsemax(dim=1))


def test_sparsemax_bad_input():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="x"):
        sparsemax([1.0, 2.0])
    with pytest.raises(TypeError, match="x"):
        sparsemax(x.long())
    with pytest.raises(ValueError, match="dim"):
        sparsemax(x, -3)
    with pytest.raises(TypeError, match="dim"):
        LigerSparsemax(dim="last")


def test_sparsemax_compiles_without_graph_break():
    """torch.compile(fullgraph=True) traces the op (its custom ops are opaque in the graph): the same values
    and gradients as eager."""
    torch._dynamo.reset()
    inputs = [torch.randn(5, 37)]

    def fn(x):
        return sparsemax(x, -1)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for run in (compiled, fn):
        leaves = [leaf(t) for t in inputs]
        y = run(*leaves)
        grads = torch.autograd.grad(y, leaves, torch.ones_like(y))
        if run is compiled:
            want = (y, grads)
    assert torch.equal(want[0], y) and all(torch.equal(a, b) for a, b in zip(want[1], grads))

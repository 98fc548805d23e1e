import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, assert_same_nonfinite, devices, leaf, strided

from liger_core import reference
from liger_core.modules import LigerReLUSquared
from liger_core.ops import relu_squared

SHAPES = {"cpu": [(3, 7, 123), (5, 257), (1031,)], "cuda": [(4, 2048, 16384), (3, 1001, 11008)]}


def check_against_eager(x):
    x, x_e, x_r = leaf(x), leaf(x), leaf(x, torch.float64)
    y, y_e, y_r = relu_squared(x), reference.relu_squared(x_e), reference.relu_squared(x_r)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)
    dy = torch.randn(x.shape, dtype=torch.float64, device=x.device).to(x.dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_e,) = torch.autograd.grad(y_e, x_e, dy)
    (dx_r,) = torch.autograd.grad(y_r, x_r, dy.double())
    assert dx.shape == x.shape
    assert_no_worse_than_eager("dx", dx, dx_e, dx_r)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_relu_squared_matches_float64(device, dtype, poison_empty):
    for shape in SHAPES[device]:
        check_against_eager((torch.randn(shape, dtype=torch.float64, device=device) * 3).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
def test_relu_squared_strided(path_device, dtype, how):
    """x and the incoming gradient non-contiguous (NaN between the elements a stride-blind kernel would
    read): y and dx no worse than eager on the same views, in the views' shapes; x untouched."""
    x = strided((torch.randn(5, 37, dtype=torch.float64) * 3).to(device=path_device, dtype=dtype), how)
    before = x.clone()
    x.requires_grad_()
    x_e = strided(x.detach(), how).requires_grad_()
    x_r = leaf(x, torch.float64)
    y, y_e, y_r = relu_squared(x), reference.relu_squared(x_e), reference.relu_squared(x_r)
    assert_no_worse_than_eager("y", y, y_e, y_r)
    dy = strided(torch.randn(5, 37, dtype=torch.float64).to(device=path_device, dtype=dtype), how)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_e,) = torch.autograd.grad(y_e, x_e, dy)
    (dx_r,) = torch.autograd.grad(y_r, x_r, dy.double())
    assert dx.shape == x.shape
    assert_no_worse_than_eager("dx", dx, dx_e, dx_r)
    assert torch.equal(x.detach(), before)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf * 0
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relu_squared_nonfinite_follow_eager(path_device, dtype):
    """+-inf, NaN, +-0, +-1e4 (squares past bf16/fp16 range stay as eager has them) in x, and +-inf / NaN in
    dy at every kind of x: NaN / +-inf exactly where eager's ``square(relu(x))`` and its autograd have them
    (relu's backward gives 0 at x <= 0 even for a non-finite dy), and no worse than eager elsewhere."""
    specials = [INF, -INF, NAN, 0.0, -0.0, 1e4, -1e4, 2e19, 1.5, -1.5]
    x = torch.cat([torch.tensor(specials).repeat_interleave(4), torch.randn(1500, dtype=torch.float64) * 3])
    x = x.to(device=path_device, dtype=dtype)
    x, x_e, x_r = leaf(x), leaf(x), leaf(x, torch.float64)
    y, y_e, y_r = relu_squared(x), reference.relu_squared(x_e), reference.relu_squared(x_r)
    assert_same_nonfinite("y", y, y_e, y_r)
    dy = torch.randn(x.shape, dtype=torch.float64)
    dy[: 4 * len(specials)] = torch.tensor([INF, -INF, NAN, 1.0]).repeat(len(specials))
    dy = dy.to(device=path_device, dtype=dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_e,) = torch.autograd.grad(y_e, x_e, dy)
    (dx_r,) = torch.autograd.grad(y_r, x_r, dy.double())
    assert_same_nonfinite("dx", dx, dx_e, dx_r)


@pytest.mark.parametrize("shape", [(0,), (0, 45), (3, 0, 5)])
def test_relu_squared_empty_like_eager(path_device, shape):
    x = leaf(torch.randn(shape, device=path_device))
    x_e = leaf(x)
    y, y_e = relu_squared(x), reference.relu_squared(x_e)
    assert y.shape == y_e.shape == shape and y.dtype == y_e.dtype
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert dx.shape == shape


def test_relu_squared_module_matches_transformers():
    """``LigerReLUSquared`` computes what transformers' ``ACT2FN["relu2"]`` does, value and gradient."""
    activations = pytest.importorskip("transformers.activations")
    x = leaf(torch.randn(7, 33, dtype=torch.float64).float() * 3)
    x_hf = leaf(x)
    y, y_hf = LigerReLUSquared()(x), activations.ACT2FN["relu2"](x_hf)
    torch.testing.assert_close(y, y_hf, rtol=0, atol=0)
    dy = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, x, dy)[0], torch.autograd.grad(y_hf, x_hf, dy)[0])


def test_relu_squared_bad_input():
    with pytest.raises(TypeError, match="x"):
        relu_squared([1.0, 2.0])
    with pytest.raises(TypeError, match="x"):
        relu_squared(torch.arange(4))


def test_relu_squared_compiles_without_graph_break():
    """torch.compile(fullgraph=True) traces the op (its custom ops are opaque in the graph): the same values
    and gradients as eager."""
    torch._dynamo.reset()
    inputs = [torch.randn(5, 37)]
    fn = relu_squared
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for run in (compiled, fn):
        leaves = [leaf(t) for t in inputs]
        y = run(*leaves)
        grads = torch.autograd.grad(y, leaves, torch.ones_like(y))
        if run is compiled:
            want = (y, grads)
    assert torch.equal(want[0], y) and all(torch.equal(a, b) for a, b in zip(want[1], grads))

"""glu_down_proj: F.linear(act(a) * b, W, bias) keeping only a and b, checked against float64."""

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    INF,
    NAN,
    assert_no_worse_than_eager,
    assert_same_nonfinite,
    devices,
    leaf,
    noncontiguous,
    special_pairs,
    strided,
    with_values_at_random,
)

from liger_core import reference
from liger_core.ops import glu_down_proj

SHAPES = {
    "cpu": [((3, 7, 45), 19), ((5, 131), 33)],
    "cuda": [((2, 2048, 8192), 2048), ((3, 1001, 5504), 2048)],
}
ACTS = [("swiglu", "none"), ("geglu", "tanh"), ("geglu", "none")]


def _eager(a, b, w, bias, activation, approximate):
    h = reference.swiglu(a, b) if activation == "swiglu" else reference.geglu(a, b, approximate)
    return F.linear(h, w, bias)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation,approximate", ACTS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
def test_glu_down_proj_matches_float64(
    device, dtype, activation, approximate, with_bias, layout, poison_empty
):
    for shape, out_features in SHAPES[device]:
        make = noncontiguous if layout == "noncontiguous" else (lambda t: t)
        a0 = make((torch.randn(shape, dtype=torch.float64, device=device) * 2).to(dtype))
        b0 = make(torch.randn(shape, dtype=torch.float64, device=device).to(dtype))
        w0 = (torch.randn(out_features, shape[-1], device=device, dtype=torch.float64) / shape[-1] ** 0.5).to(
            dtype
        )
        bias0 = torch.randn(out_features, device=device, dtype=torch.float64).to(dtype) if with_bias else None
        # ours gets its own copies: its backward writes the gradients of a and b over them
        a, b = leaf(a0), leaf(b0)
        w = leaf(w0)
        bias = leaf(bias0) if with_bias else None
        ins_e = [leaf(a0), leaf(b0), leaf(w0)] + ([leaf(bias0)] if with_bias else [None])
        ins_r = [leaf(a0, torch.float64), leaf(b0, torch.float64), leaf(w0, torch.float64)]
        ins_r += [leaf(bias0, torch.float64)] if with_bias else [None]

        y = glu_down_proj(a * 1, b * 1, w, bias, activation, approximate)  # non-leaf inputs, as in a model
        y_e = _eager(*ins_e, activation, approximate)
        y_r = _eager(*ins_r, activation, approximate)
        assert y.dtype == dtype and y.shape == (*shape[:-1], out_features)
        assert_no_worse_than_eager("y", y, y_e, y_r)

        dy = torch.randn(y.shape, dtype=torch.float64, device=device).to(dtype)
        wrt = [a, b, w] + ([bias] if with_bias else [])
        grads = torch.autograd.grad(y, wrt, dy)
        grads_e = torch.autograd.grad(y_e, [t for t in ins_e if t is not None], dy)
        grads_r = torch.autograd.grad(y_r, [t for t in ins_r if t is not None], dy.double())
        for name, g, g_e, g_r in zip(["da", "db", "dW", "dbias"], grads, grads_e, grads_r):
            assert_no_worse_than_eager(name, g, g_e, g_r)


@pytest.mark.parametrize("device", devices())
def test_glu_down_proj_shared_storage_and_second_backward(device):
    """a and b from one fused projection (shared storage): gradients get their own memory, still exact; the
    in-place contract: a second backward through the graph fails loudly instead of reading gradients."""
    x = torch.randn(6, 2 * 40, device=device, requires_grad=True)
    w = torch.randn(9, 40, device=device, requires_grad=True)
    a, b = (x * 1).chunk(2, dim=-1)
    y = glu_down_proj(a, b, w)
    x_r, w_r = leaf(x, torch.float64), leaf(w, torch.float64)
    y_r = _eager(*x_r.chunk(2, dim=-1), w_r, None, "swiglu", "none")
    torch.testing.assert_close(y.double(), y_r, rtol=1e-5, atol=1e-5)
    g = torch.autograd.grad(y.sum(), (x, w))
    g_r = torch.autograd.grad(y_r.sum(), (x_r, w_r))
    torch.testing.assert_close(g[0].double(), g_r[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g[1].double(), g_r[1], rtol=1e-5, atol=1e-5)

    a2 = torch.randn(6, 40, device=device, requires_grad=True) * 1
    b2 = torch.randn(6, 40, device=device, requires_grad=True) * 1
    y2 = glu_down_proj(a2, b2, w)
    y2.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):
        y2.sum().backward()


def test_glu_down_proj_bad_input():
    a, b, w = torch.randn(4, 8), torch.randn(4, 8), torch.randn(3, 8)
    with pytest.raises(ValueError, match="weight"):
        glu_down_proj(a, b, torch.randn(3, 9))
    with pytest.raises(ValueError, match="b"):
        glu_down_proj(a, torch.randn(4, 9), w)
    with pytest.raises(TypeError, match="weight"):
        glu_down_proj(a, b, w.double())
    with pytest.raises(ValueError, match="bias"):
        glu_down_proj(a, b, w, torch.randn(4))
    with pytest.raises(ValueError, match="activation"):
        glu_down_proj(a, b, w, activation="relu")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_glu_down_proj_under_activation_checkpointing(device, use_reentrant):
    """An MLP block checkpointed (both torch.utils.checkpoint modes) gives the gradients of the plain block;
    the two nodes pass dy through their mailbox also when the forward is recomputed in backward."""
    torch.manual_seed(0)
    gate = torch.nn.Linear(24, 40, device=device)
    up = torch.nn.Linear(24, 40, device=device)
    down = torch.nn.Linear(40, 24, device=device)
    params = [*gate.parameters(), *up.parameters(), *down.parameters()]

    def block(x, fused):
        if fused:
            return x + glu_down_proj(gate(x), up(x), down.weight, down.bias)
        return x + down(reference.swiglu(gate(x), up(x)))

    x0 = torch.randn(3, 5, 24, device=device)
    grads = {}
    for fused in (False, True):
        x = leaf(x0)
        y = torch.utils.checkpoint.checkpoint(block, x, fused, use_reentrant=use_reentrant)
        y = torch.utils.checkpoint.checkpoint(block, y, fused, use_reentrant=use_reentrant)  # two blocks
        for p in params:
            p.grad = None
        y.square().sum().backward()  # reentrant checkpointing does not support autograd.grad
        grads[fused] = [x.grad] + [p.grad.clone() for p in params]
    for g_fused, g_plain in zip(grads[True], grads[False]):
        torch.testing.assert_close(g_fused, g_plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_glu_down_proj_recomputation_skips_the_product(device, use_reentrant, monkeypatch):
    """Under non-reentrant checkpointing the recomputed forward stops once the op has recorded a and b: the
    activation's forward kernel runs once per block (in the forward), not again in backward. Reentrant
    checkpointing reruns the whole block, so there it runs twice."""
    import importlib

    from liger_core.dispatch import use_triton

    module = importlib.import_module("liger_core.ops.glu_down_proj")  # the attribute is the function

    x0 = torch.randn(3, 5, 24, device=device)
    if not use_triton(x0):
        pytest.skip("the reference path has no separate nodes")
    gate = torch.nn.Linear(24, 40, device=device)
    up = torch.nn.Linear(24, 40, device=device)
    down = torch.nn.Linear(40, 24, device=device)
    calls = {"forward": 0, "backward": 0}
    product = module._product
    phase = ["forward"]

    def counting_product(*args):
        calls[phase[0]] += 1
        return product(*args)

    monkeypatch.setattr(module, "_product", counting_product)

    def block(x):
        return x + glu_down_proj(gate(x), up(x), down.weight, down.bias)

    x = leaf(x0)
    y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=use_reentrant)
    y = torch.utils.checkpoint.checkpoint(block, y, use_reentrant=use_reentrant)
    phase[0] = "backward"
    y.square().sum().backward()
    assert calls == {"forward": 2, "backward": 0 if not use_reentrant else 2}
    assert x.grad is not None and torch.isfinite(x.grad).all()


# ----------------------------------------------------------------------------------------------------------
# Any strides, non-finite values and empty inputs, on every path: the Triton kernels (interpreter on CPU, or
# the GPU) and the pure-PyTorch reference path.
# ----------------------------------------------------------------------------------------------------------


def _inputs(shape, out_features, dtype, device):
    """a, b (shape), weight (out_features, shape[-1]) and bias (out_features,): float64 draws in ``dtype``."""
    a = (torch.randn(shape, dtype=torch.float64, device=device) * 2).to(dtype)
    b = torch.randn(shape, dtype=torch.float64, device=device).to(dtype)
    w = torch.randn(out_features, shape[-1], dtype=torch.float64, device=device) / shape[-1] ** 0.5
    bias = torch.randn(out_features, dtype=torch.float64, device=device)
    return [a, b, w.to(dtype), bias.to(dtype)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation,approximate", ACTS)
@pytest.mark.parametrize("how", ["step2", "transposed"])
def test_glu_down_proj_strided_arguments(path_device, dtype, activation, approximate, how):
    """a, b, weight, bias and the incoming gradient non-contiguous: y and every gradient in the views' shapes
    and no worse than eager's; the caller's a and b keep their values (the backward writes the gradients over
    the op's own contiguous copies)."""
    device = path_device
    shape, out_features = SHAPES[device][0]
    tensors = _inputs(shape, out_features, dtype, device)
    # weight and dy dyadic (k/128, k/8): dh = dy @ weight is exact, so da and db measure the activation's
    # math, not dh's rounding, which eager's (less exact) activation may happen to cancel more often
    tensors[2] = (torch.randint(-16, 17, tensors[2].shape, device=device) / 128).to(dtype)
    ours = [strided(t, how).requires_grad_() for t in tensors]
    before = [t.detach().clone() for t in ours[:2]]
    # eager on contiguous copies of a, b and dy, as the op reads them, and on the same weight and bias views:
    # otherwise its GEMMs and sums take other summation orders, and the error ratio would measure those
    eager = [leaf(t.contiguous()) for t in ours[:2]] + [t.detach().requires_grad_() for t in ours[2:]]
    ref = [leaf(t, torch.float64) for t in ours]

    y = glu_down_proj(*ours, activation, approximate)
    y_e, y_r = _eager(*eager, activation, approximate), _eager(*ref, activation, approximate)
    assert y.dtype == dtype and y.shape == (*shape[:-1], out_features)
    assert_no_worse_than_eager("y", y, y_e, y_r)

    dy = strided((torch.randint(-8, 9, y.shape, device=device) / 8).to(dtype), how)
    grads = torch.autograd.grad(y, ours, dy)
    grads_e = torch.autograd.grad(y_e, eager, dy.contiguous())
    grads_r = torch.autograd.grad(y_r, ref, dy.double())
    for name, g, g_e, g_r, t in zip(["da", "db", "dW", "dbias"], grads, grads_e, grads_r, ours):
        assert g.shape == t.shape
        assert_no_worse_than_eager(name, g, g_e, g_r)
    assert all(torch.equal(t.detach(), t_before) for t, t_before in zip(ours, before))


# bf16 as fp32: eager's act(a), rounded to bf16, is inf/NaN where the kernel's is; the GEMMs are the same
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf * 0
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation,approximate", ACTS)
@pytest.mark.parametrize("target", ["a,b", "weight", "bias"])
def test_glu_down_proj_nonfinite_inputs_follow_eager(path_device, dtype, activation, approximate, target):
    """+-inf and NaN in a and b (every special pair), in the weight or in the bias: y and every gradient are
    NaN / +-inf where ``F.linear(act(a) * b, weight, bias)`` and its autograd give them, and exact elsewhere
    (eager's act is ``liger_core.reference``'s: torch's, but for the erf GELU of +inf, which is +inf)."""
    device = path_device
    tensors = _inputs((201, 11), 15, dtype, device)  # finite rows and columns enough for stable error ratios
    if target == "a,b":
        tensors[:2] = special_pairs(dtype, device)
    else:
        i = 2 if target == "weight" else 3
        tensors[i] = with_values_at_random(tensors[i], [INF, -INF, NAN])
        # an infinite dh meets every a of its column: below a = -5.2 eager's tanh-GELU derivative is exactly 0
        # (fp32 tanh saturates; inf * 0 = NaN) where the kernel's is its true tiny value (+-inf); keep a above
        tensors[0] = tensors[0].clamp(-4.0, 4.0)
    ours, eager, ref = (
        [leaf(t) for t in tensors],
        [leaf(t) for t in tensors],
        [leaf(t, torch.float64) for t in tensors],
    )
    y = glu_down_proj(ours[0] * 1, ours[1] * 1, *ours[2:], activation, approximate)
    y_e, y_r = _eager(*eager, activation, approximate), _eager(*ref, activation, approximate)
    assert_same_nonfinite("y", y, y_e, y_r)
    assert not torch.isfinite(y_e).all()  # the case does reach the output

    dy = torch.randn(y.shape, dtype=torch.float64, device=device).to(dtype)
    grads = torch.autograd.grad(y, ours, dy)
    grads_e = torch.autograd.grad(y_e, eager, dy)
    grads_r = torch.autograd.grad(y_r, ref, dy.double())
    for name, g, g_e, g_r in zip(["da", "db", "dW", "dbias"], grads, grads_e, grads_r):
        assert_same_nonfinite(name, g, g_e, g_r)


@pytest.mark.parametrize("shape", [(0, 45), (0, 5, 45)])
@pytest.mark.parametrize("activation,approximate", ACTS)
def test_glu_down_proj_empty_like_eager(path_device, shape, activation, approximate):
    """0 rows: the same empty y, da, db and the same all-zero dW and dbias as eager on every path."""
    tensors = _inputs(shape, 7, torch.float32, path_device)
    ours, eager = [leaf(t) for t in tensors], [leaf(t) for t in tensors]
    y = glu_down_proj(ours[0] * 1, ours[1] * 1, *ours[2:], activation, approximate)
    y_e = _eager(*eager, activation, approximate)
    assert y.dtype == y_e.dtype and y.shape == y_e.shape == (*shape[:-1], 7)
    dy = torch.randn(y.shape, device=path_device)
    for g, g_e in zip(torch.autograd.grad(y, ours, dy), torch.autograd.grad(y_e, eager, dy)):
        assert g.dtype == g_e.dtype and torch.equal(g, g_e)

"""glu_down_proj: F.linear(act(a) * b, W, bias) keeping only a and b, checked against float64."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_no_worse_than_eager, devices, leaf, noncontiguous

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

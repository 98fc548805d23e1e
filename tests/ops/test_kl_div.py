"""kl_div: parity with torch.nn.functional.kl_div, vs the float64 reference of the same inputs, no worse than
eager in the same dtype. Only ``input`` gets a gradient (target is a constant, as in Liger-Kernel)."""

import importlib

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_no_worse_than_eager, devices, leaf, noncontiguous

from liger_core import reference
from liger_core.modules import LigerKLDIVLoss
from liger_core.ops import kl_div

kl_div_module = importlib.import_module("liger_core.ops.kl_div")

SHAPES = {"cpu": [(37, 1031), (3, 5, 131)], "cuda": [(1024, 128256), (3, 333, 32000)]}
REDUCTIONS = ["none", "sum", "mean", "batchmean"]


def inputs(shape, dtype, device, log_target):
    """Student log-probs and teacher probs of moderate spread, some exactly 0 (for log-targets: log-probs,
    some -1e4; an exact -inf log-target is NaN in torch, see test_kl_div_extreme_values)."""
    x = torch.log_softmax(torch.randn(shape, dtype=torch.float64, device=device), -1).to(dtype)
    t = torch.softmax(torch.randn(shape, dtype=torch.float64, device=device), -1)
    t[..., ::17] = 0.0
    if log_target:
        t = t.log().clamp_min(-1e4)
    return x, t.to(dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_matches_float64(device, dtype, reduction, log_target, poison_empty):
    for i, shape in enumerate(SHAPES[device]):
        x, t = inputs(shape, dtype, device, log_target)
        if i == 1:  # the second shape is strided (every other column of a wider buffer)
            x, t = noncontiguous(x), noncontiguous(t)
        x = leaf(x)
        x_e, x_r = leaf(x), leaf(x, torch.float64)
        y = kl_div(x, t, reduction, log_target)
        y_e = reference.kl_div(x_e, t, reduction, log_target)
        y_r = reference.kl_div(x_r, t.double(), reduction, log_target)
        assert y.dtype == dtype and y.shape == y_e.shape and torch.isfinite(y).all()
        assert_no_worse_than_eager("loss", y, y_e, y_r)

        go = (torch.rand(y.shape, dtype=torch.float64, device=device) + 0.5).to(dtype)  # never all 1
        (g,) = torch.autograd.grad(y, x, go)
        (g_e,) = torch.autograd.grad(y_e, x_e, go)
        (g_r,) = torch.autograd.grad(y_r, x_r, go.double())
        assert g.shape == x.shape and g.dtype == dtype and torch.isfinite(g).all()
        assert_no_worse_than_eager("grad", g, g_e, g_r)


def test_kl_div_parity_details():
    """torch semantics: batchmean divides by input.size(0) (the vector length for 1-D input), mean by numel,
    zero target probs contribute 0; target gets no gradient; grad_output 1 path; the module."""
    x = leaf(torch.log_softmax(torch.randn(131), -1))
    t = torch.softmax(torch.randn(131), -1)
    t[::3] = 0.0
    for reduction in REDUCTIONS:
        want = F.kl_div(x, t, reduction=reduction)
        torch.testing.assert_close(
            kl_div(x, t, reduction), want, rtol=1e-6, atol=1e-6 * want.abs().max().item()
        )
    x2 = leaf(torch.log_softmax(torch.randn(4, 7, 131), -1))
    t2 = leaf(torch.softmax(torch.randn(4, 7, 131), -1))
    loss = kl_div(x2, t2, "batchmean")
    torch.testing.assert_close(loss, F.kl_div(x2, t2, reduction="batchmean"), rtol=1e-6, atol=0)
    gx, gt = torch.autograd.grad(loss, (x2, t2), allow_unused=True)
    assert gt is None
    torch.testing.assert_close(gx, -t2.detach() / 4, rtol=1e-6, atol=0)

    module = LigerKLDIVLoss(reduction="sum", log_target=True)
    assert list(module.state_dict()) == [] and "log_target=True" in repr(module)
    torch.testing.assert_close(module(x2, t2.log()), F.kl_div(x2, t2.log(), reduction="sum", log_target=True))
    with pytest.raises(ValueError, match="reduction"):
        LigerKLDIVLoss(reduction="avg")


@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_extreme_values(log_target):
    """Log-probs from logits of +-1e4 (down to -2e4) and targets that are exactly 0 or 1 (log-targets down to
    -2e4: an exact log-target of -inf is NaN in torch, and here)."""
    logits = torch.randn(37, 131, dtype=torch.float64) * 3
    logits[:, :5] = torch.tensor([-1e4, 1e4, 0.0, -80.0, 80.0], dtype=torch.float64)
    x = leaf(torch.log_softmax(logits, -1).float())
    if log_target:
        t = torch.log_softmax(torch.randn(37, 131, dtype=torch.float64) * 8, -1)
        t[:, 7] = -2e4
        t[0] = -2e4
        t[0, 1] = 0.0
    else:
        t = torch.softmax(torch.randn(37, 131, dtype=torch.float64) * 8, -1)
        t[:, 7] = 0.0
        t[0] = 0.0
        t[0, 1] = 1.0
    t = t.float()
    for reduction in ("none", "batchmean"):
        y = kl_div(x, t, reduction, log_target)
        (g,) = torch.autograd.grad(y.sum(), x)
        x_r = leaf(x, torch.float64)
        y_r = reference.kl_div(x_r, t.double(), reduction, log_target)
        (g_r,) = torch.autograd.grad(y_r.sum(), x_r)
        assert torch.isfinite(y).all() and torch.isfinite(g).all()
        torch.testing.assert_close(y.double(), y_r, rtol=1e-5, atol=1e-6 * y_r.abs().max().item())
        torch.testing.assert_close(g.double(), g_r, rtol=1e-5, atol=1e-9)


def test_kl_div_custom_ops_opcheck():
    x = torch.log_softmax(torch.randn(5, 33), -1)
    t = torch.softmax(torch.randn(5, 33), -1)
    torch.library.opcheck(kl_div_module._kl_div_fwd, (x, t, False, True))
    torch.library.opcheck(kl_div_module._kl_div_fwd, (x, t.log(), True, False))
    torch.library.opcheck(kl_div_module._kl_div_bwd, (torch.tensor(0.5), t, False, torch.bfloat16))


def test_kl_div_bad_input():
    x = torch.log_softmax(torch.randn(4, 8), -1)
    with pytest.raises(ValueError, match="target"):
        kl_div(x, torch.rand(4, 9))
    with pytest.raises(TypeError, match="target"):
        kl_div(x, x.double().exp())
    with pytest.raises(TypeError, match="input"):
        kl_div(x.long(), x.long())
    with pytest.raises(ValueError, match="input"):
        kl_div(torch.tensor(0.5), torch.tensor(0.5))
    with pytest.raises(ValueError, match="reduction"):
        kl_div(x, x.exp(), reduction="avg")
    with pytest.raises(TypeError, match="log_target"):
        kl_div(x, x.exp(), log_target=1)
    with pytest.raises(ValueError, match="target"):
        kl_div(x, torch.empty(4, 8, device="meta"))

"""kl_div: parity with torch.nn.functional.kl_div, vs the float64 reference of the same inputs, no worse than
eager in the same dtype. Only ``input`` gets a gradient (target is a constant, as in Liger-Kernel)."""

import importlib

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    SLACK,
    assert_no_worse_than_eager,
    assert_same_values,
    devices,
    leaf,
    noncontiguous,
    rel_err,
)

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


def assert_loss_no_worse(name, ours, eager, ref64, input_dtype):
    """The rule for the fp32 loss: no worse than eager's (the composition on upcast inputs). From fp32
    inputs (float64 math inside) each output is its exact value rounded once, never worse than eager's. From
    16-bit inputs both are fp32 math, whose final rounding is a lottery eager can win by luck (25 draws:
    up to 1.6 x eager's error for a cancelling sum, by the one rounding): held to SLACK x eager's plus that
    relative half ulp."""
    if input_dtype == torch.float32:
        assert_no_worse_than_eager(name, ours, eager, ref64)
        return
    e_ours, e_eager = rel_err(ours, ref64), rel_err(eager, ref64)
    assert e_ours <= SLACK * e_eager + 2.0**-24, f"{name}: {e_ours:.3e} vs eager's {e_eager:.3e}"


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
        assert y.dtype == torch.float32 and y.shape == y_e.shape and torch.isfinite(y).all()
        assert_loss_no_worse("loss", y, y_e, y_r, dtype)

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


# ----------------------------------------------------------------------------------------------------------
# Edge cases on both paths: torch's semantics for empty and non-finite input, any strides, the fp32 loss
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_kl_div_empty_as_torch(path, reduction):
    """No rows, an empty last dimension, an empty middle dimension: torch's values (sum 0, mean NaN,
    batchmean NaN for input.size(0) == 0, else 0), an fp32 loss, gradients of the input's shape."""
    for shape in ((0, 131), (3, 0), (2, 0, 5)):
        for log_target in (False, True):
            x = leaf(torch.randn(shape, dtype=torch.bfloat16))
            t = torch.rand(shape, dtype=torch.bfloat16)
            y = kl_div(x, t, reduction, log_target)
            (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
            want = F.kl_div(x.double(), t.double(), reduction=reduction, log_target=log_target)
            assert y.dtype == torch.float32 and g.dtype == torch.bfloat16 and g.shape == x.shape
            assert_same_values(f"{shape} {log_target}", y, want)


@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_non_finite_as_torch(path, log_target):
    """fp32 input and target holding -inf, +inf and NaN: the loss (elementwise and reduced) and the gradient
    have NaN and +-inf exactly where torch's F.kl_div (float64) has them, its values elsewhere (e.g. NaN for
    a -inf log-target, 0 * -inf; the gradient -p or -exp(t) finite wherever the target is). bf16 takes the
    same branches (fp64 loss math, fp32 gradient math inside)."""
    x = torch.log_softmax(torch.randn(6, 131), -1)
    t = torch.softmax(torch.randn(6, 131), -1)
    if log_target:
        t = t.log()
    t[0, 3] = 0.0 if not log_target else -float("inf")  # probability 0
    x[0, 3] = -float("inf")  # ... at a -inf log-prob
    x[1, 5] = -float("inf")  # a -inf log-prob where the target is positive
    x[2, 7] = float("nan")
    t[3, 1] = float("nan")
    t[4, 2] = float("inf")
    x[5, 9] = float("inf")
    t[5, 10] = -float("inf")
    go = torch.rand(6, 131) + 0.5
    for reduction in REDUCTIONS:
        xs = leaf(x)
        y = kl_div(xs, t, reduction, log_target)
        (g,) = torch.autograd.grad(y, xs, go if reduction == "none" else torch.tensor(1.3))
        x64 = leaf(x, torch.float64)
        want = F.kl_div(x64, t.double(), reduction=reduction, log_target=log_target)
        (g64,) = torch.autograd.grad(
            want, x64, go.double() if reduction == "none" else torch.tensor(1.3).double()
        )
        assert_same_values(f"loss {reduction}", y, want.detach())
        assert_same_values(f"grad {reduction}", g, g64)


def test_kl_div_strided_inputs(path):
    """input as a strided view (gaps poisoned with NaN), target strided or with rows expanded from one (row
    stride 0), the elementwise loss's grad_output strided: the values of contiguous inputs, forward and
    backward."""
    x = torch.log_softmax(torch.randn(3, 5, 131), -1)
    t_row = torch.softmax(torch.randn(131), -1)
    wide = torch.full((3, 5, 262), float("nan"))
    wide[..., ::2] = x
    xs = wide.requires_grad_()[..., ::2]
    go = torch.rand(3, 5, 131) + 0.5
    go_wide = torch.full((3, 5, 262), float("nan"))
    go_wide[..., ::2] = go
    for t in (noncontiguous(torch.softmax(torch.randn(3, 5, 131), -1)), t_row.expand(3, 5, 131)):
        for reduction in REDUCTIONS:
            x_ref = leaf(x)
            want = kl_div(x_ref, t.contiguous(), reduction)
            g_out = go if reduction == "none" else torch.tensor(0.7)
            (g_want,) = torch.autograd.grad(want, x_ref, g_out)
            y = kl_div(xs, t, reduction)
            (g,) = torch.autograd.grad(y, xs, go_wide[..., ::2] if reduction == "none" else g_out)
            torch.testing.assert_close(y, want, rtol=1e-6, atol=0)
            torch.testing.assert_close(g, g_want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kl_div_loss_is_fp32(path, dtype):
    """16-bit inputs: an fp32 loss, elementwise or reduced, exact to fp32 (in the input dtype a reduced loss
    is ~2e-3 off), the gradient in the input dtype."""
    x, t = inputs((37, 1031), dtype, "cpu", False)
    x = leaf(x)
    for reduction in REDUCTIONS:
        y = kl_div(x, t, reduction)
        (g,) = torch.autograd.grad(y.sum(), x)
        want = F.kl_div(x.double(), t.double(), reduction=reduction)
        assert y.dtype == torch.float32 and g.dtype == dtype
        assert rel_err(y, want) <= 2**-16, reduction

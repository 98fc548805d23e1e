"""fused_linear_distill_loss: JSD / forward KL / reverse KL between student and teacher heads (a layer on
fused_linear_jsd) against a float64 reference written from the definitions, and TRL's reduction."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import SLACK, assert_no_worse_than_eager, dyadic_linear_inputs, leaf, noncontiguous, rel_err

from liger_core.losses.distill import LigerFusedLinearDistillLoss, fused_linear_distill_loss
from liger_core.ops import fused_linear_jsd

N, HS, HT, V = 23, 24, 17, 37  # odd sizes: tokens, student / teacher hidden, vocabulary


def make_inputs(dtype, n=N, lead=None, scale=1.0):
    lead = lead or (n,)
    # dyadic inputs: exact logits from any GEMM, so the chunked op and eager differ only in their own math
    sh, sw, _ = dyadic_linear_inputs(lead, HS, V, dtype, logit_std=scale)
    th, tw, _ = dyadic_linear_inputs(lead, HT, V, dtype, logit_std=scale)
    target = torch.randint(0, V, lead)
    target[torch.rand(lead) < 0.3] = -100
    return sh, sw, th, tw, target


def divergence_rows(student_logits, teacher_logits, loss, beta, temperature):
    """Per-token divergence from its definition (module docstring of liger_core.losses.distill)."""
    q = torch.log_softmax(student_logits / temperature, -1)  # student log-probs
    p = torch.log_softmax(teacher_logits / temperature, -1)  # teacher log-probs

    def kl(a, b):  # KL(A || B) of log-probs
        return (a.exp() * (a - b)).sum(-1)

    if loss == "forward_kl":
        return kl(p, q)
    if loss == "reverse_kl":
        return kl(q, p)
    m = torch.logsumexp(torch.stack([p + math.log(beta), q + math.log(1 - beta)]), 0)
    return beta * kl(p, m) + (1 - beta) * kl(q, m)


def reference_loss(sh, sw, th, tw, target, loss, beta, temperature, dtype, num_items=None):
    """The eager composition in ``dtype`` math (logits in the inputs' dtype, softmax in fp32 at least), or
    the float64 reference of the same inputs; returns (loss, dh, dw)."""
    h, w = leaf(sh, dtype), leaf(sw, dtype)
    math_dtype = torch.promote_types(dtype, torch.float32)
    zs = (h @ w.t()).to(math_dtype)
    with torch.no_grad():
        zt = (th.to(dtype) @ tw.to(dtype).t()).to(math_dtype)
    rows = divergence_rows(zs, zt, loss, beta, temperature).reshape(-1)
    keep = (target.reshape(-1) != -100) if target is not None else torch.ones_like(rows, dtype=torch.bool)
    total = rows[keep].sum()
    value = total / (num_items if num_items is not None else max(int(keep.sum()), 1))
    dh, dw = torch.autograd.grad(value, (h, w))
    return value, dh, dw


CASES = [("jsd", 0.5), ("jsd", 0.2), ("forward_kl", None), ("reverse_kl", None)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("loss,beta", CASES)
def test_distill_matches_float64(loss, beta, dtype, poison_empty):
    """Loss and student gradients no worse than the eager composition, against float64; temperature 0.7,
    a third of the tokens ignored, chunks of 8 tokens."""
    sh, sw, th, tw, target = make_inputs(dtype)
    h, w = leaf(sh), leaf(sw)
    got = fused_linear_distill_loss(h, w, th, tw, target, loss=loss, beta=beta, temperature=0.7, chunk_size=8)
    dh, dw = torch.autograd.grad(got, (h, w))
    assert got.dtype == torch.float32 and dh.dtype == dtype and dw.dtype == dtype
    b = 0.5 if beta is None else beta
    eager = reference_loss(sh, sw, th, tw, target, loss, b, 0.7, dtype)
    ref = reference_loss(sh, sw, th, tw, target, loss, b, 0.7, torch.float64)
    # the scalar loss: SLACK x eager's error plus 4 fp32 ulps (one draw of eager's scalar error is noise at
    # the ulp level: CI saw 7.5e-8 against 1.25 x eager + 0.1 eps = 3.2e-8); gradients: the tensor rule
    e_loss, e_eager = rel_err(got, ref[0]), rel_err(eager[0], ref[0])
    assert e_loss <= SLACK * e_eager + 4 * 2.0**-23, f"loss: rel. error {e_loss:.3e} vs eager's {e_eager:.3e}"
    for name, a, e, r in zip(("grad_student_hidden", "grad_student_weight"), (dh, dw), eager[1:], ref[1:]):
        assert_no_worse_than_eager(name, a, e, r)
    assert (dh[target == -100] == 0).all()


def test_distill_is_fused_linear_jsd_with_named_beta():
    """forward_kl / reverse_kl are fused_linear_jsd at beta 0 / 1, jsd at the given beta: identical values."""
    sh, sw, th, tw, target = make_inputs(torch.float32, lead=(3, 7))
    for loss, beta, jsd_beta in (("forward_kl", None, 0.0), ("reverse_kl", None, 1.0), ("jsd", 0.3, 0.3)):
        got = fused_linear_distill_loss(sh, sw, th, tw, target, loss=loss, beta=beta, temperature=2.0)
        want = fused_linear_jsd(sh, sw, th, tw, target, jsd_beta, -100, 2.0)
        assert torch.equal(got, want), loss
    assert torch.equal(fused_linear_distill_loss(sh, sw, th, tw), fused_linear_jsd(sh, sw, th, tw, None, 0.5))


def test_distill_num_items_in_batch_and_noncontiguous():
    """num_items_in_batch: sum over this micro-batch's kept tokens / the accumulated batch's count (TRL)."""
    sh, sw, th, tw, target = make_inputs(torch.float32, lead=(2, 11))
    sh, th = noncontiguous(sh), noncontiguous(th)
    n_items = 40
    h, w = leaf(sh), leaf(sw)
    got = fused_linear_distill_loss(
        h, w, th, tw, target, loss="reverse_kl", num_items_in_batch=torch.tensor(n_items)
    )
    dh, dw = torch.autograd.grad(got, (h, w))
    ref = reference_loss(sh, sw, th, tw, target, "reverse_kl", 0.5, 1.0, torch.float64, num_items=n_items)
    eager = reference_loss(sh, sw, th, tw, target, "reverse_kl", 0.5, 1.0, torch.float32, num_items=n_items)
    # the loss: fused_linear_jsd's fp32 mean (correctly rounded) rescaled, one more rounding; eager's fp32
    # scalar may be closer by luck, so the rule for this 0-dim value is one fp32 ulp of the float64 value
    assert abs(got.item() - ref[0].item()) <= 2**-23 * abs(ref[0].item())
    for name, a, e, r in zip(("dh", "dw"), (dh, dw), eager[1:], ref[1:]):
        assert_no_worse_than_eager(name, a, e, r)
    as_int = fused_linear_distill_loss(sh, sw, th, tw, target, loss="reverse_kl", num_items_in_batch=n_items)
    assert torch.equal(as_int, got.detach())


def test_distill_all_ignored_gives_zero():
    sh, sw, th, tw, _ = make_inputs(torch.float32)
    h, w = leaf(sh), leaf(sw)
    target = torch.full((N,), -100)
    for num_items in (None, 5):
        got = fused_linear_distill_loss(h, w, th, tw, target, num_items_in_batch=num_items)
        dh, dw = torch.autograd.grad(got, (h, w))
        assert got.item() == 0.0 and (dh == 0).all() and (dw == 0).all()


def test_distill_module_and_errors():
    sh, sw, th, tw, target = make_inputs(torch.bfloat16)
    module = LigerFusedLinearDistillLoss(loss="forward_kl", temperature=1.5)
    assert list(module.state_dict()) == [] and "forward_kl" in repr(module)
    want = fused_linear_distill_loss(sh, sw, th, tw, target, loss="forward_kl", temperature=1.5)
    assert torch.equal(module(sh, sw, th, tw, target), want)
    with pytest.raises(ValueError, match="loss"):
        fused_linear_distill_loss(sh, sw, th, tw, loss="kl")
    with pytest.raises(ValueError, match="beta"):
        fused_linear_distill_loss(sh, sw, th, tw, loss="reverse_kl", beta=0.5)
    with pytest.raises(ValueError, match="beta"):
        fused_linear_distill_loss(sh, sw, th, tw, beta=1.5)
    with pytest.raises(ValueError, match="temperature"):
        LigerFusedLinearDistillLoss(temperature=0)
    with pytest.raises(ValueError, match="num_items_in_batch"):
        fused_linear_distill_loss(sh, sw, th, tw, num_items_in_batch=0)
    with pytest.raises(ValueError, match="num_items_in_batch"):
        fused_linear_distill_loss(sh, sw, th, tw, num_items_in_batch=torch.ones(2))
    with pytest.raises(ValueError, match="teacher_weight"):
        fused_linear_distill_loss(sh, sw, th, tw[:-1])


def biased_reference_loss(sh, sw, sb, th, tw, tb, target, loss, beta, temperature, dtype, num_items):
    """reference_loss with lm_head biases (the logits ``h W^T + b`` in the inputs' dtype, as F.linear):
    (loss, dh, dw, db)."""
    h, w, b = leaf(sh, dtype), leaf(sw, dtype), leaf(sb, dtype)
    math_dtype = torch.promote_types(dtype, torch.float32)
    zs = torch.nn.functional.linear(h, w, b).to(math_dtype)
    with torch.no_grad():
        zt = torch.nn.functional.linear(th.to(dtype), tw.to(dtype), tb.to(dtype)).to(math_dtype)
    rows = divergence_rows(zs, zt, loss, beta, temperature).reshape(-1)
    keep = target.reshape(-1) != -100
    value = rows[keep].sum() / num_items
    return (value, *torch.autograd.grad(value, (h, w, b)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("loss,beta", [("jsd", 0.3), ("forward_kl", None), ("reverse_kl", None)])
def test_distill_with_lm_head_bias_matches_float64(loss, beta, dtype):
    """Student and teacher lm_head biases: loss and the gradients to hidden, weight and bias no worse than
    eager against float64 (the divergences from their definitions); with num_items_in_batch; the module
    takes the biases too."""
    sh, sw, sb = dyadic_linear_inputs((2, 11), HS, V, dtype, bias=True)
    th, tw, tb = dyadic_linear_inputs((2, 11), HT, V, dtype, bias=True)
    target = torch.randint(0, V, (2, 11))
    target[torch.rand(2, 11) < 0.3] = -100
    h, w, b = leaf(sh), leaf(sw), leaf(sb)
    kwargs = dict(loss=loss, beta=beta, temperature=0.7, chunk_size=8, num_items_in_batch=30)
    got = fused_linear_distill_loss(h, w, th, tw, target, student_bias=b, teacher_bias=tb, **kwargs)
    grads = torch.autograd.grad(got, (h, w, b))
    assert grads[2].dtype == dtype and grads[2].shape == (V,)
    jsd_beta = 0.3 if loss == "jsd" else None
    args = (sh, sw, sb, th, tw, tb, target, loss, jsd_beta if jsd_beta is not None else 0.5, 0.7)
    eager = biased_reference_loss(*args, dtype, 30)
    ref = biased_reference_loss(*args, torch.float64, 30)
    e_loss, e_eager = rel_err(got, ref[0]), rel_err(eager[0], ref[0])
    assert e_loss <= SLACK * e_eager + 4 * 2.0**-23, f"loss: rel. error {e_loss:.3e} vs eager's {e_eager:.3e}"
    for name, a, e, r in zip(("dhidden", "dweight", "dbias"), grads, eager[1:], ref[1:]):
        assert_no_worse_than_eager(name, a, e, r)
    module = LigerFusedLinearDistillLoss(loss=loss, beta=beta, temperature=0.7, chunk_size=8)
    via_module = module(sh, sw, th, tw, target, num_items_in_batch=30, student_bias=sb, teacher_bias=tb)
    torch.testing.assert_close(via_module, got.detach(), rtol=0, atol=0)

"""fused_linear_kl_div: the KL divergence of distillation fused with both lm_heads, as a named entry on
fused_linear_jsd (beta 0: forward KL, beta 1: reverse KL). Checked against an independent float64 composition
with torch.nn.functional.kl_div, no worse than that composition in the inputs' dtype, and bit for bit the
fused_linear_jsd endpoint it names."""

import pytest
import torch
import torch.nn.functional as F
from helpers import SLACK, assert_no_worse_than_eager, dyadic_linear_inputs, leaf, noncontiguous, rel_err

from liger_core import reference
from liger_core.modules import LigerFusedLinearKLDiv
from liger_core.ops import fused_linear_jsd, fused_linear_kl_div


def make_inputs(lead, hidden_s, hidden_t, vocab, dtype):
    sh, sw, _ = dyadic_linear_inputs(lead, hidden_s, vocab, dtype)
    th, tw, _ = dyadic_linear_inputs(lead, hidden_t, vocab, dtype)
    labels = torch.randint(0, vocab, lead)
    labels[torch.rand(lead) < 0.25] = -100
    return sh, sw, th, tw, labels


def eager_kl(sh, sw, th, tw, labels, ignore_index=-100, temperature=1.0, *, reverse=False):
    """torch's KL on full logits (in the models' dtype, upcast to fp32 for the softmax): the sum over kept
    tokens of KL(P || Q) (reverse: KL(Q || P)) divided by their number."""
    up = torch.promote_types(sh.dtype, torch.float32)
    x = torch.log_softmax((sh @ sw.t()).to(up) / temperature, -1).reshape(-1, sw.shape[0])
    y = torch.log_softmax((th @ tw.t()).detach().to(up) / temperature, -1).reshape(-1, sw.shape[0])
    keep = labels.reshape(-1) != ignore_index
    x, y = x[keep], y[keep]
    # kl_div(input, target) = sum exp(target) * (target - input)
    total = (
        F.kl_div(y, x, log_target=True, reduction="sum")
        if reverse
        else F.kl_div(x, y, log_target=True, reduction="sum")
    )
    return total / keep.sum().clamp_min(1)


def run(fn, sh, sw, th, tw, labels, go, dtype=None, **kwargs):
    h, w = leaf(sh, dtype), leaf(sw, dtype)
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    loss = fn(h, w, cast(th), cast(tw), labels, **kwargs)
    return (loss, *torch.autograd.grad(loss, (h, w), go.to(loss.dtype)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reverse", [False, True])
def test_fused_linear_kl_div_matches_float64(dtype, reverse, poison_empty):
    """37 tokens in chunks of 8, hidden sizes 67 / 45, vocabulary 131, temperature 0.7, a quarter of the
    rows ignored, grad_output != 1."""
    sh, sw, th, tw, labels = make_inputs((37,), 67, 45, 131, dtype)
    go = torch.rand((), dtype=torch.float64) + 0.5
    kw = {"temperature": 0.7, "reverse": reverse}
    ours = run(fused_linear_kl_div, sh, sw, th, tw, labels, go, chunk_size=8, **kw)
    eager = run(eager_kl, sh, sw, th, tw, labels, go, **kw)
    ref = run(eager_kl, sh, sw, th, tw, labels, go, dtype=torch.float64, **kw)
    assert ours[0].dtype == torch.float32 and ours[0].shape == ()
    assert ours[1].dtype == dtype and ours[2].dtype == dtype
    # the fp32 loss of 16-bit models: fp32 math on both sides, whose final rounding eager may win by luck
    # (see test_kl_div's rule); from fp32 models the kernel's float64 math must be no worse
    e_ours, e_eager = rel_err(ours[0], ref[0]), rel_err(eager[0], ref[0])
    assert e_ours <= SLACK * e_eager + 2.0**-23, f"loss: {e_ours:.3e} vs eager's {e_eager:.3e}"
    for name, a, e, r in zip(("grad_student_hidden", "grad_student_weight"), ours[1:], eager[1:], ref[1:]):
        assert_no_worse_than_eager(name, a, e, r)
    assert (ours[1][labels == -100] == 0).all()


@pytest.mark.parametrize("reverse", [False, True])
def test_fused_linear_kl_div_is_the_named_jsd_endpoint(reverse):
    """Bit for bit fused_linear_jsd at beta = 0 / 1 (strided 3-D hidden states, no labels), and the reference
    path's entry is the reference's endpoint."""
    sh, sw, th, tw, _ = make_inputs((2, 19), 33, 21, 97, torch.bfloat16)
    sh, th = noncontiguous(sh), noncontiguous(th)
    go = torch.tensor(1.5, dtype=torch.float64)
    beta = 1.0 if reverse else 0.0
    kl = run(fused_linear_kl_div, sh, sw, th, tw, None, go, temperature=2.0, reverse=reverse)
    jsd = run(fused_linear_jsd, sh, sw, th, tw, None, go, beta=beta, temperature=2.0)
    for a, b in zip(kl, jsd):
        assert torch.equal(a, b)
    assert kl[1].shape == sh.shape
    r_kl = reference.fused_linear_kl_div(sh, sw, th, tw, None, temperature=2.0, reverse=reverse)
    r_jsd = reference.fused_linear_jsd(sh, sw, th, tw, None, beta, temperature=2.0)
    assert torch.equal(r_kl, r_jsd)


def test_fused_linear_kl_div_module():
    sh, sw, th, tw, labels = make_inputs((11,), 16, 24, 29, torch.float32)
    module = LigerFusedLinearKLDiv(temperature=1.5, reverse=True)
    want = fused_linear_kl_div(sh, sw, th, tw, labels, temperature=1.5, reverse=True)
    assert torch.equal(module(sh, sw, th, tw, labels), want)
    assert "reverse=True" in repr(module)


def test_fused_linear_kl_div_bad_input():
    sh, sw, th, tw, labels = make_inputs((5,), 8, 8, 13, torch.float32)
    with pytest.raises(TypeError, match="reverse"):
        fused_linear_kl_div(sh, sw, th, tw, labels, reverse=1)
    with pytest.raises(ValueError, match="temperature"):
        fused_linear_kl_div(sh, sw, th, tw, labels, temperature=0.0)
    with pytest.raises(ValueError, match="teacher_weight"):
        fused_linear_kl_div(sh, sw, th, tw[:5], labels)
    with pytest.raises(TypeError, match="reverse"):
        LigerFusedLinearKLDiv(reverse="yes")

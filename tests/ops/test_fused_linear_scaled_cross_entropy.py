"""fused_linear_scaled_cross_entropy: liger-kernel's per-token scaled cross-entropy (+ entropy) of
``input @ weight.T / temperature``, on fused_linear_logprobs' chunk loop; vs the float64 eager composition RL
trainers run, no worse than it in the same dtype, forward and backward (nll and entropy both carry
gradients)."""

import pytest
import torch
from helpers import assert_no_worse_than_eager, dyadic_linear_inputs, leaf, noncontiguous

from liger_core import reference
from liger_core.modules import LigerFusedLinearScaledCrossEntropy
from liger_core.ops import fused_linear_logprobs, fused_linear_scaled_cross_entropy


def make_inputs(lead, hidden_size, vocab, dtype):
    hidden, weight, _ = dyadic_linear_inputs(lead, hidden_size, vocab, dtype, logit_std=2.0)
    target = torch.randint(0, vocab, lead)
    target.view(-1)[::5] = -100
    return hidden, weight, target


def three_ways(hidden, weight, target, temperature, return_entropy, layout=lambda t: t):
    """[(outputs, (dinput, dweight))] for the op, the eager composition in the inputs' dtype and in float64,
    with the same random output gradients."""
    runs, grads_out = [], None
    for fn, dtype in (
        (fused_linear_scaled_cross_entropy, None),
        (reference.fused_linear_scaled_cross_entropy, None),
        (reference.fused_linear_scaled_cross_entropy, torch.float64),
    ):
        h, w = leaf(hidden, dtype), leaf(weight, dtype)
        out = fn(layout(h), w, target, temperature, -100, return_entropy)
        outs = out if return_entropy else (out,)
        if grads_out is None:
            grads_out = [torch.randn(o.shape, dtype=torch.float64) for o in outs]
        grads = torch.autograd.grad(outs, (h, w), [g.to(o.dtype) for g, o in zip(grads_out, outs)])
        runs.append((outs, grads))
    return runs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("return_entropy", [False, True])
def test_scaled_cross_entropy_matches_float64(dtype, return_entropy, poison_empty):
    """37 tokens, hidden 67, vocabulary 1031 (several column blocks), temperature 0.7, every fifth token
    ignored."""
    hidden, weight, target = make_inputs((37,), 67, 1031, dtype)
    ours, eager, ref = three_ways(hidden, weight, target, 0.7, return_entropy)
    assert ours[0][0].dtype == torch.float32 and ours[0][0].shape == target.shape
    names = ("nll", "entropy")
    for name, o, e, r in zip(names, ours[0], eager[0], ref[0]):
        assert o.dtype == e.dtype
        assert_no_worse_than_eager(name, o, e, r)
    for name, o, e, r in zip(("grad_input", "grad_weight"), ours[1], eager[1], ref[1]):
        assert_no_worse_than_eager(name, o, e, r)
    ignored = target == -100
    for o in ours[0]:
        assert (o[ignored] == 0).all() and not torch.signbit(o[ignored]).any()
    assert (ours[1][0][ignored] == 0).all()


def test_scaled_cross_entropy_strided_3d():
    """(3, 13, H) hidden states as a strided view; returns target's shape."""
    hidden, weight, target = make_inputs((3, 13), 24, 131, torch.bfloat16)
    ours, eager, ref = three_ways(hidden, weight, target, 1.3, True, layout=noncontiguous)
    assert ours[0][0].shape == ours[0][1].shape == (3, 13)
    for name, o, e, r in zip(("nll", "entropy", "grad_input", "grad_weight"), (*ours[0], *ours[1]),
                             (*eager[0], *eager[1]), (*ref[0], *ref[1])):  # fmt: skip
        assert_no_worse_than_eager(name, o, e, r)


def test_scaled_cross_entropy_is_fused_linear_logprobs():
    """The entry is fused_linear_logprobs' minus log_probs and its entropy (rounded to the input's dtype)."""
    hidden, weight, target = make_inputs((29,), 16, 97, torch.bfloat16)
    nll, entropy = fused_linear_scaled_cross_entropy(hidden, weight, target, 0.5, return_entropy=True)
    out = fused_linear_logprobs(hidden, weight, target, temperature=0.5, outputs=("entropy",))
    assert torch.equal(nll, -out.log_probs) and torch.equal(entropy, out.entropy.to(torch.bfloat16))


def test_scaled_cross_entropy_module():
    hidden, weight, target = make_inputs((11,), 16, 29, torch.float32)
    module = LigerFusedLinearScaledCrossEntropy(temperature=2.0, return_entropy=True)
    got = module(hidden, weight, target)
    want = fused_linear_scaled_cross_entropy(hidden, weight, target, 2.0, return_entropy=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert "return_entropy=True" in repr(module)


def test_scaled_cross_entropy_bad_input():
    hidden, weight, target = make_inputs((5,), 8, 13, torch.float32)
    with pytest.raises(TypeError, match="return_entropy"):
        fused_linear_scaled_cross_entropy(hidden, weight, target, return_entropy=1)
    with pytest.raises(TypeError, match="temperature"):
        fused_linear_scaled_cross_entropy(hidden, weight, target, temperature=True)
    with pytest.raises(ValueError, match="temperature"):
        fused_linear_scaled_cross_entropy(hidden, weight, target, temperature=0.0)
    with pytest.raises(ValueError, match="target"):
        fused_linear_scaled_cross_entropy(hidden, weight, torch.full((5,), 13))
    with pytest.raises(ValueError, match="temperature"):
        LigerFusedLinearScaledCrossEntropy(temperature=-1.0)

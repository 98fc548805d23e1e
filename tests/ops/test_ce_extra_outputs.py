"""cross_entropy's Liger-Kernel options (token scaling inside the row kernel, token accuracy, predicted
tokens) against the float64 reference, and the loss modules' keyword-only forms of them."""

import pytest
import torch
from helpers import SLACK, assert_no_worse_than_eager, leaf, rel_err

from liger_core import reference
from liger_core.loss_options import CrossEntropyOutput
from liger_core.modules import LigerCrossEntropyLoss, LigerFusedLinearCrossEntropyLoss
from liger_core.ops import cross_entropy, fused_linear_cross_entropy

IGNORE = -100
# a scaled scalar loss: a sum of p_y l_y whose factors each carry a few fp32 roundings (the kernel's fp32
# softcap, exp and row sum, as eager's): one draw of ulp-level errors, where eager's draw may happen to round
# to the nearest value (CPU: fp16 logits, 2.3 fp32 ulps vs eager's 0.4 in 1 draw of 12); the scalar rule of
# the sequence losses, SLACK x eager's error + 4 fp32 ulps
SCALAR_FLOOR = 4 * 2.0**-23


def assert_loss_no_worse(name, ours, eager, ref64):
    """The scaled losses (a scalar or one per token) are products of two fp32 numbers each rounded once (the
    token's loss and its detached probability): the kernel and eager each land within a few ulps, on either
    side, so the bound has a floor of a few fp32 ulps rather than the tensor rule's tenth of one."""
    e_ours, e_eager = rel_err(ours, ref64), rel_err(eager, ref64)
    assert e_ours <= SLACK * e_eager + SCALAR_FLOOR, (
        f"{name}: rel. error {e_ours:.3e} vs eager's {e_eager:.3e}"
    )


def _logits(dtype, n=29, vocab=131):
    logits = (torch.randn(n, vocab, dtype=torch.float64) * 2).to(dtype)
    target = torch.randint(0, vocab, (n,))
    target[torch.randperm(n)[: n // 5]] = IGNORE
    return logits, target


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "case",
    [
        dict(reduction="mean", label_smoothing=0.1),
        dict(reduction="sum", lse_square_scale=1e-3, softcap=15.0),
        dict(reduction="none", inplace_backward=True),
    ],
    ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()),
)
def test_cross_entropy_token_scaling_matches_float64(case, dtype):
    """Loss and gradient no worse than eager against float64 (fp16: the gradient computed in backward with
    grad_output folded in; inplace_backward: the logits overwritten)."""
    case = dict(case)
    inplace = case.pop("inplace_backward", False)
    logits, target = _logits(dtype)
    # grad_output != 1, powers of two: the op stores its 16-bit gradients and scales them in backward, which
    # rounds a second time for any other factor (the ops' documented design, tested in their own files)
    shape = (29,) if case["reduction"] == "none" else ()
    grad_out = 2.0 ** torch.randint(-1, 2, shape).double()

    def run(fn, cast=None, **kwargs):
        x = leaf(logits, cast)
        inp = x * 1 if inplace else x  # a temporary the op may overwrite
        loss = fn(inp, target, use_token_scaling=True, **case, **kwargs)
        return loss, *torch.autograd.grad(loss, x, grad_out.to(loss.dtype))

    ours = run(cross_entropy, inplace_backward=inplace)
    eager = run(reference.cross_entropy)
    ref = run(reference.cross_entropy, torch.float64)
    assert_loss_no_worse("loss", ours[0], eager[0], ref[0])
    assert_no_worse_than_eager("dlogits", ours[1], eager[1], ref[1])
    plain = reference.cross_entropy(logits.double(), target, **case)
    assert not torch.allclose(plain, ref[0].detach())  # the scaling is applied


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_accuracy_and_predicted_tokens(reduction):
    logits, target = _logits(torch.bfloat16, vocab=33)
    logits[3, 7] = logits[3, 20] = 50.0  # a tie: the first maximum
    target[3] = 20
    valid = target != IGNORE
    predicted = torch.where(valid, logits.float().argmax(-1), -1)
    assert predicted[3] == 7
    x = leaf(logits)
    out = cross_entropy(
        x, target, reduction=reduction, return_token_accuracy=True, return_predicted_tokens=True
    )
    assert isinstance(out, CrossEntropyOutput) and torch.equal(out.predicted_tokens, predicted)
    correct = ((predicted == target) & valid).float()
    want = correct if reduction == "none" else correct.sum() / valid.sum()
    torch.testing.assert_close(out.token_accuracy, want)
    out.loss.sum().backward()
    torch.testing.assert_close(out.loss.detach(), cross_entropy(logits, target, reduction=reduction))


def test_modules_take_the_options():
    """The modules' keyword-only options equal the functions'; their attributes and repr show them."""
    hidden = torch.randn(13, 16)
    weight = torch.randn(33, 16) / 4
    target = torch.randint(0, 33, (13,))
    target[2] = IGNORE
    module = LigerFusedLinearCrossEntropyLoss(return_token_accuracy=True, use_token_scaling=True)
    assert module.return_token_accuracy and "use_token_scaling=True" in repr(module)
    out = module(weight, hidden, target)
    want = fused_linear_cross_entropy(
        hidden, weight, target, return_token_accuracy=True, use_token_scaling=True
    )
    assert isinstance(out, CrossEntropyOutput)
    torch.testing.assert_close(out.loss, want.loss, rtol=0, atol=0)
    torch.testing.assert_close(out.token_accuracy, want.token_accuracy, rtol=0, atol=0)
    logits = hidden @ weight.t()
    ce = LigerCrossEntropyLoss(return_predicted_tokens=True)
    got = ce(logits, target)
    assert torch.equal(got.predicted_tokens, torch.where(target != IGNORE, logits.argmax(-1), -1))
    ce.return_predicted_tokens = False
    assert isinstance(ce(logits, target), torch.Tensor)
    with pytest.raises(TypeError, match="return_token_accuracy"):
        LigerCrossEntropyLoss(return_token_accuracy="yes")

"""The loss families' options objects: passed whole (``options=``) they give exactly what the same keywords
give, they are checked once at construction, and an option given both ways is an error."""

from __future__ import annotations

import pytest
import torch

from liger_core import ops
from liger_core.loss_options import CrossEntropyOptions
from liger_core.losses import (
    cpo_loss_from_logps,
    cpo_options,
    dpo_loss_from_logps,
    dpo_options,
    grpo_loss_from_logps,
    grpo_options,
    simpo_options,
)
from liger_core.modules import LigerCrossEntropyLoss, LigerFusedLinearCrossEntropyLoss

CE_KEYWORDS = dict(ignore_index=3, reduction="sum", label_smoothing=0.1, lse_square_scale=1e-3, softcap=4.0)


def _ce_inputs(vocab=37, rows=7, hidden=9):
    logits = torch.randn(rows, vocab) * 3
    target = torch.randint(0, vocab, (rows,))
    target[0] = CE_KEYWORDS["ignore_index"]
    weight = torch.rand(vocab) + 0.5
    return logits, target, weight, torch.randn(rows, hidden), torch.randn(vocab, hidden)


def test_cross_entropy_options_whole_equal_keywords(path):
    logits, target, weight, hidden, lm_head = _ce_inputs()
    options = CrossEntropyOptions(weight=weight, return_z_loss=True, **CE_KEYWORDS)
    by_keywords = ops.cross_entropy(logits, target, weight, return_z_loss=True, **CE_KEYWORDS)
    whole = ops.cross_entropy(logits, target, options=options)
    for a, b in zip(by_keywords, whole):
        assert torch.equal(a, b)
    by_keywords = ops.fused_linear_cross_entropy(
        hidden, lm_head, target, ce_weight=weight, return_z_loss=True, **CE_KEYWORDS
    )
    whole = ops.fused_linear_cross_entropy(hidden, lm_head, target, options=options)
    for a, b in zip(by_keywords, whole):
        assert torch.equal(a, b)


def test_cross_entropy_modules_pass_their_options(path):
    logits, target, weight, hidden, lm_head = _ce_inputs()
    module = LigerCrossEntropyLoss(weight, **CE_KEYWORDS)
    assert module.reduction == "sum" and module.softcap == 4.0
    assert torch.equal(module(logits, target), ops.cross_entropy(logits, target, weight, **CE_KEYWORDS))
    module.reduction = "none"  # an attribute set replaces the options by a checked copy
    assert module.options.reduction == "none"
    per_token = ops.cross_entropy(logits, target, weight, **{**CE_KEYWORDS, "reduction": "none"})
    assert torch.equal(module(logits, target), per_token)
    with pytest.raises(ValueError, match="reduction"):
        module.reduction = "max"
    fused = LigerFusedLinearCrossEntropyLoss(weight, **CE_KEYWORDS)
    assert torch.equal(
        fused(lm_head, hidden, target),
        ops.fused_linear_cross_entropy(hidden, lm_head, target, ce_weight=weight, **CE_KEYWORDS),
    )
    assert list(module.state_dict()) == ["weight"] and list(fused.state_dict()) == ["ce_weight"]


def test_cross_entropy_options_checked_once_and_not_given_twice():
    logits, target, *_ = _ce_inputs()
    for bad, match in (
        (dict(reduction="max"), "reduction"),
        (dict(label_smoothing=1.5), "label_smoothing"),
        (dict(softcap=0.0), "softcap"),
    ):
        with pytest.raises(ValueError, match=match):
            CrossEntropyOptions(**bad)
    with pytest.raises(TypeError, match="ignore_index"):
        CrossEntropyOptions(ignore_index=1.5)
    with pytest.raises(TypeError, match="reduction inside options"):
        ops.cross_entropy(logits, target, reduction="sum", options=CrossEntropyOptions())
    with pytest.raises(TypeError, match="options must be"):
        ops.cross_entropy(logits, target, options={"reduction": "sum"})


def _grpo_inputs(batch=3, length=5):
    logps = (-torch.rand(batch, length, dtype=torch.float64) * 3).requires_grad_()
    old = logps.detach() + 0.1 * torch.randn(batch, length, dtype=torch.float64)
    ref = logps.detach() + 0.1 * torch.randn(batch, length, dtype=torch.float64)
    mask = torch.ones(batch, length)
    mask[0, 3:] = 0
    return logps, old, ref, torch.randn(batch, dtype=torch.float64), mask


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "cispo", "sapo", "vespo"])
def test_grpo_options_whole_equal_keywords(loss_type):
    logps, old, ref, adv, mask = _grpo_inputs()
    hyper = dict(beta=0.04, epsilon_low=0.1, epsilon_high=0.3, loss_type=loss_type, max_completion_length=8)
    loss, metrics = grpo_loss_from_logps(logps, old, ref, adv, mask, **hyper)
    (grad,) = torch.autograd.grad(loss, logps)
    loss_o, metrics_o = grpo_loss_from_logps(logps, old, ref, adv, mask, options=grpo_options(**hyper))
    (grad_o,) = torch.autograd.grad(loss_o, logps)
    assert torch.equal(loss, loss_o) and torch.equal(grad, grad_o)
    assert metrics.keys() == metrics_o.keys()
    assert all(torch.equal(metrics[k], metrics_o[k]) for k in metrics)


def test_grpo_options_unknown_or_twice():
    logps, old, ref, adv, mask = _grpo_inputs()
    with pytest.raises(TypeError, match="epsilon"):
        grpo_loss_from_logps(logps, old, ref, adv, mask, epsilon=0.2)  # TRL's name is epsilon_low here
    with pytest.raises(TypeError, match="beta inside options"):
        grpo_loss_from_logps(logps, old, ref, adv, mask, options=grpo_options(), beta=0.1)
    with pytest.raises(ValueError, match="loss_type"):
        grpo_options(loss_type="ppo")


def _pairs(n=4):
    return [-torch.rand(n, dtype=torch.float64) * 5 for _ in range(4)]


@pytest.mark.parametrize(
    "hyper",
    [
        dict(beta=0.2, loss_type="sigmoid", label_smoothing=0.1),
        dict(beta=0.1, loss_type=("sigmoid", "bco_pair"), loss_weights=(0.7, 0.3)),
        dict(beta=0.3, loss_type="discopop", discopop_tau=0.1),
        dict(beta=0.1, loss_type="hinge", f_divergence_type="js_divergence"),
    ],
)
def test_dpo_options_whole_equal_keywords(hyper):
    pairs = _pairs()
    by_keywords = dpo_loss_from_logps(*pairs, **hyper)
    assert torch.equal(by_keywords, dpo_loss_from_logps(*pairs, options=dpo_options(**hyper)))
    with pytest.raises(TypeError, match="inside options"):
        dpo_loss_from_logps(*pairs, options=dpo_options(**hyper), beta=0.5)


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge", "ipo", "simpo"])
def test_cpo_options_whole_equal_keywords(loss_type):
    chosen, rejected, *_ = _pairs()
    hyper = dict(beta=0.3, loss_type=loss_type, simpo_gamma=0.4, alpha=0.2)
    by_keywords = cpo_loss_from_logps(chosen, rejected, **hyper)
    whole = cpo_loss_from_logps(chosen, rejected, options=cpo_options(**hyper))
    assert all(torch.equal(a, b) for a, b in zip(by_keywords, whole))


def test_simpo_options_are_the_simpo_papers_defaults():
    options = simpo_options(simpo_gamma=0.7)
    assert options.loss_type == "simpo" and options.simpo_gamma == 0.7
    assert options.beta == 2.0 and options.cpo_alpha == 0.0
    with pytest.raises(TypeError, match="loss_type"):
        simpo_options(loss_type="sigmoid")

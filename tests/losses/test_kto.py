"""KTO on hidden states against TRL 1.16's own KTOTrainer._compute_loss (float64 log-probs), the eager
pipeline in the same dtype, and itself (KL from hidden states, module); no NaN on masked rows or one-sided
batches."""

import math

import pytest
import torch
from helpers import leaf
from pref_common import (
    IGNORE,
    TokenLogprobs,
    assert_metrics_match,
    assert_scalar_no_worse,
    assert_token_grads_no_worse,
    batch,
    freeze_token_logprobs,
    own_logprob_cases,
    run_oracle,
)

from liger_core.losses import LigerFusedLinearKTOLoss, fused_linear_kto_loss, kto, kto_kl_estimate
from liger_core.ops import fused_linear_logprobs

N, T, H, V = 7, 7, 24, 37
CHUNK = 6
CONFIGS = [
    dict(loss_type="kto", desirable_weight=1.3, undesirable_weight=0.7),
    dict(loss_type="apo_zero_unpaired"),
]


def _ours(hidden, weight, bias, target, labels, **kwargs):
    leaves = [leaf(hidden), leaf(weight)] + ([leaf(bias)] if bias is not None else [])
    loss, metrics = fused_linear_kto_loss(
        leaves[0], leaves[1], target, labels, leaves[2] if bias is not None else None, **kwargs
    )
    return loss, metrics, torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kto_matches_trl(dtype, monkeypatch):
    """loss, gradients and metrics of KTOTrainer._compute_loss with precomputed reference and KL log-probs;
    a fully masked completion in the batch."""
    hidden, weight, bias, target = batch(dtype, N, T, H, V, bias=True, empty_rows=(2,))
    labels = torch.tensor([True, False, True, True, False, False, True])
    tokens = TokenLogprobs(hidden, weight, bias, target)
    seq64 = (tokens.ref[1].log_probs.detach() * tokens.mask).sum(-1)
    ref_logps = (seq64 + 2 * torch.randn(N, dtype=torch.float64)).float()
    kl_logps, ref_kl_logps = -30 + 3 * torch.randn(N), -31 + 3 * torch.randn(N)
    beta = 0.2
    cases = []
    for config in CONFIGS:
        for kind, ref_dtype in (("ref", torch.float64), ("eager", torch.float32)):
            cases.append(
                tokens.case(
                    kind,
                    trainer="kto",
                    beta=beta,
                    labels=labels,
                    ref_logps=ref_logps.to(ref_dtype),
                    kl_logps=kl_logps.to(ref_dtype),
                    ref_kl_logps=ref_kl_logps.to(ref_dtype),
                    **config,
                )  # fmt: skip
            )
    results = run_oracle(cases)
    kl = kto_kl_estimate(kl_logps, ref_kl_logps)
    # end to end: gradients to hidden, weight and bias through the op
    loss, metrics, grads = _ours(
        hidden,
        weight,
        bias,
        target,
        labels,
        ref_logps=ref_logps,
        kl=kl,
        beta=beta,
        chunk_size=CHUNK,
        **CONFIGS[0],
    )
    assert_scalar_no_worse("kto loss", loss, results[1]["loss"], results[0]["loss"])
    eager_grads = tokens.pull_back("eager", results[1]["grad"])
    ref_grads = tokens.pull_back("ref", results[0]["grad"])
    for name, mine, theirs, ref64 in zip(("dhidden", "dweight", "dbias"), grads, eager_grads, ref_grads):
        assert mine.dtype == dtype
        # a sequence loss's gradient: one fp32 factor per sequence times softmax terms, held by the scalar
        # rule as DPO's (CPU: dhidden 2.2e-7 vs eager's 1.66e-7 in 1 run of 4 with the tensor rule)
        assert_scalar_no_worse(f"kto {name}", mine, theirs, ref64)
    # both loss types on the op's per-token log-probs computed once
    log_probs, frozen = freeze_token_logprobs(
        monkeypatch, kto, hidden, weight, bias, target, chunk_size=CHUNK
    )
    kto_inputs = dict(trainer="kto", beta=beta, labels=labels, ref_logps=ref_logps, kl_logps=kl_logps)
    own = run_oracle(
        own_logprob_cases(
            frozen, tokens.mask, [dict(kto_inputs, ref_kl_logps=ref_kl_logps, **c) for c in CONFIGS]
        )
    )
    for i, config in enumerate(CONFIGS):
        ref_res, eager_res = own[2 * i], own[2 * i + 1]  # TRL's formula on the op's own log-probs
        loss, metrics = fused_linear_kto_loss(
            hidden, weight, target, labels, bias, ref_logps=ref_logps, kl=kl, beta=beta, **config
        )
        assert_scalar_no_worse(f"{config} loss", loss, eager_res["loss"], ref_res["loss"])
        (grad,) = torch.autograd.grad(loss, log_probs)
        assert_token_grads_no_worse(
            f"{config} dlog_probs", grad, eager_res["grad"], ref_res["grad"], tokens.mask
        )
        if dtype == torch.float32:
            assert_metrics_match(metrics, results[2 * i]["metrics"])
        assert all(math.isfinite(float(v)) for v in metrics.values())


def test_kto_kl_and_reference_from_hidden():
    """ref_hidden/ref_weight and kl_hidden/kl_target/ref_kl_hidden (scored by the same op under no_grad) ==
    the same values precomputed; the module == the function."""
    hidden, weight, _, target = batch(torch.float32, N, T, H, V)
    labels = torch.tensor([1, 0, 1, 1, 0, 0, 1], dtype=torch.bool)
    ref_hidden, ref_weight = torch.randn(N, T, 16), torch.randn(V, 16) / 4
    kl_hidden, kl_target = torch.randn(N, T, H), target.roll(1, 0)
    ref_kl_hidden = torch.randn(N, T, 16)
    kw = dict(beta=0.3, chunk_size=CHUNK)
    a = _ours(
        hidden, weight, None, target, labels, ref_hidden=ref_hidden, ref_weight=ref_weight,
        kl_hidden=kl_hidden, kl_target=kl_target, ref_kl_hidden=ref_kl_hidden, **kw,
    )  # fmt: skip
    ref_logps = fused_linear_logprobs(ref_hidden, ref_weight, target, chunk_size=CHUNK).log_probs.sum(-1)
    kl_logps = fused_linear_logprobs(kl_hidden, weight, kl_target, chunk_size=CHUNK).log_probs.sum(-1)
    ref_kl_logps = fused_linear_logprobs(
        ref_kl_hidden, ref_weight, kl_target, chunk_size=CHUNK
    ).log_probs.sum(-1)
    b = _ours(
        hidden,
        weight,
        None,
        target,
        labels,
        ref_logps=ref_logps,
        kl=kto_kl_estimate(kl_logps, ref_kl_logps),
        **kw,
    )
    c = _ours(
        hidden, weight, None, target, labels, ref_hidden=ref_hidden, ref_weight=ref_weight,
        kl_hidden=kl_hidden, kl_target=kl_target, ref_kl_logps=ref_kl_logps, **kw,
    )  # fmt: skip
    for other in (b, c):
        torch.testing.assert_close(a[0], other[0])  # up to the chunking of the GEMMs
        for x, y in zip(a[2], other[2]):
            torch.testing.assert_close(x, y)
        assert a[1].keys() == other[1].keys()
    module = LigerFusedLinearKTOLoss(ref_logps=ref_logps, kl=kto_kl_estimate(kl_logps, ref_kl_logps), **kw)
    torch.testing.assert_close(module(hidden, weight, target, labels)[0], b[0], rtol=0, atol=0)


@pytest.mark.parametrize("labels", [[1] * N, [0] * N, [1, 0, 1, 0, 1, 0, 1]])
def test_kto_masked_and_one_sided_no_nan(labels):
    """All-desirable, all-undesirable and mixed batches, with every row fully ignored or two empty rows:
    finite loss, gradients, metrics; a missing side has 0 metrics and count 0."""
    labels = torch.tensor(labels, dtype=torch.bool)
    hidden, weight, bias, target = batch(torch.float32, N, T, H, V, bias=True, empty_rows=(0, 3))
    for tgt in (target, torch.full_like(target, IGNORE)):
        loss, metrics, grads = _ours(
            hidden, weight, bias, tgt, labels, ref_logps=torch.randn(N) - 20, kl=0.5, chunk_size=CHUNK
        )
        assert torch.isfinite(loss)
        assert all(torch.isfinite(g).all() for g in grads)
        assert all(math.isfinite(float(v)) for v in metrics.values()), metrics
        assert int(metrics["count/chosen"]) == int(labels.sum())
        if not labels.any():
            assert float(metrics["rewards/chosen"]) == 0.0


def test_kto_bad_inputs():
    hidden, weight, _, target = batch(torch.float32, N, T, H, V)
    labels = torch.ones(N, dtype=torch.bool)
    ref = dict(ref_logps=torch.zeros(N))
    with pytest.raises(ValueError, match="labels"):
        fused_linear_kto_loss(hidden, weight, target, labels[:3], **ref)
    with pytest.raises(ValueError, match="exactly one reference"):
        fused_linear_kto_loss(hidden, weight, target, labels)
    with pytest.raises(ValueError, match="exactly one reference"):
        fused_linear_kto_loss(hidden, weight, target, labels, ref_hidden=hidden, ref_weight=weight, **ref)
    with pytest.raises(ValueError, match="ref_logps"):
        fused_linear_kto_loss(hidden, weight, target, labels, ref_logps=torch.zeros(N + 1))
    with pytest.raises(ValueError, match="loss_type"):
        fused_linear_kto_loss(hidden, weight, target, labels, loss_type="sigmoid", **ref)
    with pytest.raises(ValueError, match="kl_target"):
        fused_linear_kto_loss(hidden, weight, target, labels, kl_hidden=hidden, **ref)
    with pytest.raises(ValueError, match="not both"):
        fused_linear_kto_loss(
            hidden, weight, target, labels, kl=0.1, kl_hidden=hidden, kl_target=target, **ref
        )
    with pytest.raises(ValueError, match="beta"):
        fused_linear_kto_loss(hidden, weight, target, labels, beta=-1.0, **ref)

"""DPO, ORPO, CPO and SimPO on hidden states against TRL 1.16's own loss code (float64 log-probs), the eager
pipeline in the same dtype, and each other (reference sources, modules); no NaN on fully masked rows."""

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

from liger_core import reference
from liger_core.losses import (
    LigerFusedLinearCPOLoss,
    LigerFusedLinearDPOLoss,
    LigerFusedLinearORPOLoss,
    LigerFusedLinearSimPOLoss,
    fused_linear_cpo_loss,
    fused_linear_dpo_loss,
    fused_linear_orpo_loss,
    fused_linear_simpo_loss,
    preference,
)
from liger_core.ops import fused_linear_logprobs
from liger_core.ops.fused_linear_logprobs import OUTPUTS

B, T, H, V = 3, 7, 24, 37
CHUNK = 5  # several chunks of the 2B * T = 42 tokens

DPO_CONFIGS = [
    dict(loss_type="sigmoid"),
    dict(loss_type="hinge"),
    dict(loss_type="ipo"),
    dict(loss_type="exo_pair", label_smoothing=1e-3),
    dict(loss_type="nca_pair"),
    dict(loss_type="robust", label_smoothing=0.1),
    dict(loss_type="bco_pair"),
    dict(loss_type="sppo_hard"),
    dict(loss_type="aot", label_smoothing=0.1),
    dict(loss_type="aot_unpaired"),
    dict(loss_type="apo_zero"),
    dict(loss_type="apo_down"),
    dict(loss_type="discopop"),
    dict(loss_type="sigmoid_norm"),
    dict(loss_type="sft"),
    dict(loss_type=["sigmoid", "sft"], loss_weights=[0.8, 0.2]),
    dict(loss_type="sigmoid", f_divergence_type="forward_kl"),
    dict(loss_type="hinge", f_divergence_type="js_divergence"),
    dict(loss_type="sigmoid", use_weighting=True),
]


def _ours(fn, hidden, weight, bias, target, **kwargs):
    leaves = [leaf(hidden), leaf(weight)] + ([leaf(bias)] if bias is not None else [])
    loss, metrics = fn(leaves[0], leaves[1], target, leaves[2] if bias is not None else None, **kwargs)
    return loss, metrics, torch.autograd.grad(loss, leaves)


def _trl_config(config):
    config = dict(config)
    if isinstance(config.get("loss_type"), str) and "loss_weights" not in config:
        config["loss_type"] = [config["loss_type"]]
    return config


def _check(name, ours, eager_res, ref_res, tokens, dtype):
    """Loss, gradients (pulled back through the reference op) and, in fp32, TRL's metrics."""
    loss, metrics, grads = ours
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert_scalar_no_worse(f"{name} loss", loss, eager_res["loss"], ref_res["loss"])
    eager_grads = tokens.pull_back("eager", eager_res["grad"])
    ref_grads = tokens.pull_back("ref", ref_res["grad"])
    for label, mine, theirs, ref64 in zip(("dhidden", "dweight", "dbias"), grads, eager_grads, ref_grads):
        assert mine.dtype == dtype
        # a sequence loss's gradient is one fp32 factor per sequence times softmax terms: in fp32 its error is
        # those few factors' roundings, so the scalar rule (1.25 x eager's + 4 fp32 ulps; fresh-clone CI:
        # dweight 1.9e-7 vs eager's 1.25e-7, dbias 1.9e-7 vs 1.2e-7); in bf16 the tensor's roundings dominate
        assert_scalar_no_worse(f"{name} {label}", mine, theirs, ref64)
    return metrics


def _check_tokens(name, loss, log_probs, eager_res, ref_res, mask):
    """Loss, and its gradient with respect to the per-token log-probs on the completion tokens (elsewhere the
    op gives no gradient), against TRL's."""
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert_scalar_no_worse(f"{name} loss", loss, eager_res["loss"], ref_res["loss"])
    (grad,) = torch.autograd.grad(loss, log_probs, allow_unused=True)
    grad = torch.zeros_like(log_probs) if grad is None else grad
    assert_token_grads_no_worse(f"{name} dlog_probs", grad, eager_res["grad"], ref_res["grad"], mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dpo_matches_trl(dtype, monkeypatch):
    """Every DPO loss type (and f-divergences, MPO weights, WPO weighting) against DPOTrainer._compute_loss,
    with precomputed reference log-probs and a fully masked chosen completion in the batch."""
    hidden, weight, bias, target = batch(dtype, 2 * B, T, H, V, empty_rows=(1,), bias=True)
    tokens = TokenLogprobs(hidden, weight, bias, target)
    seq64 = (tokens.ref[1].log_probs.detach() * tokens.mask).sum(-1)
    ref_logps = (seq64 + 2 * torch.randn(2 * B, dtype=torch.float64)).float()
    ref_c, ref_r = ref_logps[:B], ref_logps[B:]
    cases = []
    for config in DPO_CONFIGS:
        trl = dict(trainer="dpo", beta=0.1, **_trl_config(config))
        for kind, ref_dtype in (("ref", torch.float64), ("eager", torch.float32)):
            cases.append(
                tokens.case(
                    kind, ref_chosen_logps=ref_c.to(ref_dtype), ref_rejected_logps=ref_r.to(ref_dtype), **trl
                )
            )
    results = run_oracle(cases)
    # end to end, gradients to hidden, weight and bias through the op, for two configurations
    for i in (0, 2):
        ours = _ours(
            fused_linear_dpo_loss, hidden, weight, bias, target,
            ref_chosen_logps=ref_c, ref_rejected_logps=ref_r, beta=0.1, chunk_size=CHUNK, **DPO_CONFIGS[i],
        )  # fmt: skip
        _check(str(DPO_CONFIGS[i]), ours, results[2 * i + 1], results[2 * i], tokens, dtype)
    # the gradient-in-forward path (groups of whole pairs: chunk_size >= one pair's 2T tokens, or the default)
    grouped = []
    real = preference.fused_linear_logprob_loss
    with monkeypatch.context() as patch:
        patch.setattr(
            preference, "fused_linear_logprob_loss", lambda *a, **k: grouped.append(1) or real(*a, **k)
        )
        for i, chunk in ((0, 2 * T), (2, None), (15, 4 * T), (18, 2 * T)):
            ours = _ours(
                fused_linear_dpo_loss, hidden, weight, bias, target,
                ref_chosen_logps=ref_c, ref_rejected_logps=ref_r, beta=0.1, chunk_size=chunk,
                **DPO_CONFIGS[i],
            )  # fmt: skip
            _check(f"grouped {DPO_CONFIGS[i]}", ours, results[2 * i + 1], results[2 * i], tokens, dtype)
        assert len(grouped) == 4
        # the sorted aot losses couple the pairs: the recomputing path
        ours = _ours(
            fused_linear_dpo_loss, hidden, weight, bias, target,
            ref_chosen_logps=ref_c, ref_rejected_logps=ref_r, beta=0.1, chunk_size=2 * T, **DPO_CONFIGS[8],
        )  # fmt: skip
        _check(str(DPO_CONFIGS[8]), ours, results[17], results[16], tokens, dtype)
        assert len(grouped) == 4
    # every configuration on the op's per-token log-probs computed once (gradients per token)
    log_probs, frozen = freeze_token_logprobs(
        monkeypatch, preference, hidden, weight, bias, target, chunk_size=CHUNK
    )
    own = run_oracle(
        own_logprob_cases(
            frozen,
            tokens.mask,
            [
                dict(
                    trainer="dpo",
                    beta=0.1,
                    ref_chosen_logps=ref_c,
                    ref_rejected_logps=ref_r,
                    **_trl_config(c),
                )
                for c in DPO_CONFIGS
            ],
        )
    )
    for i, config in enumerate(DPO_CONFIGS):
        loss, metrics = fused_linear_dpo_loss(
            hidden, weight, target, bias, ref_chosen_logps=ref_c, ref_rejected_logps=ref_r, beta=0.1, **config
        )
        _check_tokens(str(config), loss, log_probs, own[2 * i + 1], own[2 * i], tokens.mask)
        if dtype == torch.float32:
            assert_metrics_match(metrics, results[2 * i]["metrics"])
        assert all(math.isfinite(float(v)) for v in metrics.values())


def test_dpo_alpha_divergence():
    """f_divergence_type="alpha_divergence": against a float64 formula (TRL's f'(t) = (t^(alpha-1) - 1) /
    (alpha - 1)) and against DPOTrainer in fp32 (TRL's clamp table has no float64 entry)."""
    hidden, weight, _, target = batch(torch.float32, 2 * B, T, H, V)
    tokens = TokenLogprobs(hidden, weight, None, target)
    lp64 = tokens.ref[1].log_probs.detach()
    seq64 = (lp64 * tokens.mask).sum(-1)
    ref = (seq64 + torch.randn(2 * B, dtype=torch.float64)).float()
    alpha, beta = 0.3, 0.2
    config = dict(loss_type="sigmoid", f_divergence_type="alpha_divergence", f_alpha_divergence_coef=alpha)
    loss, metrics = fused_linear_dpo_loss(
        hidden, weight, target, ref_chosen_logps=ref[:B], ref_rejected_logps=ref[B:], beta=beta, **config
    )
    lr = seq64 - ref.double()
    scores = torch.expm1((alpha - 1) * lr) / (alpha - 1)
    expected = -torch.nn.functional.logsigmoid(beta * (scores[:B] - scores[B:])).mean()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)
    (trl,) = run_oracle(
        [tokens.case("eager", trainer="dpo", beta=beta, ref_chosen_logps=ref[:B], ref_rejected_logps=ref[B:],
                     **_trl_config(config))]
    )  # fmt: skip
    torch.testing.assert_close(loss, trl["loss"].float(), rtol=1e-5, atol=1e-6)
    assert_metrics_match(metrics, trl["metrics"])


def test_dpo_reference_sources_agree():
    """ref_hidden/ref_weight (scored by the same op under no_grad) == the precomputed sums of that op's
    log-probs; reference_free == zero reference log-probs; the module == the function."""
    hidden, weight, bias, target = batch(torch.float32, 2 * B, T, H, V, bias=True)
    ref_hidden = torch.randn(2 * B, T, 16)
    ref_weight = torch.randn(V, 16) / 4
    ref_tokens = fused_linear_logprobs(ref_hidden, ref_weight, target, chunk_size=CHUNK).log_probs
    ref_seq = ref_tokens.sum(-1)
    kw = dict(beta=0.3, loss_type="ipo", chunk_size=CHUNK)
    a = _ours(
        fused_linear_dpo_loss,
        hidden,
        weight,
        bias,
        target,
        ref_hidden=ref_hidden,
        ref_weight=ref_weight,
        **kw,
    )
    b = _ours(
        fused_linear_dpo_loss, hidden, weight, bias, target,
        ref_chosen_logps=ref_seq[:B], ref_rejected_logps=ref_seq[B:], **kw,
    )  # fmt: skip
    # same values up to the summation order of the sequence log-probs
    torch.testing.assert_close(a[0], b[0])
    for x, y in zip(a[2], b[2]):
        torch.testing.assert_close(x, y)
    free = _ours(fused_linear_dpo_loss, hidden, weight, bias, target, reference_free=True, **kw)
    zeros = _ours(
        fused_linear_dpo_loss, hidden, weight, bias, target,
        ref_chosen_logps=torch.zeros(B), ref_rejected_logps=torch.zeros(B), **kw,
    )  # fmt: skip
    torch.testing.assert_close(free[0], zeros[0], rtol=0, atol=0)
    module = LigerFusedLinearDPOLoss(**kw)
    loss, metrics = module(hidden, weight, target, bias, ref_hidden=ref_hidden, ref_weight=ref_weight)
    torch.testing.assert_close(loss, a[0], rtol=0, atol=0)
    assert set(metrics) == set(a[1])
    # no metrics statistics: same loss, reward/log-prob metrics only
    lean = fused_linear_dpo_loss(
        hidden,
        weight,
        target,
        bias,
        ref_hidden=ref_hidden,
        ref_weight=ref_weight,
        compute_metrics=False,
        **kw,
    )
    torch.testing.assert_close(lean[0], a[0], rtol=0, atol=0)
    assert "logits/chosen" not in lean[1] and "rewards/margins" in lean[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dpo_gradient_in_forward_path(dtype, monkeypatch):
    """Needs no TRL: the grouped path (gradients in the forward pass, groups of whole pairs,
    compensated bf16 dW) against the float64 pipeline, no less exact than the recomputing path (chunk_size
    below one pair), for a few loss types, WPO weighting, the SFT mix, a reference head and a fully ignored
    row; same metrics."""
    hidden, weight, bias, target = batch(dtype, 2 * B, T, H, V, empty_rows=(1,), bias=True)
    ref_hidden = torch.randn(2 * B, T, 16, dtype=torch.float64).to(dtype)
    ref_weight = (torch.randn(V, 16, dtype=torch.float64) / 4).to(dtype)
    configs = [
        dict(loss_type="sigmoid"),
        dict(loss_type="ipo", beta=0.3),
        dict(loss_type=["sigmoid", "sft"], loss_weights=[0.8, 0.2]),
        dict(loss_type="sigmoid", use_weighting=True),
        dict(loss_type="apo_zero", ref_hidden=ref_hidden, ref_weight=ref_weight),
    ]
    grouped = []
    real = preference.fused_linear_logprob_loss
    monkeypatch.setattr(
        preference, "fused_linear_logprob_loss", lambda *a, **k: grouped.append(1) or real(*a, **k)
    )
    for config in configs:
        config = dict(config)
        if "ref_hidden" not in config:
            config.update(ref_chosen_logps=torch.randn(B) - 20, ref_rejected_logps=torch.randn(B) - 20)
        config.setdefault("beta", 0.1)
        runs = {
            name: _ours(fused_linear_dpo_loss, hidden, weight, bias, target, chunk_size=chunk, **config)
            for name, chunk in (("grouped", 2 * T), ("recompute", CHUNK))
        }
        # float64: the same formula on the float64 reference op's log-probs (graph to float64 leaves)
        leaves = [leaf(hidden, torch.float64), leaf(weight, torch.float64), leaf(bias, torch.float64)]
        out64 = reference.fused_linear_logprobs(leaves[0], leaves[1], target, leaves[2], outputs=OUTPUTS)
        with monkeypatch.context() as patch:
            patch.setattr(preference, "token_logprobs", lambda *a, outputs=(), out64=out64, **k: out64)
            loss64, _ = fused_linear_dpo_loss(hidden, weight, target, bias, chunk_size=CHUNK, **config)
        runs["ref64"] = (loss64, None, torch.autograd.grad(loss64, leaves))
        (g_loss, g_metrics, g_grads), (r_loss, r_metrics, r_grads) = runs["grouped"], runs["recompute"]
        f_loss, _, f_grads = runs["ref64"]
        assert_scalar_no_worse(f"{config} loss", g_loss, r_loss, f_loss)
        for label, mine, theirs, ref64 in zip(("dhidden", "dweight", "dbias"), g_grads, r_grads, f_grads):
            assert mine.dtype == dtype
            # a sequence loss's gradient is one fp32 factor per sequence times exact-to-fp64 softmax terms:
            # in fp32 its error is those few factors' roundings (1.25 x plus 4 fp32 ulps, as the scalar rule;
            # CPU: 2.8e-7 vs 9.1e-8 in 1 run of 6 with the tensor rule), in bf16 the tensor's own roundings
            assert_scalar_no_worse(f"{config} {label}", mine, theirs, ref64)
        assert set(g_metrics) == set(r_metrics)
        for key in g_metrics:
            torch.testing.assert_close(g_metrics[key], r_metrics[key], rtol=2e-2, atol=1e-4)
    assert len(grouped) == len(configs)  # the grouped runs went the grouped way, and only they


def test_dpo_per_pair_metrics():
    """per_pair=True adds the (B,) tensors whose means are the logged metrics; rewards = beta (logps -
    ref)."""
    hidden, weight, _, target = batch(torch.float32, 2 * B, T, H, V, empty_rows=(1,))
    ref_c, ref_r = torch.randn(B) - 20, torch.randn(B) - 20
    kwargs = dict(ref_chosen_logps=ref_c, ref_rejected_logps=ref_r, beta=0.3, chunk_size=CHUNK)
    _, plain = fused_linear_dpo_loss(hidden, weight, target, **kwargs)
    _, metrics = fused_linear_dpo_loss(hidden, weight, target, per_pair=True, **kwargs)
    assert set(metrics) - set(plain) == {
        "chosen_logps",
        "rejected_logps",
        "chosen_rewards",
        "rejected_rewards",
    }
    for name, ref in (("chosen", ref_c), ("rejected", ref_r)):
        logps, rewards = metrics[f"{name}_logps"], metrics[f"{name}_rewards"]
        assert logps.shape == rewards.shape == (B,) and not logps.requires_grad
        torch.testing.assert_close(rewards, 0.3 * (logps - ref))
        torch.testing.assert_close(logps.mean(), metrics[f"logps/{name}"])
        torch.testing.assert_close(rewards.mean(), metrics[f"rewards/{name}"])
    assert metrics["chosen_logps"][1] == 0  # the fully ignored chosen row


def test_sigmoid_label_smoothing_is_conservative_dpo():
    """sigmoid with label_smoothing: -(1 - eps) log sig(beta d) - eps log sig(-beta d) (float64 formula)."""
    hidden, weight, _, target = batch(torch.float32, 2 * B, T, H, V)
    ref = torch.randn(2 * B) - 30
    eps, beta = 0.2, 0.5
    loss, _ = fused_linear_dpo_loss(
        hidden,
        weight,
        target,
        ref_chosen_logps=ref[:B],
        ref_rejected_logps=ref[B:],
        beta=beta,
        label_smoothing=eps,
    )
    lp = reference.fused_linear_logprobs(hidden.double(), weight.double(), target).log_probs.sum(-1)
    d = (lp[:B] - ref[:B].double()) - (lp[B:] - ref[B:].double())
    expected = (
        -(1 - eps) * torch.nn.functional.logsigmoid(beta * d)
        - eps * torch.nn.functional.logsigmoid(-beta * d)
    ).mean()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_orpo_matches_trl(dtype):
    """ORPOTrainer.get_batch_loss_metrics (trl.experimental) on the same average log-probs and chosen NLL."""
    hidden, weight, bias, target = batch(dtype, 2 * B, T, H, V, bias=True)
    tokens = TokenLogprobs(hidden, weight, bias, target)
    beta = 0.25
    results = run_oracle([tokens.case(kind, trainer="orpo", beta=beta) for kind in ("ref", "eager")])
    ours = _ours(fused_linear_orpo_loss, hidden, weight, bias, target, beta=beta, chunk_size=CHUNK)
    metrics = _check("orpo", ours, results[1], results[0], tokens, dtype)
    if dtype == torch.float32:
        # trl.experimental's logits/* average every position of the full logits (prompt and padding too)
        assert_metrics_match(metrics, results[0]["metrics"], skip=("logits/chosen", "logits/rejected"))
    module = LigerFusedLinearORPOLoss(beta=beta, chunk_size=CHUNK)
    torch.testing.assert_close(module(hidden, weight, target, bias)[0], ours[0], rtol=0, atol=0)


def test_orpo_nll_target():
    """nll_target: the NLL term over other targets of the chosen rows (e.g. prompt + completion), float64."""
    hidden, weight, _, target = batch(torch.float32, 2 * B, T, H, V)
    nll_target = torch.randint(0, V, (B, T))
    nll_target[0, -1] = IGNORE
    loss, metrics = fused_linear_orpo_loss(hidden, weight, target, nll_target=nll_target, beta=0.1)
    base_loss, base_metrics = fused_linear_orpo_loss(hidden, weight, target, beta=0.1)
    lp = reference.fused_linear_logprobs(hidden[:B].double(), weight.double(), nll_target).log_probs
    expected_nll = -lp.sum() / (nll_target != IGNORE).sum()
    torch.testing.assert_close(metrics["nll_loss"].double(), expected_nll, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        loss - metrics["nll_loss"], base_loss - base_metrics["nll_loss"], rtol=1e-5, atol=1e-6
    )


CPO_CONFIGS = [
    dict(loss_type="sigmoid", label_smoothing=0.1),
    dict(loss_type="hinge"),
    dict(loss_type="ipo"),
    dict(loss_type="simpo", simpo_gamma=0.7),
    dict(loss_type="simpo", alpha=0.25, cpo_alpha=0.0),  # AlphaPO
    dict(loss_type="sigmoid", cpo_alpha=0.0),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpo_simpo_matches_trl(dtype, monkeypatch):
    """CPOTrainer.get_batch_loss_metrics (trl.experimental): sigmoid, hinge, ipo, simpo, AlphaPO, no NLL."""
    hidden, weight, bias, target = batch(dtype, 2 * B, T, H, V, bias=True)
    tokens = TokenLogprobs(hidden, weight, bias, target)
    beta = 0.4
    cases = [
        tokens.case(kind, trainer="cpo", beta=beta, **config)
        for config in CPO_CONFIGS
        for kind in ("ref", "eager")
    ]
    results = run_oracle(cases)
    ours = _ours(
        fused_linear_cpo_loss, hidden, weight, bias, target, beta=beta, chunk_size=CHUNK, **CPO_CONFIGS[3]
    )
    _check(f"cpo {CPO_CONFIGS[3]}", ours, results[7], results[6], tokens, dtype)  # end to end: simpo
    with monkeypatch.context() as patch:
        log_probs, frozen = freeze_token_logprobs(
            patch, preference, hidden, weight, bias, target, chunk_size=CHUNK
        )
        own = run_oracle(
            own_logprob_cases(
                frozen, tokens.mask, [dict(trainer="cpo", beta=beta, **config) for config in CPO_CONFIGS]
            )
        )
        for i, config in enumerate(CPO_CONFIGS):
            loss, metrics = fused_linear_cpo_loss(hidden, weight, target, bias, beta=beta, **config)
            _check_tokens(f"cpo {config}", loss, log_probs, own[2 * i + 1], own[2 * i], tokens.mask)
            if dtype == torch.float32:
                assert_metrics_match(
                    metrics, results[2 * i]["metrics"], skip=("logits/chosen", "logits/rejected")
                )
    # SimPO = CPO(loss_type="simpo") with its own defaults; the modules
    simpo = fused_linear_simpo_loss(hidden, weight, target, bias, beta=beta, simpo_gamma=0.7)
    cpo = fused_linear_cpo_loss(
        hidden, weight, target, bias, beta=beta, loss_type="simpo", simpo_gamma=0.7, cpo_alpha=0
    )
    torch.testing.assert_close(simpo[0], cpo[0], rtol=0, atol=0)
    torch.testing.assert_close(
        LigerFusedLinearSimPOLoss(beta=beta, simpo_gamma=0.7)(hidden, weight, target, bias)[0], simpo[0]
    )
    torch.testing.assert_close(
        LigerFusedLinearCPOLoss(beta=beta)(hidden, weight, target, bias)[0],
        fused_linear_cpo_loss(hidden, weight, target, bias, beta=beta)[0],
    )


@pytest.mark.parametrize(
    "fn, kwargs",
    [
        (fused_linear_dpo_loss, dict(reference_free=True, loss_type="ipo")),
        (fused_linear_dpo_loss, dict(reference_free=True, loss_type=["sigmoid_norm", "sft"])),
        (fused_linear_orpo_loss, {}),
        (fused_linear_cpo_loss, dict(loss_type="simpo")),
        (fused_linear_simpo_loss, {}),
    ],
)
def test_fully_masked_rows_no_nan(fn, kwargs):
    """Every row fully ignored, and a batch with one empty pair: finite loss, gradients and metrics."""
    hidden, weight, bias, target = batch(torch.float32, 2 * B, T, H, V, bias=True, empty_rows=(0, B))
    for tgt in (target, torch.full_like(target, IGNORE)):
        loss, metrics, grads = _ours(fn, hidden, weight, bias, tgt, chunk_size=CHUNK, **kwargs)
        assert torch.isfinite(loss), loss
        assert all(torch.isfinite(g).all() for g in grads)
        assert all(math.isfinite(float(v)) for v in metrics.values()), metrics


def test_preference_bad_inputs():
    hidden, weight, _, target = batch(torch.float32, 2 * B, T, H, V)
    ref = dict(ref_chosen_logps=torch.zeros(B), ref_rejected_logps=torch.zeros(B))
    with pytest.raises(ValueError, match="2B rows"):
        fused_linear_dpo_loss(hidden[:5], weight, target[:5], reference_free=True)
    with pytest.raises(ValueError, match="target"):
        fused_linear_dpo_loss(hidden, weight, target[:, :5], reference_free=True)
    with pytest.raises(ValueError, match="hidden"):
        fused_linear_dpo_loss(hidden[0], weight, target[0], reference_free=True)
    with pytest.raises(ValueError, match="exactly one reference"):
        fused_linear_dpo_loss(hidden, weight, target)
    with pytest.raises(ValueError, match="exactly one reference"):
        fused_linear_dpo_loss(hidden, weight, target, reference_free=True, **ref)
    with pytest.raises(ValueError, match="ref_chosen_logps"):
        fused_linear_dpo_loss(
            hidden, weight, target, ref_chosen_logps=torch.zeros(B + 1), ref_rejected_logps=torch.zeros(B)
        )
    with pytest.raises(ValueError, match="ref_weight"):
        fused_linear_dpo_loss(hidden, weight, target, ref_hidden=hidden)
    with pytest.raises(ValueError, match="loss_type"):
        fused_linear_dpo_loss(hidden, weight, target, loss_type="kto", **ref)
    with pytest.raises(ValueError, match="label_smoothing"):
        fused_linear_dpo_loss(hidden, weight, target, loss_type="exo_pair", **ref)
    with pytest.raises(ValueError, match="label_smoothing"):
        fused_linear_dpo_loss(hidden, weight, target, loss_type="robust", label_smoothing=0.5, **ref)
    with pytest.raises(ValueError, match="f_divergence_type"):
        fused_linear_dpo_loss(
            hidden, weight, target, loss_type="apo_zero", f_divergence_type="forward_kl", **ref
        )
    with pytest.raises(ValueError, match="loss_weights"):
        fused_linear_dpo_loss(
            hidden, weight, target, loss_type=["sigmoid", "hinge"], loss_weights=[1.0], **ref
        )
    with pytest.raises(ValueError, match="beta"):
        fused_linear_dpo_loss(hidden, weight, target, beta=0.0, **ref)
    with pytest.raises(ValueError, match="loss_type"):
        fused_linear_cpo_loss(hidden, weight, target, loss_type="kto")
    with pytest.raises(ValueError, match="class index"):
        fused_linear_orpo_loss(hidden, weight, target.masked_fill(target == IGNORE, V))
    with pytest.raises(TypeError, match="target"):
        fused_linear_orpo_loss(hidden, weight, target.float())

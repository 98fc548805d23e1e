"""``average_log_prob`` (length-normalised sequence log-probs) in DPO (every loss type) and KTO, against
TRL 1.16's own loss code.

TRL sums per-token log-probs; fed the per-token log-probs divided by their row's completion-token count n,
its sums are the averages ``sum_t log p_t / n``, so the same oracle gives the averaged losses, and its
gradient with respect to those scaled log-probs, divided by n, is the gradient with respect to the op's
log-probs.
ipo and sigmoid_norm normalise by length themselves (no second division) and sft is a token mean: with
averaged inputs they equal TRL's plain losses."""

import math

import pytest
import torch
from helpers import leaf
from pref_common import (
    TokenLogprobs,
    assert_metrics_match,
    assert_scalar_no_worse,
    assert_token_grads_no_worse,
    batch,
    freeze_token_logprobs,
    own_logprob_cases,
    run_oracle,
)

from liger_core.losses import dpo_options, fused_linear_dpo_loss, fused_linear_kto_loss, kto, preference
from liger_core.ops import fused_linear_logprobs

B, T, H, V = 3, 7, 24, 37
CHUNK = 5

# the loss types whose sequence log-probs are sums in TRL: averaged here
SUMMED = [
    dict(loss_type="sigmoid"),
    dict(loss_type="hinge"),
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
    dict(loss_type="sigmoid", f_divergence_type="forward_kl"),
]
# normalised by TRL already (ipo, sigmoid_norm) or a token mean (sft)
NORMALISED = [dict(loss_type="ipo"), dict(loss_type="sigmoid_norm"), dict(loss_type="sft")]


def _trl(config):
    config = dict(config)
    config["loss_type"] = [config["loss_type"]]
    return config


def _counts(mask):
    return mask.sum(-1, keepdim=True).clamp(min=1).to(torch.float64)


def _scaled(frozen, counts):
    return frozen._replace(log_probs=frozen.log_probs.detach() / counts.to(frozen.log_probs.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dpo_average_log_prob_matches_trl(dtype, monkeypatch):
    """Every DPO loss type with average_log_prob=True: loss, gradient with respect to the per-token
    log-probs and (fp32) TRL's metrics, a fully masked chosen completion in the batch; end to end through
    the op for sigmoid."""
    hidden, weight, bias, target = batch(dtype, 2 * B, T, H, V, empty_rows=(1,), bias=True)
    tokens = TokenLogprobs(hidden, weight, bias, target)
    counts = _counts(tokens.mask)
    avg64 = (tokens.ref[1].log_probs.detach() * tokens.mask).sum(-1) / counts[:, 0]
    ref_avg = (avg64 + 0.3 * torch.randn(2 * B, dtype=torch.float64)).float()
    ref_c, ref_r = ref_avg[:B], ref_avg[B:]
    # end to end (gradients to hidden, weight, bias through the op): TRL on scaled float64 / eager log-probs
    cases = []
    for kind in ("ref", "eager"):
        case = tokens.case(kind, trainer="dpo", beta=0.1, ref_chosen_logps=ref_c, ref_rejected_logps=ref_r,
                           **_trl(SUMMED[0]))  # fmt: skip
        case["log_probs"] = case["log_probs"] / counts.to(case["log_probs"].dtype)
        cases.append(case)
    ref_res, eager_res = run_oracle(cases)
    leaves = [leaf(hidden), leaf(weight), leaf(bias)]
    loss, _ = fused_linear_dpo_loss(
        *leaves[:2], target, leaves[2], ref_chosen_logps=ref_c, ref_rejected_logps=ref_r,
        chunk_size=CHUNK, average_log_prob=True, **SUMMED[0],
    )  # fmt: skip
    assert_scalar_no_worse("sigmoid loss", loss, eager_res["loss"], ref_res["loss"])
    grads = torch.autograd.grad(loss, leaves)
    eager_grads = tokens.pull_back("eager", eager_res["grad"] / counts.float())
    ref_grads = tokens.pull_back("ref", ref_res["grad"] / counts)
    for label, mine, theirs, ref64 in zip(("dhidden", "dweight", "dbias"), grads, eager_grads, ref_grads):
        assert mine.dtype == dtype
        assert_scalar_no_worse(f"sigmoid {label}", mine, theirs, ref64)

    # every loss type on the op's per-token log-probs computed once
    log_probs, frozen = freeze_token_logprobs(
        monkeypatch, preference, hidden, weight, bias, target, chunk_size=CHUNK
    )
    common = dict(trainer="dpo", beta=0.1, ref_chosen_logps=ref_c, ref_rejected_logps=ref_r)
    summed = run_oracle(
        own_logprob_cases(_scaled(frozen, counts), tokens.mask, [dict(common, **_trl(c)) for c in SUMMED])
    )
    # TRL's own length normalisation sees the sums, and the averaged reference times n
    ref_sums = ref_avg.double() * counts[:, 0]
    plain = dict(common, ref_chosen_logps=ref_sums[:B], ref_rejected_logps=ref_sums[B:])
    normalised = run_oracle(
        own_logprob_cases(frozen, tokens.mask, [dict(plain, **_trl(c)) for c in NORMALISED])
    )
    for configs, results, scale in (
        (SUMMED, summed, counts),
        (NORMALISED, normalised, torch.ones_like(counts)),
    ):
        for i, config in enumerate(configs):
            loss, metrics = fused_linear_dpo_loss(
                hidden, weight, target, bias, ref_chosen_logps=ref_c, ref_rejected_logps=ref_r,
                options=dpo_options(beta=0.1, average_log_prob=True, **config) if i % 2 else None,
                **({} if i % 2 else dict(beta=0.1, average_log_prob=True, **config)),
            )  # fmt: skip
            ref64, eager = results[2 * i], results[2 * i + 1]
            assert_scalar_no_worse(f"{config} loss", loss, eager["loss"], ref64["loss"])
            (grad,) = torch.autograd.grad(loss, log_probs, allow_unused=True)
            grad = torch.zeros_like(log_probs) if grad is None else grad
            assert_token_grads_no_worse(
                f"{config} dlog_probs",
                grad,
                eager["grad"] / scale.float(),
                ref64["grad"] / scale,
                tokens.mask,
            )
            assert all(math.isfinite(float(v)) for v in metrics.values())
            if dtype == torch.float32 and configs is SUMMED:  # logps/* are the averages
                assert_metrics_match(metrics, ref64["metrics"])


def test_dpo_average_reference_from_hidden():
    """With average_log_prob the reference scored from ref_hidden is averaged too: == precomputed averages;
    the logged logps are the averages."""
    hidden, weight, bias, target = batch(torch.float32, 2 * B, T, H, V, bias=True, empty_rows=(4,))
    mask = target != -100
    ref_hidden, ref_weight = torch.randn(2 * B, T, 16), torch.randn(V, 16) / 4
    ref_tokens = fused_linear_logprobs(ref_hidden, ref_weight, target, chunk_size=CHUNK).log_probs
    ref_avg = (ref_tokens * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    kw = dict(beta=0.3, loss_type="apo_down", chunk_size=CHUNK, average_log_prob=True, per_pair=True)
    a, ma = fused_linear_dpo_loss(
        hidden, weight, target, bias, ref_hidden=ref_hidden, ref_weight=ref_weight, **kw
    )
    b, mb = fused_linear_dpo_loss(
        hidden, weight, target, bias, ref_chosen_logps=ref_avg[:B], ref_rejected_logps=ref_avg[B:], **kw
    )
    torch.testing.assert_close(a, b)
    policy = fused_linear_logprobs(hidden, weight, target, bias, chunk_size=CHUNK).log_probs
    avg = (policy * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    torch.testing.assert_close(ma["chosen_logps"], avg[:B])
    torch.testing.assert_close(mb["rejected_logps"], avg[B:])
    assert float(ma["rejected_logps"][1]) == 0.0  # the fully ignored row
    with pytest.raises(TypeError, match="average_log_prob"):
        dpo_options(average_log_prob=1)


KTO_CONFIGS = [
    dict(loss_type="kto", desirable_weight=1.3, undesirable_weight=0.7),
    dict(loss_type="apo_zero_unpaired"),
]


def test_kto_average_log_prob_matches_trl(monkeypatch):
    """KTO with average_log_prob=True: loss, gradient with respect to the per-token log-probs and metrics of
    KTOTrainer._compute_loss on length-normalised log-probs; the KL term from hidden states is averaged
    too."""
    n = 7
    hidden, weight, bias, target = batch(torch.float32, n, T, H, V, bias=True, empty_rows=(2,))
    labels = torch.tensor([True, False, True, True, False, False, True])
    mask = target != -100
    counts = _counts(mask)
    with torch.no_grad():
        seq = fused_linear_logprobs(hidden, weight, target, bias, chunk_size=CHUNK).log_probs
    ref_avg = ((seq * mask).sum(-1) / counts[:, 0].float() + 0.3 * torch.randn(n)).float()
    # the KL completions from hidden states: the reference from precomputed averages
    kl_hidden, kl_target = torch.randn(n, T, H), target.roll(1, 0)
    kl_mask = kl_target != -100
    with torch.no_grad():
        kl_tokens = fused_linear_logprobs(kl_hidden, weight, kl_target, bias, chunk_size=CHUNK).log_probs
    kl_avg = (kl_tokens * kl_mask).sum(-1) / kl_mask.sum(-1).clamp(min=1)
    ref_kl_avg = kl_avg - 0.05 + 0.1 * torch.randn(n)
    log_probs, frozen = freeze_token_logprobs(
        monkeypatch, kto, hidden, weight, bias, target, chunk_size=CHUNK
    )
    common = dict(trainer="kto", beta=0.2, labels=labels, ref_logps=ref_avg, kl_logps=kl_avg,
                  ref_kl_logps=ref_kl_avg)  # fmt: skip
    results = run_oracle(
        own_logprob_cases(_scaled(frozen, counts), mask, [dict(common, **c) for c in KTO_CONFIGS])
    )
    for i, config in enumerate(KTO_CONFIGS):
        # the frozen op also answers the KL pass: give it the KL completions' log-probs there
        calls = []

        def token_logprobs(*args, outputs=(), calls=calls, **kwargs):
            calls.append(args[2] is kl_target)
            return frozen._replace(log_probs=kl_tokens) if args[2] is kl_target else frozen

        monkeypatch.setattr(kto, "token_logprobs", token_logprobs)
        loss, metrics = fused_linear_kto_loss(
            hidden, weight, target, labels, bias, ref_logps=ref_avg, kl_hidden=kl_hidden, kl_target=kl_target,
            ref_kl_logps=ref_kl_avg, beta=0.2, average_log_prob=True, **config,
        )  # fmt: skip
        assert calls == [False, True]  # the policy pass, then the KL completions' pass
        ref64, eager = results[2 * i], results[2 * i + 1]
        assert_scalar_no_worse(f"kto {config} loss", loss, eager["loss"], ref64["loss"])
        (grad,) = torch.autograd.grad(loss, log_probs)
        assert_token_grads_no_worse(
            f"kto {config} dlog_probs", grad, eager["grad"] / counts.float(), ref64["grad"] / counts, mask
        )
        assert_metrics_match(metrics, ref64["metrics"])
    with pytest.raises(TypeError, match="average_log_prob"):
        fused_linear_kto_loss(hidden, weight, target, labels, ref_logps=ref_avg, average_log_prob="yes")


def test_dpo_average_log_prob_grouped_path_equals_recomputing_path(monkeypatch):
    """The gradient-in-forward path (groups of whole pairs) averages as the recomputing path does."""
    hidden, weight, bias, target = batch(torch.float32, 2 * B, T, H, V, empty_rows=(2,), bias=True)
    grouped = []
    real = preference.fused_linear_logprob_loss
    monkeypatch.setattr(
        preference, "fused_linear_logprob_loss", lambda *a, **k: grouped.append(1) or real(*a, **k)
    )
    ref_c, ref_r = torch.randn(B) - 3, torch.randn(B) - 3
    for config in (dict(loss_type="sigmoid"), dict(loss_type=["ipo", "sft"], loss_weights=[0.5, 0.5])):
        runs = []
        for chunk in (2 * T, CHUNK):
            leaves = [leaf(hidden), leaf(weight), leaf(bias)]
            loss, metrics = fused_linear_dpo_loss(
                *leaves[:2], target, leaves[2], ref_chosen_logps=ref_c, ref_rejected_logps=ref_r,
                chunk_size=chunk, average_log_prob=True, **config,
            )  # fmt: skip
            runs.append((loss, metrics, torch.autograd.grad(loss, leaves)))
        (g_loss, g_metrics, g_grads), (r_loss, r_metrics, r_grads) = runs
        torch.testing.assert_close(g_loss, r_loss)
        for a, b in zip(g_grads, r_grads):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(g_metrics["logps/chosen"], r_metrics["logps/chosen"])
    assert len(grouped) == 2

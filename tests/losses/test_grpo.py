"""GRPO-family losses: the formula on per-token log-probs against a float64 re-implementation of TRL 1.16's
``GRPOTrainer._compute_loss`` math (and against TRL's own method, run by the Python with TRL that
``pref_common.trl_python`` finds), normalisation, masking, and the fused entry point against the unfused
composition (logits -> log_softmax -> formula)."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import FLOOR, SLACK, assert_no_worse_than_eager, dyadic_linear_inputs, rel_err
from pref_common import trl_python

from liger_core.losses.grpo import (
    CLIPPED_LOSS_TYPES,
    GRPO_LOSS_TYPES,
    LigerFusedLinearGRPOLoss,
    fused_linear_grpo_loss,
    grpo_loss_from_logps,
)
from liger_core.ops import fused_linear_logprobs

REPO = Path(__file__).resolve().parents[2]
B, T = 3, 7
MAX_COMPLETION_LENGTH = 9


# ------------------------------------------------------------------------------------------------------------
# Reference: TRL 1.16's GRPOTrainer._compute_loss (and its metrics) re-written from its documented math, run
# in the inputs' dtype (float64 for the reference, fp32 for "eager", the code the loss replaces).
# ------------------------------------------------------------------------------------------------------------


def reference_grpo(logps, old, ref, adv, mask, cfg):
    """(loss, metrics) of TRL's formula for one process; ``cfg`` holds TRL config names."""
    loss_type = cfg["loss_type"]
    eps_low = cfg.get("epsilon", 0.2)
    eps_high = cfg.get("epsilon_high") or eps_low
    beta = cfg.get("beta", 0.0)
    accum = cfg.get("gradient_accumulation_steps", 1)
    mask = mask.to(logps.dtype)
    adv = adv[:, None] if adv.dim() == 1 else adv
    old = logps.detach() if old is None else old
    log_ratio = logps - old
    if cfg.get("importance_sampling_level", "token") == "sequence":
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))[:, None]
    else:
        log_w = log_ratio
    w = torch.exp(log_w)
    if beta:
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        if cfg.get("use_bias_correction_kl", True):
            kl = kl * w
    phi = None
    if loss_type == "cispo":
        per_token = -torch.clamp(w, max=eps_high).detach() * adv * logps
    elif loss_type == "sapo":
        tau = torch.where(
            adv > 0, cfg.get("sapo_temperature_pos", 1.0), cfg.get("sapo_temperature_neg", 1.05)
        )
        per_token = -torch.sigmoid(tau * (w - 1)) * 4 / tau * adv
    elif loss_type == "vespo":
        with torch.no_grad():
            lo = math.log(1e-8)
            seq = (log_ratio.clamp(-20, 20) * mask).sum(-1, keepdim=True)
            if cfg.get("importance_sampling_ratio") is not None:
                seq = seq + cfg["importance_sampling_ratio"].to(seq.dtype).log().clamp(lo, 20).sum(
                    -1, keepdim=True
                )
            lw = seq.clamp(lo, 20)
            k = torch.where(adv >= 0, 2.0, 3.0)
            lam = torch.where(adv >= 0, 3.0, 2.0)
            phi = torch.exp(lam + k * lw - lam * lw.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        per_token = -phi * adv * logps
    else:
        clipped = torch.clamp(w, 1 - eps_low, 1 + eps_high)
        if cfg.get("delta") is not None:
            w = torch.clamp(w, max=cfg["delta"])
        per_token = -torch.min(w * adv, clipped * adv)
    if cfg.get("off_policy_mask_threshold") is not None:
        sampler = cfg.get("sampling_per_token_logps")
        sampler = old if sampler is None else sampler.to(logps.dtype)
        seq_kl = ((sampler - logps.detach()).nan_to_num(nan=0.0) * mask).sum(1, keepdim=True)
        seq_kl = seq_kl / mask.sum(1, keepdim=True).clamp(min=1.0)
        per_token = per_token * ((adv >= 0) | (seq_kl <= cfg["off_policy_mask_threshold"])).to(logps.dtype)
    if cfg.get("importance_sampling_ratio") is not None and loss_type != "vespo":
        per_token = per_token * cfg["importance_sampling_ratio"].to(logps.dtype)
    if beta:
        per_token = per_token + beta * kl
    if loss_type in ("grpo", "sapo"):
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accum
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0) / accum
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (per_token.size(0) * cfg["max_completion_length"]) / accum
    elif loss_type == "luspo":
        loss = (per_token * mask).sum(-1).mean() / accum
    else:
        n_items = cfg.get("num_items_in_batch", mask.sum())
        n_items = torch.as_tensor(n_items, dtype=logps.dtype).clamp(min=1.0) / cfg.get("num_processes", 1)
        n_items = n_items * accum / cfg.get("steps_per_generation", accum)
        loss = (per_token * mask).sum() / n_items

    def batch_mean(x):
        if x.shape[1] == 1:
            return x.sum() / x.shape[0]
        return (x * mask).sum() / mask.sum().clamp(min=1.0)

    def seq_mean(x):
        return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

    def nan_pick(x, fn):
        x = x[~x.isnan()]
        return fn(x) if x.numel() else torch.tensor(math.nan, dtype=logps.dtype)

    metrics = {}
    if beta:
        metrics["kl"] = batch_mean(kl.detach())
    if cfg.get("entropies") is not None:
        metrics["entropy"] = batch_mean(cfg["entropies"].to(logps.dtype))
    if loss_type in CLIPPED_LOSS_TYPES:
        low = ((w < 1 - eps_low) & (adv < 0)).to(logps.dtype)
        high = ((w > 1 + eps_high) & (adv > 0)).to(logps.dtype)
        metrics["clip_ratio/low_mean"] = batch_mean(low)
        metrics["clip_ratio/high_mean"] = batch_mean(high)
        metrics["clip_ratio/region_mean"] = batch_mean(((low + high) > 0).to(logps.dtype))
        metrics["clip_ratio/low_min"] = nan_pick(seq_mean(low), torch.min)
        metrics["clip_ratio/high_max"] = nan_pick(seq_mean(high), torch.max)
        # Liger-Kernel's clip_ratio: the clipped region per token (a completion's sequence-level clipping
        # broadcast over its tokens), weighted by the mask
        region_tokens = ((low + high) > 0).to(logps.dtype).expand_as(mask)
        metrics["clip_ratio"] = (region_tokens * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "cispo":
        metrics["cispo_clip_ratio"] = batch_mean(((w > eps_high) & (adv > 0)).to(logps.dtype))
    elif loss_type == "vespo":
        metrics["vespo/phi_seq_mean"] = batch_mean(phi)
    return loss, metrics


# ------------------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------------------


def make_case(loss_type, level="token", beta=0.0, off_policy=True, batch=B, length=T, **extra):
    """Random log-probs (policy, old policy a little off, reference), advantages with both signs, ragged mask
    with one fully masked completion; ratios spread so that both clipping sides are hit."""
    logps = -torch.rand(batch, length, dtype=torch.float64) * 4 - 0.05
    mask = torch.ones(batch, length, dtype=torch.long)
    for i in range(batch):
        mask[i, torch.randint(1, length + 1, ()).item() :] = 0
    if batch > 2:
        mask[batch - 2] = 0  # a completion whose every token is padding
    logps = torch.where(mask.bool(), logps, torch.zeros_like(logps))
    adv = torch.randn(batch, dtype=torch.float64)
    adv[0] = abs(adv[0]) + 0.1
    adv[-1] = -abs(adv[-1]) - 0.1
    case = {
        "loss_type": loss_type,
        "importance_sampling_level": level,
        "beta": beta,
        "per_token_logps": logps,
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": (logps + 0.3 * torch.randn_like(logps)) if off_policy else None,
        "ref_per_token_logps": (logps + 0.2 * torch.randn_like(logps)) if beta else None,
        "max_completion_length": MAX_COMPLETION_LENGTH,
    }
    case.update(extra)
    return case


def ours(case, dtype=torch.float64, requires_grad=True):
    """grpo_loss_from_logps on the case (inputs cast to dtype); returns (loss, grad wrt logps, metrics)."""
    logps = case["per_token_logps"].to(dtype).requires_grad_(requires_grad)

    def cast(key):
        t = case.get(key)
        return None if t is None else t.to(dtype)

    kwargs = {
        key: case[key]
        for key in (
            "beta",
            "epsilon_high",
            "delta",
            "importance_sampling_level",
            "use_bias_correction_kl",
            "max_completion_length",
            "num_items_in_batch",
            "num_processes",
            "gradient_accumulation_steps",
            "steps_per_generation",
            "off_policy_mask_threshold",
            "sapo_temperature_pos",
            "sapo_temperature_neg",
        )
        if key in case
    }
    if "epsilon" in case:
        kwargs["epsilon_low"] = case["epsilon"]
    loss, metrics = grpo_loss_from_logps(
        logps,
        cast("old_per_token_logps"),
        cast("ref_per_token_logps"),
        case["advantages"].to(dtype),
        case["completion_mask"],
        loss_type=case["loss_type"],
        importance_sampling_ratio=cast("importance_sampling_ratio"),
        sampling_per_token_logps=cast("sampling_per_token_logps"),
        entropies=cast("entropies"),
        **kwargs,
    )
    grad = torch.autograd.grad(loss, logps)[0] if requires_grad else None
    return loss, grad, metrics


def reference(case, dtype=torch.float64):
    logps = case["per_token_logps"].to(dtype).requires_grad_(True)

    def cast(key):
        t = case.get(key)
        return None if t is None else t.to(dtype)

    cfg = dict(case)
    for key in ("importance_sampling_ratio", "sampling_per_token_logps", "entropies"):
        cfg[key] = cast(key)
    loss, metrics = reference_grpo(
        logps,
        cast("old_per_token_logps"),
        cast("ref_per_token_logps"),
        case["advantages"].to(dtype),
        case["completion_mask"],
        cfg,
    )
    return loss, torch.autograd.grad(loss, logps)[0], metrics


def all_cases():
    """Every loss type x importance-sampling level x KL on/off x on/off-policy, plus the extra options."""
    cases = []
    for loss_type, level, beta, off_policy in itertools.product(
        GRPO_LOSS_TYPES, ("token", "sequence"), (0.0, 0.04), (True, False)
    ):
        cases.append(make_case(loss_type, level, beta, off_policy))
    for loss_type in GRPO_LOSS_TYPES:
        cases.append(
            make_case(loss_type, beta=0.04, use_bias_correction_kl=False, epsilon=0.1, epsilon_high=0.28)
        )
        ratio = torch.rand(B, T, dtype=torch.float64) + 0.5
        cases.append(make_case(loss_type, importance_sampling_ratio=ratio))
        cases.append(make_case(loss_type, off_policy_mask_threshold=0.05))
        sampler = make_case(loss_type)["per_token_logps"]
        cases.append(make_case(loss_type, off_policy_mask_threshold=0.05, sampling_per_token_logps=sampler))
        # an accumulation window of 4 micro-batches, generation batch of 8 micro-batches over 2 processes
        cases.append(
            make_case(
                loss_type,
                num_items_in_batch=torch.tensor(57),
                num_processes=2,
                gradient_accumulation_steps=4,
                steps_per_generation=8,
            )
        )
    for delta in (1.1, 1.5):
        cases.append(make_case("dapo", delta=delta, epsilon=0.3))
        cases.append(make_case("grpo", "sequence", delta=delta))
    cases.append(make_case("sapo", sapo_temperature_pos=0.7, sapo_temperature_neg=2.0))
    cases.append(make_case("grpo", entropies=torch.rand(B, T, dtype=torch.float64) * 3))
    cases.append(make_case("dapo", advantages_per_token=True))
    cases[-1]["advantages"] = torch.randn(B, T, dtype=torch.float64)
    return cases


def case_id(case):
    keys = [case["loss_type"], case["importance_sampling_level"]]
    keys += [f"{k}" for k in sorted(case) if k not in ("loss_type", "importance_sampling_level")]
    return "-".join(str(k) for k in keys)


# ------------------------------------------------------------------------------------------------------------
# Formula tests
# ------------------------------------------------------------------------------------------------------------


def assert_metrics_equal(got, want, tol=1e-12):
    assert set(got) == set(want), f"metric names {sorted(got)} != {sorted(want)}"
    for name in want:
        g, w = float(got[name]), float(want[name])
        assert (math.isnan(g) and math.isnan(w)) or abs(g - w) <= tol, f"{name}: {g} != {w}"


def test_formula_float64_equals_reference():
    """float64: the loss, its gradient and every metric are TRL's formula (to float64 rounding)."""
    for case in all_cases():
        loss, grad, metrics = ours(case)
        ref_loss, ref_grad, ref_metrics = reference(case)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), case_id(case)
        assert abs(loss.item() - ref_loss.item()) <= 1e-12 * max(1.0, abs(ref_loss.item())), case_id(case)
        assert rel_err(grad, ref_grad) <= 1e-12, case_id(case)
        assert_metrics_equal(metrics, ref_metrics)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_formula_low_precision_no_worse_than_eager(dtype):
    """fp32 / bf16 log-probs: loss and gradient no worse than TRL's formula run in that dtype, against the
    float64 formula on the same (rounded) inputs."""
    for case in all_cases():
        rounded = {
            k: (v.to(dtype).double() if torch.is_tensor(v) and v.is_floating_point() else v)
            for k, v in case.items()
        }
        loss, grad, metrics = ours(rounded, dtype)
        assert loss.dtype == torch.float32 and grad.dtype == dtype
        assert all(m.dtype == torch.float32 for m in metrics.values())
        ref_loss, ref_grad, _ = reference(rounded)
        eager_loss, eager_grad, _ = reference(rounded, dtype)
        assert_no_worse_than_eager("loss", loss, eager_loss.to(loss.dtype), ref_loss)
        assert_no_worse_than_eager("grad", grad, eager_grad.to(dtype), ref_grad)


def test_fully_masked_batch_and_garbage_padding():
    """Every completion masked: loss 0, gradient 0, no NaN; -inf/NaN in padding never reaches the loss."""
    for loss_type in GRPO_LOSS_TYPES:
        case = make_case(loss_type, beta=0.04)
        case["completion_mask"] = torch.zeros(B, T, dtype=torch.long)
        loss, grad, metrics = ours(case)
        assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad)), loss_type
        for name, value in metrics.items():
            if name not in ("clip_ratio/low_min", "clip_ratio/high_max", "vespo/phi_seq_mean"):
                assert value.item() == 0.0, (loss_type, name)
        case = make_case(loss_type, "sequence", beta=0.04)
        clean_loss, clean_grad, _ = ours(case)
        pad = case["completion_mask"] == 0
        for key, value in (
            ("per_token_logps", -math.inf),
            ("old_per_token_logps", math.nan),
            ("ref_per_token_logps", math.inf),
        ):
            case[key] = case[key].masked_fill(pad, value)
        loss, grad, _ = ours(case)
        assert loss.item() == clean_loss.item() and torch.equal(grad, clean_grad), loss_type


def test_on_policy_gradient_is_advantage_weighted_log_prob_gradient():
    """On-policy (old None), no KL: the clipped loss's gradient is -A * m / normaliser (ratio 1, no clip)."""
    case = make_case("bnpo", off_policy=False)
    _, grad, metrics = ours(case)
    mask = case["completion_mask"].double()
    expected = -case["advantages"][:, None] * mask / mask.sum()
    assert rel_err(grad, expected) <= 1e-15
    assert metrics["clip_ratio/region_mean"].item() == 0.0


def test_sequence_level_clip_ratio_is_token_weighted():
    """Sequence-level importance sampling: ``clip_ratio`` (Liger-Kernel's metric) counts a clipped
    completion once per completion token, clip_ratio/region_mean (TRL's) once per completion."""
    n_tokens = (5, 1, 3)
    mask = torch.zeros(3, 6, dtype=torch.long)
    for i, n in enumerate(n_tokens):
        mask[i, :n] = 1
    logps = torch.where(mask.bool(), -torch.rand(3, 6, dtype=torch.float64) - 0.5, 0.0)
    # sequence log-ratios +0.5 (A > 0: clipped above), 0 (not clipped), -0.5 (A > 0: not clipped)
    old = logps - torch.tensor([0.5, 0.0, -0.5], dtype=torch.float64)[:, None] * mask
    adv = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)
    for loss_type in CLIPPED_LOSS_TYPES:
        _, metrics = grpo_loss_from_logps(
            logps, old, None, adv, mask, loss_type=loss_type, importance_sampling_level="sequence",
            max_completion_length=6,
        )  # fmt: skip
        assert metrics["clip_ratio"].item() == pytest.approx(5 / 9, rel=1e-6)
        assert metrics["clip_ratio/region_mean"].item() == pytest.approx(1 / 3, rel=1e-6)
        _, token_metrics = grpo_loss_from_logps(logps, old, None, adv, mask, loss_type=loss_type,
                                                max_completion_length=6)  # fmt: skip
        assert token_metrics["clip_ratio"].item() == token_metrics["clip_ratio/region_mean"].item()


def test_normalisation_matches_trl_semantics():
    """dapo over a generation batch split into micro-batches: the sum of the micro-batch losses equals the
    loss of the whole batch (TRL's num_items_in_batch), unlike bnpo's per-micro-batch normalisation."""
    case = make_case("dapo", batch=8, length=T)
    whole, whole_grad, _ = ours(case)
    n_items = case["completion_mask"].sum()
    parts = []
    for rows in torch.arange(8).split(2):
        part = {k: (v[rows] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in case.items()}
        part.update(num_items_in_batch=n_items, gradient_accumulation_steps=4, steps_per_generation=4)
        parts.append(ours(part)[0])
    assert abs(sum(p.item() for p in parts) - whole.item()) <= 1e-12
    # dr_grpo: the constant is B * max_completion_length, not the padded length
    dr = make_case("dr_grpo", off_policy=False)
    loss, _, _ = ours(dr)
    per_token = -dr["advantages"][:, None] * dr["completion_mask"]
    assert abs(loss.item() - per_token.sum().item() / (B * MAX_COMPLETION_LENGTH)) <= 1e-12


def test_argument_errors():
    logps = torch.randn(B, T)
    mask = torch.ones(B, T)
    adv = torch.randn(B)
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss_from_logps(logps, None, None, adv, mask, loss_type="ppo")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        grpo_loss_from_logps(logps, None, None, adv, mask, importance_sampling_level="batch")
    with pytest.raises(ValueError, match="ref_per_token_logps"):
        grpo_loss_from_logps(logps, None, None, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss_from_logps(logps, None, None, adv, mask, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss_from_logps(logps, None, None, torch.randn(B + 1), mask)
    with pytest.raises(ValueError, match="completion_mask"):
        grpo_loss_from_logps(logps, None, None, adv, mask[:, :-1])
    with pytest.raises(ValueError, match="old_per_token_logps"):
        grpo_loss_from_logps(logps, logps[:, :-1], None, adv, mask)
    with pytest.raises(TypeError, match="per_token_logps"):
        grpo_loss_from_logps(logps.long(), None, None, adv, mask)
    with pytest.raises(ValueError, match="epsilon_high"):
        grpo_loss_from_logps(logps, None, None, adv, mask, epsilon_high=math.nan)
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        grpo_loss_from_logps(logps, None, None, adv, mask, gradient_accumulation_steps=0)


# ------------------------------------------------------------------------------------------------------------
# TRL's own code (the Python that trl_python finds: TRL 1.16, same torch), on the same float64 tensors
# ------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trl_results(tmp_path_factory):
    python = trl_python()
    cases = [c for c in all_cases() if not c.get("advantages_per_token")]
    for case in cases:
        case["entropies"] = torch.rand(B, T, dtype=torch.float64)
    tmp = tmp_path_factory.mktemp("trl")
    torch.save(cases, tmp / "cases.pt")
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    script = Path(__file__).with_name("trl_grpo_oracle.py")
    proc = subprocess.run(
        [str(python), str(script), str(tmp / "cases.pt"), str(tmp / "out.pt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return cases, torch.load(tmp / "out.pt")


def test_against_trl_grpo_trainer(trl_results):
    """Loss, gradient with respect to the log-probs and logged metrics: those of TRL's _compute_loss."""
    cases, results = trl_results
    assert len(results) == len(cases) > 100
    for case, trl in zip(cases, results):
        loss, grad, metrics = ours(case)
        assert abs(loss.item() - trl["loss"].item()) <= 1e-12 * max(1.0, abs(trl["loss"].item())), case_id(
            case
        )
        assert rel_err(grad, trl["grad"]) <= 1e-12, case_id(case)
        if case.get("num_processes", 1) == 1:
            trl_metrics = {k: v for k, v in trl["metrics"].items() if k in metrics or k != "entropy"}
            # clip_ratio is Liger-Kernel's metric (TRL logs it on its liger-kernel path only): its own test
            metrics = {k: v for k, v in metrics.items() if k != "clip_ratio"}
            # TRL takes the clip ratios' means in fp32 (`.float()` of the boolean masks): one fp32 rounding
            assert_metrics_equal(metrics, trl_metrics, tol=2**-23)


# ------------------------------------------------------------------------------------------------------------
# Fused entry point: hidden states + lm_head -> log-probs (liger_core.ops.fused_linear_logprobs) -> formula
# ------------------------------------------------------------------------------------------------------------

H, V = 24, 37


def make_fused_inputs(dtype, with_bias, batch=B):
    """Dyadic inputs (exact logits from any GEMM, see helpers.dyadic_linear_inputs): with Gaussian ones the
    chunked and the unchunked GEMM round differently, and the fp32 dW ratio of the two is noise (a CI run
    failed at 1.35 x eager)."""
    hidden, weight, bias = dyadic_linear_inputs((batch, T), H, V, dtype, bias=with_bias, logit_std=2.0)
    target = torch.randint(0, V, (batch, T))
    return hidden, weight, bias, target


def unfused(hidden, weight, bias, target, case, dtype, temperature):
    """The composition the fused loss replaces, in ``dtype`` (TRL's eager path: logits in the model dtype,
    log_softmax in fp32) or float64: ((loss, dh, dw[, db]), per-token log-probs, d loss / d log-probs)."""
    h, w = hidden.to(dtype).requires_grad_(True), weight.to(dtype).requires_grad_(True)
    b = bias.to(dtype).requires_grad_(True) if bias is not None else None
    logits = torch.nn.functional.linear(h, w, b)  # the lm_head
    logits = logits.to(torch.promote_types(dtype, torch.float32)) / temperature
    logps = torch.log_softmax(logits, -1).gather(-1, target[..., None]).squeeze(-1)
    math_dtype = logps.dtype
    ref = case.get("ref_per_token_logps")
    old = case.get("old_per_token_logps")
    loss, _ = reference_grpo(
        logps,
        old.to(math_dtype) if old is not None else None,
        ref.to(math_dtype) if ref is not None else None,
        case["advantages"].to(math_dtype),
        case["completion_mask"],
        dict(case),
    )
    inputs = [t for t in (h, w, b) if t is not None]
    grads = torch.autograd.grad(loss, [*inputs, logps])
    return (loss, *grads[:-1]), logps.detach(), grads[-1]


def assert_loss_no_worse_than_eager(loss, eager, ref):
    """The scalar loss: its error may not exceed eager's own plus what eager's per-token log-prob errors can
    move the loss (|g . dl| <= ||g|| ||dl||, g = d loss / d log-probs), times the usual slack.

    One scalar is one draw of the rounding errors of the per-token log-probs it sums (here dominated by the
    fp32/bf16 logits of either GEMM): two equally accurate computations give errors of the same size but
    random ratio, so "ours <= 1.25 x eager's" would fail at random. The per-token log-probs are held to the
    ratio rule by layer 1's tests; if ||dl_ours|| <= 1.25 ||dl_eager||, the bound below holds, and an error
    in the formula or its normalisation (orders of magnitude larger) still fails it."""
    (loss_eager, *_), logps_eager, _ = eager
    (loss_ref, *_), logps_ref, grad_ref = ref
    propagated = grad_ref.norm().item() * (logps_eager.double() - logps_ref).norm().item()
    bound = 1.25 * (abs(loss_eager.item() - loss_ref.item()) + propagated) + 2**-24 * abs(loss_ref.item())
    assert abs(loss.item() - loss_ref.item()) <= bound, (
        f"loss error {abs(loss.item() - loss_ref.item())} > {bound}"
    )


def float64_grads_at(logps64, hidden, weight, bias, target, case):
    """Float64 gradients (hidden, weight[, bias]) of the loss whose log-probs are the float64 ones of the
    inputs but whose d loss / d log-probs is the float64 formula's at ``logps64``: the gradient a perfect
    pipeline would give from those log-probs."""
    at = logps64.detach().double().requires_grad_(True)
    old, ref = case.get("old_per_token_logps"), case.get("ref_per_token_logps")
    loss, _ = reference_grpo(at, old, ref, case["advantages"], case["completion_mask"], dict(case))
    (g,) = torch.autograd.grad(loss, at)
    inputs = [t.double().requires_grad_(True) for t in (hidden, weight, bias) if t is not None]
    logits = torch.nn.functional.linear(*inputs)
    logps = torch.log_softmax(logits, -1).gather(-1, target[..., None]).squeeze(-1)
    return torch.autograd.grad(logps, inputs, g)


def assert_grad_no_worse(name, ours, eager, ref64):
    """The on-policy gradient rule: bf16 as everywhere (1.25 x eager's + floor). fp32: eager's dW / db are
    one GEMM / one sum of nearly exact terms, often within a few tenths of the output's own final rounding,
    where the ratio of two such errors is noise (eight completions: dr_grpo's db failed the plain rule once
    in ~1000 runs, 5.64e-8 vs eager's 3.21e-8); so the budget adds that rounding (the error of the float64
    result rounded to fp32), which every fp32 result carries."""
    if ours.dtype != torch.float32:
        assert_no_worse_than_eager(name, ours, eager, ref64)
        return
    rounding = rel_err(ref64.to(ours.dtype), ref64)
    e_ours, e_eager = rel_err(ours, ref64), rel_err(eager, ref64)
    bound = SLACK * e_eager + rounding + FLOOR[ours.dtype]
    assert e_ours <= bound, f"{name}: {e_ours:.3e} > 1.25 x eager's {e_eager:.3e} + rounding {rounding:.3e}"


FUSED_B = 8  # completions in test_fused_matches_float64 (see its docstring)

FUSED_CASES = [
    ("dapo", "token", 0.04, True),
    ("grpo", "sequence", 0.0, False),
    ("dr_grpo", "token", 0.0, True),
    ("bnpo", "token", 0.04, False),
    ("cispo", "token", 0.04, False),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("off_policy", [False, True], ids=["on_policy", "off_policy"])
@pytest.mark.parametrize("loss_type,level,beta,with_bias", FUSED_CASES)
def test_fused_matches_float64(loss_type, level, beta, with_bias, off_policy, dtype):
    """B=8, T=7, H=24, V=37, chunks of 4 tokens, a fully masked completion: loss and gradients (hidden,
    weight, bias) against float64, no worse than the unfused composition (logits -> log_softmax -> formula).

    Eight completions, not three: the per-token gradient is nearly one factor per completion, so dW and db
    are sums of a few large terms (more completions: more independent draws, a shorter tail of the ratio of
    two fp32 errors); the fp32 rule is ``assert_grad_no_worse``'s (distributions of both rules at 3 and 8
    completions: benchmarks/results/cpu/grpo_ratio_tail.txt, command in its .meta.json).

    Temperature 1: the op and eager then round the same logits of the same GEMM, so their errors compare
    draw for draw (the temperature is checked by the exact composition test below and by layer 1's tests).
    Off-policy, d loss / d log-probs contains w = exp(l - l_old): each completion's gradient is scaled by its
    own log-prob error (a few draws at this size, so a ratio of two runs' errors is noise). There the
    gradient may also carry the error that the float64 formula itself passes on from the op's log-probs
    (layer 1 holds those to the eager rule), and nothing more: a layer-2 error (composition, dtype,
    normalisation) still fails."""
    temperature = 1.0
    hidden, weight, bias, target = make_fused_inputs(dtype, with_bias, FUSED_B)
    case = make_case(loss_type, level, beta, off_policy=False, batch=FUSED_B)
    # the op and eager take fp32 advantages: the reference takes the same values (a rounding of the inputs
    # is no error of either; unrounded, it moved whole sequences' gradients by up to half an ulp)
    case["advantages"] = case["advantages"].float().double()
    with torch.no_grad():
        z = (hidden.double() @ weight.double().t() + (bias.double() if bias is not None else 0)) / temperature
        own = torch.log_softmax(z, -1).gather(-1, target[..., None]).squeeze(-1)
    case["per_token_logps"] = own
    if off_policy:  # old / reference log-probs near the policy's own: ratios clip on both sides
        case["old_per_token_logps"] = (own + 0.3 * torch.randn_like(own)).float().double()
    if beta:
        case["ref_per_token_logps"] = (own + 0.2 * torch.randn_like(own)).float().double()
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True) if bias is not None else None
    old = case.get("old_per_token_logps")
    loss, metrics = fused_linear_grpo_loss(
        h,
        w,
        target,
        b,
        advantages=case["advantages"].float(),
        completion_mask=case["completion_mask"],
        old_per_token_logps=old.float() if old is not None else None,
        ref_per_token_logps=case["ref_per_token_logps"].float() if beta else None,
        beta=beta,
        loss_type=loss_type,
        importance_sampling_level=level,
        temperature=temperature,
        max_completion_length=MAX_COMPLETION_LENGTH,
        chunk_size=4,
    )
    grads = torch.autograd.grad(loss, [t for t in (h, w, b) if t is not None])
    assert loss.dtype == torch.float32 and all(g.dtype == dtype for g in grads)
    assert "entropy" in metrics and torch.isfinite(metrics["entropy"])
    eager = unfused(hidden, weight, bias, target, case, dtype, temperature)
    ref = unfused(
        hidden.double(),
        weight.double(),
        bias.double() if bias is not None else None,
        target,
        case,
        torch.float64,
        temperature,
    )
    assert_loss_no_worse_than_eager(loss, eager, ref)
    names = ("grad_hidden", "grad_weight", "grad_bias")
    if not off_policy:
        for name, a, e, r in zip(names, grads, eager[0][1:], ref[0][1:]):
            assert_grad_no_worse(name, a, e, r)
    else:
        scored = target.masked_fill(case["completion_mask"] == 0, -100)
        op_logps = fused_linear_logprobs(hidden, weight, scored, bias, chunk_size=4).log_probs
        passed_on = float64_grads_at(op_logps, hidden, weight, bias, target, case)
        for name, a, e, r, p in zip(names, grads, eager[0][1:], ref[0][1:], passed_on):
            allowed = rel_err(p, r)  # the formula's float64 gradient at the op's log-probs
            e_ours, e_eager = rel_err(a, r), rel_err(e, r)
            bound = 1.25 * (e_eager + allowed) + 0.1 * torch.finfo(dtype).eps
            assert e_ours <= bound, f"{name}: {e_ours:.3e} > 1.25 x (eager {e_eager:.3e} + {allowed:.3e})"
    masked = case["completion_mask"] == 0
    assert (grads[0][masked] == 0).all()  # padding positions get no gradient


def test_fused_equals_formula_on_op_logprobs_and_module():
    """The fused loss is exactly the formula on fused_linear_logprobs's fp64 log-probs, rounded to fp32 once;
    the reference log-probs from ref_hidden (policy head by default); the module forwards to the function."""
    hidden, weight, bias, target = make_fused_inputs(torch.float32, True)
    ref_hidden = hidden + 0.1 * torch.randn_like(hidden)
    case = make_case("dapo", beta=0.04)
    mask = case["completion_mask"]
    kwargs = dict(advantages=case["advantages"].float(), completion_mask=mask, beta=0.04, temperature=1.3)
    loss, metrics = fused_linear_grpo_loss(hidden, weight, target, bias, ref_hidden=ref_hidden, **kwargs)
    scored = target.masked_fill(mask == 0, -100)
    out = fused_linear_logprobs(
        hidden, weight, scored, bias, temperature=1.3, outputs=("log_probs", "entropy"),
        log_probs_dtype=torch.float64,
    )  # fmt: skip
    ref = fused_linear_logprobs(ref_hidden, weight, scored, bias, temperature=1.3).log_probs
    want, want_metrics = grpo_loss_from_logps(
        out.log_probs, None, ref, kwargs["advantages"], mask, beta=0.04, entropies=out.entropy
    )
    assert want.dtype == torch.float64 and loss.dtype == torch.float32
    assert torch.equal(loss, want.float())
    assert all(value.dtype == torch.float32 for value in metrics.values())
    assert_metrics_equal(metrics, {name: value.float() for name, value in want_metrics.items()}, tol=0.0)
    # gradients: the op's backward with the formula's d loss / d log-probs as grad_output
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss, _ = fused_linear_grpo_loss(h, w, target, bias, ref_hidden=ref_hidden, **kwargs)
    got = torch.autograd.grad(loss, (h, w))
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logps = fused_linear_logprobs(
        h2, w2, scored, bias, temperature=1.3, log_probs_dtype=torch.float64
    ).log_probs
    logps_leaf = logps.detach().requires_grad_(True)
    formula, _ = grpo_loss_from_logps(logps_leaf, None, ref, kwargs["advantages"], mask, beta=0.04)
    (g,) = torch.autograd.grad(formula, logps_leaf)
    want = torch.autograd.grad(logps, (h2, w2), g)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    module = LigerFusedLinearGRPOLoss(beta=0.04, temperature=1.3)
    assert list(module.state_dict()) == [] and "dapo" in repr(module)
    got, _ = module(
        hidden,
        weight,
        target,
        bias,
        advantages=kwargs["advantages"],
        completion_mask=mask,
        ref_hidden=ref_hidden,
    )
    assert torch.equal(got, loss)
    with pytest.raises(ValueError, match="loss_type"):
        LigerFusedLinearGRPOLoss(loss_type="ppo")
    with pytest.raises(ValueError, match="ref_hidden"):
        fused_linear_grpo_loss(
            hidden, weight, target, advantages=kwargs["advantages"], completion_mask=mask, beta=0.1
        )
    with pytest.raises(ValueError, match="target"):
        fused_linear_grpo_loss(
            hidden, weight, target[:, :-1], advantages=kwargs["advantages"], completion_mask=mask
        )


def test_fused_fully_masked_batch_no_nan():
    hidden, weight, bias, target = make_fused_inputs(torch.bfloat16, True)
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    for loss_type in GRPO_LOSS_TYPES:
        loss, metrics = fused_linear_grpo_loss(
            h,
            w,
            target,
            bias,
            advantages=torch.randn(B),
            completion_mask=torch.zeros(B, T, dtype=torch.long),
            loss_type=loss_type,
            max_completion_length=MAX_COMPLETION_LENGTH,
        )
        dh, dw = torch.autograd.grad(loss, (h, w))
        assert loss.item() == 0.0 and (dh == 0).all() and (dw == 0).all(), loss_type
        assert metrics["entropy"].item() == 0.0

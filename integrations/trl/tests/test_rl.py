"""DPO, KTO and GRPO (TRL >= 1.15) with use_liger_kernel: TRL's fused LM head computes its log-probs with
liger_core.ops.fused_linear_logprobs; TRL's losses and logged metrics are unchanged.

Each trainer runs a few fp32 steps on the tiny random-init Llama twice, flag off and on, from the same weights
and data; the logged loss and every logged metric agree to rel 1e-4 (abs 1e-6): the two runs differ only by
liger_core's kernels (fused log-probs, RMSNorm, RoPE, SwiGLU) in place of PyTorch's and TRL's, all fp32.
Spies count the calls of both log-prob kernels: the flag-on run never calls TRL's, the flag-off run never
calls liger_core's.
"""

from __future__ import annotations

import logging
import math

import liger_core_trl
import pytest
import torch
import trl.trainer.utils as trl_utils
from liger_core_trl.logprobs import LigerCoreLogProbFunction, trl_kernel
from tiny import kinds

import liger_core.ops

REL, ABS = 1e-4, 1e-6
SKIP_KEYS = ("runtime", "per_second", "flos", "epoch", "step")
COMMON = dict(
    per_device_train_batch_size=4,
    learning_rate=1e-2,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    disable_tqdm=True,
    seed=0,
    bf16=False,  # TRL's configs default to bf16 autocast; fp32 lets runs with and without the flag agree
)
PROMPTS = ["The quick brown", "Fused kernels keep", "A tiny model", "RMSNorm, RoPE", "Short", "The trainer"]
ANSWERS = ["fox jumps.", "the logits out.", "is enough.", "run in Triton.", "one.", "patches the model."]


@pytest.fixture
def spies(monkeypatch):
    """Counts of calls of liger_core's op and of TRL's own kernel (whatever name TRL resolves)."""
    calls = {"liger_core": 0, "trl": 0}
    op = liger_core.ops.fused_linear_logprobs
    trl_apply = trl_kernel().apply

    def counted_op(*args, **kwargs):
        calls["liger_core"] += 1
        return op(*args, **kwargs)

    def counted_trl(*args):
        calls["trl"] += 1
        return trl_apply(*args)

    monkeypatch.setattr(liger_core.ops, "fused_linear_logprobs", counted_op)
    monkeypatch.setattr(trl_kernel(), "apply", staticmethod(counted_trl))
    return calls


def logged(trainer) -> list[dict[str, float]]:
    return [
        {k: v for k, v in entry.items() if not any(s in k for s in SKIP_KEYS)}
        for entry in trainer.state.log_history
        if "loss" in entry
    ]


def assert_same_logs(off, on, required: tuple[str, ...]) -> None:
    logs_off, logs_on = logged(off), logged(on)
    assert len(logs_on) == len(logs_off) == off.args.max_steps
    assert set(required) <= set().union(*logs_off), sorted(set().union(*logs_off))
    for step, (a, b) in enumerate(zip(logs_off, logs_on)):
        assert set(a) == set(b), step
        for key in a:
            assert math.isfinite(b[key]), (step, key)
            assert b[key] == pytest.approx(a[key], rel=REL, abs=ABS), (step, key, a[key], b[key])


def run_both(build, spies, layer_kernels=("rms_norm", "swiglu", "rope")):
    """`build(use_liger_kernel)` -> trainer; train flag off, then on; check which kernel each run called."""
    liger_core_trl.install()
    off = build(False)
    off.train()
    assert spies["liger_core"] == 0 and spies["trl"] > 0
    spies["trl"] = 0
    on = build(True)
    on.train()
    assert spies["trl"] == 0 and spies["liger_core"] > 0
    assert trl_utils._ChunkedLogProbFunction is trl_kernel()  # put back after train()
    assert kinds(off.model) == set() and kinds(on.model) == set(layer_kernels)
    return off, on


def test_dpo_flag_on_off(make_model, tokenizer, tmp_path, spies):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    rows = [
        {"prompt": p, "chosen": " " + a, "rejected": " " + ANSWERS[(i + 1) % len(ANSWERS)]}
        for i, (p, a) in enumerate(zip(PROMPTS, ANSWERS))
    ]
    dataset = Dataset.from_list(rows)

    def build(flag):
        args = DPOConfig(
            output_dir=str(tmp_path / str(flag)),
            max_steps=2,
            max_length=16,
            beta=0.5,
            use_weighting=True,  # also the log_sum_sq_probs statistic
            precompute_ref_log_probs=True,  # reference log-probs computed in the constructor
            use_liger_kernel=flag,
            **COMMON,
        )
        return DPOTrainer(model=make_model(), args=args, train_dataset=dataset, processing_class=tokenizer)

    off, on = run_both(build, spies)
    assert_same_logs(
        off,
        on,
        (
            "loss", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
            "rewards/margins", "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected",
            "entropy", "mean_token_accuracy",
        ),
    )  # fmt: skip
    assert any(e["rewards/margins"] != 0 for e in logged(on))  # the policy moved away from the reference


def test_kto_flag_on_off(make_model, tokenizer, tmp_path, spies):
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    rows = [
        {"prompt": p, "completion": " " + a, "label": i % 2 == 0}
        for i, (p, a) in enumerate(zip(PROMPTS, ANSWERS))
    ]
    rows += [
        {"prompt": p, "completion": " " + ANSWERS[(i + 2) % len(ANSWERS)], "label": i % 2 == 1}
        for i, p in enumerate(PROMPTS)
    ]
    dataset = Dataset.from_list(rows)

    def build(flag):
        args = KTOConfig(
            output_dir=str(tmp_path / str(flag)),
            max_steps=2,
            max_length=16,
            beta=0.5,
            train_sampling_strategy="sequential",
            use_liger_kernel=flag,
            **COMMON,
        )
        return KTOTrainer(model=make_model(), args=args, train_dataset=dataset, processing_class=tokenizer)

    off, on = run_both(build, spies)
    assert_same_logs(off, on, ("loss", "grad_norm", "kl", "entropy"))


def reward_chars(completions, **kwargs) -> list[float]:
    """A deterministic reward that varies between completions (GRPO's advantages must not all be zero)."""
    return [float(sum(map(ord, text)) % 13) for text in completions]


def test_grpo_flag_on_off(make_model, tokenizer, tmp_path, spies):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    dataset = Dataset.from_list([{"prompt": p} for p in PROMPTS[:4]])

    def build(flag):
        args = GRPOConfig(
            output_dir=str(tmp_path / str(flag)),
            max_steps=2,
            num_generations=2,
            max_completion_length=4,
            temperature=0.9,  # the fused head divides the logits by the sampling temperature
            beta=0.1,  # KL to a reference model: its log-probs come from the fused head too
            num_iterations=2,  # old log-probs computed at generation time: clip ratios from real ratios
            epsilon=0.05,
            loss_type="dapo",
            **COMMON,
            use_liger_kernel=flag,
            # layer kernels off: generation with them is slow in Triton's interpreter (DPO/KTO/SFT test them)
            liger_kernel_config={"rms_norm": False, "swiglu": False, "rope": False},
        )
        return GRPOTrainer(
            model=make_model(),
            reward_funcs=reward_chars,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
        )

    off, on = run_both(build, spies, layer_kernels=())
    assert_same_logs(
        off,
        on,
        (
            "loss", "grad_norm", "reward", "reward_std", "kl", "entropy", "clip_ratio/low_mean",
            "clip_ratio/high_mean", "clip_ratio/region_mean", "completions/mean_length",
        ),
    )  # fmt: skip
    assert any(e["kl"] != 0 for e in logged(on)) and any(e.get("reward_std") for e in logged(on))
    assert any(e["clip_ratio/region_mean"] != 0 for e in logged(on))  # old log-probs differ from the new


def test_grpo_entropy_bonus_keeps_trl_kernel(make_model, tokenizer, tmp_path, spies, caplog):
    """The entropy bonus backpropagates through the entropy, which liger_core returns without gradient."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    liger_core_trl.install()
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        num_generations=2,
        max_completion_length=3,
        entropy_coef=0.01,
        **COMMON,
        use_liger_kernel=True,
    )
    with caplog.at_level(logging.WARNING, logger="liger_core_trl"):
        trainer = GRPOTrainer(
            model=make_model(),
            reward_funcs=reward_chars,
            args=args,
            train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS[:4]]),
            processing_class=tokenizer,
        )
        trainer.train()
    assert spies["liger_core"] == 0 and spies["trl"] > 0
    assert kinds(trainer.model) == {"rms_norm", "swiglu", "rope"}  # the layer kernels still apply
    assert sum("entropy bonus" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("softcap, scale, bias", [(None, 1.0, False), (3.0, 0.5, True)])
def test_adapter_matches_trl_kernel(softcap, scale, bias):
    """LigerCoreLogProbFunction.apply vs TRL's ChunkedLogProbFunction.apply on the same (odd-shaped) inputs:
    all five outputs, and the gradients of a loss on the log-probs."""
    n, h, v = 13, 24, 67
    hidden = torch.randn(n, h, dtype=torch.float64).float().requires_grad_()
    weight = (torch.randn(v, h) * 0.3).requires_grad_()
    b = (torch.randn(v) * 0.1).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n,))
    outputs = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
    args = (targets, 0.7, 32, softcap, scale, outputs)
    ours = LigerCoreLogProbFunction.apply(hidden, weight, b, *args)
    theirs = trl_kernel().apply(hidden, weight, b, *args)
    assert len(ours) == len(theirs) == 5
    for name, x, y in zip(outputs, ours, theirs):
        assert x.shape == y.shape == (n,) and x.dtype == y.dtype, name
        if name == "is_top1":
            assert torch.equal(x, y)
        else:
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=name)
    grad_out = torch.randn(n)
    params = [p for p in (hidden, weight, b) if p is not None]
    g_ours = torch.autograd.grad((ours[0] * grad_out).sum(), params)
    g_theirs = torch.autograd.grad((theirs[0] * grad_out).sum(), params)
    for x, y in zip(g_ours, g_theirs):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_fused_linear_cross_entropy_off_keeps_trl_kernel(make_model, tokenizer, tmp_path, spies):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    liger_core_trl.install()
    rows = [{"prompt": p, "chosen": " " + a, "rejected": " no"} for p, a in zip(PROMPTS, ANSWERS)]
    args = DPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        max_length=12,
        use_liger_kernel=True,
        liger_kernel_config={"fused_linear_cross_entropy": False},
        **COMMON,
    )
    trainer = DPOTrainer(
        model=make_model(), args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    trainer.train()
    assert spies["liger_core"] == 0 and spies["trl"] > 0
    assert kinds(trainer.model) == {"rms_norm", "swiglu", "rope"}


def test_install_uninstall_restores_trl(spies):
    from trl import DPOTrainer, GRPOTrainer
    from trl.trainer.base_trainer import _BaseTrainer

    before = {
        (cls, name): cls.__dict__.get(name)
        for cls in (_BaseTrainer, DPOTrainer, GRPOTrainer)
        for name in ("__init__", "train", "evaluate", "predict")
    }
    liger_core_trl.install()
    liger_core_trl.install()  # idempotent
    assert "train" in _BaseTrainer.__dict__ and DPOTrainer.evaluate is not before[(DPOTrainer, "evaluate")]
    assert trl_utils._ChunkedLogProbFunction is trl_kernel()  # swapped only while a flagged trainer runs
    liger_core_trl.uninstall()
    after = {key: key[0].__dict__.get(key[1]) for key in before}
    assert after == before

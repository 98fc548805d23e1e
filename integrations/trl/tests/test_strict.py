"""`strict` in a TRL config's `liger_kernel_config`: every kernel asked for runs, or the trainer stops before
its first step with liger_core's `PatchIncompleteError`. Without it the trainer runs and the plugin warns,
naming the kernel left out. TRL's own fused LM head is not a miss: it computes the loss by design."""

from __future__ import annotations

import logging
import sys
import types

import liger_core_trl
import pytest
from test_rl import COMMON, PROMPTS, reward_chars
from test_sft import sft_trainer, train_logs, uses_trl_fused_head
from tiny import kinds

from liger_core.patching import PatchIncompleteError, is_patched

STRICT = {"strict": True, "rope": False}  # RoPE is the slowest kernel in Triton's interpreter


def with_wrapped_norm(model):
    """The final RMSNorm's forward replaced on the instance, as a profiling or offloading library does:
    liger_core leaves such a module alone."""
    norm = model.model.norm
    norm.forward = types.MethodType(lambda self, x: type(self).forward(self, x), norm)
    return model


def test_trl_parser_reads_strict_from_argv(monkeypatch, tmp_path):
    from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

    liger_core_trl.install()
    argv = ["sft.py", "--output_dir", str(tmp_path), "--use_cpu", "--bf16", "false", "--use_liger_kernel"]
    monkeypatch.setattr(sys, "argv", [*argv, "--liger_kernel_config", '{"strict": true}'])
    _, config, _ = TrlParser((ScriptArguments, SFTConfig, ModelConfig)).parse_args_and_config()
    assert config.liger_kernel_config == {"strict": True}


def test_strict_sft_stops_before_the_first_step(make_model, tokenizer, text_dataset, tmp_path):
    liger_core_trl.install()
    trainer = sft_trainer(
        with_wrapped_norm(make_model()),
        tokenizer,
        text_dataset,
        tmp_path,
        use_liger_kernel=True,
        liger_kernel_config=STRICT,
    )
    with pytest.raises(PatchIncompleteError, match="rms_norm: LlamaRMSNorm has an instance-level forward"):
        trainer.train()
    assert trainer.state.global_step == 0 and not is_patched(trainer.model)


def test_strict_sft_under_trl_fused_head_trains(make_model, tokenizer, text_dataset, tmp_path, caplog):
    liger_core_trl.install()
    trainer = sft_trainer(
        make_model(),
        tokenizer,
        text_dataset,
        tmp_path,
        use_liger_kernel=True,
        liger_kernel_config=STRICT,
        max_steps=1,
    )
    with caplog.at_level(logging.INFO):
        trainer.train()
    assert len(train_logs(trainer)) == 1
    assert kinds(trainer.model) == {"rms_norm", "swiglu"} and uses_trl_fused_head(trainer.model)
    assert "NOT applied" not in caplog.text


def grpo(model, tokenizer, tmp_path, config):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        num_generations=2,
        max_completion_length=3,
        entropy_coef=0.01,  # backpropagates through the entropy: liger_core's fused log-probs cannot serve it
        **COMMON,
        use_liger_kernel=True,
        liger_kernel_config=config,
    )
    return GRPOTrainer(
        model=model,
        reward_funcs=reward_chars,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS[:4]]),
        processing_class=tokenizer,
    )


def test_grpo_entropy_bonus_strict_stops_the_constructor_and_trains_without(
    make_model, tokenizer, tmp_path, caplog
):
    liger_core_trl.install()
    layers_off = {"rms_norm": False, "swiglu": False, "rope": False}  # generation is slow with them
    with pytest.raises(
        PatchIncompleteError,
        match="fused_linear_cross_entropy cannot be applied to GRPOTrainer: .*entropy bonus",
    ):
        grpo(make_model(), tokenizer, tmp_path / "strict", {"strict": True, **layers_off})

    with caplog.at_level(logging.WARNING, logger="liger_core_trl"):
        trainer = grpo(make_model(), tokenizer, tmp_path / "lenient", layers_off)
        trainer.train()
    assert trainer.state.global_step == 1
    warned = [
        r.getMessage() for r in caplog.records if "NOT applied: fused_linear_cross_entropy" in r.getMessage()
    ]
    assert len(warned) == 1 and "entropy bonus" in warned[0]


def test_strict_with_deepspeed_zero3_stops_the_constructor(make_model, tokenizer, tmp_path, monkeypatch):
    from datasets import Dataset
    from liger_core_trl import logprobs
    from trl import DPOConfig, DPOTrainer

    liger_core_trl.install()
    monkeypatch.setattr(logprobs, "_zero3_enabled", lambda: True)
    args = DPOConfig(
        output_dir=str(tmp_path), max_length=12, use_liger_kernel=True, liger_kernel_config=STRICT, **COMMON
    )
    rows = [{"prompt": p, "chosen": " yes", "rejected": " no"} for p in PROMPTS]
    with pytest.raises(
        PatchIncompleteError, match="fused_linear_cross_entropy cannot be applied to DPOTrainer: .*ZeRO-3"
    ):
        DPOTrainer(
            model=make_model(), args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
        )

"""SFTTrainer (TRL >= 1.15) with use_liger_kernel through liger_core: layer kernels under TRL's fused head."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import liger_core_trl
import pytest
import torch
from tiny import MAX_TOKENS, child_env, kinds

BIN = Path(sys.executable).parent


def sft_trainer(model, tokenizer, dataset, output_dir, **overrides):
    from trl import SFTConfig, SFTTrainer

    settings = dict(
        output_dir=str(output_dir),
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        train_sampling_strategy="sequential",
        disable_tqdm=True,
        seed=0,
        max_length=MAX_TOKENS + 1,
        bf16=False,  # SFTConfig defaults to bf16 autocast; float32 lets runs with and without the flag agree
    )
    settings.update(overrides)
    return SFTTrainer(
        model=model, args=SFTConfig(**settings), train_dataset=dataset, processing_class=tokenizer
    )


def train_logs(trainer):
    return [e for e in trainer.state.log_history if "loss" in e]


def uses_trl_fused_head(model) -> bool:
    """TRL's `add_fused_lm_head` forward is bound on the model (under accelerate's output wrapper, if any)."""
    forward = vars(model).get("_original_forward", vars(model).get("forward"))
    return forward is not None and forward.__func__.__code__.co_name == "_fused_forward"


def test_sft_flag_on_off_three_steps(make_model, tokenizer, text_dataset, tmp_path):
    liger_core_trl.install()
    off = sft_trainer(make_model(), tokenizer, text_dataset, tmp_path / "off")
    off.train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        on = sft_trainer(make_model(), tokenizer, text_dataset, tmp_path / "on", use_liger_kernel=True)
        on.train()
    assert not [w for w in caught if "use_liger_kernel" in str(w.message)]  # TRL's deprecation is not raised

    assert kinds(off.model) == set()
    # layer kernels only: TRL's fused LM head computes the loss, liger_core's fused loss is not put on top
    assert kinds(on.model) == {"rms_norm", "swiglu", "rope"}
    assert uses_trl_fused_head(on.model) and uses_trl_fused_head(off.model)
    assert on.args.use_liger_kernel is True and on.args.liger_kernel_config is None

    logs_off, logs_on = train_logs(off), train_logs(on)
    assert len(logs_off) == len(logs_on) == 3
    assert [e["loss"] for e in logs_on] == pytest.approx([e["loss"] for e in logs_off], rel=1e-4)
    assert all(0.0 <= e["mean_token_accuracy"] <= 1.0 for e in logs_on)
    assert [e["mean_token_accuracy"] for e in logs_on] == pytest.approx(
        [e["mean_token_accuracy"] for e in logs_off]
    )
    for (name, p_off), p_on in zip(off.model.named_parameters(), on.model.parameters()):
        torch.testing.assert_close(p_on, p_off, rtol=1e-4, atol=1e-5, msg=name)


def test_fused_linear_cross_entropy_in_config_defers_to_trl_head(
    caplog, make_model, tokenizer, text_dataset, tmp_path
):
    config = {"fused_linear_cross_entropy": True, "rope": False}
    with pytest.raises(ValueError, match="fused_linear_cross_entropy"):  # TRL alone
        sft_trainer(
            make_model(), tokenizer, text_dataset, tmp_path, use_liger_kernel=True, liger_kernel_config=config
        )

    liger_core_trl.install()
    trainer = sft_trainer(
        make_model(),
        tokenizer,
        text_dataset,
        tmp_path,
        use_liger_kernel=True,
        liger_kernel_config=config,
        max_steps=1,
    )
    with caplog.at_level(logging.INFO, logger="liger_core_hf"):
        trainer.train()
    assert kinds(trainer.model) == {"rms_norm", "swiglu"}
    assert uses_trl_fused_head(trainer.model)
    assert trainer.args.liger_kernel_config == config  # left as the user wrote it
    warned = [
        r for r in caplog.records if r.levelno == logging.WARNING and "computes the loss itself" in r.message
    ]
    assert len(warned) == 1 and "_fused_forward" in warned[0].message
    assert "mean_token_accuracy" in train_logs(trainer)[0]


def test_without_the_hook_trl_and_transformers_want_liger_kernel(
    make_model, tokenizer, text_dataset, tmp_path
):
    with pytest.warns(FutureWarning, match="deprecated"):
        trainer = sft_trainer(
            make_model(), tokenizer, text_dataset, tmp_path, use_liger_kernel=True, max_steps=1
        )
    with pytest.raises(ImportError, match="liger-kernel"):
        trainer.train()


def test_sft_script_with_the_flag_and_json_config(tiny_dir, dataset_dir, tmp_path):
    cmd = [
        str(BIN / "liger-core-trl"), "sft",
        "--model_name_or_path", str(tiny_dir), "--dataset_name", str(dataset_dir),
        "--output_dir", str(tmp_path),
        "--max_steps", "2", "--per_device_train_batch_size", "2", "--logging_steps", "1",
        "--max_length", str(MAX_TOKENS + 1), "--learning_rate", "0.01", "--save_strategy", "no",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--dtype", "float32", "--bf16", "false",
        "--use_liger_kernel", "--liger_kernel_config", '{"rope": false}',
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=child_env(HF_DATASETS_OFFLINE="1"), timeout=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "liger_core: patched llama: rms_norm x5, swiglu x2" in out
    assert "fused_linear_cross_entropy x" not in out and "rope x" not in out
    assert "mean_token_accuracy" in out
    assert "`use_liger_kernel=True` is deprecated" not in out  # TRL's warning: liger_core serves the flag
    assert (tmp_path / "model.safetensors").exists()  # the script ran to its end (save_model)


def test_trl_parser_reads_the_flag_and_json_config_from_argv(monkeypatch, tmp_path):
    from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

    argv = ["sft.py", "--output_dir", str(tmp_path), "--use_cpu", "--bf16", "false", "--use_liger_kernel"]
    monkeypatch.setattr(sys, "argv", [*argv, "--liger_kernel_config", '{"swiglu": false}'])
    with pytest.raises(SystemExit):  # TRL's parser alone: "invalid dict value"
        TrlParser((ScriptArguments, SFTConfig, ModelConfig)).parse_args_and_config()
    liger_core_trl.install()
    _, config, _ = TrlParser((ScriptArguments, SFTConfig, ModelConfig)).parse_args_and_config()
    assert config.use_liger_kernel is True and config.liger_kernel_config == {"swiglu": False}

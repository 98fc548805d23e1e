"""TRL's own CLI, unmodified: `trl sft|dpo ... --use_liger_kernel` on a tiny local model (CPU). `trl` starts
`accelerate launch` on TRL's script: the child is a new interpreter, served by liger_core through the plugins'
`.pth` activation. The assertions read the run's log lines: which library serves the flag, liger_core's patch
report (kinds and counts), the log-probs of TRL's fused LM head computed by liger_core."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import MAX_TOKENS, SENTENCES, child_env

TRL = str(Path(sys.executable).parent / "trl")
SERVED = re.compile(r"use_liger_kernel is served by liger_core \S+ \(liger-core-hf \S+, liger-core-trl \S+\)")
LAYERS = "[liger_core_hf] use_liger_kernel: liger_core: patched llama: rms_norm x5, swiglu x2, rope x2"


@pytest.fixture(scope="module")
def preference_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("preference-data")
    with open(directory / "train.jsonl", "w") as f:
        for s in SENTENCES:
            f.write(json.dumps({"prompt": s[:12], "chosen": s[12:], "rejected": s[::-1][:20]}) + "\n")
    return directory


def trl(command: str, model: Path, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        TRL, command, "--model_name_or_path", str(model), "--dataset_name", str(data),
        "--output_dir", str(out),
        "--max_steps", "2", "--per_device_train_batch_size", "2", "--logging_steps", "1",
        "--max_length", str(2 * MAX_TOKENS), "--learning_rate", "0.01", "--save_strategy", "no",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--dtype", "float32", "--bf16", "false",
        *extra,
    ]  # fmt: skip
    # accelerate's child finds `python` on PATH: this venv's
    env = child_env(HF_DATASETS_OFFLINE="1", PATH=f"{Path(sys.executable).parent}:{child_env()['PATH']}")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)


@pytest.mark.parametrize("command, trainer", [("sft", "SFTTrainer"), ("dpo", "DPOTrainer")])
def test_trl_cli_with_the_flag_runs_liger_core(
    command, trainer, tiny_dir, dataset_dir, preference_dir, tmp_path
):
    data = dataset_dir if command == "sft" else preference_dir
    proc = trl(command, tiny_dir, data, tmp_path, "--use_liger_kernel")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert len(SERVED.findall(log)) == 1, log[-4000:]
    assert LAYERS in log  # layer kernels only: TRL's fused LM head computes the loss
    assert "fused_linear_cross_entropy x" not in log
    assert (
        f"[liger_core_trl] use_liger_kernel: {trainer}'s fused LM head computes its log-probs with "
        "liger_core.ops.fused_linear_logprobs" in log
    )
    assert "`use_liger_kernel=True` is deprecated" not in log  # TRL's own handling never saw the flag
    assert "liger-kernel >= 0.3.0 is not available" not in log
    assert (tmp_path / "model.safetensors").exists()  # the script ran to its end


def test_trl_cli_misspelled_flag_is_a_did_you_mean_error(tiny_dir, dataset_dir, tmp_path):
    proc = trl("sft", tiny_dir, dataset_dir, tmp_path, "--use_liger_kernal")
    assert proc.returncode != 0
    assert "unknown argument --use_liger_kernal: did you mean --use_liger_kernel?" in proc.stderr
    assert not (tmp_path / "model.safetensors").exists()


def test_trl_cli_json_kernel_config(tiny_dir, dataset_dir, tmp_path):
    proc = trl("sft", tiny_dir, dataset_dir, tmp_path, "--use_liger_kernel", "--liger_kernel_config",
               '{"rope": false, "swiglu": false}')  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert re.search(
        r"\[liger_core_hf\] use_liger_kernel: liger_core: patched llama: rms_norm x5(\n| \|)", log
    )

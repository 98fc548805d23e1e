"""``liger-lmf train`` end to end: LLaMA-Factory's own training for 3 steps on CPU with liger_core's kernels
(Triton interpreter), single process and relaunched under torchrun like a multi-GPU run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import free_port, subprocess_env, train_config

LIGER_LMF = [sys.executable, "-m", "liger_core_llamafactory"]


def _run(cmd, env, cwd, timeout=420):
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    return output


def _losses(out_dir):
    with open(out_dir / "trainer_log.jsonl", encoding="utf-8") as f:
        return [row["loss"] for row in map(json.loads, f) if "loss" in row]


def test_train_three_steps_with_liger_core(tiny_llama, tiny_dataset_dir, tmp_path):
    config = train_config(tiny_llama, tiny_dataset_dir, tmp_path / "out", enable_liger_kernel=True)
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    console_script = Path(sys.executable).parent / "liger-lmf"  # what users type
    output = _run([str(console_script), "train", str(path)], subprocess_env(), tmp_path)
    # liger_core patched the model that LLaMA-Factory trained, and LLaMA-Factory never asked for liger-kernel
    assert "liger_core kernels active on LlamaForCausalLM" in output, output[-4000:]
    active = next(line for line in output.splitlines() if "liger_core kernels active" in line)
    for kind in ("fused_linear_cross_entropy", "rms_norm", "rope", "swiglu"):
        assert kind in active, active
    assert "pip install liger-kernel" not in output
    losses = _losses(tmp_path / "out")
    assert len(losses) == 3 and all(0 < loss < 20 for loss in losses), losses


def test_torchrun_workers_all_patch(tiny_llama, tiny_dataset_dir, tmp_path):
    """FORCE_TORCHRUN (what LLaMA-Factory does with several GPUs): 2 CPU workers (gloo), the setting given
    on the command line reaches both, and each patches its own model."""
    config = train_config(tiny_llama, tiny_dataset_dir, tmp_path / "out", max_steps=1, ddp_backend="gloo")
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    port = str(free_port())
    env = subprocess_env(FORCE_TORCHRUN="1", NPROC_PER_NODE="2", MASTER_PORT=port, OMP_NUM_THREADS="1")
    output = _run([*LIGER_LMF, "train", str(path), "enable_liger_kernel=true"], env, tmp_path, timeout=540)
    assert "-m liger_core_llamafactory.worker" in output and "LIGER_CORE_LMF=1" in output
    for rank in ("0", "1"):
        assert f"[rank {rank}] liger_core kernels active on LlamaForCausalLM" in output, output[-4000:]
    assert len(_losses(tmp_path / "out")) == 1

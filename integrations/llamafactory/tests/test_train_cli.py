"""LLaMA-Factory's own, unmodified ``llamafactory-cli train`` with the plugin installed: 3 CPU steps with
liger_core's kernels (Triton interpreter), single process and relaunched under torchrun like a multi-GPU
run; the liger keys are checked before training."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import free_port, subprocess_env, train_config

LLAMAFACTORY_CLI = str(Path(sys.executable).parent / "llamafactory-cli")  # what users type
LAYERS = 2  # conftest.build_tiny_llama


def _run(cmd, env, cwd, timeout=420, ok=True):
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    if ok:
        assert proc.returncode == 0, output[-6000:]
    return proc.returncode, output


def _losses(out_dir):
    with open(out_dir / "trainer_log.jsonl", encoding="utf-8") as f:
        return [row["loss"] for row in map(json.loads, f) if "loss" in row]


def active_kernels(output: str, rank: str = "0") -> dict[str, int]:
    """``{kind: modules}`` of the ``[rank N] liger_core kernels active on LlamaForCausalLM: ...`` line."""
    pattern = rf"\[rank {rank}\] liger_core kernels active on LlamaForCausalLM: (.*)"
    [listed] = re.findall(pattern, output)
    return {kind: int(n) for kind, n in re.findall(r"(\w+) x(\d+)", listed)}


def expected_sft_kernels(layers: int) -> dict[str, int]:
    """A Llama's liger_core kernels for SFT: two RMSNorms per layer and the final one, one RoPE (attention)
    and one SwiGLU MLP per layer, the fused linear cross-entropy once (the causal-LM head)."""
    return {"fused_linear_cross_entropy": 1, "rms_norm": 2 * layers + 1, "rope": layers, "swiglu": layers}


def test_llamafactory_cli_train_runs_liger_core(tiny_llama, tiny_dataset_dir, tmp_path):
    config = train_config(tiny_llama, tiny_dataset_dir, tmp_path / "out", enable_liger_kernel=True)
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    _, output = _run([LLAMAFACTORY_CLI, "train", str(path)], subprocess_env(), tmp_path)
    # liger_core patched the model that LLaMA-Factory trained, and LLaMA-Factory never asked for liger-kernel
    assert active_kernels(output) == expected_sft_kernels(LAYERS), output[-4000:]
    [served] = [line for line in output.splitlines() if "enable_liger_kernel is served by liger_core" in line]
    import liger_core

    assert f"liger_core {liger_core.__version__}" in served, served
    assert "pip install liger-kernel" not in output
    losses = _losses(tmp_path / "out")
    assert len(losses) == 3 and all(0 < loss < 20 for loss in losses), losses


def test_llamafactory_cli_torchrun_workers_all_patch(tiny_llama, tiny_dataset_dir, tmp_path):
    """FORCE_TORCHRUN (what LLaMA-Factory does with several GPUs): its launcher re-runs itself under torchrun
    with 2 CPU workers (gloo); the start-up hook runs in both, each patches its own model, and only rank 0
    says which library serves the flag."""
    config = train_config(tiny_llama, tiny_dataset_dir, tmp_path / "out", max_steps=1, ddp_backend="gloo")
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    port = str(free_port())
    env = subprocess_env(FORCE_TORCHRUN="1", NPROC_PER_NODE="2", MASTER_PORT=port, OMP_NUM_THREADS="1")
    cmd = [LLAMAFACTORY_CLI, "train", str(path), "enable_liger_kernel=true"]
    _, output = _run(cmd, env, tmp_path, timeout=540)
    assert "torchrun" in output or "distributed tasks" in output, output[-4000:]
    for rank in ("0", "1"):
        assert active_kernels(output, rank) == expected_sft_kernels(LAYERS), output[-4000:]
    assert output.count("enable_liger_kernel is served by liger_core") == 1, output[-4000:]
    assert len(_losses(tmp_path / "out")) == 1


def test_llamafactory_cli_names_a_misspelled_liger_key(tiny_llama, tiny_dataset_dir, tmp_path):
    config = train_config(tiny_llama, tiny_dataset_dir, tmp_path / "out", enable_liger_kernal=True)
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    code, output = _run(
        [LLAMAFACTORY_CLI, "train", str(path)], subprocess_env(ALLOW_EXTRA_ARGS="1"), tmp_path, ok=False
    )
    # ALLOW_EXTRA_ARGS=1 would make LLaMA-Factory drop the key and train without liger_core
    assert code != 0
    assert "unknown key 'enable_liger_kernal' (did you mean 'enable_liger_kernel'?)" in output, output[-4000:]
    assert not (tmp_path / "out" / "trainer_log.jsonl").exists()

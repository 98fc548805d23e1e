"""End to end with Axolotl's own, unmodified CLI: ``axolotl train config.yaml`` -> its default launcher
(accelerate) -> Axolotl's config loading and training, 3 CPU steps with liger_core's kernels (Triton
interpreter), liger-kernel installed beside it (Axolotl's own dependency) and never applied; a misspelled
plugin module stops the run before training."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import PLUGIN, axolotl_config, subprocess_env

AXOLOTL = str(Path(sys.executable).parent / "axolotl")  # what users type
LAYERS = 2  # conftest.build_tiny_llama


def _run(args, cwd, timeout=480):
    proc = subprocess.run(
        [AXOLOTL, *args], cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout + proc.stderr


def active_kernels(output: str) -> dict[str, int]:
    """``{kind: modules}`` of the plugin's ``kernels active on LlamaForCausalLM (rank 0): ...`` line."""
    [listed] = re.findall(r"liger_core: kernels active on LlamaForCausalLM \(rank 0\): (.*)", output)
    return {kind: int(n) for kind, n in re.findall(r"(\w+) x(\d+)", listed)}


def test_axolotl_train_runs_liger_core_not_liger_kernel(tiny_llama, tiny_dataset, tmp_path):
    import importlib.metadata

    import liger_core

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(axolotl_config(tiny_llama, tiny_dataset, tmp_path)))
    code, output = _run(["train", str(path)], tmp_path)
    assert code == 0, output[-6000:]
    assert f"Plugin loaded successfully: {PLUGIN}" in output
    # one line (rank 0) names the library that serves the flag, with its version, and liger-kernel's
    [served] = [line for line in output.splitlines() if "use_liger_kernel is served by liger_core" in line]
    assert f"liger_core {liger_core.__version__}" in served, served
    liger_kernel = importlib.metadata.version("liger-kernel")  # Axolotl's dependency
    assert f"liger-kernel {liger_kernel} is installed and is not applied" in served, served
    # a Llama: two RMSNorms per layer and the final one, RoPE and SwiGLU once per layer, one fused loss
    assert active_kernels(output) == {
        "fused_linear_cross_entropy": 1,
        "rms_norm": 2 * LAYERS + 1,
        "rope": LAYERS,
        "swiglu": LAYERS,
    }, output[-6000:]
    assert "already runs liger-kernel's patches" not in output  # post_model_build checked the model
    losses = [float(x) for x in re.findall(r"'loss': '?([0-9.]+)", output)]
    assert len(losses) == 3 and all(0 < loss < 20 for loss in losses), losses


def test_axolotl_train_stops_on_a_misspelled_plugin_module(tiny_llama, tiny_dataset, tmp_path):
    """Without the hook Axolotl logs the ImportError, drops the plugin's keys and trains with rc 0."""
    config = axolotl_config(
        tiny_llama, tiny_dataset, tmp_path, plugins=["liger_core_axolotI.LigerCorePlugin"]
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    code, output = _run(["train", str(path)], tmp_path)
    assert code != 0, output[-6000:]
    assert f"Did you mean {PLUGIN}?" in output, output[-6000:]
    assert not re.search(r"'loss': ", output)  # stopped before training

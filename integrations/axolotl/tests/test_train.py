"""End to end: ``liger-core-axolotl train config.yaml`` -> Axolotl's CLI -> its default launcher (accelerate)
-> Axolotl's config loading and training, 3 CPU steps with liger_core's kernels (Triton interpreter)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import axolotl_config, subprocess_env

WRAPPER = str(Path(sys.executable).parent / "liger-core-axolotl")


def _run(args, cwd, timeout=480):
    proc = subprocess.run(
        [WRAPPER, *args], cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_train_three_steps_with_liger_core(tiny_llama, tiny_dataset, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(axolotl_config(tiny_llama, tiny_dataset, tmp_path)))
    code, output = _run(["train", str(path)], tmp_path)
    assert code == 0, output[-6000:]
    assert "Plugin loaded successfully: liger_core_axolotl.LigerCorePlugin" in output
    assert '"use_liger_kernel": true' in output  # the key survived Axolotl's validation
    active = [
        line for line in output.splitlines() if "liger_core: kernels active on LlamaForCausalLM" in line
    ]
    assert active, output[-6000:]
    for kind in ("fused_linear_cross_entropy", "rms_norm", "rope", "swiglu"):
        assert kind in active[0], active[0]
    losses = [float(x) for x in re.findall(r"'loss': '?([0-9.]+)", output)]
    assert len(losses) == 3 and all(0 < loss < 20 for loss in losses), losses


def test_wrapper_stops_a_run_whose_plugin_is_misspelled(
    tiny_llama, tiny_dataset, tmp_path, monkeypatch, capsys
):
    """Plain ``axolotl train`` would log the import error and train without liger_core; the wrapper exits 2
    before Axolotl starts."""
    import axolotl.cli.main
    from liger_core_axolotl.cli import main

    monkeypatch.setattr(axolotl.cli.main, "main", lambda: pytest.fail("Axolotl was started"))
    config = axolotl_config(tiny_llama, tiny_dataset, tmp_path, plugins=["liger_core_axolotl.LigerCorePlugn"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        main(["train", str(path)])
    assert exit_info.value.code == 2
    assert "Did you mean liger_core_axolotl.LigerCorePlugin?" in capsys.readouterr().err

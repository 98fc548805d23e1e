"""Zero-change activation for a vision-language model: the unmodified script `tests/scripts/train_vlm.py`
(HfArgumentParser + `AutoModelForImageTextToText` + Trainer, random images in Qwen2VLProcessor's layout) run
with `--use_liger_kernel` on a saved tiny Qwen2.5-VL trains with liger_core's kernels in the text model and
the vision tower.

The subprocesses run as a user's process does (the `.pth` activation on, `tiny.child_env`); the assertions
read the run's log (the served-by line, liger_core's patch report with kinds and counts expected from the
config, nothing left out) and the script's result file (losses equal to the run without the flag).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import child_env, qwen2_5_vl_model

import liger_core

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "train_vlm.py")
SERVED = re.compile(r"use_liger_kernel is served by liger_core \S+ \(liger-core-hf \S+\)")
STEPS = 4  # 4 rows, 2 a batch: steps 3 and 4 repeat the batches of steps 1 and 2


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-qwen2_5_vl")
    qwen2_5_vl_model().save_pretrained(directory)
    return directory


def train(model_dir: Path, output_dir: Path, *flags: str) -> tuple[dict, str]:
    args = [
        "--model_dir", str(model_dir), "--output_dir", str(output_dir), "--max_steps", str(STEPS),
        "--per_device_train_batch_size", "2", "--logging_steps", "1", "--learning_rate", "0.01",
        "--save_strategy", "no", "--report_to", "none", "--use_cpu",
        "--train_sampling_strategy", "sequential", "--disable_tqdm", "true", "--seed", "0",
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, SCRIPT, *args, *flags], capture_output=True, text=True, env=child_env(), timeout=600
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads((output_dir / "result.json").read_text()), proc.stderr


def test_child_imports_this_liger_core():
    """The script's process imports the liger_core under test (PYTHONPATH is passed on), not another copy."""
    code = "import liger_core; print(liger_core.__file__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env())
    assert proc.stdout.strip() == liger_core.__file__, proc.stderr


def test_unmodified_vlm_script_with_the_flag_runs_liger_core(vlm_dir, tmp_path):
    plain, plain_log = train(vlm_dir, tmp_path / "plain")
    assert plain["kinds"] == [] and "liger_core" not in plain_log

    launched, log = train(vlm_dir, tmp_path / "flag", "--use_liger_kernel")
    assert len(SERVED.findall(log)) == 1, log[-3000:]

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(vlm_dir)
    layers, blocks = config.text_config.num_hidden_layers, config.vision_config.depth
    counts = {
        "rms_norm": 2 * layers + 1 + 2 * blocks + 1,  # 2 per decoder layer + final; 2 per block + merger's
        "swiglu": layers + blocks,  # the gated MLPs of text and vision
        "rope": layers + blocks,  # the rotary function of every text and every vision attention
        "fused_linear_cross_entropy": 1,
    }
    swapped = ", ".join(f"{kind} x{n}" for kind, n in counts.items())
    report = f"liger_core: patched qwen2_5_vl (structural): {swapped}"
    lines = [line for line in log.splitlines() if "[liger_core_hf] use_liger_kernel: " in line]
    assert [line.split("[liger_core_hf] use_liger_kernel: ", 1)[1] for line in lines] == [report], log[-3000:]
    assert "NOT applied" not in log
    assert launched["kinds"] == sorted(counts)

    assert len(launched["losses"]) == len(plain["losses"]) == STEPS
    assert all(math.isfinite(x) for x in launched["losses"])
    assert launched["losses"] == pytest.approx(plain["losses"], rel=1e-5)
    assert launched["losses"][2] < launched["losses"][0] and launched["losses"][3] < launched["losses"][1]

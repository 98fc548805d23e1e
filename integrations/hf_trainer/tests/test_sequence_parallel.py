"""`--use_liger_kernel` under accelerate's Ulysses sequence parallelism (`ParallelismConfig(sp_backend=
"deepspeed")`, DeepSpeed ZeRO-2) on 2 CPU processes (gloo): the Trainer patches the model with `tiled_mlp` and
`offload_checkpoints` on, accelerate shards each sequence over the ranks, and the losses and trained weights
equal one unpatched process's (`tests/scripts/ulysses_sp_trainer.py`). run_tests.sh installs DeepSpeed (no
C++ op compiled ahead of time).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from tiny import child_env

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "ulysses_sp_trainer.py")


@pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch.distributed with the gloo backend")
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_trainer_with_ulysses_sequence_parallelism_matches_one_process(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", SCRIPT]
    env = child_env(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", OUT_DIR=str(tmp_path / "out"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "OK: Trainer + Ulysses SP x2 + liger_core == one process unpatched" in proc.stdout, output[-6000:]
    assert "MISMATCH" not in proc.stdout, output[-6000:]

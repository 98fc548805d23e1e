"""Ulysses sequence parallelism (DeepSpeed's ALST, the engine accelerate's `ParallelismConfig(sp_backend=
"deepspeed")` drives for the HF Trainer and TRL) over 2 CPU processes (gloo) with a liger_core-patched Llama:
the engine's own attention all-to-all, sequence sharding and loss reduction; liger_core's fused linear
cross-entropy on each shard, `tiled_mlp` and `offload_checkpoints` on. Same loss and gradients as one process,
patched or not (tests/dist_scripts/ulysses_sp_train.py).

`deepspeed` must be importable: tests/run_all.sh installs it in the core venvs (no C++ op is compiled ahead of
time). The children inherit TRITON_INTERPRET from tests/conftest.py.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

pytest.importorskip("transformers")

SCRIPT = Path(__file__).parent / "dist_scripts" / "ulysses_sp_train.py"
HAS_GLOO = dist.is_available() and dist.is_gloo_available()
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


@pytest.mark.skipif(not HAS_GLOO, reason="needs torch.distributed with the gloo backend")
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (see the module doc)")
def test_ulysses_two_ranks_match_single_process():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd.append(str(SCRIPT))
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "OK: Ulysses SP x2 patched == one process" in proc.stdout, output[-6000:]
    assert "MISMATCH" not in proc.stdout, output[-6000:]

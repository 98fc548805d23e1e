"""FSDP2 (fully_shard, gloo, 2 CPU processes) of a liger_core-patched Llama: same loss and gradients as one
unpatched process, with the fused linear cross-entropy used (never its materialised-logits fallback).

The children inherit TRITON_INTERPRET from tests/conftest.py, so on a machine without a GPU they run the
Triton kernels in the interpreter (20-40 s per launch on 2 cores).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

pytest.importorskip("transformers")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with the gloo backend", allow_module_level=True)

SCRIPT = Path(__file__).parent / "dist_scripts" / "fsdp2_train.py"


@pytest.mark.parametrize(
    "flags", [[], ["--shard-lm-head"], ["--tie"]], ids=["lm_head_in_root", "lm_head_own_unit", "tied"]
)
def test_fsdp2_two_ranks_match_single_process(flags):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(SCRIPT), *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "OK: FSDP2 x2 patched == single-process unpatched" in proc.stdout, output[-6000:]

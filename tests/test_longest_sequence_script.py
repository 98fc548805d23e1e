"""benchmarks/longest_sequence.py: the search finds the boundary an attempt function draws, and the script
runs end to end on CPU with a tiny config (``--tiny``), writing its CSV, meta file and plot."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "longest_sequence.py"


def _module():
    spec = importlib.util.spec_from_file_location("longest_sequence", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("limit", [4096, 28672, 100000, 409600, 1 << 20])
@pytest.mark.parametrize("start", [4096, 98304, 393216])
def test_search_brackets_the_limit(limit, start):
    search = _module().search_longest
    tried = []

    def attempt(n):
        tried.append(n)
        return "ok" if n <= limit else "oom"

    found = search(attempt, start, 4096, 1 << 20)
    want = limit // 4096 * 4096
    assert found["longest"] == want and found["complete"], (found, tried)
    assert all(n % 4096 == 0 and n <= 1 << 20 for n in tried)
    assert found["failed"] is None if want == 1 << 20 else found["failed"] == want + 4096
    # far from the start: growth by x1.25 then bisection; near it (within 25%): a handful of attempts
    assert len(tried) <= (8 if 0.8 * start <= limit <= 1.25 * start else 30)


def test_search_stops_on_other_failures_and_budget():
    search = _module().search_longest
    found = search(lambda n: "failed", 8192, 4096, 65536)
    assert found["longest"] is None and not found["complete"] and "failed" in found["reason"]
    found = search(lambda n: "oom", 8192, 4096, 65536)
    assert found["longest"] is None and found["complete"] and found["failed"] == 4096
    calls = []
    found = search(lambda n: calls.append(n) or "ok", 8192, 4096, 1 << 20, lambda: len(calls) >= 2)
    assert len(calls) == 2 and found["longest"] == calls[-1] and not found["complete"]
    with pytest.raises(ValueError, match="resolution"):
        search(lambda n: "ok", 8192, 0, 65536)


def test_tiny_run_on_cpu(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--tiny", "--providers", "liger_core_long", "--max-length", "48"]
    cmd += ["--resolution", "48", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "longest_sequence.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["provider"], r["length"], r["status"], r["longest"]) for r in rows] == [
        ("liger_core_long", "48", "ok", "True")
    ], rows
    assert int(rows[0]["offloaded"]) == 2  # both layers' inputs went to host memory and came back
    meta = json.loads((tmp_path / "longest_sequence.meta.json").read_text())
    search = meta["searches"]["llama8b-lora/liger_core_long"]
    assert search["longest"] == 48 and search["reason"] == "reached --max-length"
    assert search["patched"]["tiled_mlp"] == 2 and search["patched"]["offload_checkpoints"] == 2
    assert "--out <dir>" in meta["command"]
    assert any(f.endswith(".png") for f in meta["files"]) == (tmp_path / "longest_sequence.png").exists()

"""benchmarks/model_shapes.py on CPU: the model table, the shapes it derives per op, the summary, and the
sweep's plumbing end to end in Triton's interpreter (``--cpu-smoke``, untimed)."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from liger_core.harness.registry import ALL_OPS, DEFAULT_OPS, OPS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "model_shapes.py"


def _module():
    spec = importlib.util.spec_from_file_location("model_shapes", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


ms = _module()


def _run(*args: str, tmp_path: Path) -> int:
    """The script's main in this process (the tests run with TRITON_INTERPRET=1 already)."""
    return ms.main(["--cpu-smoke", "--out", str(tmp_path), *args])


def _read(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_model_table_is_consistent():
    models = ms.load_models()
    assert len(models) >= 20
    assert len({m["name"] for m in models}) == len(models)
    for m in models:
        for k in ("hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab"):
            assert isinstance(m[k], int) and m[k] > 0, (m["name"], k)
        assert m["heads"] % m["kv_heads"] == 0, m["name"]  # grouped-query attention
        assert m["head_dim"] % 2 == 0 and m["act"] in ("silu", "gelu"), m["name"]


def test_every_op_gets_deduplicated_model_shapes():
    models = ms.load_models()
    names = {m["name"] for m in models}
    for op in ALL_OPS:
        cases = ms.distinct_shapes(op, models, batch=4, seq=2047)
        assert cases, op
        keys = [c.key for c in cases]
        assert len(keys) == len(set(keys)), op
        for c in cases:
            OPS[op].label(c.shape)  # the suite's label and floor take the derived shape
            OPS[op].floor(c.shape, 2, "fwd+bwd")
        covered = {n for c in cases for n in c.models}
        if op not in ms._GLU_ACT:  # every model has a norm, RoPE and a loss head
            assert covered == names, (op, names - covered)
        assert [len(c.models) for c in cases] == sorted((len(c.models) for c in cases), reverse=True)
    # models of one architecture share a measurement; tokens are 4 x 2047, not a power of two
    norms = {c.shape["N"]: c for c in ms.distinct_shapes("rms_norm", models, 4, 2047)}
    assert {"Llama-3-8B", "Llama-3.1-8B", "Mistral-7B-v0.3"} <= set(norms[4096].models)
    assert norms[4096].shape["M"] == 8188
    glu = {c.shape["N"] for c in ms.distinct_shapes("swiglu", models, 4, 2047)}
    assert {18432, 2048} <= glu  # DeepSeek V3's dense and expert MLPs
    assert not {c.shape["N"] for c in ms.distinct_shapes("geglu", models, 4, 2047)} & {11008, 28672}


def test_schedule_takes_turns_over_the_ops():
    models = ms.load_models()
    order = ms.schedule(["rms_norm", "geglu", "rope"], models, 4, 2047)
    assert [c.op for c in order[:6]] == ["rms_norm", "geglu", "rope"] * 2
    ops = ("rms_norm", "geglu", "rope")
    assert len(order) == sum(len(ms.distinct_shapes(o, models, 4, 2047)) for o in ops)


def test_summary_fastest_counts_only_passing_providers():
    def row(provider, ms_, gpu, check="ok", error=""):
        return dict(op="rms_norm", shape="8188x2560", dtype="bfloat16", mode="fwd+bwd", provider=provider,
                    ms=ms_, gpu_ms=gpu, floor_ms=0.05, check=check, error=error)  # fmt: skip

    rows = [
        row("liger_core", 0.30, 0.10),
        row("torch.compile", 0.50, 0.08),
        row("liger_kernel", 0.20, 0.05, check="WARN"),  # faster but wrong: not the fastest
        row("torch", "", "", check="error", error="OOM"),
    ]
    (s,) = ms.summarize(rows, ("torch", "liger_core", "torch.compile", "liger_kernel"), ["Qwen3-4B"])
    assert s["fastest_gpu"] == "torch.compile" and s["fastest_wall"] == "liger_core"
    assert s["liger_core_gpu_vs_fastest"] == pytest.approx(0.10 / 0.08)
    assert s["liger_core_wall_vs_fastest"] == pytest.approx(1.0)
    assert s["liger_core_gpu_pct_of_floor"] == pytest.approx(50.0)
    assert s["torch_ms"] is None and s["models"] == "Qwen3-4B"


def test_cpu_smoke_runs_every_default_op(tmp_path):
    """Two tiny shapes per op through the suite's bench_case (checked, untimed)."""
    assert _run("--providers", "torch", "liger_core", tmp_path=tmp_path) == 0
    rows = _read(tmp_path / "model_shapes.csv")
    assert sorted({r["op"] for r in rows}) == sorted(DEFAULT_OPS)
    for op in DEFAULT_OPS:
        assert sum(r["op"] == op for r in rows) == 2, op
    assert all(r["liger_core_check"] == "ok" for r in rows)
    assert (tmp_path / "model_shapes.meta.json").exists() and (tmp_path / "model_shapes_rows.csv").exists()


def test_time_limit_leaves_shapes_for_resume(tmp_path):
    """--max-minutes 0 starts no shape and lists them all in the meta file for --resume."""
    assert _run("--max-minutes", "0", "--ops", "rms_norm", "rope", tmp_path=tmp_path) == 0
    meta = json.loads((tmp_path / "model_shapes.meta.json").read_text())
    assert meta["shapes_run"] == 0 and len(meta["shapes_left_by_time_limit"]) == 4


def test_resume_leaves_only_shapes_not_yet_run(tmp_path):
    """A resumed run cut off by the time limit lists the shapes still to run, not those of earlier runs."""
    assert _run("--ops", "rms_norm", "--providers", "torch", "liger_core", tmp_path=tmp_path) == 0
    assert _run("--resume", "--max-minutes", "0", "--ops", "rope", "rms_norm", tmp_path=tmp_path) == 0
    meta = json.loads((tmp_path / "model_shapes.meta.json").read_text())
    assert meta["shapes_run"] == 0 and len(meta["earlier_runs"]) == 1
    assert sorted(s.split()[0] for s in meta["shapes_left_by_time_limit"]) == ["rope", "rope"]

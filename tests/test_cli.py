"""The `liger-core` command (env, check, bench, demo) and the benchmark suite's code path, on CPU.

The GPU-only parts (timing, memory, the peers' compiled kernels) run on the GPU machine through
benchmarks/run_gpu.sh; `test_check_on_gpu` runs there under `pytest -m gpu`.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from liger_core import bench, check, reference

ROOT = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()


def run_cli(*args: str, drop_interpret: bool = False, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if drop_interpret:
        env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "liger_core.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


def test_env_reports_versions_gpu_and_paths():
    r = run_cli("env")
    assert r.returncode == 0, r.stdout + r.stderr
    for field in ("torch", "triton", "transformers", "Triton", "CPU tensors", "ops"):
        assert field in r.stdout, f"{field!r} missing from:\n{r.stdout}"
    if not HAS_CUDA:
        assert "no GPU" in r.stdout


def test_unknown_command_is_an_error():
    r = run_cli("frobnicate")
    assert r.returncode != 0
    assert "invalid choice" in r.stderr


@pytest.mark.skipif(HAS_CUDA, reason="CPU behaviour")
def test_check_sets_interpreter_itself_and_swiglu_passes():
    r = run_cli("check", "--ops", "swiglu", drop_interpret=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "TRITON_INTERPRET=1" in r.stdout  # it says that it set the variable
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("swiglu ")]
    assert [row[1] for row in rows] == ["float32", "bfloat16"]
    assert all("pass" in row for row in rows), r.stdout
    assert "2/2 checks passed" in r.stdout


def _wrong_swiglu(a, b):
    return reference.swiglu(a, b) * (1 + 2**-5)  # ~3% off: far outside any dtype's budget


def test_check_fails_on_a_wrong_kernel():
    spec = bench.OPS["swiglu"]
    shape, cpu = spec.shapes["cpu"][0], torch.device("cpu")
    row, ok = check.check_one(spec, _wrong_swiglu, shape, torch.float32, cpu, timed=False)
    assert not ok and row[6] == "FAIL"
    assert row[4] > 1e-2  # the kernel error column


def test_check_exit_code_is_nonzero_when_a_kernel_fails(monkeypatch, capsys):
    if HAS_CUDA:
        pytest.skip("CPU shapes")
    monkeypatch.setattr(check, "available", lambda module, name: _wrong_swiglu if module == "ops" else
                        getattr(reference, name))  # fmt: skip
    assert check.main(["--ops", "swiglu", "--dtypes", "float32"]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.skipif(HAS_CUDA, reason="CPU behaviour")
def test_bench_refuses_on_cpu():
    r = run_cli("bench", "--quick")
    assert r.returncode == 2
    assert "no CUDA GPU" in r.stderr and "--dry-run" in r.stderr


def test_demo_missing_gives_a_clear_message(monkeypatch, capsys):
    from liger_core import cli

    monkeypatch.setitem(sys.modules, "liger_core.demo", None)  # an install without liger_core/demo.py
    assert cli.main(["demo"]) == 2
    assert "liger_core.demo is not part of this install" in capsys.readouterr().err


def test_floors_match_the_issue_figures():
    """The floors quoted in issues 2, 3 and 7 (bf16, fwd+bwd): bytes / 3 TB/s; FLCE 6 BT H V / 800 TFLOP/s."""

    def floor(name):
        spec = bench.OPS[name]
        return spec.floor(spec.shapes["default"][0], 2, "fwd+bwd")

    assert floor("rms_norm").ms == pytest.approx(0.224, abs=0.002)
    assert floor("layer_norm").ms == pytest.approx(0.224, abs=0.002)
    assert floor("swiglu").ms == pytest.approx(1.25, abs=0.01)
    assert floor("rope").ms == pytest.approx(0.225, abs=0.003)
    assert floor("cross_entropy").ms == pytest.approx(1.40, abs=0.01)
    assert floor("fused_linear_cross_entropy").ms == pytest.approx(32.3, abs=0.1)
    assert floor("fused_linear_cross_entropy").basis == "flops"
    # forward alone moves fewer bytes than forward + backward, for every op
    for name, spec in bench.OPS.items():
        shape = spec.shapes["default"][0]
        assert spec.floor(shape, 2, "fwd").seconds < spec.floor(shape, 2, "fwd+bwd").seconds, name


def test_sweep_shapes_cover_the_issue_7_ranges():
    rows = bench.OPS["rms_norm"].shapes["sweep"]
    assert {s["N"] for s in rows} == {1024, 2048, 4096, 8192, 16384}
    assert {s["M"] for s in rows} >= {1024, 65536} and any(s["M"] % 16 for s in rows)  # an odd token count
    vocabs = {s["V"] for s in bench.OPS["cross_entropy"].shapes["sweep"]}
    assert vocabs == {32000, 128256, 152064, 256000}
    assert any(s["BT"] % 16 for s in bench.OPS["fused_linear_cross_entropy"].shapes["sweep"])


def test_rel_err_chunks_agree_with_the_direct_formula(monkeypatch):
    x, ref = torch.randn(1000, dtype=torch.float64), torch.randn(1000, dtype=torch.float64)
    direct = ((x - ref).norm() / ref.norm()).item()
    monkeypatch.setattr(bench, "_ERR_CHUNK", 77)
    assert bench.rel_err(x, ref) == pytest.approx(direct, rel=1e-12)
    x[3] = float("nan")
    assert bench.rel_err(x, ref) == float("inf")


class _WritesDbOverB(torch.autograd.Function):
    """y = a * b whose backward writes db over b, as liger-kernel's SwiGLU backward writes da/db over a/b."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        da = dy * b
        b.copy_(dy * a)
        return da, b


def test_runner_detects_providers_that_write_into_their_inputs():
    """A provider that overwrites an input is found by the checked run, and its inputs are restored."""
    spec = bench.OPS["swiglu"]
    runner = bench.CaseRunner(spec, spec.shapes["cpu"][0], torch.float32, torch.device("cpu"))
    runner.compute_reference()
    run = runner.run_checked(_WritesDbOverB.apply)
    assert [pristine is runner.case.args[1] for _, pristine in run.restore_pairs] == [True]
    assert torch.equal(run.args[1].detach(), runner.case.args[1])  # restored after the checked run
    assert runner.run_checked(reference.swiglu).restore_pairs == []


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")
def test_restoring_timer_starts_every_run_without_a_gradient():
    """The timer for providers that write into their inputs runs each batch on copies of the written inputs
    but shares the others (here x and w of an in-place RMSNorm, which writes dx over dy): every timed run
    must find their gradients cleared, as do_bench's runs do, or it is charged an accumulation into them."""
    from liger_core import ops

    spec = bench.OPS["rms_norm"]
    runner = bench.CaseRunner(spec, {"M": 1000, "N": 1536}, torch.bfloat16, torch.device("cuda"))
    runner.compute_reference()
    seen: list[bool] = []

    def in_place_rms_norm(x, w, *rest):
        seen.append(x.grad is None and w.grad is None)
        return ops.rms_norm(x, w, *rest, in_place=True)

    run = runner.run_checked(in_place_rms_norm)
    assert bench._written_names(runner, run) == ["grad_out0"]
    seen.clear()
    median, _, _ = bench._bench_restoring(run, "fwd+bwd", 1.0, 2.0, 40, est_ms=0.05)
    assert median > 0 and len(seen) > bench.RESTORE_BATCH and all(seen), seen


@pytest.mark.slow
def test_bench_dry_run_writes_csv_and_plots(tmp_path):
    r = subprocess.run(
        [sys.executable, "benchmarks/bench_ops.py", "--dry-run", "--ops", "swiglu", "--providers", "torch",
         "liger_core", "torch.compile", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    rows = list(csv.DictReader((tmp_path / "ops_cpu-dryrun.csv").open()))
    assert len(rows) == 6  # 3 providers x 2 modes
    assert {(row["provider"], row["mode"]) for row in rows} == {
        (p, m) for p in ("torch", "liger_core", "torch.compile") for m in ("fwd", "fwd+bwd")
    }
    assert all(row["check"] == "ok" and not row["error"] for row in rows), rows
    assert all(float(row["floor_ms"]) > 0 for row in rows)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "ops_cpu-dryrun_time.png").stat().st_size > 0


@pytest.mark.slow
def test_bench_continues_in_a_fresh_process_after_a_crash(tmp_path, monkeypatch, capsys):
    """After a case that breaks the GPU context, the remaining cases run in a new process, appending to the
    same CSV; the first process then prints the table of every row (simulated: the check is forced once)."""
    broken = iter([True])
    monkeypatch.setattr(bench, "process_broken", lambda device: next(broken, False))
    rc = bench.main(["--dry-run", "--ops", "swiglu", "geglu", "--providers", "torch", "--out", str(tmp_path),
                     "--no-plots"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "continue in a fresh process" in out
    rows = list(csv.DictReader((tmp_path / "ops_cpu-dryrun.csv").open()))
    assert [(r["op"], r["mode"]) for r in rows] == [
        ("swiglu", "fwd"), ("swiglu", "fwd+bwd"), ("geglu", "fwd"), ("geglu", "fwd+bwd")
    ]  # fmt: skip
    assert all(r["check"] == "ok" for r in rows), rows


def test_bench_where_keeps_only_matching_shapes(tmp_path, capsys):
    """--where N=... keeps the shapes with that value (the CPU shape of swiglu is 37 x 123); none left is an
    error, not an empty run."""
    common = ["--dry-run", "--ops", "swiglu", "--providers", "torch", "--modes", "fwd", "--no-plots"]
    assert bench.main([*common, "--out", str(tmp_path / "none"), "--where", "N=999,1000"]) == 2
    assert "no shape" in capsys.readouterr().err
    assert bench.main([*common, "--out", str(tmp_path), "--where", "N=999,123", "M=37"]) == 0
    rows = list(csv.DictReader((tmp_path / "ops_cpu-dryrun.csv").open()))
    assert [(r["op"], r["provider"], r["mode"]) for r in rows] == [("swiglu", "torch", "fwd")]


def test_plots_from_rows(tmp_path):
    pytest.importorskip("matplotlib")

    def row(op, shape, provider, mode, ms):
        return {"op": op, "shape": shape, "provider": provider, "mode": mode, "ms": ms, "floor_ms": 0.1,
                "pct_of_floor": 10 / ms, "peak_extra_gib": 0.5}  # fmt: skip

    rows = [
        row(op, "8x8", p, m, ms)
        for op in ("rms_norm", "swiglu")
        for p, ms in (("torch", 2.0), ("liger_core", 1.0))
        for m in bench.MODES
    ]
    files = bench.plot_results(rows, tmp_path, "single")
    assert sorted(f.name for f in files) == ["single_floor.png", "single_memory.png", "single_time.png"]
    sweep = rows + [dict(r, shape="16x16") for r in rows]
    assert [f.name for f in bench.plot_results(sweep, tmp_path, "sweep")] == [
        "sweep_floor.png",
        "sweep_relative.png",
    ]
    wins = bench.peer_wins(sweep)  # torch at 2 ms never beats liger_core at 1 ms
    assert wins == []
    assert bench.peer_wins([dict(r, ms=0.5) if r["provider"] == "torch" else r for r in rows])

    # with GPU times (CUDA-graph replay): a fourth plot, and a peer slower on the wall clock but faster in GPU
    # time is listed as such (a host-bound liger_core row must not hide a slower kernel)
    timed = [dict(r, gpu_ms=r["ms"] / 2, gpu_pct_of_floor=20 / r["ms"]) for r in rows]
    files = bench.plot_results(timed, tmp_path, "graphs")
    assert "graphs_gpu_floor.png" in {f.name for f in files}
    timed_sweep = timed + [dict(r, shape="16x16") for r in timed]
    assert [f.name for f in bench.plot_results(timed_sweep, tmp_path, "gsweep")] == [
        "gsweep_floor.png",
        "gsweep_gpu_floor.png",
        "gsweep_relative.png",
        "gsweep_gpu_relative.png",
    ]
    assert bench.peer_wins(timed) == []
    faster_kernel = [dict(r, gpu_ms=0.1) if r["provider"] == "torch" else r for r in timed]
    wins = bench.peer_wins(faster_kernel)
    assert wins and all("faster in GPU time" in w for w in wins), wins


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")
def test_check_on_gpu():
    # the check runs in a subprocess that needs ~20 GiB for swiglu's fp32 float64 reference: hand back the
    # memory this test process's caching allocator holds from earlier tests
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    r = run_cli("check", "--ops", "swiglu", "rms_norm")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith(("swiglu ", "rms_norm "))]
    assert len(rows) == 4 and all(" pass " in line for line in rows), r.stdout

"""The `liger-core` command (env, check, bench, demo) and the benchmark suite's code path, on CPU.

The GPU-only parts (timing, memory, the peers' compiled kernels) run on the GPU machine through
benchmarks/run_gpu.sh; `test_check_on_gpu` runs there under `pytest -m gpu`.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

from liger_core import reference
from liger_core.harness import bench, check, correctness, interpreter, plots, registry, report, timing

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
    r = run_cli("env", drop_interpret=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for field in ("torch", "triton", "transformers", "Triton", "CPU tensors", "kernels", "ops"):
        assert field in r.stdout, f"{field!r} missing from:\n{r.stdout}"
    if not HAS_CUDA:
        assert "GPU          none" in r.stdout
        assert "compiled" not in r.stdout  # nothing is compiled for a GPU that is not there
        assert "kernels      run as PyTorch reference code" in r.stdout


def test_env_in_the_interpreter_says_so(capsys):
    """Under TRITON_INTERPRET=1 (set by conftest before triton is imported) CPU tensors run the kernels."""
    from liger_core import cli
    from liger_core.dispatch import triton_status

    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    if triton_status() == "interpreted" and not HAS_CUDA:
        assert "CPU tensors  the Triton kernels, in Triton's interpreter" in out
        assert "kernels      run as Triton in the interpreter" in out
        assert "compiled" not in out


def test_env_kernel_paths_for_each_triton_state_and_gpu():
    from liger_core.cli import kernel_paths

    def rows(status, gpu):
        return dict(kernel_paths(status, gpu, "1" if status == "interpreted" else ""))

    no_gpu = rows("compiled", None)  # triton importable, not interpreting, no GPU: nothing can be compiled
    assert "no usable GPU" in no_gpu["Triton"] and "compile" not in no_gpu["kernels"]
    assert no_gpu["CPU tensors"].startswith("PyTorch reference code") and "CUDA tensors" not in no_gpu
    assert no_gpu["kernels"].startswith("run as PyTorch reference code")
    gpu = rows("compiled", "NVIDIA H100")
    assert gpu["CUDA tensors"] == "the compiled Triton kernels on NVIDIA H100"
    assert gpu["kernels"].startswith("run as compiled Triton on NVIDIA H100")
    interp = rows("interpreted", None)
    assert "interpreter" in interp["Triton"] and interp["CPU tensors"].startswith("the Triton kernels")
    assert rows("interpreted", "NVIDIA H100")["CUDA tensors"].startswith("refused")
    missing = rows("missing", None)
    assert "missing" in missing["Triton"] and missing["kernels"].startswith("run as PyTorch reference code")
    assert "TRITON_INTERPRET" not in missing["CPU tensors"]  # no advice that cannot work without triton


def test_env_gpu_summary_tells_cpu_build_from_no_device_from_unusable(monkeypatch):
    from liger_core.cli import gpu_summary

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert gpu_summary() == (None, "none: this torch is a CPU-only build (torch.version.cuda is None)")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert gpu_summary() == (None, "none visible: torch is built for CUDA 12.8, but finds no GPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def broken_ones(*args, **kwargs):
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device\nmore")

    monkeypatch.setattr(torch, "ones", broken_ones)
    gpu, text = gpu_summary()
    assert gpu is None and text == (
        "present but not usable: RuntimeError: "
        "CUDA error: no kernel image is available for execution on the device"
    )


def test_env_rejects_arguments_and_has_help(capsys):
    from liger_core import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["env", "--bogus"])
    assert e.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["env", "--help"])
    assert e.value.code == 0 and "usable" in capsys.readouterr().out


def test_unknown_command_is_an_error():
    r = run_cli("frobnicate")
    assert r.returncode != 0
    assert "invalid choice" in r.stderr


def test_no_command_prints_help_with_the_commands(capsys):
    from liger_core import cli

    assert cli.main([]) == 2  # argparse's exit code for a usage error
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("usage: liger-core [-h] [--version] COMMAND [ARGS...]")
    for name, text in cli.COMMANDS.items():
        assert f"  {name:<7} {text}" in captured.err
    assert "required" not in captured.err


def test_version(capsys):
    import liger_core
    from liger_core import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"liger-core {liger_core.__version__}\n"


def test_console_script_without_arguments():
    """The installed entry point (``python -m liger_core.cli``): help on stderr and exit code 2."""
    r = run_cli()
    assert r.returncode == 2 and "commands:" in r.stderr and "demo" in r.stderr and r.stdout == ""


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
    spec = registry.OPS["swiglu"]
    shape, cpu = spec.shapes["cpu"][0], torch.device("cpu")
    row, ok = check.check_one(spec, _wrong_swiglu, shape, torch.float32, cpu, timed=False)
    assert not ok and row[6] == "FAIL"
    assert row[4] > 1e-2  # the kernel error column


def test_check_output_has_no_interpreter_warnings(capsys):
    """Triton's interpreter runs kernels in numpy, which warns about values a kernel computes and then
    discards (both sides of a tl.where, masked-off lanes) and inf/nan inputs; a GPU does not: ``check`` hides
    those warnings, and only those."""
    from liger_core.dispatch import triton_status

    if HAS_CUDA or triton_status() != "interpreted":
        pytest.skip("the interpreter's warnings")
    spec = registry.OPS["kl_div"]  # log(0) in lanes that tl.where then discards
    fn = registry.available("ops", "kl_div")
    with warnings.catch_warnings(record=True) as raw:  # the same kernel, outside check: numpy warns
        warnings.simplefilter("always")
        check.check_one(spec, fn, spec.shapes["cpu"][0], torch.float32, torch.device("cpu"), timed=False)
    interpreter = [w for w in raw if issubclass(w.category, RuntimeWarning) and "triton" in w.filename]
    assert interpreter, "this case no longer makes numpy warn: pick one that does, or drop the filter"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert check.main(["--ops", "kl_div", "--dtypes", "float32"]) == 0
    assert [w for w in seen if "triton" in w.filename] == []
    out = capsys.readouterr()
    assert "1/1 checks passed" in out.out and "RuntimeWarning" not in out.out + out.err


def test_quiet_interpreter_keeps_other_warnings():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with interpreter.quiet_interpreter():
            warnings.warn("a RuntimeWarning of this module", RuntimeWarning, stacklevel=1)
            warnings.warn("a UserWarning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["a RuntimeWarning of this module", "a UserWarning"]


def test_check_exit_code_is_nonzero_when_a_kernel_fails(monkeypatch, capsys):
    if HAS_CUDA:
        pytest.skip("CPU shapes")
    monkeypatch.setattr(check, "available", lambda module, name: _wrong_swiglu if module == "ops" else
                        getattr(reference, name))  # fmt: skip
    assert check.main(["--ops", "swiglu", "--dtypes", "float32"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_check_imports_neither_timing_nor_plotting_code():
    """`liger-core check` runs the correctness runner only: a CPU check of one op leaves the benchmark's
    timers, the plots (matplotlib) and the bench command unimported."""
    code = (
        "import sys\n"
        "from liger_core import cli\n"
        "rc = cli.main(['check', '--ops', 'swiglu', '--dtypes', 'float32'])\n"
        "heavy = ['matplotlib', 'liger_core.harness.timing', 'liger_core.harness.plots', "
        "'liger_core.harness.bench']\n"
        "print('LOADED', [m for m in heavy if m in sys.modules], 'RC', rc)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU check: on a GPU the check times each kernel on purpose
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "LOADED [] RC 0" in r.stdout, r.stdout[-2000:]


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
        spec = registry.OPS[name]
        return spec.floor(spec.shapes["default"][0], 2, "fwd+bwd")

    assert floor("rms_norm").ms == pytest.approx(0.224, abs=0.002)
    assert floor("layer_norm").ms == pytest.approx(0.224, abs=0.002)
    assert floor("swiglu").ms == pytest.approx(1.25, abs=0.01)
    assert floor("rope").ms == pytest.approx(0.225, abs=0.003)
    assert floor("cross_entropy").ms == pytest.approx(1.40, abs=0.01)
    assert floor("fused_linear_cross_entropy").ms == pytest.approx(32.3, abs=0.1)
    assert floor("fused_linear_cross_entropy").basis == "flops"
    # forward alone moves fewer bytes than forward + backward, for every op
    for name, spec in registry.OPS.items():
        shape = spec.shapes["default"][0]
        assert spec.floor(shape, 2, "fwd").seconds < spec.floor(shape, 2, "fwd+bwd").seconds, name


def test_sweep_shapes_cover_the_issue_7_ranges():
    rows = registry.OPS["rms_norm"].shapes["sweep"]
    assert {s["N"] for s in rows} == {1024, 2048, 4096, 8192, 16384}
    assert {s["M"] for s in rows} >= {1024, 65536} and any(s["M"] % 16 for s in rows)  # an odd token count
    vocabs = {s["V"] for s in registry.OPS["cross_entropy"].shapes["sweep"]}
    assert vocabs == {32000, 128256, 152064, 256000}
    assert any(s["BT"] % 16 for s in registry.OPS["fused_linear_cross_entropy"].shapes["sweep"])


def test_rel_err_chunks_agree_with_the_direct_formula(monkeypatch):
    x, ref = torch.randn(1000, dtype=torch.float64), torch.randn(1000, dtype=torch.float64)
    direct = ((x - ref).norm() / ref.norm()).item()
    monkeypatch.setattr(correctness, "_ERR_CHUNK", 77)
    assert correctness.rel_err(x, ref) == pytest.approx(direct, rel=1e-12)
    x[3] = float("nan")
    assert correctness.rel_err(x, ref) == float("inf")


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
    spec = registry.OPS["swiglu"]
    runner = correctness.CaseRunner(spec, spec.shapes["cpu"][0], torch.float32, torch.device("cpu"))
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

    spec = registry.OPS["rms_norm"]
    runner = correctness.CaseRunner(spec, {"M": 1000, "N": 1536}, torch.bfloat16, torch.device("cuda"))
    runner.compute_reference()
    seen: list[bool] = []

    def in_place_rms_norm(x, w, *rest):
        seen.append(x.grad is None and w.grad is None)
        return ops.rms_norm(x, w, *rest, in_place=True)

    run = runner.run_checked(in_place_rms_norm)
    assert bench._written_names(runner, run) == ["grad_out0"]
    seen.clear()
    median, _, _ = timing._bench_restoring(run, "fwd+bwd", 1.0, 2.0, 40, est_ms=0.05)
    assert median > 0 and len(seen) > timing.RESTORE_BATCH and all(seen), seen


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
    assert list(tmp_path.glob("*.png")) == []  # nothing was timed: no plot rather than empty axes
    assert "no plots: a dry run times nothing" in r.stdout


def test_bench_dry_run_writes_nothing_into_the_working_directory(tmp_path, monkeypatch, capsys):
    """Without --out a dry run writes its CSV into a new temporary directory, never into
    benchmarks/results/ of the checkout it runs in, and draws no plot (nothing is timed)."""
    checkout, temp = tmp_path / "checkout", tmp_path / "tmp"
    (checkout / "benchmarks" / "results").mkdir(parents=True)
    temp.mkdir()
    monkeypatch.chdir(checkout)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    assert bench.main(["--dry-run", "--ops", "swiglu", "--providers", "torch", "--modes", "fwd"]) == 0
    out = capsys.readouterr().out
    assert [p for p in checkout.rglob("*") if p.is_file()] == []
    (run_dir,) = temp.iterdir()
    assert run_dir.name.startswith("liger-core-bench-dry-run-")
    assert sorted(p.name for p in run_dir.iterdir()) == ["ops_cpu-dryrun.csv", "ops_cpu-dryrun_meta.json"]
    assert f"wrote {run_dir / 'ops_cpu-dryrun.csv'} (1 rows)" in out
    assert "no plots: a dry run times nothing" in out


def test_plots_of_untimed_rows_write_no_file(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [{"op": "swiglu", "shape": "37x123", "provider": p, "mode": m, "ms": "", "floor_ms": 1e-4,
             "pct_of_floor": "", "peak_extra_gib": "", "check": "ok"}
            for p in ("torch", "liger_core") for m in report.MODES]  # fmt: skip
    assert plots.plot_results(rows, tmp_path, "dry") == []
    assert list(tmp_path.iterdir()) == []


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
        for m in report.MODES
    ]
    files = plots.plot_results(rows, tmp_path, "single")
    assert sorted(f.name for f in files) == ["single_floor.png", "single_memory.png", "single_time.png"]
    sweep = rows + [dict(r, shape="16x16") for r in rows]
    assert [f.name for f in plots.plot_results(sweep, tmp_path, "sweep")] == [
        "sweep_floor.png",
        "sweep_relative.png",
    ]
    wins = report.peer_wins(sweep)  # torch at 2 ms never beats liger_core at 1 ms
    assert wins == []
    assert report.peer_wins([dict(r, ms=0.5) if r["provider"] == "torch" else r for r in rows])

    # with GPU times (CUDA-graph replay): a fourth plot, and a peer slower on the wall clock but faster in GPU
    # time is listed as such (a host-bound liger_core row must not hide a slower kernel)
    timed = [dict(r, gpu_ms=r["ms"] / 2, gpu_pct_of_floor=20 / r["ms"]) for r in rows]
    files = plots.plot_results(timed, tmp_path, "graphs")
    assert "graphs_gpu_floor.png" in {f.name for f in files}
    timed_sweep = timed + [dict(r, shape="16x16") for r in timed]
    assert [f.name for f in plots.plot_results(timed_sweep, tmp_path, "gsweep")] == [
        "gsweep_floor.png",
        "gsweep_gpu_floor.png",
        "gsweep_relative.png",
        "gsweep_gpu_relative.png",
    ]
    assert report.peer_wins(timed) == []
    faster_kernel = [dict(r, gpu_ms=0.1) if r["provider"] == "torch" else r for r in timed]
    wins = report.peer_wins(faster_kernel)
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


# ------------------------------------------------------------------------------------------------------------
# liger-core demo (end to end on CPU: tests/patching/test_demo.py)
# ------------------------------------------------------------------------------------------------------------


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_demo_progress_on_a_pipe(monkeypatch):
    """Not a terminal: a line at the start, when the model is built, every `every` seconds, and at the end,
    each with the step, the loss, the time so far and the ETA from the mean step time."""
    import io

    from liger_core import demo

    clock, out = _Clock(), io.StringIO()
    monkeypatch.setattr(demo.time, "perf_counter", clock)
    bar = demo.Progress("[1/4] HF", stream=out, every=5.0)
    clock.now += 8
    bar.update(0, 10, None)
    for step in range(1, 11):
        clock.now += 2
        bar.update(step, 10, 5.0 - step / 10)
    bar.done()
    assert out.getvalue().splitlines() == [
        "  [1/4] HF: starting (Python imports, building the model)...",
        "  [1/4] HF: model built in 8 s, training 10 step(s)...",
        "  [1/4] HF: step 3/10, loss 4.7000, 14 s, ETA 14 s",
        "  [1/4] HF: step 6/10, loss 4.4000, 20 s, ETA 8 s",
        "  [1/4] HF: step 9/10, loss 4.1000, 26 s, ETA 2 s",
        "  [1/4] HF: step 10/10, loss 4.0000, 28 s",
    ]


def test_demo_progress_on_a_terminal_rewrites_one_line(monkeypatch):
    import io

    from liger_core import demo

    class Tty(io.StringIO):
        def isatty(self):
            return True

    clock, out = _Clock(), Tty()
    monkeypatch.setattr(demo.time, "perf_counter", clock)
    bar = demo.Progress("run", stream=out)
    bar.update(0, 2, None)
    clock.now += 1
    bar.update(1, 2, 3.0)
    clock.now += 1
    bar.update(2, 2, 2.0)
    bar.done()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("run: step 2/2, loss 2.0000, 2 s\n")
    assert text.count("\r\033[K") == 4  # starting, built, step 1, step 2: each rewrites the line
    assert "step 1/2, loss 3.0000, 1 s, ETA 1 s" in text


def _fake_popen(monkeypatch, script: str):
    """Make demo._spawn run ``script`` instead of a training worker (same pipes, same protocol)."""
    from liger_core import demo

    real = subprocess.Popen

    def popen(cmd, **kwargs):
        return real([sys.executable, "-c", script], **kwargs)

    monkeypatch.setattr(demo.subprocess, "Popen", popen)
    return demo


def _cfg():
    from liger_core import demo

    return demo.RunConfig(mode="hf", device="cpu", steps=2, warmup_steps=0, **demo.KERNEL_CHECK_MODEL)


def test_demo_spawn_streams_progress_and_returns_the_results(monkeypatch, capsys):
    """Two runs in one worker process: one progress line each, the results in order."""
    demo = _fake_popen(
        monkeypatch,
        "import json, sys\n"
        f"P, R = {demo_marks()!r}\n"
        "print('a warning the worker printed', file=sys.stderr)\n"
        "for run in (0, 1):\n"
        "    for s, l in ((0, None), (1, 2.5), (2, 2.25)):\n"
        "        print(P + json.dumps(dict(run=run, step=s, steps=2, loss=l)))\n"
        "    print(R + json.dumps(dict(run=run, losses=[2.5, 2.25 + run])))\n",
    )
    results = demo._spawn([_cfg(), _cfg()], interpret=False, timeout=60, labels=["[1/2] HF", "[2/2] ours"])
    assert results == [{"losses": [2.5, 2.25]}, {"losses": [2.5, 3.25]}]
    out = capsys.readouterr().out
    assert "[1/2] HF: starting (Python imports, building the model)" in out
    assert "[1/2] HF: step 2/2, loss 2.2500" in out
    assert "[2/2] ours: starting (building the model)" in out and "[2/2] ours: step 2/2" in out
    assert "a warning the worker printed" not in out  # the worker's own output is kept for a failure


def demo_marks():
    from liger_core import demo

    return demo._PROGRESS_MARK, demo._RESULT_MARK


def test_demo_spawn_failure_shows_the_workers_output(monkeypatch):
    demo = _fake_popen(monkeypatch, "import sys\nprint('Traceback: boom', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match=r"the hf run failed \(exit code 3\):\nTraceback: boom"):
        demo._spawn([_cfg()], interpret=False, timeout=60)


def test_demo_spawn_times_out(monkeypatch):
    demo = _fake_popen(monkeypatch, "import time\ntime.sleep(30)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        demo._spawn([_cfg()], interpret=False, timeout=0.5)


def _results(hf_tps=1000.0, lc_tps=2120.0):
    losses = [5.0, 4.0, 3.0]
    return {
        "hf": dict(losses=losses, tokens_per_s=hf_tps, peak_bytes=100 * 2**20),
        "liger_core": dict(losses=losses, tokens_per_s=lc_tps, peak_bytes=90 * 2**20),
    }


def test_demo_cpu_speed_table_is_no_speedup(capsys):
    """On CPU liger_core ran its PyTorch reference code: the numbers are printed as such, with no ratio."""
    import re

    from liger_core import demo

    r = _results()
    r["hf"]["memory_kind"] = "torch.cuda.max_memory_allocated"
    demo.print_speed_table(r["hf"], r["liger_core"], gpu=False, warmup=1)
    cpu = capsys.readouterr().out
    assert not re.search(r"x\d", cpu), cpu
    assert "liger_core reference code" in cpu and "not a kernel speedup" in cpu and "memory  " not in cpu
    demo.print_speed_table(r["hf"], r["liger_core"], gpu=True, warmup=3)
    gpu = capsys.readouterr().out
    assert "x2.12" in gpu and "x0.90" in gpu and "not a kernel speedup" not in gpu


def _plotted(monkeypatch, tmp_path, gpu: bool) -> tuple[list[str], str, dict]:
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    from liger_core import demo

    seen = {}

    def savefig(fig, path, **kwargs):
        seen.update(titles=[ax.get_title() for ax in fig.axes], suptitle=fig._suptitle.get_text(), kw=kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    assert demo._plot(_results(), tmp_path / "p.png", "demo", gpu) == f"plot: {tmp_path / 'p.png'}"
    return seen["titles"], seen["suptitle"], seen["kw"]


def test_demo_cpu_plot_shows_losses_not_speed(monkeypatch, tmp_path):
    titles, suptitle, kw = _plotted(monkeypatch, tmp_path, gpu=False)
    assert titles == ["loss curves", "liger_core loss - HF loss"]
    assert "no GPU: liger_core ran its PyTorch reference code" in suptitle
    assert kw.get("bbox_inches") == "tight"  # nothing clipped at the figure's edge
    titles, suptitle, _ = _plotted(monkeypatch, tmp_path, gpu=True)
    assert titles == ["loss curves", "tokens / s (higher is better)", "peak memory, GiB (lower is better)"]

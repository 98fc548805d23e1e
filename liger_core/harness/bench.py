"""Case registry, correctness check and GPU benchmark suite (``liger-core bench``, ``liger-core check``,
``benchmarks/bench_ops.py``): the logic lives here once, the scripts and the CLI only parse arguments.

For each op and shape it builds one set of realistic inputs, computes the float64 reference (forward and
every gradient), then for each provider (liger_core, torch eager = the HF/PyTorch code we replace,
torch.compile of that eager code, liger-kernel, cut-cross-entropy):

1. runs it once, forward and backward, on fresh copies of the inputs and compares every output with the
   float64 reference (relative error ``||out - ref|| / ||ref||``), beside eager's own error in the same dtype:
   ``ok`` when ``err <= 1.25 * eager_err + floor(dtype)`` (the rule of the unit tests), else ``WARN``;
   the run also tells whether the provider writes into its inputs (liger-kernel's CE writes the gradient
   into the logits, its SwiGLU writes da/db into a/b, its RMSNorm writes dx into dy, its RoPE rotates q/k
   in place);
2. times ``fwd`` (a training forward: inputs require grad, activations are saved) and ``fwd+bwd`` (forward
   then backward with a fixed gradient), median of many runs with the L2 cache flushed before each. Providers
   that leave their inputs untouched are timed by ``triton.testing.do_bench``; those that write into their
   inputs by the same loop (``_bench_restoring``) in batches of up to 8 runs, each run on its own copy of the
   written inputs, all restored from a pristine copy before the batch, outside the timed region, so every run
   sees real data (never a gradient of a gradient, never zeros) and the host runs ahead as in do_bench;
3. measures the peak extra memory of one run: ``max_memory_allocated`` minus what was allocated before
   (inputs and pristine copies excluded; outputs, saved activations and gradients included).

Each row also carries the floor: the fewest HBM bytes the op must move divided by 3.0 TB/s (H100), or for
the matmul losses the FLOPs divided by 800 TFLOP/s (measured bf16 GEMM rate), and ``pct_of_floor`` =
floor / time. The byte and FLOP counts are written next to each op below and in docs/performance.md.

A provider that fails (missing package, exception, OOM) gets a row with its error; the run goes on.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from liger_core.harness.correctness import CaseRunner, ProviderRun, free_memory
from liger_core.harness.floors import Floor
from liger_core.harness.interpreter import prepare_triton, quiet_interpreter
from liger_core.harness.peers import peer_version
from liger_core.harness.plots import plot_results
from liger_core.harness.providers import provider_fn
from liger_core.harness.registry import ALL_OPS, DEFAULT_OPS, OPS, OpSpec
from liger_core.harness.report import (
    MODES,
    PROVIDERS,
    CsvSink,
    as_number,
    peer_wins,
    print_table,
    read_csv,
)
from liger_core.harness.timing import (
    QUICK,
    Timing,
    make_step,
    peak_extra_bytes,
    short_error,
    time_graph,
    time_step,
)

GIB = 2**30


# ------------------------------------------------------------------------------------------------------------
# The suite
# ------------------------------------------------------------------------------------------------------------


def gpu_tag(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu-dryrun"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "_", name).strip("_")


def bench_case(
    spec: OpSpec,
    shape: dict,
    dtype: torch.dtype,
    device: torch.device,
    providers: Sequence[str],
    modes: Sequence[str],
    timing: Timing | None,
    sink: CsvSink,
    gpu: str,
    compile_backend: str,
    log: Callable[[str], None] = print,
) -> None:
    label = spec.label(shape)
    dname = str(dtype).replace("torch.", "")
    s = torch.empty((), dtype=dtype).element_size()
    floors = {m: spec.floor(shape, s, m) for m in modes}
    base = {"gpu": gpu, "op": spec.name, "shape": label, "dtype": dname}
    log(f"== {spec.title} {label} {dname}: floor " + ", ".join(f"{m} {floors[m].ms:.4g} ms" for m in modes))

    def emit(provider: str, mode: str, **fields) -> None:
        row = dict(
            base, mode=mode, provider=provider, floor_ms=floors[mode].ms, floor_basis=floors[mode].basis
        )
        row.update(fields)
        ms = row.get("ms")
        if ms:
            row["pct_of_floor"] = 100.0 * floors[mode].ms / ms
        gpu_ms = row.get("gpu_ms")
        if gpu_ms and not math.isnan(gpu_ms):
            row["gpu_pct_of_floor"] = 100.0 * floors[mode].ms / gpu_ms
        sink.add(row)

    try:
        runner = CaseRunner(spec, shape, dtype, device)
        runner.compute_reference()
    except Exception as e:  # noqa: BLE001 - a broken case must not stop the suite
        log(f"   inputs/reference failed: {short_error(e)}")
        for p in providers:
            for m in modes:
                emit(p, m, error=f"reference: {short_error(e)}", check="error")
        free_memory()
        return
    if runner.ref is not None:
        try:  # the accuracy budget: the reference (the code we replace) in this dtype
            runner.set_eager(runner.run_checked(runner.reference).errors)
        except Exception as e:  # noqa: BLE001
            log(f"   eager reference run failed ({short_error(e)}): outputs unchecked")
    free_memory()

    for provider in providers:
        fn, why = provider_fn(spec, provider, compile_backend)
        if fn is None:
            if why != "n/a":
                log(f"   {provider:<14} skipped: {why}")
                for m in modes:
                    emit(provider, m, error=why, check="skipped")
            continue
        try:
            run = runner.run_checked(fn)
        except Exception as e:  # noqa: BLE001
            err = short_error(e)
            log(f"   {provider:<14} failed its checked run: {err}")
            for m in modes:
                emit(provider, m, error=err, check="error")
            free_memory()
            continue
        err, eager_err, worst, ok = runner.verdict(run.errors)
        if runner.ref is None or runner.eager_errors is None:
            check = "unchecked (reference or eager run did not fit)"
        else:
            check = "ok" if ok else ("FAIL" if provider == "liger_core" else "WARN")
        fields = dict(
            rel_err=err,
            eager_rel_err=eager_err,
            ref_dtype=runner.ref_dtype,
            check=check,
            worst_output=worst,
            writes_inputs=";".join(_written_names(runner, run)),
        )
        not_capturable = ""  # after one mode fails to capture, the others are not tried (see _host_sync_in)
        for mode in modes:
            row = dict(fields)
            try:
                if timing is not None:
                    ms, p20, p80, timer = time_step(run, mode, timing)
                    row.update(ms=ms, ms_p20=p20, ms_p80=p80, timer=timer)
                    row["peak_extra_gib"] = peak_extra_bytes(run, mode) / GIB
                    if not_capturable:
                        row["gpu_ms"], row["gpu_timer"] = math.nan, not_capturable
                    else:
                        row["gpu_ms"], row["gpu_timer"] = time_graph(
                            run, mode, timing, check_host_sync=provider != "liger_core"
                        )
                        if row["gpu_timer"].startswith("not capturable"):
                            not_capturable = row["gpu_timer"]
                else:
                    make_step(run, mode)()  # dry run: exercise the timed code path once, untimed
                    row["timer"] = "none (dry run)"
            except Exception as e:  # noqa: BLE001
                row["error"] = short_error(e)
            emit(provider, mode, **row)
            log(_progress_line(provider, mode, row, floors[mode]))
        del run
        free_memory()
    del runner
    free_memory()


def _written_names(runner: CaseRunner, run: ProviderRun) -> list[str]:
    names = []
    for work, _ in run.restore_pairs:
        for i, a in enumerate(run.args):
            if a is work:
                names.append(f"arg{i}")
        for i, g in enumerate(run.grads):
            if g is work:
                names.append(f"grad_out{i}")
    return names


def _progress_line(provider: str, mode: str, row: dict, floor: Floor) -> str:
    parts = [f"   {provider:<14} {mode:<8}"]
    if row.get("ms") is not None:
        parts.append(
            f"{row['ms']:9.4f} ms  {row.get('peak_extra_gib', math.nan):7.3f} GiB  "
            f"{100 * floor.ms / row['ms']:5.1f}% of floor"
        )
    gpu_ms = as_number(row.get("gpu_ms"))
    if gpu_ms is not None:
        parts.append(f"GPU {gpu_ms:.4f} ms ({100 * floor.ms / gpu_ms:5.1f}%)")
    elif row.get("gpu_timer"):
        parts.append(f"GPU time {row['gpu_timer'][:60]}")
    if row.get("check"):
        parts.append(
            f"check {row['check']} (err {row.get('rel_err', math.nan):.2e} vs eager "
            f"{row.get('eager_rel_err', math.nan):.2e} on {row.get('worst_output', '')})"
        )
    if row.get("error"):
        parts.append(f"ERROR {row['error']}")
    return "  ".join(parts)


# ------------------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="liger-core bench",
        description="Benchmark liger_core's kernels beside torch eager, torch.compile, liger-kernel and "
        "cut-cross-entropy on this GPU: median ms (fwd, fwd+bwd), peak extra memory, % of the floor.",
    )
    p.add_argument(
        "--ops",
        nargs="+",
        default=list(DEFAULT_OPS),
        metavar="OP",
        help=f"ops to run, or 'all' (default: {' '.join(DEFAULT_OPS)}; all: {' '.join(ALL_OPS)})",
    )
    p.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=PROVIDERS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument(
        "--sweep",
        action="store_true",
        help="sweep shapes (hidden 1024..16384 x tokens 1k..64k incl. odd counts; vocab 32k..256k)",
    )
    p.add_argument(
        "--where",
        nargs="+",
        default=[],
        metavar="KEY=V[,V]",
        help="keep only the shapes whose KEY is one of the values, e.g. --sweep --where N=8192,16384 "
        "(norms/GLUs at those hidden sizes; shape keys: M, N for the row ops, B, T, Hq, Hk, D for rope, "
        "N/BT, V, H for the losses; a shape without the key is left out)",
    )
    p.add_argument("--quick", action="store_true", help="shorter timing (warmup 10 ms, rep 40 ms)")
    p.add_argument(
        "--out",
        default=None,
        help="directory for the CSV and PNG files (default: benchmarks/results; with --dry-run a new "
        "temporary directory, so a dry run writes nothing into the checkout)",
    )
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny shapes on CPU (Triton interpreter), every provider run once forward and backward "
        "and checked, nothing timed (so no plots): exercises this script without a GPU",
    )
    p.add_argument("--plot-from", metavar="CSV", help="only print the table and draw the plots of a CSV")
    # internal: a run whose CUDA context broke (a crashed kernel) continues in a fresh process with these
    p.add_argument("--append", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--resume-shape", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ops == ["all"]:
        args.ops = list(ALL_OPS)
    try:
        args.where = {k: set(v.split(",")) for k, v in (w.split("=", 1) for w in args.where)}
    except ValueError:
        p.error(f"--where takes KEY=V[,V] terms, got {args.where}")
    unknown = [o for o in args.ops if o not in OPS]
    if unknown:
        p.error(f"unknown op(s) {unknown}; choose from {list(ALL_OPS)} or 'all'")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    with quiet_interpreter():  # a dry run runs the kernels in Triton's interpreter: no numpy warnings noise
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = parse_args(argv)
    if args.out is None:
        args.out = (
            tempfile.mkdtemp(prefix="liger-core-bench-dry-run-") if args.dry_run else "benchmarks/results"
        )
    out_dir = Path(args.out)
    if args.plot_from:
        rows = read_csv(Path(args.plot_from))
        print_table(rows)
        _print_peer_wins(rows)
        if not args.no_plots:
            files = plot_results(rows, out_dir, Path(args.plot_from).stem)
            for f in files:
                print(f"wrote {f}")
            if not files:
                print(f"no plots: {args.plot_from} has no timings (a dry run's CSV)")
        return 0
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print(
            "liger-core bench: no CUDA GPU found (torch.cuda.is_available() is False); it needs one.\n"
            "To exercise the benchmark code on CPU without timing, use --dry-run.",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda") if cuda and not args.dry_run else torch.device("cpu")
    note = prepare_triton(cuda=device.type == "cuda")
    if note:
        print(f"note: {note}")
    dtype = getattr(torch, args.dtype)
    timing = None if device.type == "cpu" else (QUICK if args.quick else Timing())
    shapes_key = "cpu" if device.type == "cpu" else ("sweep" if args.sweep else "default")
    gpu = gpu_tag(device)
    prefix = f"{'sweep' if args.sweep else 'ops'}_{gpu}"
    csv_path = out_dir / f"{prefix}.csv"
    meta = environment_summary(device)
    meta.update(
        argv=list(sys.argv if argv is None else argv), shapes=shapes_key, started=time.strftime("%F %T")
    )
    print(json.dumps(meta))
    out_dir.mkdir(parents=True, exist_ok=True)
    sink = CsvSink(csv_path, append=args.append)
    compile_backend = "inductor" if device.type == "cuda" else "aot_eager"  # CPU dry run: no C++ codegen
    cases = [
        (name, i, shape)
        for name in args.ops
        for i, shape in enumerate(OPS[name].shapes[shapes_key])
        if not (name == args.ops[0] and i < args.resume_shape)
        and all(str(shape.get(k)) in values for k, values in args.where.items())
    ]
    if not cases:
        print(f"liger-core bench: no shape of {args.ops} matches --where {args.where}", file=sys.stderr)
        return 2
    t0 = time.time()
    child_rc = 0
    for k, (name, _, shape) in enumerate(cases):
        bench_case(
            OPS[name], shape, dtype, device, args.providers, args.modes, timing, sink, gpu, compile_backend
        )
        if k + 1 < len(cases) and process_broken(device):
            child_rc = continue_in_fresh_process(args, cases[k + 1 :])
            break
    if args.append:  # a continuation: the first process prints the table and draws the plots
        return child_rc
    meta["seconds"] = round(time.time() - t0, 1)
    (out_dir / f"{prefix}_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    rows = read_csv(csv_path)  # every row, also those a continuation process wrote
    print()
    print_table(rows)
    _print_peer_wins(rows)
    print(f"\nwrote {csv_path} ({len(rows)} rows) in {meta['seconds']} s")
    if timing is None:
        print("no plots: a dry run times nothing (the CSV has the correctness checks)")
    elif not args.no_plots:
        try:
            for f in plot_results(rows, out_dir, prefix):
                print(f"wrote {f}")
        except Exception as e:  # noqa: BLE001 - plots are a convenience; the CSV is the result
            print(f"plots failed: {short_error(e)}")
            traceback.print_exc()
    ours_bad = [
        f"{r['op']} {r['shape']} {r['mode']}: {r.get('error') or r.get('check')}"
        for r in rows
        if r["provider"] == "liger_core"
        and r.get("check") != "skipped"
        and (r.get("error") or r.get("check") == "FAIL")
    ]
    if ours_bad:  # the run is complete, but say loudly that our own kernels did not all run correctly
        print(f"\nliger_core failed in {len(ours_bad)} row(s):")
        for line in ours_bad:
            print(f"  {line}")
        return 1
    return child_rc


def process_broken(device: torch.device) -> bool:
    """True when this process can no longer use the GPU: a kernel crashed (illegal address, device-side
    assert) and CUDA's error is sticky, so every later case would fail too."""
    if device.type != "cuda":
        return False
    try:
        torch.ones(1, device=device).add_(1).item()
        torch.cuda.synchronize()
        return False
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return True


def continue_in_fresh_process(args: argparse.Namespace, rest: Sequence[tuple[str, int, dict]]) -> int:
    """Run the remaining cases in a new Python process that appends to the same CSV."""
    ops = list(dict.fromkeys(name for name, _, _ in rest))
    argv = ["--ops", *ops, "--resume-shape", str(rest[0][1]), "--append", "--no-plots"]
    argv += ["--providers", *args.providers, "--modes", *args.modes, "--dtype", args.dtype, "--out", args.out]
    if args.where:
        argv += ["--where", *(f"{k}={','.join(sorted(v))}" for k, v in args.where.items())]
    argv += [
        flag
        for flag, on in (("--sweep", args.sweep), ("--quick", args.quick), ("--dry-run", args.dry_run))
        if on
    ]
    print(
        f"\nthis process can no longer use the GPU (a kernel crashed): the remaining {len(rest)} case(s) "
        f"continue in a fresh process: liger-core bench {' '.join(argv)}\n",
        flush=True,
    )
    env = dict(os.environ)  # the package's own root first, in case it was found through sys.path only
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return subprocess.call([sys.executable, "-m", "liger_core.cli", "bench", *argv], env=env)


def _print_peer_wins(rows: Sequence[dict]) -> None:
    wins = peer_wins(rows)
    print(f"\nwhere a peer beats liger_core: {len(wins) or 'nowhere'}")
    for line in wins:
        print(f"  {line}")


def environment_summary(device: torch.device) -> dict:
    from liger_core.dispatch import triton_status

    info = {
        "torch": torch.__version__,
        "triton": _dist_version("triton"),
        "liger_kernel": peer_version("liger_kernel"),
        "cut_cross_entropy": peer_version("cce"),
        "triton_status": triton_status(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    return info


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())

"""Every op at the shapes real models give it: liger_core beside torch eager, torch.compile, liger-kernel and
cut-cross-entropy, per distinct shape of the model table ``benchmarks/configs/model_shapes.json``.

Each model's dimensions become one shape per op (tokens = batch x seq, by default 4 x 2047 = 8188, not a power
of two):

- rms_norm, layer_norm and the norm variants (fused_add_rms_norm, rms_norm_no_weight, poly_norm, dyt,
  modulated_rms_norm, group_norm with the hidden size as channels): tokens x hidden
- swiglu (models with silu MLPs), geglu (gelu MLPs): tokens x intermediate
- relu_squared: tokens x intermediate of every model (the MLP activation of relu^2 models)
- rope: batch x heads x seq x head_dim for q, batch x kv_heads x seq x head_dim for k
- cross_entropy, kl_div, jsd, tvd, softmax, sparsemax: tokens x vocab
- fused_linear_cross_entropy, fused_linear_scaled_cross_entropy: tokens x hidden -> vocab
- fused_linear_jsd: student tokens x hidden, teacher tokens x the largest hidden of the models sharing its
  vocabulary -> vocab

Models that give an op the same shape share one measurement (the CSV lists them). Shapes run in turns over
the ops, each op's most shared shapes first, so a run cut off by ``--max-minutes`` has covered every op's most
common shapes; ``--resume`` continues a run in the same files. A shape whose inputs and fp32 reference need
more than the device's memory is skipped (listed in the meta file).

Each case goes through the suite's ``bench_case`` (``liger_core.harness.bench``): checked against the float64
reference, then wall time (``do_bench``) and GPU time (CUDA-graph replay) with the short ``--timing``. Per
(op, shape, mode) ``model_shapes.csv`` has every provider's wall and GPU ms, liger_core's % of the floor, the
fastest provider by GPU time and by wall time (among the providers whose outputs passed the check) and
liger_core's ratio to it (1.0: liger_core is the fastest); ``model_shapes_rows.csv`` has the suite's full rows
(errors, memory, timers).

    python benchmarks/model_shapes.py                          # ~8 min -> benchmarks/results/<hw>/
    python benchmarks/model_shapes.py --ops rms_norm swiglu --max-minutes 3
    python benchmarks/model_shapes.py --resume                 # continue a cut-off run
    python benchmarks/model_shapes.py --list                   # the distinct shapes per op, nothing run
    python benchmarks/model_shapes.py --cpu-smoke              # CPU: 2 tiny shapes per op, untimed
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from liger_core.harness.interpreter import prepare_triton, quiet_interpreter  # noqa: E402

TABLE = ROOT / "benchmarks" / "configs" / "model_shapes.json"
# Short per-shape timing: the default run covers ~150 distinct shapes in a few GPU minutes. Medians of tens
# of runs of kernels of 0.02-40 ms; the full suite's Timing() is for published single-shape numbers.
FAST = dict(warmup_ms=5.0, rep_ms=25.0, min_reps=5, max_reps=200)
# Ops whose shape comes from the MLP, by the MLP's activation in the table.
_GLU_ACT = {"swiglu": "silu", "geglu": "gelu"}
# CPU smoke: two tiny model rows, derived through the same code as the real ones.
SMOKE_MODELS = (
    {"name": "tiny-a", "hidden": 40, "intermediate": 72, "heads": 4, "kv_heads": 2, "head_dim": 10,
     "vocab": 301, "act": "silu"},
    {"name": "tiny-b", "hidden": 24, "intermediate": 56, "heads": 3, "kv_heads": 1, "head_dim": 8,
     "vocab": 257, "act": "silu"},
    {"name": "tiny-c", "hidden": 40, "intermediate": 88, "heads": 2, "kv_heads": 2, "head_dim": 12,
     "vocab": 301, "act": "gelu"},
    {"name": "tiny-d", "hidden": 24, "intermediate": 40, "heads": 4, "kv_heads": 1, "head_dim": 8,
     "vocab": 257, "act": "gelu"},
)  # fmt: skip


# ------------------------------------------------------------------------------------------------------------
# Shapes
# ------------------------------------------------------------------------------------------------------------


def load_models(path: Path = TABLE) -> list[dict]:
    models = json.loads(path.read_text())["models"]
    need = ("name", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab", "act")
    for m in models:
        missing = [k for k in need if k not in m]
        if missing:
            raise ValueError(f"{path}: model {m.get('name', m)} lacks {missing}")
    return models


_NORMS = (
    "rms_norm", "layer_norm", "fused_add_rms_norm", "rms_norm_no_weight", "poly_norm", "dyt",
    "modulated_rms_norm", "group_norm",
)  # fmt: skip


def model_shapes(op: str, m: dict, batch: int, seq: int, models: Sequence[dict]) -> list[dict]:
    """The shapes ``op`` gets in model ``m``: none where the model has no such op (a GLU of the other
    activation), two GLU shapes where it has dense and expert MLPs (``moe_intermediate``)."""
    tokens = batch * seq
    if op in _NORMS:
        return [{"M": tokens, "N": m["hidden"]}]
    if op in _GLU_ACT:
        widths = [m["intermediate"]] + ([m["moe_intermediate"]] if "moe_intermediate" in m else [])
        return [{"M": tokens, "N": n} for n in widths] if m["act"] == _GLU_ACT[op] else []
    if op == "relu_squared":  # the MLP activation at the model's widths (as relu^2 models use it)
        widths = [m["intermediate"]] + ([m["moe_intermediate"]] if "moe_intermediate" in m else [])
        return [{"M": tokens, "N": n} for n in widths]
    if op == "rope":
        return [{"B": batch, "T": seq, "Hq": m["heads"], "Hk": m["kv_heads"], "D": m["head_dim"]}]
    if op in ("cross_entropy", "kl_div", "jsd", "tvd"):
        return [{"N": tokens, "V": m["vocab"]}]
    if op in ("softmax", "sparsemax"):  # over the vocabulary, as output layers
        return [{"M": tokens, "N": m["vocab"]}]
    if op in ("fused_linear_cross_entropy", "fused_linear_scaled_cross_entropy"):
        return [{"BT": tokens, "H": m["hidden"], "V": m["vocab"]}]
    if op == "fused_linear_jsd":
        teacher = max(o["hidden"] for o in models if o["vocab"] == m["vocab"])
        return [{"BT": tokens, "Hs": m["hidden"], "Ht": teacher, "V": m["vocab"]}]
    if op == "multi_token_attention":  # every head's score matrix, mixed over heads by a 5 x 5 convolution
        return [{"B": batch, "C": m["heads"], "L": seq, "K": 5}]
    if op == "fused_neighborhood_attention":
        return [{"B": batch, "H": m["heads"], "L": seq, "D": m["head_dim"], "K": 7}]
    raise ValueError(f"op {op!r} has no shape rule in model_shapes.py")


@dataclasses.dataclass
class ShapeCase:
    op: str
    shape: dict
    models: list[str]

    @property
    def key(self) -> tuple:
        return (self.op, tuple(sorted(self.shape.items())))


def distinct_shapes(op: str, models: Sequence[dict], batch: int, seq: int) -> list[ShapeCase]:
    """The op's distinct shapes over the models, the most shared first (then by size)."""
    by_key: dict[tuple, ShapeCase] = {}
    for m in models:
        for shape in model_shapes(op, m, batch, seq, models):
            case = ShapeCase(op, shape, [])
            by_key.setdefault(case.key, case).models.append(m["name"])
    return sorted(by_key.values(), key=lambda c: (-len(c.models), sorted(c.shape.items())))


def schedule(ops: Sequence[str], models: Sequence[dict], batch: int, seq: int) -> list[ShapeCase]:
    """Every op's distinct shapes in turns over the ops (one shape of each op, then the next of each)."""
    per_op = [distinct_shapes(op, models, batch, seq) for op in ops]
    out = []
    for i in range(max((len(s) for s in per_op), default=0)):
        out += [s[i] for s in per_op if i < len(s)]
    return out


def est_bytes(case: ShapeCase, dtype: torch.dtype) -> float:
    """Memory the case needs at least: the inputs and pristine copies in ``dtype`` and the reference in fp32
    (the suite's fallback when float64 does not fit)."""
    from liger_core.harness.registry import OPS

    elems = OPS[case.op].ref_elems(case.shape)
    return elems * (4 + 2 * torch.empty((), dtype=dtype).element_size())


# ------------------------------------------------------------------------------------------------------------
# Summary
# ------------------------------------------------------------------------------------------------------------


def _num(v) -> float | None:
    if v is None or v == "":
        return None
    v = float(v)
    return None if math.isnan(v) else v


def _passed(row: dict) -> bool:
    """A provider counts for 'fastest' when its outputs passed the check (or could not be checked)."""
    check = row.get("check") or ""
    return not row.get("error") and (check == "ok" or check.startswith("unchecked"))


def summarize(rows: Iterable[dict], providers: Sequence[str], models: Sequence[str] = ()) -> list[dict]:
    """One summary row per (op, shape, mode) from the suite's rows (dicts with op, shape, dtype, mode,
    provider, ms, gpu_ms, floor_ms, check, error): each provider's ms and GPU ms, liger_core's % of the floor,
    the fastest provider by GPU time and by wall time among those that passed the check, and liger_core's
    time over the fastest's."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault((r["op"], r["shape"], r.get("dtype", ""), r["mode"]), {})[r["provider"]] = r
    out = []
    for (op, shape, dtype, mode), by_p in groups.items():
        floor = next((_num(r.get("floor_ms")) for r in by_p.values() if _num(r.get("floor_ms"))), None)
        s = {"op": op, "shape": shape, "dtype": dtype, "mode": mode, "floor_ms": floor}
        s["models"] = ";".join(models)
        s["n_models"] = len(models)
        for p in providers:
            r = by_p.get(p, {})
            s[f"{p}_ms"], s[f"{p}_gpu_ms"] = _num(r.get("ms")), _num(r.get("gpu_ms"))
        ours = by_p.get("liger_core", {})
        s["liger_core_check"] = ours.get("check") or ours.get("error") or ""
        for col, field in (("gpu", "gpu_ms"), ("wall", "ms")):
            timed = {p: _num(r.get(field)) for p, r in by_p.items() if _passed(r)}
            timed = {p: t for p, t in timed.items() if t is not None}
            best = min(timed, key=timed.get) if timed else None
            s[f"fastest_{col}"] = best or ""
            s[f"fastest_{col}_ms"] = timed.get(best) if best else None
            ours_t = _num(ours.get(field))
            s[f"liger_core_{col}_pct_of_floor"] = 100 * floor / ours_t if floor and ours_t else None
            s[f"liger_core_{col}_vs_fastest"] = ours_t / timed[best] if best and ours_t else None
        out.append(s)
    return out


SUMMARY_HEAD = (
    "op", "shape", "dtype", "mode", "n_models", "models", "floor_ms", "liger_core_check",
    "fastest_gpu", "fastest_gpu_ms", "liger_core_gpu_vs_fastest", "liger_core_gpu_pct_of_floor",
    "fastest_wall", "fastest_wall_ms", "liger_core_wall_vs_fastest", "liger_core_wall_pct_of_floor",
)  # fmt: skip


def summary_columns(providers: Sequence[str]) -> list[str]:
    return list(SUMMARY_HEAD) + [f"{p}_{k}" for p in providers for k in ("gpu_ms", "ms")]


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return str(v)


def append_csv(path: Path, columns: Sequence[str], rows: Iterable[dict]) -> None:
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r.get(k)) for k in columns})


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def print_summary(rows: Sequence[dict], log=print) -> None:
    """One line per (op, shape, mode): liger_core's GPU and wall ms, the fastest provider of each and
    liger_core's time over it (1.00: liger_core is the fastest), liger_core's GPU % of the floor."""

    def cell(v, fmt: str, width: int) -> str:
        return format(v, fmt) if v is not None else "-".rjust(width)

    head = (
        f"{'op':<26} {'shape':<24} {'mode':<7} {'n':>2} | {'GPU ms':>8} {'fastest':<13} {'x':>5} "
        f"{'%floor':>6} | {'wall ms':>8} {'fastest':<13} {'x':>5} | check"
    )
    log(head)
    log("-" * len(head))
    for r in rows:
        log(
            f"{r['op']:<26} {r['shape']:<24} {r['mode']:<7} {r.get('n_models', ''):>2} | "
            f"{cell(_num(r.get('liger_core_gpu_ms')), '8.4f', 8)} {r.get('fastest_gpu') or '-':<13} "
            f"{cell(_num(r.get('liger_core_gpu_vs_fastest')), '5.2f', 5)} "
            f"{cell(_num(r.get('liger_core_gpu_pct_of_floor')), '6.1f', 6)} | "
            f"{cell(_num(r.get('liger_core_ms')), '8.4f', 8)} {r.get('fastest_wall') or '-':<13} "
            f"{cell(_num(r.get('liger_core_wall_vs_fastest')), '5.2f', 5)} | {r.get('liger_core_check', '')}"
        )
    slow = [r for r in rows if (_num(r.get("liger_core_gpu_vs_fastest")) or 0) > 1.1]
    log(f"\nshapes where liger_core's GPU time is > 1.1x the fastest: {len(slow)}")
    for r in sorted(slow, key=lambda r: -float(r["liger_core_gpu_vs_fastest"])):
        log(
            f"  {r['op']} {r['shape']} {r['mode']}: {float(r['liger_core_gpu_vs_fastest']):.2f}x "
            f"{r['fastest_gpu']} ({r['models']})"
        )


# ------------------------------------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------------------------------------


def hw_dir(device: torch.device) -> str:
    """benchmarks/results/<hw>: h100, h200, ... (the GPU's model number), else the suite's full tag."""
    from liger_core.harness.bench import gpu_tag

    tag = gpu_tag(device)
    first = tag.split("_")[0]
    return first if re.fullmatch(r"[a-z]+\d+[a-z]*", first) else tag


def git_commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        return sha + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_sweep(args: argparse.Namespace, device: torch.device, out_dir: Path) -> int:
    from liger_core.harness.bench import bench_case, environment_summary, gpu_tag, process_broken
    from liger_core.harness.correctness import free_memory
    from liger_core.harness.registry import OPS
    from liger_core.harness.report import CsvSink
    from liger_core.harness.timing import Timing

    dtype = getattr(torch, args.dtype)
    timing = None if device.type == "cpu" else _timing(args.timing, Timing)
    summary_path, rows_path = out_dir / "model_shapes.csv", out_dir / "model_shapes_rows.csv"
    meta_path = out_dir / "model_shapes.meta.json"
    if not args.resume:
        for p in (summary_path, rows_path):
            p.unlink(missing_ok=True)
    done = {(r["op"], r["shape"]) for r in read_rows(summary_path)}
    cases = schedule(args.ops, args.models, args.batch, args.seq)
    if device.type == "cpu":  # the smoke: the first two shapes of each op
        cases = [c for c in cases if sum(d.op == c.op for d in cases[: cases.index(c)]) < 2]
    total_mem = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else math.inf
    compile_backend = "inductor" if device.type == "cuda" else "aot_eager"  # CPU: no C++ codegen
    sink = CsvSink(rows_path, append=True)
    gpu = gpu_tag(device)
    cols = summary_columns(args.providers)
    ran, skipped_mem, left = [], [], []
    t0 = time.time()
    for i, case in enumerate(cases):
        spec = OPS[case.op]
        label = spec.label(case.shape)
        if (case.op, label) in done:
            continue
        if time.time() - t0 > 60 * args.max_minutes:
            labels = ((c.op, OPS[c.op].label(c.shape)) for c in cases[i:])
            left = [f"{op} {lbl}" for op, lbl in labels if (op, lbl) not in done]  # not earlier runs'
            break
        if est_bytes(case, dtype) > 0.9 * total_mem:
            skipped_mem.append(f"{case.op} {label} ({est_bytes(case, dtype) / 2**30:.0f} GiB)")
            print(f"== {spec.title} {label}: skipped, needs ~{est_bytes(case, dtype) / 2**30:.0f} GiB")
            continue
        first = len(sink.rows)
        print(f"[{time.time() - t0:6.0f} s] {case.op} {label}: {', '.join(case.models)}")
        bench_case(
            spec, case.shape, dtype, device, args.providers, args.modes, timing, sink, gpu, compile_backend
        )
        free_memory()
        summary = summarize(sink.rows[first:], args.providers, case.models)
        append_csv(summary_path, cols, summary)
        ran.append(f"{case.op} {label}")
        if process_broken(device):  # a crashed kernel: CUDA's error is sticky, every later case would fail
            left = [f"{c.op} {OPS[c.op].label(c.shape)}" for c in cases[i + 1 :]]
            print(f"\nthe GPU is unusable in this process after {case.op} {label}: continue with --resume")
            break
    seconds = round(time.time() - t0, 1)
    meta = {
        "hardware": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)",
        "benchmark": "every op at the distinct shapes of real models (benchmarks/configs/model_shapes.json)",
        "date": time.strftime("%F %T %Z"),
        "versions": environment_summary(device),
        "command": "python benchmarks/model_shapes.py " + " ".join(args.argv),
        "commit": git_commit(),
        "tokens": f"{args.batch} x {args.seq} = {args.batch * args.seq}",
        "dtype": args.dtype,
        "timing": None if timing is None else dataclasses.asdict(timing),
        "seconds": seconds,
        "shapes_run": len(ran),
        "shapes_skipped_memory": skipped_mem,
        "shapes_left_by_time_limit": left,
        "files": [summary_path.name, rows_path.name, meta_path.name],
    }
    if args.resume and meta_path.exists():
        meta["earlier_runs"] = json.loads(meta_path.read_text()).get("earlier_runs", []) + [
            {k: v for k, v in json.loads(meta_path.read_text()).items() if k != "earlier_runs"}
        ]
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    print()
    print_summary(read_rows(summary_path))
    print(f"\n{len(ran)} shape(s) in {seconds} s -> {summary_path}, {rows_path}, {meta_path.name}")
    if skipped_mem:
        print(f"skipped (memory): {', '.join(skipped_mem)}")
    if left:
        print(f"{len(left)} shape(s) left by --max-minutes {args.max_minutes}: continue with --resume")
    bad = [r for r in read_rows(summary_path) if r["liger_core_check"] not in ("ok", "")
           and not r["liger_core_check"].startswith("unchecked")]  # fmt: skip
    if bad:
        print(f"\nliger_core did not pass in {len(bad)} row(s):")
        for r in bad:
            print(f"  {r['op']} {r['shape']} {r['mode']}: {r['liger_core_check']}")
        return 1
    return 0


def _timing(name: str, timing_cls):
    from liger_core.harness.timing import QUICK

    return {"fast": timing_cls(**FAST), "quick": QUICK, "full": timing_cls()}[name]


# ------------------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from liger_core.harness.registry import ALL_OPS, DEFAULT_OPS
    from liger_core.harness.report import MODES, PROVIDERS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    more = " ".join(o for o in ALL_OPS if o not in DEFAULT_OPS)
    p.add_argument(
        "--ops",
        nargs="+",
        default=list(DEFAULT_OPS),
        help=f"default: {' '.join(DEFAULT_OPS)}; 'all': also {more}",
    )
    p.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=PROVIDERS)
    p.add_argument("--modes", nargs="+", default=["fwd+bwd"], choices=MODES)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2047, help="tokens = batch x seq (default 8188)")
    p.add_argument("--models", nargs="+", default=None, metavar="NAME", help="only these rows of the table")
    p.add_argument("--table", type=Path, default=TABLE)
    p.add_argument(
        "--max-minutes",
        type=float,
        default=7.0,
        help="start no new shape after this many minutes (default 7: with start-up and the last shape, ~8)",
    )
    p.add_argument(
        "--timing",
        default="fast",
        choices=("fast", "quick", "full"),
        help=f"fast: {FAST}; quick: bench_ops.py --quick; full: its default",
    )
    p.add_argument(
        "--resume", action="store_true", help="append, skipping the (op, shape)s already in the CSV"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="default benchmarks/results/<hw> (smoke: a temp dir)"
    )
    p.add_argument("--list", action="store_true", help="print the distinct shapes per op and exit")
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="CPU, Triton interpreter: 2 tiny shapes per op from tiny model rows, checked, untimed",
    )
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.ops == ["all"]:
        args.ops = list(ALL_OPS)
    unknown = [o for o in args.ops if o not in ALL_OPS]
    if unknown:
        p.error(f"unknown op(s) {unknown}; choose from {list(ALL_OPS)}")
    if args.cpu_smoke:
        args.models, args.batch, args.seq = list(SMOKE_MODELS), 2, 7
    else:
        table = load_models(args.table)
        if args.models:
            names = {m["name"] for m in table}
            missing = sorted(set(args.models) - names)
            if missing:
                p.error(f"--models: not in {args.table.name}: {missing}")
            table = [m for m in table if m["name"] in args.models]
        args.models = table
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        from liger_core.harness.registry import OPS

        for op in args.ops:
            shapes = distinct_shapes(op, args.models, args.batch, args.seq)
            print(f"{op}: {len(shapes)} distinct")
            for c in shapes:
                print(f"  {OPS[op].label(c.shape):<28} {', '.join(c.models)}")
        return 0
    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu_smoke:
        print("model_shapes.py needs a CUDA GPU; on CPU use --cpu-smoke (or --list)", file=sys.stderr)
        return 2
    device = torch.device("cpu") if args.cpu_smoke else torch.device("cuda")
    note = prepare_triton(cuda=device.type == "cuda")
    if note:
        print(f"note: {note}")
    out_dir = args.out
    if out_dir is None:
        out_dir = (
            Path(tempfile.mkdtemp(prefix="model-shapes-smoke-"))
            if args.cpu_smoke
            else ROOT / "benchmarks" / "results" / hw_dir(device)
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet_interpreter():
        return run_sweep(args, device, out_dir)


if __name__ == "__main__":
    sys.exit(main())

"""Where one training step of e2e_models.py's VLM or MoE spends its time: hf vs liger-kernel vs liger_core.

For each mode (its own process, as in e2e_models.py, whose model, batch and patch builders this reuses):
warm-up steps, then ``--timed`` unprofiled steps (wall time per step and the host's issue time: when the
step's Python returns, before the final synchronisation), then one step under ``torch.profiler``
(CPU + CUDA activities). From the profiler's trace it prints:

  * the step's wall time, the GPU's busy time (union of kernel / memcpy / memset intervals) and idle time,
    the host time spent waiting in synchronising CUDA calls (stream/device/event synchronize, blocking
    copies) and the host time that is left (Python + dispatch + launches), the number of launches;
  * GPU busy time and kernel count per phase: forward (split into the vision tower and the rest: text
    layers and loss), backward (split at the moment the gradient reaches the vision tower's output: text
    layers + loss before, vision tower after), optimizer; and the GPU idle time inside each phase;
  * GPU time per kernel category (GEMM, attention, Triton kernels by what they compute, PyTorch
    elementwise/reduce/copy/cat/index, optimizer), side by side for all modes;
  * the top kernels by total GPU time (grouped by name: count, total ms), and the top CPU ops by self time.

Usage (GPU machine, repo root; liger-kernel importable for its mode):
    python benchmarks/profile_e2e.py [--model vlm|moe] [--modes hf liger_kernel liger_core]
        [--vlm-layers 8] [--moe-layers N] [--warmup 2] [--timed 2] [--top 25] [--trace-dir DIR]
``--trace-dir`` keeps each mode's Chrome trace (gzipped) for a closer look in Perfetto.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as bc  # noqa: E402  (worker processes, environment)
import e2e_models as em  # noqa: E402  (model, batch and patch builders)

MARK = "PROFILE_RESULT "
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")

# (category, pattern) in order; a kernel takes the first category whose pattern its name matches
CATEGORIES = [
    ("attention", r"flash|fmha|attention|sdpa|_attn_"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|cublas|wgmma|sm90_|sm80_|splitK|gemv"),
    ("optimizer", r"multi_tensor|adam|foreach"),
    ("triton:cross_entropy", r"cross_entropy|_ce_|logsumexp|_lse|flce|logits"),
    ("triton:rms/layer_norm", r"^(?!.*at::native).*(rms|norm)"),
    ("triton:glu", r"^(?!.*at::native).*(swiglu|geglu|glu|silu)"),
    ("triton:rope", r"^(?!.*at::native).*(rope|rotary)"),
    ("torch:cat", r"CatArray|cat_"),
    ("torch:copy", r"copy|direct_copy|transpose|permute|contiguous"),
    ("torch:index/scatter", r"index|gather|scatter|embedding|sort|radix|unique|nonzero"),
    ("torch:reduce", r"reduce|Reduce|norm_kernel|sum_|mean"),
    ("torch:elementwise", r"elementwise|unrolled|Functor|functor|fill"),
    ("memcpy/memset", r"^Memcpy|^Memset|^\[memcpy\]|^\[memset\]"),
]


def _category(name: str) -> str:
    for cat, pattern in CATEGORIES:
        if re.search(pattern, name):
            return cat
    return "triton:other" if "at::native" not in name and "void " not in name else "other"


def _short(name: str, width: int = 110) -> str:
    s = name.replace("void ", "").replace("at::native::", "").replace("(anonymous namespace)::", "")
    s = s.replace("c10::", "").replace("std::", "")
    return s if len(s) <= width else s[: width - 3] + "..."


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _analyse(trace: dict, step_cpu: dict) -> dict:
    """Summaries of one profiled step from its Chrome trace (times in microseconds)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    ann = {}
    marks = []
    for e in events:
        if e.get("cat") in ("user_annotation", "gpu_user_annotation") and e["name"].startswith("phase:"):
            if e.get("cat") == "user_annotation":
                ann.setdefault(e["name"], []).append((e["ts"], e["ts"] + e["dur"]))
        if e.get("cat") == "user_annotation" and e["name"] == "mark:vision_backward":
            marks.append(e["ts"])
    step = ann["phase:step"][0]
    launches = {}
    sync_us = 0.0
    n_launch = 0
    runtime_us = 0.0
    for e in events:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver"):
            continue
        if not (step[0] <= e["ts"] <= step[1]):
            continue
        runtime_us += e["dur"]
        corr = (e.get("args") or {}).get("correlation")
        if corr is not None:
            launches[corr] = e["ts"]
        if e["name"].startswith(SYNC_CALLS):
            sync_us += e["dur"]
        if e["name"].startswith(LAUNCH_CALLS):
            n_launch += 1
    vision_bwd = min(marks) if marks else None

    def phase_of(ts: float | None) -> str:
        if ts is None:
            return "unattributed"
        for name in ("phase:vision_forward",):
            if any(a <= ts <= b for a, b in ann.get(name, [])):
                return "forward: vision tower"
        if any(a <= ts <= b for a, b in ann.get("phase:forward", [])):
            return "forward: text + loss"
        if any(a <= ts <= b for a, b in ann.get("phase:backward", [])):
            if vision_bwd is not None and ts >= vision_bwd:
                return "backward: vision tower"
            return "backward: text + loss" if vision_bwd is not None else "backward"
        if any(a <= ts <= b for a, b in ann.get("phase:optimizer", [])):
            return "optimizer"
        return "other (sync/loss.item)"

    kernels = {}
    cats = {}
    phases = {}
    intervals = []
    phase_intervals = {}
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        corr = (e.get("args") or {}).get("correlation")
        launch_ts = launches.get(corr)
        if launch_ts is None and not (step[0] <= e["ts"] <= step[1] + 5e6):
            continue
        name = e["name"] if e["cat"] == "kernel" else f"[{e['cat'][4:]}] {e['name']}"
        k = kernels.setdefault(name, [0, 0.0])
        k[0] += 1
        k[1] += e["dur"]
        cat = _category(name)
        c = cats.setdefault(cat, [0, 0.0])
        c[0] += 1
        c[1] += e["dur"]
        ph = phase_of(launch_ts)
        p = phases.setdefault(ph, [0, 0.0])
        p[0] += 1
        p[1] += e["dur"]
        intervals.append((e["ts"], e["ts"] + e["dur"]))
        phase_intervals.setdefault(ph, []).append((e["ts"], e["ts"] + e["dur"]))
    # phase windows on the GPU: first kernel start to last kernel end; idle = window - busy union
    phase_rows = {}
    for ph, (n, busy_sum) in phases.items():
        iv = phase_intervals[ph]
        window = max(b for _, b in iv) - min(a for a, _ in iv)
        phase_rows[ph] = dict(
            kernels=n, gpu_ms=busy_sum / 1e3, window_ms=window / 1e3, idle_ms=(window - _union(iv)) / 1e3
        )
    wall = step[1] - step[0]
    busy = _union(intervals)
    gaps = []
    srt = sorted(intervals)
    end = srt[0][1] if srt else 0
    for a, b in srt[1:]:
        if a > end:
            gaps.append(a - end)
        end = max(end, b)
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])
    return dict(
        wall_ms=wall / 1e3,
        gpu_busy_ms=busy / 1e3,
        gpu_kernel_sum_ms=sum(v[1] for v in kernels.values()) / 1e3,
        gpu_idle_ms=(wall - busy) / 1e3,
        gaps_over_20us=dict(n=sum(g > 20 for g in gaps), ms=sum(g for g in gaps if g > 20) / 1e3),
        host_sync_wait_ms=sync_us / 1e3,
        host_other_ms=(wall - sync_us) / 1e3,
        cuda_api_ms=runtime_us / 1e3,
        launches=n_launch,
        kernels_total=sum(v[0] for v in kernels.values()),
        phases=phase_rows,
        categories={k: dict(count=v[0], ms=v[1] / 1e3) for k, v in cats.items()},
        top_kernels=[dict(name=n, count=v[0], ms=v[1] / 1e3, category=_category(n)) for n, v in top[:60]],
        cpu_ops=step_cpu,
        vision_backward_marked=bool(marks),
    )


def worker(model_name: str, mode: str, opts: dict) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    device = torch.device(opts["device"])
    cuda = device.type == "cuda"
    result = dict(model=model_name, mode=mode, status="ok")
    built = em.setup(model_name, mode, opts, result)
    if built is None:
        return result
    model, optimizer, batches, report = built
    if report is not None:
        result["report"] = str(report)

    def sync():
        bc.sync(device)

    # phase annotations: the vision tower's forward (pre/post hooks) and the moment its output's gradient
    # arrives in backward (everything launched after it is the vision tower's backward)
    visual = getattr(getattr(model, "model", model), "visual", None)
    state = dict(profiling=False, rf=None)
    if visual is not None:

        def pre(_m, _args, _kwargs=None):
            if state["profiling"]:
                state["rf"] = record_function("phase:vision_forward")
                state["rf"].__enter__()

        def post(_m, _args, output, *_rest):
            if state["rf"] is not None:
                state["rf"].__exit__(None, None, None)
                state["rf"] = None
            if not state["profiling"]:
                return
            t = getattr(output, "pooler_output", None)
            if t is None:
                t = (
                    output
                    if torch.is_tensor(output)
                    else next(
                        (
                            x
                            for x in (output.values() if hasattr(output, "values") else output)
                            if torch.is_tensor(x)
                        ),
                        None,
                    )
                )
            if t is not None and t.requires_grad:

                def mark(g):
                    with record_function("mark:vision_backward"):
                        pass
                    return g

                t.register_hook(mark)

        visual.register_forward_pre_hook(pre)
        visual.register_forward_hook(post)

    def step(b):
        with record_function("phase:forward"):
            loss = model(**b).loss
        with record_function("phase:backward"):
            loss.backward()
        with record_function("phase:optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss

    for i in range(opts["warmup"]):
        step(batches[i % 2])
    sync()
    walls, issues = [], []
    for i in range(opts["timed"]):
        t0 = time.perf_counter()
        step(batches[i % 2])
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        walls.append(t2 - t0)
        issues.append(t1 - t0)
    result["unprofiled"] = dict(
        step_ms=[w * 1e3 for w in walls],
        host_issue_ms=[w * 1e3 for w in issues],
        tokens_per_s=opts["batch"] * opts["seq"] * len(walls) / sum(walls),
    )
    state["profiling"] = True
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        with record_function("phase:step"):
            loss = step(batches[0])
            sync()
    state["profiling"] = False
    result["loss"] = loss.item()
    cpu = []
    for evt in prof.key_averages():
        if str(getattr(evt, "device_type", "")).endswith("CPU") and not evt.key.startswith(
            ("phase:", "mark:")
        ):
            cpu.append(dict(name=evt.key, count=evt.count, self_ms=evt.self_cpu_time_total / 1e3))
    cpu.sort(key=lambda r: -r["self_ms"])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
        if opts.get("trace_dir"):
            os.makedirs(opts["trace_dir"], exist_ok=True)
            with (
                open(path, "rb") as f,
                gzip.open(os.path.join(opts["trace_dir"], f"{model_name}_{mode}.json.gz"), "wb") as g,
            ):
                g.write(f.read())
    result["profile"] = _analyse(trace, cpu[:40])
    result["peak_alloc_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    return result


def _print(results: list[dict], top: int) -> None:
    ok = [r for r in results if r.get("status") == "ok"]
    for r in results:
        if r.get("status") != "ok":
            print(f"\n## {r['mode']}: {r['status']}: {r.get('error', '')[:1500]}")
    if not ok:
        return
    modes = [r["mode"] for r in ok]
    w = 14
    print("\n## step summary (ms; profiled step unless noted)")
    print(f"  {'':44}" + "".join(f"{m:>{w}}" for m in modes))

    def mean(xs):
        return sum(xs) / len(xs)

    rows = [
        ("unprofiled step wall (mean)", lambda r: mean(r["unprofiled"]["step_ms"])),
        ("unprofiled host issue time (mean)", lambda r: mean(r["unprofiled"]["host_issue_ms"])),
        ("unprofiled tokens/s", lambda r: r["unprofiled"]["tokens_per_s"]),
        ("profiled step wall", lambda r: r["profile"]["wall_ms"]),
        ("GPU busy (union of kernels)", lambda r: r["profile"]["gpu_busy_ms"]),
        ("GPU kernel time sum", lambda r: r["profile"]["gpu_kernel_sum_ms"]),
        ("GPU idle in step", lambda r: r["profile"]["gpu_idle_ms"]),
        ("  idle gaps > 20 us: total", lambda r: r["profile"]["gaps_over_20us"]["ms"]),
        ("  idle gaps > 20 us: count", lambda r: r["profile"]["gaps_over_20us"]["n"]),
        ("host waiting in sync CUDA calls", lambda r: r["profile"]["host_sync_wait_ms"]),
        ("host other (Python+dispatch+launch)", lambda r: r["profile"]["host_other_ms"]),
        ("CUDA API time (all calls)", lambda r: r["profile"]["cuda_api_ms"]),
        ("kernel launches", lambda r: r["profile"]["launches"]),
        ("GPU kernels/copies", lambda r: r["profile"]["kernels_total"]),
        ("vision backward split found (1 = yes)", lambda r: int(r["profile"]["vision_backward_marked"])),
        ("peak alloc GiB", lambda r: r["peak_alloc_gib"]),
        ("loss (profiled step)", lambda r: r["loss"]),
    ]
    for label, fn in rows:
        cells = []
        for r in ok:
            v = fn(r)
            cells.append(f"{v:>{w},.0f}" if isinstance(v, int) or abs(v) >= 1000 else f"{v:>{w}.2f}")
        print(f"  {label:44}" + "".join(cells))

    print("\n## GPU time by phase (ms busy / kernels / idle ms inside the phase's GPU window)")
    phases = []
    for r in ok:
        for p in r["profile"]["phases"]:
            if p not in phases:
                phases.append(p)
    print(f"  {'':30}" + "".join(f"{m:>26}" for m in modes))
    for p in phases:
        cells = []
        for r in ok:
            d = r["profile"]["phases"].get(p)
            cells.append(
                f"{d['gpu_ms']:>9.1f} /{d['kernels']:>6} /{d['idle_ms']:>7.1f}" if d else f"{'-':>26}"
            )
        print(f"  {p:30}" + "".join(cells))

    print("\n## GPU time by kernel category (ms, count)")
    cats = sorted(
        {c for r in ok for c in r["profile"]["categories"]},
        key=lambda c: -max(r["profile"]["categories"].get(c, {"ms": 0})["ms"] for r in ok),
    )
    print(f"  {'':24}" + "".join(f"{m:>22}" for m in modes))
    for c in cats:
        cells = []
        for r in ok:
            d = r["profile"]["categories"].get(c)
            cells.append(f"{d['ms']:>12.1f} ({d['count']:>6})" if d else f"{'-':>22}")
        print(f"  {c:24}" + "".join(cells))

    for r in ok:
        print(
            f"\n## {r['mode']}: top {top} kernels by total GPU time"
            + (f"  [{r['report']}]" if r.get("report") else "")
        )
        print(f"  {'ms':>9} {'count':>6}  {'category':22} name")
        for k in r["profile"]["top_kernels"][:top]:
            print(f"  {k['ms']:>9.2f} {k['count']:>6}  {k['category']:22} {_short(k['name'])}")
        print(f"  {r['mode']}: top 15 CPU ops by self time (profiled step; includes profiler overhead)")
        for c in r["profile"]["cpu_ops"][:15]:
            print(f"  {c['self_ms']:>9.2f} {c['count']:>6}  {_short(c['name'], 90)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=em.MODELS, default="vlm")
    parser.add_argument("--modes", nargs="+", choices=em.MODES, default=list(em.MODES))
    parser.add_argument(
        "--vlm-layers", type=int, default=8, help="VLM text layers (default 8; vision tower kept)"
    )
    parser.add_argument("--moe-layers", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timed", type=int, default=2, help="unprofiled timed steps before the profiled one")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--no-grad-ckpt", action="store_true")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per mode")
    parser.add_argument("--trace-dir", default=None)
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test of this script (tiny shapes)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--opts", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        model_name, mode = args.worker.split(":")
        try:
            result = worker(model_name, mode, json.loads(args.opts))
        except Exception as e:  # noqa: BLE001 - report, do not hang the parent
            import traceback

            traceback.print_exc()
            result = dict(
                model=model_name, mode=mode, status="failed", error=f"{type(e).__name__}: {e}"[:2000]
            )
        print(MARK + json.dumps(result), flush=True)
        return 0

    import torch

    if not torch.cuda.is_available() and not args.tiny:
        print("profile_e2e: needs a CUDA device (--tiny: CPU smoke test)", file=sys.stderr)
        return 2
    if args.tiny:
        shape = dict(em.VLM_TINY if args.model == "vlm" else em.MOE_TINY)
        batch, seq, image = em.BATCH_TINY[args.model]
    else:
        shape = dict(em.QWEN2_5_VL_3B if args.model == "vlm" else em.QWEN3_30B_A3B)
        layers = args.vlm_layers if args.model == "vlm" else args.moe_layers
        if layers:
            shape["num_hidden_layers"] = layers
        batch, seq, image = em.BATCH[args.model]
    opts = dict(
        device="cpu" if args.tiny else "cuda",
        dtype="float32" if args.tiny else "bfloat16",
        shape=shape,
        batch=batch,
        seq=seq,
        image=image,
        warmup=args.warmup,
        timed=args.timed,
        grad_ckpt=not args.no_grad_ckpt,
        trace_dir=args.trace_dir,
    )
    env = bc.environment()
    print(
        f"profile_e2e: model {args.model}, {shape['num_hidden_layers']} text layers, batch {batch} x {seq}"
        f"{f', one {image}px image each' if image else ''}, grad ckpt {opts['grad_ckpt']}, warm-up "
        f"{args.warmup}, {args.timed} timed + 1 profiled step\n  {env}",
        flush=True,
    )
    results = []
    for mode in args.modes:
        result, proc, wall = bc.spawn_worker(__file__, f"{args.model}:{mode}", opts, MARK, args.timeout)
        if proc is None:
            results.append(dict(mode=mode, status="timeout", error=f"no result within {args.timeout:.0f} s"))
            continue
        if result is None:
            tail = bc.output_tail(proc)
            result = dict(mode=mode, status="failed", error=f"exit {proc.returncode}: {tail}")
        results.append(result)
        print(f"  {mode}: {results[-1]['status']} in {wall:.0f} s", flush=True)
    _print(results, args.top)
    return 0 if all(r.get("status") in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

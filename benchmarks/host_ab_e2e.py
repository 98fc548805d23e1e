"""Unprofiled A/B of e2e_models.py's VLM training step: is liger_core's process slower on the host?

The profile of the Qwen2.5-VL-3B-shaped step (profile_e2e.py, ~3,600 windowed vision attention calls per
step: host-bound) showed liger_core's step slower than hf's and liger-kernel's although it does the least
GPU work, with every host-side op slower in its process. Each mode here runs in its own process, one after
the other, in the order given (a mode may repeat, to see whether the position in the sequence matters):

  hf              the model as transformers builds it
  control         ``import liger_core`` and its patching, ops and modules packages; nothing patched
  liger_core      ``liger_core.apply_liger_kernel(model)``
  liger_core_text as liger_core, then the vision tower's modules get their class forwards back (their
                  ``__dict__`` forward overrides are dropped): only the text layers and the loss are patched
  liger_kernel    liger-kernel's ``apply_liger_kernel_to_qwen2_5_vl()`` before the model is built

Per mode: step wall time (mean, min, max of ``--timed`` steps after ``--warmup``), tokens/s, the host's
issue time, Python's garbage-collector pauses inside the timed steps (count per generation and total ms,
from ``gc.callbacks``), then host microbenchmarks in the same process after training: ``torch.empty`` on the
GPU, a one-element ``add_`` launch, and one vision-window SDPA call (1 x 16 heads x 64 tokens x 80, bf16:
the GPU finishes each far faster than the host issues it), each as the mean host time per call over a loop.
Also the process's thread count and the CPU affinity, and the TORCH_/CUDA_/TRITON_/PYTORCH_ environment.

Usage (GPU machine, repo root):
    python benchmarks/host_ab_e2e.py [--modes liger_core hf control liger_core_text liger_core]
        [--vlm-layers 8] [--warmup 3] [--timed 8] [--deadline 330]
Modes that would start after ``--deadline`` seconds are skipped (and listed).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as bc  # noqa: E402  (worker processes, environment)
import e2e_models as em  # noqa: E402  (model, batch and patch builders)

MARK = "HOST_AB_RESULT "
MODES = ("hf", "control", "liger_core", "liger_core_text", "liger_kernel")


def _host_loop(fn, n: int, sync) -> float:
    """Mean host microseconds per call of ``fn`` over ``n`` calls (best of three loops)."""
    best = float("inf")
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
        sync()
    return best * 1e6


def _unpatch_vision(model) -> int:
    """Drop the instance forward overrides under the vision tower; returns how many were dropped."""
    visual = model.model.visual
    dropped = 0
    for module in visual.modules():
        if "forward" in module.__dict__ and any(k.startswith("_liger_core") for k in module.__dict__):
            del module.__dict__["forward"]
            dropped += 1
    return dropped


def worker(mode: str, opts: dict) -> dict:
    import torch

    device = torch.device(opts["device"])
    cuda = device.type == "cuda"
    dtype = getattr(torch, opts["dtype"])
    shape = opts["shape"]
    result = dict(mode=mode, status="ok")
    if mode == "control":
        import liger_core
        import liger_core.modules  # noqa: F401
        import liger_core.ops  # noqa: F401
        import liger_core.patching  # noqa: F401
    built = em.setup("vlm", mode, opts, result)  # liger_core_text: liger_core's patch, vision undone below
    if built is None:
        return result
    model, optimizer, batches, report = built
    if report is not None:
        result["report"] = str(report)
        if mode == "liger_core_text":
            result["vision_forwards_restored"] = _unpatch_vision(model)

    def step(b):
        return bc.train_step(model, optimizer, b)

    for i in range(opts["warmup"]):
        step(batches[i % 2])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()

    gc_log = {"start": None, "pauses": [0, 0, 0], "ms": 0.0}

    def on_gc(phase, info):
        if phase == "start":
            gc_log["start"] = time.perf_counter()
        elif gc_log["start"] is not None:
            gc_log["ms"] += (time.perf_counter() - gc_log["start"]) * 1e3
            gc_log["pauses"][info["generation"]] += 1
            gc_log["start"] = None

    gc.callbacks.append(on_gc)
    walls, issues = [], []
    for i in range(opts["timed"]):
        t0 = time.perf_counter()
        loss = step(batches[i % 2])
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        walls.append((t2 - t0) * 1e3)
        issues.append((t1 - t0) * 1e3)
    gc.callbacks.remove(on_gc)
    tokens = opts["batch"] * opts["seq"]
    result.update(
        step_ms=walls,
        issue_ms=issues,
        tokens_per_s=tokens * len(walls) / (sum(walls) / 1e3),
        loss=loss.item(),
        gc_pauses=gc_log["pauses"],
        gc_ms_per_step=gc_log["ms"] / len(walls),
        gc_objects=len(gc.get_objects()),
    )

    # host cost per call of single ops, in this process as training left it
    x = torch.zeros(1, device=device)
    heads, head_dim = 16, shape["vision_config"]["hidden_size"] // 16
    q = torch.randn(1, heads, 64, head_dim, device=device, dtype=dtype)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    result["micro_us"] = dict(
        empty=_host_loop(lambda: torch.empty(1024, device=device), 4000, sync),
        add_launch=_host_loop(lambda: x.add_(1), 4000, sync),
        sdpa_window=_host_loop(lambda: sdpa(q, q, q), 1000, sync),
    )
    with open("/proc/self/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    result.update(
        threads=threads,
        affinity=len(os.sched_getaffinity(0)),
        env={k: v for k, v in os.environ.items() if k.startswith(("TORCH", "CUDA", "TRITON", "PYTORCH"))},
        peak_alloc_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
    )
    return result


def _row(r: dict) -> str:
    s = sorted(r["step_ms"])
    mean = sum(s) / len(s)
    issue = sum(r["issue_ms"]) / len(r["issue_ms"])
    m = r["micro_us"]
    gen = "/".join(str(n) for n in r["gc_pauses"])
    return (
        f"  {r['mode']:<16}{mean:>9.1f}{s[0]:>9.1f}{s[-1]:>9.1f}{issue:>9.1f}{r['tokens_per_s']:>10,.0f}"
        f"{r['gc_ms_per_step']:>8.1f} {gen:>10}{m['empty']:>8.2f}{m['add_launch']:>8.2f}"
        f"{m['sdpa_window']:>8.1f}{r['threads']:>5}{r['loss']:>8.3f}"
    )


HEADER = (
    f"  {'mode':<16}{'step ms':>9}{'min':>9}{'max':>9}{'issue':>9}{'tok/s':>10}{'gc ms':>8} {'gc 0/1/2':>10}"
    f"{'empty':>8}{'add_':>8}{'sdpa':>8}{'thr':>5}{'loss':>8}"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["liger_core", "hf", "control"])
    parser.add_argument("--vlm-layers", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timed", type=int, default=8)
    parser.add_argument("--deadline", type=float, default=330, help="seconds: no mode starts after this")
    parser.add_argument("--timeout", type=float, default=150, help="seconds per mode")
    parser.add_argument("--tiny", action="store_true", help="tiny config (CPU check of the script)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--opts", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        try:
            result = worker(args.worker, json.loads(args.opts))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which prints it
            result = dict(mode=args.worker, status="failed", error=f"{type(e).__name__}: {e}"[:2000])
        print(MARK + json.dumps(result), flush=True)
        return 0

    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    shape = dict(em.QWEN2_5_VL_3B if cuda else em.VLM_TINY)
    if cuda:
        shape["num_hidden_layers"] = args.vlm_layers
    batch, seq, image = em.BATCH["vlm"] if cuda else em.BATCH_TINY["vlm"]
    opts = dict(shape=shape, batch=batch, seq=seq, image=image, warmup=args.warmup, timed=args.timed)
    opts.update(device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32")
    env = bc.environment()
    print(f"# {json.dumps(env)}")
    print(
        f"host_ab_e2e: VLM ({'Qwen2.5-VL-3B shape' if cuda else 'tiny, CPU'}), "
        f"{shape['num_hidden_layers']} text layers, batch {batch} x {seq}, one {image}px image each, "
        f"grad ckpt, {opts['dtype']}, warm-up {args.warmup}, {args.timed} timed steps; modes in this order: "
        f"{' '.join(args.modes)}"
    )
    print("  gc: collector pauses inside the timed steps (ms per step; collections per generation)")
    print(
        "  empty / add_ / sdpa: host us per call of torch.empty(1024) / x.add_(1) / one 64-token window SDPA"
    )
    print(HEADER, flush=True)
    started = time.perf_counter()
    results = []
    for mode in args.modes:
        if time.perf_counter() - started > args.deadline:
            print(f"  {mode:<16}skipped: past the {args.deadline:.0f} s deadline", flush=True)
            continue
        r, proc, wall = bc.spawn_worker(__file__, mode, opts, MARK, args.timeout)
        if proc is None:
            print(f"  {mode:<16}timeout after {args.timeout:.0f} s", flush=True)
            continue
        if r is None:
            tail = bc.output_tail(proc, 8)
            print(f"  {mode:<16}failed (exit {proc.returncode}): {tail}", flush=True)
            continue
        if r["status"] != "ok":
            print(f"  {mode:<16}{r['status']}: {r.get('error', '')[:400]}", flush=True)
            continue
        results.append(r)
        print(_row(r) + f"   ({wall:.0f} s)", flush=True)
    print("\nper mode: steps (ms), patch report, environment")
    for r in results:
        steps = " ".join(f"{t:.0f}" for t in r["step_ms"])
        print(f"  {r['mode']}: steps {steps}; gc objects {r['gc_objects']:,}")
        if r.get("report"):
            extra = (
                f"; vision forwards restored: {r['vision_forwards_restored']}"
                if "vision_forwards_restored" in r
                else ""
            )
            print(f"    {r['report']}{extra}")
        print(f"    env {r['env']}; affinity {r['affinity']} CPUs; peak alloc {r['peak_alloc_gib']:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""End-to-end training throughput and peak memory of a Llama-3.2-1B-shaped model: Hugging Face eager vs
liger-kernel's patch vs liger_core's, each mode in its own process.

Model: vocab 128256, hidden 2048, 16 layers, 32 query / 8 key-value heads, intermediate 8192, tied embeddings,
RoPE theta 500000; bf16 weights, gradients and AdamW states (fused AdamW); batch 8 x 2048 tokens; gradient
checkpointing (non-reentrant); SDPA attention. Random weights and random token ids (throughput and memory do
not depend on them; the first-step losses of the three modes are printed as a sanity check: same weights,
same batch, so they must agree to bf16 noise).

Modes:
  hf            transformers as is
  liger_kernel  ``liger_kernel.transformers.apply_liger_kernel_to_llama()`` before the model is built (its
                defaults: rope, rms_norm, swiglu, fused linear cross-entropy); skipped if not importable
  liger_core    ``liger_core.apply_liger_kernel(model)`` on the built model (defaults: the same four kinds)

tokens/s = batch * seq_len * timed steps / wall time of those steps (after warm-up, CUDA-synchronised); peak
memory = ``torch.cuda.max_memory_allocated()`` over the warm-up and timed steps (weights, gradients and
optimizer states included), reserved memory alongside. Results: ``benchmarks/results/e2e_llama1b_<gpu>.csv``
and ``.json`` (environment, per-mode details).

Usage (GPU machine, repo root):  python benchmarks/e2e_llama1b.py [--modes hf liger_kernel liger_core]
On CPU:  python benchmarks/e2e_llama1b.py --tiny   (tiny shapes; liger_core runs its Triton kernels under the
interpreter; checks the script end to end, numbers meaningless; writes e2e_llama1b_tiny-cpu.*)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as bc  # noqa: E402  (model building, workers, timing, results)

RESULTS = bc.RESULTS
MODES = ("hf", "liger_kernel", "liger_core")
MARK = "E2E_RESULT "

LLAMA_1B = dict(
    bc.LLAMA3,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    tie_word_embeddings=True,
    max_position_embeddings=131072,
)
TINY = dict(
    LLAMA_1B,
    **bc.TINY_TEXT,
    max_position_embeddings=256,
)


def _llama_config(shape: dict):
    return bc.causal_lm_config("llama", shape, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def worker(mode: str, opts: dict) -> dict:
    import torch

    device = torch.device(opts["device"])
    dtype = getattr(torch, opts["dtype"])
    result = dict(mode=mode, status="ok")
    if mode == "liger_kernel":
        patch = bc.liger_kernel_patch("llama")
        if isinstance(patch, str):
            return dict(mode=mode, status="skipped", error=patch)
        patch()  # class level, before the model is built (its documented usage)
        import liger_kernel

        result["version"] = getattr(liger_kernel, "__version__", "?")
    from transformers import LlamaForCausalLM

    config = _llama_config(opts["shape"])
    model = bc.build_model(lambda: LlamaForCausalLM(config), device, dtype)
    if mode.startswith("liger_core"):
        import liger_core
        from liger_core.patching import causal_lm

        # "liger_core@256": the fused linear cross-entropy's chunk of logits bounded by 256 MiB;
        # "liger_core-unfused": the MLP's activation and down projection as two ops (not glu_down_proj)
        if "@" in mode:
            causal_lm.FLCE_MAX_CHUNK_BYTES = int(mode.split("@")[1]) * 2**20
        if mode.endswith("-unfused"):
            from liger_core import tuning

            tuning.FUSE_DOWN_PROJ = False

        result["report"] = str(liger_core.apply_liger_kernel(model))
        result["version"] = liger_core.__version__
    bc.enable_training(model, opts["grad_ckpt"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")

    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(4):
        ids = torch.randint(0, config.vocab_size, (opts["batch"], opts["seq"]), generator=gen).to(device)
        batches.append(dict(input_ids=ids, labels=ids))

    def train_step(batch):
        return bc.train_step(model, optimizer, batch)

    bc.reset_peak_memory(device)
    # diagnostics of the occasional slow step: Python's garbage-collector pauses, per-step GPU times
    timed = bc.timed_steps(train_step, batches, opts["warmup"], opts["steps"], device, diagnostics=True)
    gc_pauses = timed["gc_pauses"]  # (generation, ms)
    result["gc_pauses"] = {
        "count": len(gc_pauses),
        "total_ms": round(sum(ms for _, ms in gc_pauses), 1),
        "longest": [(g, round(ms, 1)) for g, ms in sorted(gc_pauses, key=lambda p: -p[1])[:3]],
    }
    if "step_ms" in timed:  # per-step GPU timeline and allocator retries
        result["step_ms"] = timed["step_ms"]
        result["alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    tuning = sys.modules.get("liger_core.tuning")
    if tuning is not None:
        result["flce_loops"] = dict(tuning.LOOP_COUNTS)
    if opts.get("memtrace") and device.type == "cuda":
        result["memory"] = _memory_at_peak(lambda: train_step(batches[0]))
    if opts.get("profile") and device.type == "cuda":
        result["kernels"] = _profile_step(lambda: train_step(batches[0]))
    result.update(bc.throughput(timed, opts["batch"] * opts["seq"], opts["steps"], model))
    result.update(bc.peak_memory(device))
    return result


def _spawn(mode: str, opts: dict, timeout: float) -> dict:
    # --tiny on CPU: liger_core's Triton kernels run in the interpreter
    interpret = opts["device"] == "cpu" and mode == "liger_core"
    result, proc, wall = bc.spawn_worker(__file__, mode, opts, MARK, timeout, interpret)
    if proc is None:
        return dict(mode=mode, status="timeout", error=f"no result within {timeout:.0f} s")
    if result is not None:
        result["wall_s"] = wall
        return result
    status, error = bc.no_result(proc)
    return dict(mode=mode, status=status, error=error)


def _environment() -> dict:
    import torch

    env = dict(python=platform.python_version(), torch=torch.__version__)
    for name in ("transformers", "triton", "liger_kernel"):
        try:
            env[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            env[name] = None
    env["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return env


def _mode(text: str) -> str:
    name, _, mib = text.removesuffix("-unfused").partition("@")
    if name not in MODES or (mib and not (name == "liger_core" and mib.isdigit())):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected one of {MODES}, liger_core@<MiB> or liger_core[@<MiB>]-unfused"
        )
    return text


KERNEL_CATEGORIES = (  # (category, substrings of the kernel name), first match wins
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "splitk", "matmul")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
)


def _category(name: str) -> str:
    low = name.lower()
    for category, keys in KERNEL_CATEGORIES:
        if any(k in low for k in keys):
            return category
    if "::" in name or low.startswith("void"):  # ATen's C++ kernels (templated names)
        return "other (aten elementwise, copies, reductions)"
    return "Triton (liger_core / liger-kernel)"


def _profile_step(step) -> dict:
    """GPU kernels of one training step: the 15 largest by total time (name, calls, ms), the total by
    category (GEMMs, attention, optimizer, Triton kernels, other) and the step's wall time, so that what the
    kernels of this project can still win is bounded by numbers."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    averages = list(prof.key_averages())
    rows = sorted(averages, key=lambda e: -e.device_time_total)[:15]
    categories: dict[str, float] = {}
    for e in averages:
        if e.device_time_total > 0:
            c = _category(e.key)
            categories[c] = categories.get(c, 0.0) + e.device_time_total / 1e3
    return dict(
        top=[dict(name=e.key[:90], calls=e.count, ms=round(e.device_time_total / 1e3, 3)) for e in rows],
        by_category_ms={k: round(v, 2) for k, v in sorted(categories.items(), key=lambda kv: -kv[1])},
        kernels_ms=round(sum(categories.values()), 2),
        profiled_step_wall_ms=round(wall_ms, 2),
        idle=_idle_gaps(prof),
    )


def _idle_gaps(prof, min_us: float = 20.0, top: int = 8) -> dict:
    """Where the GPU waits within the step: the gaps between one kernel's end (the latest end so far) and the
    next kernel's start, in total and the largest ones with the kernels on each side (a host sync or slow host
    code shows up as a gap before the first kernel it launches)."""
    import torch

    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    gaps, end, before = [], None, None
    for e in kernels:
        if end is not None and e.time_range.start - end > min_us:
            gaps.append((e.time_range.start - end, before, e.name))
        if end is None or e.time_range.end > end:
            end, before = e.time_range.end, e.name
    gaps.sort(key=lambda g: -g[0])
    return dict(
        total_ms=round(sum(g[0] for g in gaps) / 1e3, 3),
        n_gaps=len(gaps),
        largest=[dict(ms=round(g / 1e3, 3), after=a[:60], before=b[:60]) for g, a, b in gaps[:top]],
    )


def _memory_at_peak(step) -> dict:
    """One training step under the CUDA caching allocator's history: the peak of allocated bytes within the
    step, the phase it falls in, and the largest live allocations at that moment with the Python frame that
    made each (the first frame in liger_core, liger_kernel, transformers or torch.nn / autograd code)."""
    import torch

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    try:
        # checkpoint's early stop raises an exception through the recomputed forward; the allocator's Python
        # stack capture during that unwinding loses it (SystemError, torch 2.11): recompute in full here
        with torch.utils.checkpoint.set_checkpoint_early_stop(False):
            step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = [e for trace in snapshot["device_traces"] for e in trace]
    live: dict[int, dict] = {}
    total = peak = peak_index = 0
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
        if total > peak:
            peak, peak_index = total, i
    live = {}
    for e in events[: peak_index + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)

    def where(e) -> str:
        keep = ("liger_core", "liger_kernel", "transformers", "torch/nn", "torch/autograd", "torch/optim",
                "torch/utils/checkpoint", "e2e_llama1b", "benchmarks/_common")  # fmt: skip
        for f in e.get("frames", []):
            if any(k in f["filename"] for k in keep):
                return (
                    f"{f['filename'].split('site-packages/')[-1].split('/main/')[-1]}:{f['line']} {f['name']}"
                )
        return "?"

    groups: dict[str, list[int]] = {}
    for e in live.values():
        groups.setdefault(where(e), []).append(e["size"])
    top = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:14]
    return dict(
        step_peak_gib=(base + peak) / 2**30,
        base_gib=base / 2**30,
        at_peak=[dict(where=k, n=len(v), gib=round(sum(v) / 2**30, 4)) for k, v in top],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--modes",
        nargs="+",
        type=_mode,
        default=list(MODES),
        help="hf, liger_kernel, liger_core, or liger_core@MiB (fused-linear-CE chunk of logits bound)",
    )
    parser.add_argument("--profile", action="store_true", help="GPU kernels of one extra step per mode")
    parser.add_argument("--memtrace", action="store_true", help="live allocations at one step's peak")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20; --tiny 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; --tiny 1)")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--no-grad-ckpt", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test of this script (tiny shapes)")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per mode (default 240; --tiny 600)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--opts", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        opts = json.loads(args.opts)
        return bc.run_worker_main(MARK, dict(mode=args.worker), lambda: worker(args.worker, opts))

    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        print(
            "e2e_llama1b: no CUDA device; run with --tiny for a CPU smoke test of the script", file=sys.stderr
        )
        return 2
    opts = dict(
        device="cuda" if cuda else "cpu",
        dtype="bfloat16" if cuda else "float32",
        shape=LLAMA_1B if not args.tiny else TINY,
        batch=args.batch or (8 if not args.tiny else 1),
        seq=args.seq or (2048 if not args.tiny else 16),
        steps=args.steps or (20 if not args.tiny else 2),
        warmup=args.warmup if args.warmup is not None else (3 if not args.tiny else 1),
        grad_ckpt=not args.no_grad_ckpt,
        profile=args.profile,
        memtrace=args.memtrace,
    )
    timeout = args.timeout or (240 if cuda else 600)
    env = _environment()
    tag = (env["gpu"] or "tiny-cpu").replace(" ", "_") if cuda else "tiny-cpu"
    print(f"e2e_llama1b: {env}")
    print(
        f"  model {'Llama-3.2-1B shape' if not args.tiny else 'tiny'}: {opts['shape']}\n"
        f"  {opts['dtype']}, batch {opts['batch']} x {opts['seq']}, grad checkpointing {opts['grad_ckpt']}, "
        f"fused AdamW, {opts['warmup']} warm-up + {opts['steps']} timed steps",
        flush=True,
    )
    results = []
    for mode in args.modes:
        result = _spawn(mode, opts, timeout)
        results.append(result)
        line = bc.progress_line(result, ("error", "kernels", "memory"))
        print(f"  {mode}: {line}", flush=True)
        if result.get("error"):
            print(f"    error: {result['error']}", flush=True)
        memory = result.get("memory")
        if memory:
            print(
                f"    step peak {memory['step_peak_gib']:.3f} GiB (before the step {memory['base_gib']:.3f})"
            )
            for m in memory["at_peak"]:
                print(f"    {m['gib']:8.4f} GiB {m['n']:5d}x  {m['where']}", flush=True)
        kernels = result.get("kernels")
        if kernels:
            print(
                f"    profiled step: {kernels['profiled_step_wall_ms']:.2f} ms wall, "
                f"{kernels['kernels_ms']:.2f} ms of GPU kernels"
            )
            for category, ms in kernels["by_category_ms"].items():
                print(f"    {ms:9.2f} ms  {category}")
            for k in kernels["top"]:
                print(f"    {k['ms']:9.3f} ms {k['calls']:5d}x  {k['name']}", flush=True)
            idle = kernels.get("idle")
            if idle:
                print(f"    GPU idle {idle['total_ms']:.2f} ms in {idle['n_gaps']} gaps > 20 us; largest:")
                for g in idle["largest"]:
                    print(f"    {g['ms']:9.3f} ms  after {g['after']}  before {g['before']}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"e2e_llama1b_{tag}"
    fields = ["mode", "status", "tokens_per_s", "step_time_s", "peak_alloc_gib", "peak_reserved_gib"]
    fields += ["first_loss", "last_loss", "params", "version", "wall_s", "error"]
    bc.write_csv(f"{stem}.csv", fields, results)
    bc.write_json(f"{stem}.json", dict(environment=env, options=opts, results=results), indent=2)

    print(f"\n  {'mode':14}{'status':>9}{'tokens/s':>12}{'peak alloc':>12}{'reserved':>10}{'first loss':>12}")
    for r in results:
        tps, alloc, reserved, first = bc.summary_cells(r)
        print(f"  {r['mode']:14}{r['status']:>9}{tps:>12}{alloc:>12}{reserved:>10}{first:>12}")
    by_mode = {r["mode"]: r for r in results if r["status"] == "ok"}
    ours, peer = by_mode.get("liger_core"), by_mode.get("liger_kernel")
    if ours and peer and "peak_alloc_gib" in ours:
        faster = ours["tokens_per_s"] / peer["tokens_per_s"]
        leaner = ours["peak_alloc_gib"] / peer["peak_alloc_gib"]
        verdict = "yes" if faster > 1 and leaner < 1 else "NO"
        print(
            f"\n  liger_core vs liger_kernel: tokens/s x{faster:.3f}, peak memory x{leaner:.3f}; "
            f"beats it on both: {verdict}"
        )
    if ours and by_mode.get("hf") and "peak_alloc_gib" in ours:
        hf = by_mode["hf"]
        print(
            f"  liger_core vs hf: tokens/s x{ours['tokens_per_s'] / hf['tokens_per_s']:.3f}, "
            f"peak memory x{ours['peak_alloc_gib'] / hf['peak_alloc_gib']:.3f}"
        )
    print(f"  wrote {stem}.csv and {stem}.json")
    return 0 if "liger_core" not in args.modes or ours else 1


if __name__ == "__main__":
    sys.exit(main())

"""Side-by-side variants of RoPE, SwiGLU and GeGLU in one GPU call (issue 7 method: predict, change, measure).

    PYTHONPATH=.:/tmp/liger_peer_site python benchmarks/variants_glu_rope.py [--quick] [--only rope,glu,host]

Every variant is checked against the float64 reference and timed by the suite's own code
(``liger_core.harness``: CaseRunner, do_bench with the L2 flush, the restoring loop for providers that write
their inputs, peak extra memory), at the default shapes, beside liger-kernel. Also:
- ``host``: host (CPU) time per call of each provider at a tiny shape, where the GPU work is negligible: the
  time a training step cannot hide when the GPU waits for the launch;
- ``profile``: the GPU kernels of one fwd+bwd (name, count, total µs) from torch.profiler.
Variants are module knobs flipped here (``dispatch.EAGER_VIA_CUSTOM_OPS``, ``rope._NUM_WARPS``, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from liger_core.harness import correctness as harness_correctness  # noqa: E402
from liger_core.harness import interpreter as harness_interpreter  # noqa: E402
from liger_core.harness import peers as harness_peers  # noqa: E402
from liger_core.harness import providers as harness_providers  # noqa: E402
from liger_core.harness import registry as harness_registry  # noqa: E402
from liger_core.harness import report as harness_report  # noqa: E402
from liger_core.harness import timing as harness_timing  # noqa: E402
from liger_core.ops import geglu, rope, swiglu  # noqa: E402

rope_module = sys.modules["liger_core.ops.rope"]
launch_module = sys.modules["liger_core.ops._launch"]

ROWS: list[str] = []
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a smoke test of this script


def log(line: str) -> None:
    print(line, flush=True)
    ROWS.append(line)


@contextlib.contextmanager
def knobs(module, **values) -> Iterator[None]:
    old = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


def liger_kernel_fn(op: str) -> Callable | None:
    """liger-kernel's functional op, called exactly as the suite calls it (None if not installed)."""
    return harness_registry.OPS[op].liger_kernel if harness_peers.peer_version("liger_kernel") else None


def measure(
    op: str, shape: dict, variants: dict[str, tuple[Callable, dict]], timing: harness_timing.Timing
) -> None:
    """variants: name -> (fn, {module: knobs}) timed at `shape` with the suite's code."""
    spec = harness_registry.OPS[op]
    runner = harness_correctness.CaseRunner(spec, shape, torch.bfloat16, DEVICE)
    runner.compute_reference()
    eager = runner.run_checked(harness_registry.available("reference", op))
    runner.set_eager(eager.errors)
    del eager
    floors = {m: spec.floor(shape, 2, m).ms for m in harness_report.MODES}
    log(
        f"-- {spec.title} {spec.label(shape)}: floor fwd {floors['fwd']:.4f} ms, "
        f"fwd+bwd {floors['fwd+bwd']:.4f} ms"
    )
    for name, (fn, knob_map) in variants.items():
        if fn is None:
            log(f"   {name:34s} unavailable")
            continue
        try:
            with contextlib.ExitStack() as stack:
                for module, values in knob_map.items():
                    stack.enter_context(knobs(module, **values))
                run = runner.run_checked(fn)
                err, eager_err, out_name, ok = runner.verdict(run.errors)
                cells = []
                for mode in harness_report.MODES:
                    med, p20, p80, _ = harness_timing.time_step(run, mode, timing)
                    cells.append(f"{mode} {med:.4f} ({100 * floors[mode] / med:3.0f}%)")
                if (
                    DEVICE.type == "cuda"
                ):  # the kernels' time alone (CUDA-graph replay), as the suite's column
                    gpu_ms, _ = harness_timing.time_graph(run, "fwd+bwd", timing, check_host_sync=False)
                    cells.append(f"GPU f+b {gpu_ms:.4f} ({100 * floors['fwd+bwd'] / gpu_ms:3.0f}%)")
                mem = harness_timing.peak_extra_bytes(run, "fwd+bwd") / 2**30
                written = "writes inputs" if run.restore_pairs else ""
                log(
                    f"   {name:34s} {' | '.join(cells)} | {mem:.3f} GiB | "
                    f"{'ok' if ok else 'FAIL'} {out_name} {err:.2e} (eager {eager_err:.2e}) {written}"
                )
                del run
        except Exception as e:  # noqa: BLE001
            log(f"   {name:34s} ERROR {type(e).__name__}: {str(e)[:200]}")
            traceback.print_exc()
        harness_correctness.free_memory()


def host_time(op: str, shape: dict, variants: dict[str, tuple[Callable, dict]], n: int = 300) -> None:
    """Host µs per fwd and fwd+bwd call at a tiny shape (GPU time negligible: the CPU is the bottleneck)."""
    spec = harness_registry.OPS[op]
    runner = harness_correctness.CaseRunner(spec, shape, torch.bfloat16, DEVICE)
    runner.compute_reference()
    log(f"-- host time per call, {spec.title} {spec.label(shape)} (µs, median of 5 x {n} calls)")
    for name, (fn, knob_map) in variants.items():
        if fn is None:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for module, values in knob_map.items():
                    stack.enter_context(knobs(module, **values))
                run = runner.run_checked(fn)
                cells = []
                for mode in harness_report.MODES:
                    step = harness_timing.make_step(run, mode)
                    samples = []
                    for _ in range(5):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        for _ in range(n):
                            step()
                            for t in run.diff_tensors:
                                t.grad = None
                        torch.cuda.synchronize()
                        samples.append((time.perf_counter() - t0) / n * 1e6)
                    cells.append(f"{mode} {sorted(samples)[2]:6.1f}")
                log(f"   {name:34s} {' | '.join(cells)}")
        except Exception as e:  # noqa: BLE001
            log(f"   {name:34s} ERROR {type(e).__name__}: {str(e)[:200]}")


def raw_launch_host_time(n: int = 1000) -> None:
    """Host µs of one bare RoPE kernel launch (no checks, no autograd): ours vs liger-kernel's."""
    shape = {"B": 1, "T": 16, "Hq": 8, "Hk": 2, "D": 128}
    q, k, cos, sin = harness_registry.OPS["rope"].build(shape, torch.bfloat16, DEVICE).args
    calls = {"liger_core _launch": lambda: rope_module._launch(q, k, cos, sin, False, 1, q.dtype, False)}
    if harness_peers.peer_version("liger_kernel"):
        from liger_kernel.ops.rope import rope_forward  # noqa: PLC0415

        calls["liger_kernel rope_forward"] = lambda: rope_forward(q, k, cos, sin)
    log(f"-- host time of one bare launch, RoPE {harness_registry.OPS['rope'].label(shape)} (µs)")
    for name, call in calls.items():
        log(f"   {name:34s} {per_call_us(call, n):6.1f}")


def per_call_us(call: Callable[[], object], n: int = 1000) -> float:
    """Host µs per call: median of 5 batches of n calls, synchronised around each batch."""
    call()
    samples = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(samples)[2]


def profile(op: str, shape: dict, variants: dict[str, tuple[Callable, dict]], repeat: int = 1) -> None:
    """GPU kernels of one fwd+bwd (after warm-up; the mean of ``repeat`` profiled ones): name, count, µs."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    spec = harness_registry.OPS[op]
    runner = harness_correctness.CaseRunner(spec, shape, torch.bfloat16, DEVICE)
    runner.compute_reference()
    log(f"-- kernels of one fwd+bwd, {spec.title} {spec.label(shape)}")
    for name, (fn, knob_map) in variants.items():
        if fn is None:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for module, values in knob_map.items():
                    stack.enter_context(knobs(module, **values))
                run = runner.run_checked(fn)
                step = harness_timing.make_step(run, "fwd+bwd")
                for _ in range(3):
                    step()
                    for t in run.diff_tensors:
                        t.grad = None
                torch.cuda.synchronize()
                with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(repeat):
                        step()
                        for t in run.diff_tensors:
                            t.grad = None
                    torch.cuda.synchronize()
                kernels = {}
                for ev in prof.events():
                    if ev.device_type.name == "CUDA":
                        c, t = kernels.get(ev.name, (0, 0.0))
                        kernels[ev.name] = (c + 1 / repeat, t + ev.device_time_total / repeat)
                total = sum(t for _, t in kernels.values())
                ranked = sorted(kernels.items(), key=lambda x: -x[1][1])
                parts = ", ".join(f"{k[:40]} x{c:g} {t:.1f}" for k, (c, t) in ranked)
                log(f"   {name:34s} total {total:7.1f} µs: {parts}")
                for t in run.diff_tensors:
                    t.grad = None
        except Exception as e:  # noqa: BLE001
            log(f"   {name:34s} ERROR {type(e).__name__}: {str(e)[:200]}")


def host_profile(op: str, shape: dict, n: int = 200) -> None:
    """cProfile of the suite's timing loop (L2-flush memset, events, step, grads reset) at a real shape:
    where the host time of one fwd+bwd goes, ours beside liger-kernel's (top functions by own time)."""
    import cProfile
    import io
    import pstats

    spec = harness_registry.OPS[op]
    runner = harness_correctness.CaseRunner(spec, shape, torch.bfloat16, DEVICE)
    runner.compute_reference()
    cache = torch.empty(harness_timing._L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    providers = {
        "liger_core": harness_providers.provider_fn(spec, "liger_core")[0],
        "liger_kernel": liger_kernel_fn(op),
    }
    for name, fn in providers.items():
        if fn is None:
            continue
        run = runner.run_checked(fn)
        step = harness_timing.make_step(run, "fwd+bwd")
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2 * n)]

        def loop(run=run, step=step, events=events) -> None:
            for i in range(n):
                for t in run.diff_tensors:
                    t.grad = None
                cache.zero_()
                events[2 * i].record()
                step()
                events[2 * i + 1].record()
            torch.cuda.synchronize()

        loop()
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        profiler.enable()
        loop()
        profiler.disable()
        wall = (time.perf_counter() - t0) / n * 1e6
        gpu = sorted(events[2 * i].elapsed_time(events[2 * i + 1]) for i in range(n))[n // 2]
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(12)
        log(
            f"-- host profile {name}, {spec.title} {spec.label(shape)}: {wall:.0f} µs/iteration (profiled), "
            f"median event time {gpu:.4f} ms"
        )
        for line in out.getvalue().splitlines():
            if line.strip() and ("{" in line or "/" in line or "ncalls" in line):
                log("   " + line.strip()[:150])
        del run


def rope_variants() -> dict[str, tuple[Callable, dict]]:
    # session 12 timed several tokens per program for few heads here (slower at every shape; the code is gone:
    # benchmarks/NOTES.md, session 12); add knob variants of rope_module below as needed
    return {"liger_core": (rope, {}), "liger_kernel": (liger_kernel_fn("rope"), {})}


def glu_variants(op: str) -> dict[str, tuple[Callable, dict]]:
    fn = swiglu if op == "swiglu" else geglu
    inplace = lambda a, b: fn(a, b, inplace_backward=True)  # noqa: E731 (the suite's setting)
    variants = {"liger_core inplace_backward (block 4096, 8 warps)": (inplace, {})}
    # session 12: peers 0.3-1.7 % faster at many shapes; block size and warps of the flat kernels
    for block, warps in ((2048, 4), (8192, 8), (8192, 16), (16384, 16)):
        knob = {"ELEMENTWISE_MAX_BLOCK": block, "ELEMENTWISE_LARGE_BLOCK_WARPS": warps}
        variants[f"liger_core inplace_backward, block {block}, {warps} warps"] = (
            inplace,
            {launch_module: knob},
        )
    variants["liger_kernel"] = (liger_kernel_fn(op), {})
    return variants


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="rope,glu,host,profile")
    parser.add_argument(
        "--rope-shapes",
        default="",
        help="rope section: e.g. 1x64x1024x128x16,4x32x4096x128x8 (B x Hq x T x D x Hk)",
    )
    parser.add_argument("--glu-shapes", default="", help="glu section: e.g. 16384x1024,65536x8192 (M x N)")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    harness_interpreter.prepare_triton()
    if DEVICE.type == "cpu":  # smoke test: tiny shapes, no timing
        harness_timing.time_step = lambda run, mode, timing: (1.0, 1.0, 1.0, "none")
        harness_timing.peak_extra_bytes = lambda run, mode: 0
        torch.cuda.synchronize = lambda: None
    timing = harness_timing.QUICK if args.quick else harness_timing.Timing()
    rope_shape = {"B": 4, "T": 4096, "Hq": 32, "Hk": 8, "D": 128}
    glu_shape = {"M": 16384, "N": 14336}
    if DEVICE.type == "cpu":
        rope_shape, glu_shape = {"B": 2, "T": 5, "Hq": 4, "Hk": 2, "D": 16}, {"M": 7, "N": 33}
        parts -= {"host", "profile"}  # they need CUDA events
    rope_shapes = [rope_shape]
    if args.rope_shapes and DEVICE.type == "cuda":
        rope_shapes = [
            dict(zip(("B", "Hq", "T", "D", "Hk"), (int(v) for v in shape.split("x")), strict=True))
            for shape in args.rope_shapes.split(",")
        ]
    glu_shapes = [glu_shape]
    if args.glu_shapes and DEVICE.type == "cuda":
        glu_shapes = [
            dict(zip(("M", "N"), map(int, shape.split("x")), strict=True))
            for shape in args.glu_shapes.split(",")
        ]
    log(f"device {DEVICE}, torch {torch.__version__}")
    sections = [
        *(
            ("rope", lambda shape=shape: measure("rope", shape, rope_variants(), timing))
            for shape in rope_shapes
        ),
        ("profile", lambda: profile("rope", rope_shape, rope_variants())),
        ("hostprof", lambda: host_profile("rope", rope_shape)),
        ("host", lambda: host_time("rope", {"B": 1, "T": 16, "Hq": 8, "Hk": 2, "D": 128}, rope_variants())),
        ("host", raw_launch_host_time),
        ("host", lambda: host_time("swiglu", {"M": 16, "N": 256}, glu_variants("swiglu"))),
        *(
            ("glu", lambda op=op, shape=shape: measure(op, shape, glu_variants(op), timing))
            for op in ("swiglu", "geglu")
            for shape in glu_shapes
        ),
    ]
    for part, section in sections:
        if part in parts:
            try:
                section()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
    print("\n==================== summary ====================")
    print("\n".join(ROWS))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Side-by-side variants of cross_entropy and fused_linear_cross_entropy in one GPU call (issue 7 method).

    PYTHONPATH=.:/tmp/liger_peer_site python benchmarks/variants_ce.py [--quick] [--only ce,kernel,parts,...]

Sections:
- ``ce``: the op at 8192 x 128256 bf16 through the suite's own code (``liger_core.harness``: float64 check,
  do_bench with the L2 flush, the restoring loop for in-place providers, peak extra memory), several kernel
  settings (module knobs of ``liger_core.ops.cross_entropy``) beside liger-kernel;
- ``kernel``: the cross-entropy kernel alone (gradient into a separate buffer) over block sizes, warps, pass-2
  order and eviction hints: many settings cheaply;
- ``ce32``: fp32 logits (fp64 per-element math vs fp32 math: speed and the suite's accuracy check);
- ``parts``: the pieces of one FLCE chunk (logits GEMM, CE kernel, dh GEMM and alternatives, dW accumulation
  in bf16 and fp32) at several chunk sizes: ms, TFLOP/s, GB/s;
- ``flce``: the whole FLCE fwd+bwd at several chunk sizes (time, peak extra memory: the trade-off curve),
  beside liger-kernel;
- ``profile``: the GPU kernels of one fwd+bwd (name, count, total µs) from torch.profiler.
On CPU (no GPU) it is a smoke test at tiny shapes (Triton interpreter), timing nothing.
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
from liger_core.harness import floors as harness_floors  # noqa: E402
from liger_core.harness import interpreter as harness_interpreter  # noqa: E402
from liger_core.harness import peers as harness_peers  # noqa: E402
from liger_core.harness import registry as harness_registry  # noqa: E402
from liger_core.harness import report as harness_report  # noqa: E402
from liger_core.harness import timing as harness_timing  # noqa: E402
from liger_core.ops import cross_entropy, fused_linear_cross_entropy  # noqa: E402

ce_mod = sys.modules["liger_core.ops.cross_entropy"]
flce_mod = sys.modules["liger_core.ops.fused_linear_cross_entropy"]

ROWS: list[str] = []
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GPU = DEVICE.type == "cuda"


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
    return harness_registry.OPS[op].liger_kernel if harness_peers.peer_version("liger_kernel") else None


def sync() -> None:
    if GPU:
        torch.cuda.synchronize()


def bench_ms(fn: Callable[[], object], warmup: int = 25, rep: int = 100) -> float:
    """Median ms of fn (do_bench: L2 flushed before each run); 0 on CPU."""
    if not GPU:
        fn()
        return 0.0
    import triton.testing

    q = triton.testing.do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5])
    return float(q[0] if isinstance(q, (list, tuple)) else q)


def measure(op: str, shape: dict, dtype, variants: dict, timing: harness_timing.Timing) -> None:
    """variants: name -> (fn, {module: knobs}) through the suite's check, timing and memory code."""
    spec = harness_registry.OPS[op]
    runner = harness_correctness.CaseRunner(spec, shape, dtype, DEVICE)
    runner.compute_reference()
    eager = runner.run_checked(harness_registry.available("reference", op))
    runner.set_eager(eager.errors)
    del eager
    s = torch.empty((), dtype=dtype).element_size()
    floors = {m: spec.floor(shape, s, m).ms for m in harness_report.MODES}
    log(
        f"-- {spec.title} {spec.label(shape)} {dtype}: floor fwd {floors['fwd']:.4f} ms, "
        f"fwd+bwd {floors['fwd+bwd']:.4f} ms (ref {runner.ref_dtype})"
    )
    for name, (fn, knob_map) in variants.items():
        if fn is None:
            log(f"   {name:40s} unavailable")
            continue
        try:
            with contextlib.ExitStack() as stack:
                for module, values in knob_map.items():
                    stack.enter_context(knobs(module, **values))
                run = runner.run_checked(fn)
                err, eager_err, out_name, ok = runner.verdict(run.errors)
                cells = []
                for mode in harness_report.MODES:
                    if GPU:
                        med, _, _, _ = harness_timing.time_step(run, mode, timing)
                    else:
                        harness_timing.make_step(run, mode)()
                        med = float("nan")
                    cells.append(f"{mode} {med:.4f} ({100 * floors[mode] / med:3.0f}%)")
                mem = harness_timing.peak_extra_bytes(run, "fwd+bwd") / 2**30 if GPU else float("nan")
                written = "writes inputs" if run.restore_pairs else ""
                log(
                    f"   {name:40s} {' | '.join(cells)} | {mem:.3f} GiB | "
                    f"{'ok' if ok else 'FAIL'} {out_name} {err:.2e} (eager {eager_err:.2e}) {written}"
                )
                del run
        except Exception as e:  # noqa: BLE001
            log(f"   {name:40s} ERROR {type(e).__name__}: {str(e)[:300]}")
            traceback.print_exc()
        harness_correctness.free_memory()


# ------------------------------------------------------------------------------------------------------------
# cross_entropy
# ------------------------------------------------------------------------------------------------------------


def ce_variants() -> dict:
    def ours(**kw):
        return lambda x, t: cross_entropy(x, t, **kw)

    inplace = ours(inplace_backward=True)
    return {
        "in place (defaults)": (inplace, {}),
        "in place, check_targets=False": (ours(inplace_backward=True, check_targets=False), {}),
        "default (gradient in a new buffer)": (ours(), {}),
        "liger_kernel": (liger_kernel_fn("cross_entropy"), {}),
    }


def kernel_sweep(n: int, vocab: int, dtype) -> None:
    """The CE kernel alone (reads logits, writes the gradient to a separate buffer), many settings."""
    logits = torch.randn(n, vocab, device=DEVICE, dtype=dtype) * 2
    target = torch.randint(0, vocab, (n,), device=DEVICE)
    grad = torch.empty_like(logits)
    loss_rows = torch.empty(n, dtype=torch.float64, device=DEVICE)
    z_rows = torch.empty_like(loss_rows)
    stats = ce_mod.target_stats(target, None, -100, vocab)
    floor = 2 * n * vocab * logits.element_size() / harness_floors.HBM_BYTES_PER_S * 1e3
    log(f"-- CE kernel alone {n}x{vocab} {dtype}: floor (read + write) {floor:.4f} ms")

    def launch():
        ce_mod.launch_cross_entropy(
            logits, target, None, grad, loss_rows, z_rows, stats, ignore_index=-100, mean=True,
            label_smoothing=0.0, lse_square_scale=0.0, softcap=None,
        )  # fmt: skip

    default = dict(CE_PASS1_POLICY="evict_last", CE_PASS2_POLICY="evict_first", CE_STORE_POLICY="evict_first")
    settings = [  # (name, knobs)
        ("32768 cols 32 warps, hints (default)", {}),
        ("32768/32, hints, loads only", dict(CE_STORE_POLICY="")),
        ("32768/32, hints + streaming stores .cs", dict(CE_STORE_CACHE=".cs")),
        ("16384/32, hints", dict(CE_MAX_BLOCK=16384)),
        ("16384/16, hints", dict(CE_MAX_BLOCK=16384, CE_WARPS=16)),
        ("8192/16, hints", dict(CE_MAX_BLOCK=8192, CE_WARPS=16)),
    ]
    if not GPU:
        settings = settings[:2]
    for name, values in settings:
        try:
            with knobs(ce_mod, **{**default, **values}):
                launch()
                ms = bench_ms(launch)
            log(f"   {name:44s} {ms:.4f} ms ({100 * floor / ms if ms else 0:3.0f}% of floor)")
        except Exception as e:  # noqa: BLE001
            log(f"   {name:44s} ERROR {type(e).__name__}: {str(e)[:300]}")
    # the whole forward with and without the host sync of the target check (gradient in place)
    x = logits.clone()
    for check in (True, False):

        def fwd(check=check):
            return cross_entropy(x, target, inplace_backward=True, check_targets=check)

        try:
            x.requires_grad_(True)
            fwd()
            ms = bench_ms(fwd)
            log(f"   op forward (requires_grad, in place), check_targets={check}: {ms:.4f} ms")
        except Exception as e:  # noqa: BLE001
            log(f"   op forward check_targets={check} ERROR {type(e).__name__}: {str(e)[:300]}")


def ce32_variants() -> dict:
    inplace = lambda x, t: cross_entropy(x, t, inplace_backward=True)  # noqa: E731
    return {
        "fp32 logits, fp64 math (defaults: 16384/16)": (inplace, {}),
        "liger_kernel": (liger_kernel_fn("cross_entropy"), {}),
    }


def ce32_accuracy(n: int, vocab: int) -> None:
    """fp32 logits: error of dlogits and loss / eager's, for fp64 vs fp32 per-element math, over the unit
    test's option sets and reductions (the test's shapes and inputs: scale 3, a fifth of the rows ignored)."""
    from liger_core import reference

    cases = {
        "plain": dict(),
        "smooth_weight": dict(label_smoothing=0.1, weighted=True),
        "zloss_softcap": dict(lse_square_scale=1e-2, softcap=4.0),
        "all": dict(label_smoothing=0.2, weighted=True, lse_square_scale=1e-3, softcap=30.0),
    }
    log(f"-- fp32 accuracy, {n}x{vocab}: err(ours)/err(eager) for dlogits (loss), fp64 math | fp32 math")
    for case, opts in cases.items():
        opts = dict(opts)
        weighted = opts.pop("weighted", False)
        for reduction in ("mean", "sum", "none"):
            logits = (torch.randn(n, vocab, dtype=torch.float64, device=DEVICE) * 3.0).float()
            target = torch.randint(0, vocab, (n,), device=DEVICE)
            target[torch.randperm(n, device=DEVICE)[: n // 5]] = -100
            weight = (
                (torch.rand(vocab, dtype=torch.float64, device=DEVICE) + 0.5).float() if weighted else None
            )
            if reduction == "none":
                grad_out = torch.randn(n, device=DEVICE)
            else:
                grad_out = torch.tensor(3.7 if case != "plain" else 1.0, device=DEVICE)
            outs = {}
            for kind in ("ref", "eager", "fp64", "fp32"):
                dt = torch.float64 if kind == "ref" else torch.float32
                x = logits.to(dt).requires_grad_(True)
                w = weight.to(dt) if weight is not None else None
                if kind in ("ref", "eager"):
                    loss = reference.cross_entropy(x, target, w, reduction=reduction, **opts)
                else:
                    with knobs(ce_mod, CE_FP32_MATH=kind):
                        loss = cross_entropy(x, target, w, reduction=reduction, **opts)
                (dx,) = torch.autograd.grad(loss, x, grad_out.to(dt))
                outs[kind] = (loss.detach(), dx)
            ratios = []
            for kind in ("fp64", "fp32"):
                cells = []
                for i in (1, 0):
                    e = harness_correctness.rel_err(outs[kind][i], outs["ref"][i])
                    ee = harness_correctness.rel_err(outs["eager"][i], outs["ref"][i])
                    cells.append(f"{e / ee if ee else float('nan'):.3f}")
                ratios.append(f"{cells[0]} ({cells[1]})")
            log(f"   {case:14s} {reduction:5s} {' | '.join(ratios)}")
            del outs, logits
            harness_correctness.free_memory()


# ------------------------------------------------------------------------------------------------------------
# fused_linear_cross_entropy
# ------------------------------------------------------------------------------------------------------------


def flce_parts(bt: int, hidden_size: int, vocab: int, chunks: tuple[int, ...]) -> None:
    """Each piece of one chunk, timed alone (the inputs of a real chunk: bf16, random)."""
    dtype = torch.bfloat16
    h = torch.randn(bt, hidden_size, device=DEVICE, dtype=dtype)
    w = torch.randn(vocab, hidden_size, device=DEVICE, dtype=dtype) * hidden_size**-0.5
    target = torch.randint(0, vocab, (bt,), device=DEVICE)
    gw = torch.zeros(vocab, hidden_size, device=DEVICE, dtype=dtype)
    gh = torch.empty(bt, hidden_size, device=DEVICE, dtype=dtype)
    stats = ce_mod.target_stats(target, None, -100, vocab)
    loss_rows = torch.empty(bt, dtype=torch.float64, device=DEVICE)
    z_rows = torch.empty_like(loss_rows)
    log(f"-- FLCE pieces per chunk, BT {bt} H {hidden_size} V {vocab} bf16 (W {w.numel() * 2 / 1e9:.2f} GB)")
    for c in chunks:
        _flce_parts_chunk(c, h, w, target, gw, gh, stats, loss_rows, z_rows)
        harness_correctness.free_memory()


def _flce_parts_chunk(c, h, w, target, gw, gh, stats, loss_rows, z_rows) -> None:
    vocab, hidden_size = w.shape
    dtype = h.dtype
    buf = torch.empty(c, vocab, device=DEVICE, dtype=dtype)
    hc = h[:c]
    gemm_flops = 2 * c * hidden_size * vocab
    gemm_bytes = (vocab * hidden_size + c * vocab) * 2
    rows = {}

    def logits_mm():
        torch.mm(hc, w.t(), out=buf)

    def ce_kernel():
        ce_mod.launch_cross_entropy(
            buf, target[:c], None, buf, loss_rows[:c], z_rows[:c], stats, ignore_index=-100, mean=True,
            label_smoothing=0.0, lse_square_scale=0.0, softcap=None,
        )  # fmt: skip

    def dh_mm():
        torch.mm(buf, w, out=gh[:c])

    def dw_addmm_bf16():
        gw.addmm_(buf.t(), hc)

    rows["logits = h_c W^T (mm out=)"] = (logits_mm, gemm_flops, gemm_bytes)
    logits_mm()
    rows["CE kernel in place"] = (ce_kernel, 0, 2 * c * vocab * 2)
    rows["dh = g W (mm out=)"] = (dh_mm, gemm_flops, gemm_bytes)
    rows["dW += g^T h_c (addmm_ bf16)"] = (dw_addmm_bf16, gemm_flops, 2 * vocab * hidden_size * 2)
    log(f"   chunk {c} tokens (logits {c * vocab * 2 / 2**20:.0f} MiB):")
    for name, (fn, flops, nbytes) in rows.items():
        try:
            fn()
            ms = bench_ms(fn)
            tf = flops / ms / 1e9 if ms and flops else 0.0
            gbs = nbytes / ms / 1e6 if ms else 0.0
            log(f"      {name:44s} {ms:8.4f} ms  {tf:6.0f} TFLOP/s  {gbs:6.0f} GB/s (min bytes)")
        except Exception as e:  # noqa: BLE001
            log(f"      {name:44s} ERROR {type(e).__name__}: {str(e)[:200]}")


def flce_variants(chunks: tuple[int, ...]) -> dict:
    out = {}
    for c in chunks:
        fn = lambda h, w, t, c=c: fused_linear_cross_entropy(h, w, t, chunk_size=c)  # noqa: E731
        out[f"chunk {c}"] = (fn, {})
    if not chunks or not GPU:
        out["default chunk"] = (fused_linear_cross_entropy, {})
        # the two-pass loop whatever the headroom (the default picks a token loop below an earlier peak)
        two_pass = lambda h, w, t: fused_linear_cross_entropy(h, w, t, max_chunk_bytes=32 * 2**20)  # noqa: E731
        out["two-pass, 32 MiB slices"] = (two_pass, {})
        out["liger_kernel"] = (liger_kernel_fn("fused_linear_cross_entropy"), {})
    return out


def host_time(op: str, shape: dict, variants: dict, n: int = 200 if GPU else 1) -> None:
    """Host µs per fwd and fwd+bwd call at a tiny shape (the GPU waits for the host there)."""
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
                        sync()
                        t0 = time.perf_counter()
                        for _ in range(n):
                            step()
                            for t in run.diff_tensors:
                                t.grad = None
                        sync()
                        samples.append((time.perf_counter() - t0) / n * 1e6)
                    cells.append(f"{mode} {sorted(samples)[2]:6.1f}")
                log(f"   {name:40s} {' | '.join(cells)}")
        except Exception as e:  # noqa: BLE001
            log(f"   {name:40s} ERROR {type(e).__name__}: {str(e)[:200]}")


def profile(op: str, shape: dict, variants: dict) -> None:
    """GPU kernels of one fwd+bwd (after warm-up): name, count, total µs."""
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
                for _ in range(2):
                    step()
                    for t in run.diff_tensors:
                        t.grad = None
                sync()
                with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                    t0 = time.perf_counter()
                    step()
                    sync()
                    wall = (time.perf_counter() - t0) * 1e3
                kernels: dict[str, tuple[int, float]] = {}
                for ev in prof.events():
                    if ev.device_type.name == "CUDA":
                        c, t = kernels.get(ev.name, (0, 0.0))
                        kernels[ev.name] = (c + 1, t + ev.device_time_total)
                total = sum(t for _, t in kernels.values())
                parts = ", ".join(
                    f"{k[:60]} x{c} {t:.0f}"
                    for k, (c, t) in sorted(kernels.items(), key=lambda x: -x[1][1])[:8]
                )
                log(f"   {name:30s} kernels {total / 1e3:7.2f} ms (wall {wall:.2f} ms): {parts}")
                for t in run.diff_tensors:
                    t.grad = None
                del run
        except Exception as e:  # noqa: BLE001
            log(f"   {name:30s} ERROR {type(e).__name__}: {str(e)[:200]}")
        harness_correctness.free_memory()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="kernel,ce,ce32,parts,flce,profile")
    parser.add_argument("--flce-chunks", default="256,512,1024")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    harness_interpreter.prepare_triton()
    timing = harness_timing.QUICK if args.quick else harness_timing.Timing()
    ce_shape = {"N": 8192, "V": 128256}
    flce_shape = {"BT": 8192, "H": 4096, "V": 128256}
    chunks = tuple(int(c) for c in args.flce_chunks.split(","))
    part_chunks = (256, 512)
    if not GPU:  # smoke test
        ce_shape, flce_shape = {"N": 7, "V": 1031}, {"BT": 13, "H": 16, "V": 301}
        chunks, part_chunks = (4, 8), (4,)
    log(f"device {DEVICE} ({torch.cuda.get_device_name() if GPU else 'cpu'}), torch {torch.__version__}")
    sections = [
        ("kernel", lambda: kernel_sweep(ce_shape["N"], ce_shape["V"], torch.bfloat16)),
        ("ce", lambda: measure("cross_entropy", ce_shape, torch.bfloat16, ce_variants(), timing)),
        ("ce32", lambda: measure("cross_entropy", ce_shape, torch.float32, ce32_variants(), timing)),
        ("ce32acc", lambda: ce32_accuracy(*((4096, 128256) if GPU else (37, 131)))),
        ("parts", lambda: flce_parts(flce_shape["BT"], flce_shape["H"], flce_shape["V"], part_chunks)),
        (
            "flce",
            lambda: measure(
                "fused_linear_cross_entropy", flce_shape, torch.bfloat16, flce_variants(chunks), timing
            ),
        ),
        (
            "profile",
            lambda: profile(
                "fused_linear_cross_entropy",
                flce_shape,
                {k: v for k, v in flce_variants(()).items() if "check_targets" not in k},
            ),
        ),
        (
            "profile",
            lambda: profile(
                "cross_entropy",
                ce_shape,
                {k: v for k, v in ce_variants().items() if k.startswith(("in place (", "liger"))},
            ),
        ),
        ("host", lambda: host_time("cross_entropy", {"N": 16, "V": 256}, ce_variants())),
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

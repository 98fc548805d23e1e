"""RMSNorm / LayerNorm variants in one GPU call (issue 7 method: predict, change, measure).

    PYTHONPATH=.:/tmp/site python benchmarks/variants_norm.py [--quick]

Sections (each printed as it is measured; the last lines are a summary):
- ``kernels``: the launchers alone (``_*_fwd_impl`` / ``_*_bwd_impl``, no autograd), timed with
  ``triton.testing.do_bench`` (L2 flush, median) for each knob setting of ``liger_core.ops._launch``
  (NORM_BWD_PROGRAMS_PER_SM, NORM_BWD_ELEMENTS_PER_THREAD, NORM_BWD_PREFETCH, NORM_FWD_ELEMENTS_PER_THREAD,
  NORM_TILE_ELEMENTS) at 16384x4096, 4096x4096 and 16384x8192 bf16; every variant is first checked against
  a float64 reference of the same inputs (relative error of y, dx, dw, db), then timed. One launch costs the
  host far less than these kernels take, so this is GPU time.
- ``regs``: registers / spills of each compiled norm kernel (from the compiled kernel objects).
- ``ops``: the whole op (autograd, as the suite times it) at 16384x4096: ours (direct launch and through
  the custom-op dispatcher) beside liger-kernel, with the suite's checks.
- ``profile``: the GPU kernels of one fwd+bwd, ours and liger-kernel's.
On CPU (no GPU) it only smoke-tests the checks at a tiny shape in the Triton interpreter.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton.testing  # noqa: E402
import variants_glu_rope as vr  # noqa: E402

from liger_core import dispatch  # noqa: E402
from liger_core.harness import providers as harness_providers  # noqa: E402
from liger_core.harness import registry as harness_registry  # noqa: E402
from liger_core.harness import timing as harness_timing  # noqa: E402
from liger_core.ops import _launch  # noqa: E402

ln = sys.modules["liger_core.ops.layer_norm"]
rms = sys.modules["liger_core.ops.rms_norm"]
DEVICE = vr.DEVICE
log = vr.log
SUMMARY: list[str] = []
ONLY_VARIANTS: list[str] = []  # --variants: name prefixes to run
GRAPH = False  # --graph: time the launchers as CUDA-graph replays


def _wide(per_thread: int, reload: bool) -> dict:
    """Knobs giving both norms' wide-row backward tiles (8192 and 16384 columns) one setting."""
    table = {8192: (per_thread, reload), 16384: (per_thread, reload)}
    return {"NORM_BWD_WIDE_RMS_NORM": table, "NORM_BWD_WIDE_LAYER_NORM": table}


BWD_VARIANTS = {  # name -> _launch knobs
    "P2 E8 pf (current)": {},
    "P1 E8 pf": {"NORM_BWD_PROGRAMS_PER_SM": 1},
    "P4 E8 pf": {"NORM_BWD_PROGRAMS_PER_SM": 4},
    "P2 E16 pf": {"NORM_BWD_ELEMENTS_PER_THREAD": 16},
    "P1 E16 pf": {"NORM_BWD_PROGRAMS_PER_SM": 1, "NORM_BWD_ELEMENTS_PER_THREAD": 16},
    "P2 E8 nopf": {"NORM_BWD_PREFETCH": False},
    "P1 E16 nopf (liger-like)": {
        "NORM_BWD_PROGRAMS_PER_SM": 1,
        "NORM_BWD_ELEMENTS_PER_THREAD": 16,
        "NORM_BWD_PREFETCH": False,
    },
    "P2 E16 nopf": {"NORM_BWD_ELEMENTS_PER_THREAD": 16, "NORM_BWD_PREFETCH": False},
    "P4 E16 nopf": {
        "NORM_BWD_PROGRAMS_PER_SM": 4,
        "NORM_BWD_ELEMENTS_PER_THREAD": 16,
        "NORM_BWD_PREFETCH": False,
    },
    "P2 E4 pf": {"NORM_BWD_ELEMENTS_PER_THREAD": 4},
    # long rows (hidden 16384, the sweep's losers): one pass over a register-resident row (spilling) against
    # the chunked two-pass loop, and wider column chunks
    "fused16384": {"NORM_BWD_FUSED_MAX_COLS": 16384},
    "fused16384 E32": {"NORM_BWD_FUSED_MAX_COLS": 16384, "NORM_BWD_ELEMENTS_PER_THREAD": 32},
    # session 9: backward of wide rows (one row per tile above NORM_TILE_ELEMENTS): (elements per thread,
    # re-load after the reductions) per padded width, both ops alike; "held E16 P2" is session 5's setting
    "wide (current)": {},
    "wide held E16 P2": {**_wide(16, False), "NORM_BWD_WIDE_PROGRAMS_PER_SM": 2},
    "wide held E16": _wide(16, False),
    "wide held E32": _wide(32, False),
    "wide reload E16": _wide(16, True),
    "wide reload E32": _wide(32, True),
    "chunk8192": {"NORM_CHUNK_COLS": 8192},
    "chunk2048": {"NORM_CHUNK_COLS": 2048},
    # LayerNorm backward occupancy (its kernel holds ~166 registers a thread at 16 elements: 8 warps per SM);
    # measured at 16384x4096: 1 program/SM with 2-row tiles 0.161 ms, 1-row tiles 0.183, 2 programs/SM with
    # 8 elements a thread 0.201, 3 programs 0.217, without prefetch 0.203
    "LN-tile8192 (current)": {},
    "LN-tile4096": {"NORM_BWD_TILE_ELEMENTS_LAYER_NORM": 4096},
    "LN-tile16384": {"NORM_BWD_TILE_ELEMENTS_LAYER_NORM": 16384},
    "LN-tile8192 P2": {"NORM_BWD_PROGRAMS_PER_SM_LAYER_NORM": 2},
    "RMS-tile8192": {"NORM_TILE_ELEMENTS": 8192},
    # session 11, LayerNorm at hidden 1024 (65536 x 1024: torch.compile 4.7 % faster in the sweep): its
    # backward runs 4-row tiles at 8 warps, one program per SM (the 4096-column register budget); more warps
    "LN1k E8": {"NORM_BWD_ELEMENTS_PER_THREAD": 8},
    "LN1k E8 P2": {"NORM_BWD_ELEMENTS_PER_THREAD": 8, "NORM_BWD_PROGRAMS_PER_SM_LAYER_NORM": 2},
    "LN1k E4 P2": {"NORM_BWD_ELEMENTS_PER_THREAD": 4, "NORM_BWD_PROGRAMS_PER_SM_LAYER_NORM": 2},
    "LN1k P2": {"NORM_BWD_PROGRAMS_PER_SM_LAYER_NORM": 2},
    "LN1k P3": {"NORM_BWD_PROGRAMS_PER_SM_LAYER_NORM": 3},
    "LN1k nopf P2": {"NORM_BWD_PREFETCH": False, "NORM_BWD_PROGRAMS_PER_SM_LAYER_NORM": 2},
    "LN1k tile8192": {"NORM_TILE_ELEMENTS": 8192},
    "LN1k tile2048": {"NORM_TILE_ELEMENTS": 2048},
    # session 12: LayerNorm backward, dW/dB summed per tile into one accumulator row (torch.compile's
    # structure at 65536 x 1024: ~2048 programs of 32 rows, one accumulator row each); programs per SM,
    # prefetch, tile elements (default 4096), warps (default 8); "TS P8 nopf tile1024 W4" is the setting
    # taken for 1024 columns (`_launch.NORM_BWD_TILE_SUM_*`)
    **{
        " ".join(
            ["TS", f"P{per_sm}"]
            + ["nopf"] * (not pf)
            + [f"tile{tile}"] * bool(tile)
            + [f"W{warps}"] * bool(warps)
        ): {
            "NORM_BWD_TILE_SUM_LAYER_NORM": (1024, 2048, 4096),
            "NORM_BWD_TILE_SUM_PROGRAMS_PER_SM": per_sm,
            "NORM_BWD_TILE_SUM_PREFETCH": pf,
            "NORM_BWD_TILE_SUM_WARPS": warps or 8,
            "NORM_BWD_TILE_SUM_TILE_ELEMENTS": tile or 4096,
        }
        for per_sm, pf, tile, warps in (
            (1, True, 0, 0),
            (2, True, 0, 0),
            (4, True, 0, 0),
            (8, True, 0, 0),
            (16, True, 0, 0),
            (2, False, 0, 0),
            (4, False, 0, 0),
            (8, False, 0, 0),
            (16, False, 0, 0),
            (4, True, 0, 4),
            (8, False, 0, 4),
            (16, False, 0, 4),
            (8, True, 2048, 0),
            (16, False, 2048, 0),
            (16, False, 1024, 4),
            (32, False, 1024, 4),
            (8, True, 8192, 0),
            (4, True, 8192, 0),
            (8, False, 1024, 4),
            (16, True, 1024, 4),
            (8, True, 1024, 4),
            (16, True, 2048, 4),
            (8, False, 2048, 4),
        )
    },
}
FWD_VARIANTS = {
    "E16 tile4096 (current)": {},
    "E8 tile4096": {"NORM_FWD_ELEMENTS_PER_THREAD": 8},
    "E32 tile4096": {"NORM_FWD_ELEMENTS_PER_THREAD": 32},
    "E16 tile8192": {"NORM_TILE_ELEMENTS": 8192},
    "E8 tile8192": {"NORM_TILE_ELEMENTS": 8192, "NORM_FWD_ELEMENTS_PER_THREAD": 8},
    "fwd chunked above 8192": {"NORM_FUSED_MAX_COLS": 8192},
    "fwd E32": {"NORM_FWD_ELEMENTS_PER_THREAD": 32},
    "LN1k fwd E8": {"NORM_FWD_ELEMENTS_PER_THREAD": 8},
    "LN1k fwd E4": {"NORM_FWD_ELEMENTS_PER_THREAD": 4},
    "LN1k fwd tile8192": {"NORM_TILE_ELEMENTS": 8192},
    "LN1k fwd tile2048": {"NORM_TILE_ELEMENTS": 2048},
}


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def make_inputs(op: str, m: int, n: int):
    x = torch.randn(m, n, device=DEVICE, dtype=torch.bfloat16)
    w = (1.0 + 0.1 * torch.randn(n, device=DEVICE)).to(torch.bfloat16)
    b = (0.1 * torch.randn(n, device=DEVICE)).to(torch.bfloat16) if op == "layer_norm" else None
    dy = torch.randn(m, n, device=DEVICE, dtype=torch.bfloat16)
    return x, w, b, dy


def reference(op: str, x, w, b, dy):
    """float64 (y, dx, dw, db) of the same bf16 inputs."""
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    bd = b.double().requires_grad_() if b is not None else None
    if op == "rms_norm":
        y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
        y = y.to(torch.bfloat16).double() * wd  # llama rounding of xn (as our kernel, casting_mode="llama")
        # gradient of the unrounded path (what every kernel computes)
        yg = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * wd
        yg.backward(dy.double())
        return y.detach(), xd.grad, wd.grad, None
    y = torch.nn.functional.layer_norm(xd, (x.shape[-1],), wd, bd, 1e-5)
    y.backward(dy.double())
    return y.detach(), xd.grad, wd.grad, bd.grad


def launch(op: str, x, w, b, dy):
    """(fwd, bwd) closures over the launchers alone, and a function returning (y, dx, dw, db)."""
    if op == "rms_norm":
        y, rstd = rms._rms_norm_fwd_impl(x, w, 1e-6, 0.0, "llama")

        def fwd():
            rms._rms_norm_fwd_impl(x, w, 1e-6, 0.0, "llama")

        def bwd():
            rms._rms_norm_bwd_impl(dy, x, w, rstd, 0.0)

        def outputs():
            y, rstd2 = rms._rms_norm_fwd_impl(x, w, 1e-6, 0.0, "llama")
            dx, dw = rms._rms_norm_bwd_impl(dy, x, w, rstd2, 0.0)
            return y, dx, dw, None

        return fwd, bwd, outputs
    y, mean, rstd = ln._layer_norm_fwd_impl(x, w, b, 1e-5)

    def fwd():
        ln._layer_norm_fwd_impl(x, w, b, 1e-5)

    def bwd():
        ln._layer_norm_bwd_impl(dy, x, w, mean, rstd, True)

    def outputs():
        y, mean2, rstd2 = ln._layer_norm_fwd_impl(x, w, b, 1e-5)
        dx, dw, db = ln._layer_norm_bwd_impl(dy, x, w, mean2, rstd2, True)
        return y, dx, dw, db

    return fwd, bwd, outputs


def kernels(shapes, quick: bool, norm_ops=("rms_norm", "layer_norm")) -> None:
    rep = 40 if quick else 100
    for op in norm_ops:
        for m, n in shapes:
            x, w, b, dy = make_inputs(op, m, n)
            ref = reference(op, x, w, b, dy)
            floor_ms = {"fwd": 4 * m * n / 3e9, "bwd": 6 * m * n / 3e9}  # bf16 bytes / 3 TB/s
            floors = f"floor fwd {floor_ms['fwd']:.4f}, bwd {floor_ms['bwd']:.4f} ms"
            log(f"-- kernels {op} {m}x{n} bf16 ({floors})")
            for kind, variants in (("fwd", FWD_VARIANTS), ("bwd", BWD_VARIANTS)):
                for name, knob in variants.items():
                    if ONLY_VARIANTS and not any(name.startswith(v) for v in ONLY_VARIANTS):
                        continue
                    try:
                        with vr.knobs(_launch, **knob):
                            fwd, bwd, outputs = launch(op, x, w, b, dy)
                            got = outputs()
                            errs = [rel(g, r) for g, r in zip(got, ref) if r is not None]
                            bad = any(not (e < 2e-2) for e in errs)  # bf16 outputs: ~3e-3
                            fn = fwd if kind == "fwd" else bwd
                            if DEVICE.type == "cuda" and GRAPH:
                                # GPU time alone: the launcher's work (allocations, 4-5 launches) replayed
                                # from a CUDA graph, no host gaps (and no L2 flush)
                                ms = triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")
                            elif DEVICE.type == "cuda":
                                ms = triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")
                            else:
                                fn()
                                ms = float("nan")
                            s = _launch.norm_settings(
                                n, backward=kind == "bwd", layer_norm=op == "layer_norm"
                            )
                            line = (
                                f"   {kind} {name:26s} {ms:.4f} ms ({100 * floor_ms[kind] / ms:3.0f}%) "
                                f"warps {s.num_warps} bm {s.block_m} | err "
                                + " ".join(f"{e:.1e}" for e in errs)
                                + (" BAD" if bad else "")
                            )
                            log(line)
                            SUMMARY.append(f"{op} {m}x{n} {line.strip()}")
                    except Exception as e:  # noqa: BLE001
                        log(f"   {kind} {name:26s} ERROR {type(e).__name__}: {str(e)[:300]}")
                        traceback.print_exc()
            del x, w, b, dy, ref
            if DEVICE.type == "cuda":
                torch.cuda.empty_cache()


def regs() -> None:
    log("-- registers / spills of compiled norm kernels")
    kernels = (
        (rms, ("_rms_norm_fwd_kernel", "_rms_norm_bwd_kernel")),
        (ln, ("_layer_norm_fwd_kernel", "_layer_norm_bwd_kernel")),
    )
    for mod, names in kernels:
        for name in names:
            kernel = getattr(mod, name)
            cache = getattr(kernel, "device_caches", None)
            try:
                entries = []
                for dev_cache in (cache or {}).values():
                    entries.extend(dev_cache[0].values())
                for ck in entries:
                    if hasattr(ck, "_init_handles"):
                        ck._init_handles()
                    c = ck.metadata
                    log(
                        f"   {name} warps {c.num_warps} regs {ck.n_regs} spills {ck.n_spills} smem {c.shared}"
                    )
            except Exception as e:  # noqa: BLE001
                log(f"   {name} ERROR {type(e).__name__}: {str(e)[:200]}")


def ops(quick: bool, norm_ops=("rms_norm", "layer_norm"), shapes=((16384, 4096),)) -> None:
    timing = harness_timing.QUICK if quick else harness_timing.Timing()
    for op in norm_ops:
        for m, n in shapes:
            shape = {"M": m, "N": n} if DEVICE.type == "cuda" else {"M": 37, "N": 123}
            ours = harness_providers.provider_fn(harness_registry.OPS[op], "liger_core")[0]
            variants = {
                "liger_core (direct launch)": (ours, {}),
                "liger_core (custom-op dispatch)": (ours, {dispatch: {"EAGER_VIA_CUSTOM_OPS": True}}),
                "liger_kernel": (vr.liger_kernel_fn(op), {}),
            }
            vr.measure(op, shape, variants, timing)
            if DEVICE.type == "cuda":
                profiled = {k: v for k, v in variants.items() if "dispatch" not in k}
                vr.profile(op, shape, profiled, repeat=5)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="kernels,regs,ops")
    parser.add_argument("--graph", action="store_true", help="kernels: CUDA-graph replay timing (GPU time)")
    parser.add_argument("--variants", default="", help="kernels: comma-separated variant name prefixes")
    parser.add_argument("--shapes", default="", help="kernels: e.g. 16384x16384,4093x16384 (rows x hidden)")
    parser.add_argument("--ops", default="rms_norm,layer_norm", help="which norms (kernels and ops sections)")
    parser.add_argument("--ops-shapes", default="16384x4096", help="ops section: rows x hidden")
    args = parser.parse_args()
    global GRAPH
    GRAPH = args.graph
    ONLY_VARIANTS.extend(v for v in args.variants.split(",") if v)
    sections = set(args.only.split(","))
    shapes = [(16384, 4096), (4096, 4096), (16384, 8192)] if DEVICE.type == "cuda" else [(5, 257)]
    if args.shapes and DEVICE.type == "cuda":
        shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    norm_ops = tuple(args.ops.split(","))
    if "kernels" in sections:
        kernels(shapes, args.quick, norm_ops)
    if "regs" in sections and DEVICE.type == "cuda":
        regs()
    if "ops" in sections:
        op_shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.ops_shapes.split(",")]
        ops(args.quick, norm_ops, op_shapes)
    print("\n==== summary (kernel ms, % of floor) ====")
    for line in SUMMARY:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

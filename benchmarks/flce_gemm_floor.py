"""The GEMMs alone of fused linear cross-entropy's exact orders, timed as full-size cuBLAS calls: a lower
bound on any exact implementation that runs those FLOPs, beside the op and torch.compile in the same run.

    PYTHONPATH=. python benchmarks/flce_gemm_floor.py [--bt 8192 4096] [--hidden 4096] [--vocab 128256]
        [--rounds 3]

Orders (bf16, T tokens, hidden H, vocabulary V; one "GEMM" = 2 T H V FLOPs):
  every logit  logits = h W^T, dh = dlogits W, dW = dlogits^T h: 3 GEMMs (6 BT H V), T x V logits in memory
               (2 GiB at 8192 x 128256: torch.compile's order)
  kept K       liger_core's exact order within dW's storage (K = min(T, H) tokens kept vocabulary-major in
               dW's storage, the other T - K recomputed in pass 2): 3 + (T - K) / T GEMMs (7 BT H V at 8192
               x 4096)
Each order's GEMMs run back to back as single calls at their full shapes (the op runs them by chunks and
slices), on random inputs, under ``triton.testing.do_bench`` (median, L2 flushed). The op (default loop,
``USE_HEADROOM=False`` as in the suite) and torch.compile's ``F.linear`` + ``F.cross_entropy`` take fwd+bwd
in the same process, all interleaved over ``--rounds`` rounds (the median round is reported). On CPU: a
smoke run at tiny shapes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import liger_core.ops  # noqa: E402,F401
from liger_core import tuning  # noqa: E402
from liger_core.ops import fused_linear_cross_entropy  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")
FLCE = sys.modules["liger_core.ops.fused_linear_cross_entropy"]


def bench_ms(fn) -> float:
    if not GPU:
        fn()
        return float("nan")
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=50, rep=400, return_mode="median"))


def gemm_orders(t: int, h: int, v: int) -> dict[str, tuple[float, float]]:
    """{order: (GEMM count in units of 2 T H V FLOPs, median ms of its GEMMs back to back)}."""
    dt = torch.bfloat16
    hid = torch.randn(t, h, dtype=dt, device=DEVICE)
    w = torch.randn(v, h, dtype=dt, device=DEVICE) * 0.02
    logits = torch.empty(t, v, dtype=dt, device=DEVICE)
    dh = torch.empty(t, h, dtype=dt, device=DEVICE)
    dw = torch.empty(v, h, dtype=dt, device=DEVICE)
    kept = min(t, h)
    rest = t - kept

    def every_logit():
        torch.mm(hid, w.t(), out=logits)
        torch.mm(logits, w, out=dh)
        torch.mm(logits.t(), hid, out=dw)

    def kept_order():
        torch.mm(hid, w.t(), out=logits)  # pass 1: every token's logits once (token- or vocabulary-major)
        torch.mm(logits, w, out=dh)
        if rest:  # pass 2: the other tokens' logits again
            torch.mm(hid[:rest], w.t(), out=logits[:rest])
        torch.mm(logits.t(), hid, out=dw)

    return {
        "every logit (3 GEMMs)": (3.0, bench_ms(every_logit)),
        f"kept {kept} ({3 + rest / t:.2f} GEMMs)": (3 + rest / t, bench_ms(kept_order)),
    }


def fwd_bwd_ms(fn, t: int, h: int, v: int) -> float:
    dt = torch.bfloat16
    hid = torch.randn(t, h, dtype=dt, device=DEVICE).requires_grad_()
    w = (torch.randn(v, h, dtype=dt, device=DEVICE) * 0.02).requires_grad_()
    target = torch.randint(0, v, (t,), device=DEVICE)

    def step():
        hid.grad = w.grad = None
        fn(hid, w, target).backward()

    return bench_ms(step)


def eager(h, w, t):
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w).float(), t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bt", type=int, nargs="+", default=[8192, 4096] if GPU else [37])
    ap.add_argument("--hidden", type=int, default=4096 if GPU else 64)
    ap.add_argument("--vocab", type=int, default=128256 if GPU else 1031)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median round is reported")
    args = ap.parse_args()
    tuning.USE_HEADROOM = False
    compiled = torch.compile(eager)
    print(f"device: {torch.cuda.get_device_name() if GPU else 'cpu'}, torch {torch.__version__}")
    print(f"{'tokens':>7} {'what':<34} {'GEMMs':>6} {'ms':>8} {'TFLOP/s':>8}  rounds")
    for t in args.bt:
        unit = 2 * t * args.hidden * args.vocab  # FLOPs of one GEMM
        times: dict[str, list[float]] = {}
        counts: dict[str, float] = {}
        for _ in range(args.rounds):  # interleaved: the clock drifts with power and heat between rounds
            for name, (count, ms) in gemm_orders(t, args.hidden, args.vocab).items():
                times.setdefault(name, []).append(ms)
                counts[name] = count
            for name, fn in (("liger_core fwd+bwd", fused_linear_cross_entropy), ("torch.compile", compiled)):
                if GPU:
                    torch.cuda.empty_cache()
                times.setdefault(name, []).append(fwd_bwd_ms(fn, t, args.hidden, args.vocab))
            if GPU:
                torch.cuda.empty_cache()
        for name, ms_list in times.items():
            ms = sorted(ms_list)[len(ms_list) // 2]
            rounds = " ".join(f"{x:.2f}" for x in ms_list)
            if name in counts:
                rate = counts[name] * unit / ms / 1e9
                print(f"{t:>7} {name:<34} {counts[name]:>6.2f} {ms:>8.3f} {rate:>8.1f}  {rounds}")
            else:
                print(f"{t:>7} {name:<34} {'':>6} {ms:>8.3f} {'':>8}  {rounds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

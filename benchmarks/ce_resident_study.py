"""The row-resident cross-entropy kernel (Gluon, ``liger_core/ops/_cross_entropy_resident.py``) beside the
streaming kernel, in one GPU call (issue 7, CE row).

    PYTHONPATH=. python benchmarks/ce_resident_study.py [--shapes 8192x128256,8192x32000] [--warps 8,16]

For each shape (bf16): the kernel alone (``launch_cross_entropy`` into a separate gradient buffer, mean
reduction) with ``CE_RESIDENT`` off and on, each checked against float64 first (per-row loss and gradient,
relative error), then timed with ``triton.testing.do_bench`` (L2 flushed before each run); then the op's
fwd+bwd in place (``cross_entropy(..., inplace_backward=True)`` and ``.backward()``, as the suite times it),
GPU time replayed as a CUDA graph. ``--warps`` also times the resident kernel with other warp counts
(``NUM_WARPS``). Floor: one read + one write of the logits at 3.0 TB/s. No GPU: prints why and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import liger_core.ops  # noqa: E402,F401
from liger_core import tuning  # noqa: E402

ce_mod = sys.modules["liger_core.ops.cross_entropy"]
cross_entropy = ce_mod.cross_entropy
resident = sys.modules["liger_core.ops._cross_entropy_resident"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


def graph_ms(fn, reps: int = 20) -> float:
    """Median GPU time of ``fn`` replayed from a CUDA graph (no host time), 5 trials of ``reps`` replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return sorted(times)[2]


def study_shape(n: int, v: int, warps: list[int]) -> None:
    import triton.testing

    shape = f"{n}x{v}"
    floor = 2 * n * v * 2 / 3.0e12 * 1e3
    x = (torch.randn(n, v, device="cuda") * 2).to(torch.bfloat16)
    t = torch.randint(0, v, (n,), device="cuda")
    t[::97] = -100  # a few ignored rows (they skip the read: many would flatter the time)
    xr = x.double().requires_grad_(True)
    ref_rows = torch.nn.functional.cross_entropy(xr, t, reduction="none")
    (ref_rows.sum() / (t != -100).sum()).backward()  # mean over the kept rows, as the kernel
    ref_grad = xr.grad
    del xr
    g = torch.empty_like(x)
    loss = torch.empty(n, dtype=torch.float64, device="cuda")
    z = torch.empty_like(loss)
    stats = ce_mod.target_stats(t, None, -100, v)

    def kernel():
        ce_mod.launch_cross_entropy(
            x, t, None, g, loss, z, stats, ignore_index=-100, mean=True, label_smoothing=0.0,
            lse_square_scale=0.0, softcap=None,
        )  # fmt: skip

    variants = [("streaming kernel", False, None)]
    variants += [(f"resident kernel, {w} warps", True, w) for w in warps]
    for name, on, num_warps in variants:
        tuning.CE_RESIDENT, resident.NUM_WARPS = on, num_warps
        try:
            g.fill_(float("nan"))
            loss.fill_(float("nan"))
            kernel()
            torch.cuda.synchronize()
            errors = f"{rel(loss, ref_rows):9.2e} {rel(g, ref_grad):9.2e}"
            ms = float(triton.testing.do_bench(kernel, warmup=25, rep=200, return_mode="median"))
            print(f"{shape:>14s} {name:26s} {ms:8.4f} {100 * floor / ms:6.1f}% {errors}")
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{shape:>14s} {name:26s} ERROR {type(e).__name__}: {str(e)[:300]}")
    resident.NUM_WARPS = None
    for name, on in (("op fwd+bwd, streaming", False), ("op fwd+bwd, resident", True)):
        tuning.CE_RESIDENT = on
        work = x.clone().requires_grad_(True)

        def op(work=work):
            torch.autograd.grad(cross_entropy(work, t, inplace_backward=True), work)

        try:
            ms = graph_ms(op)
            print(f"{shape:>14s} {name:26s} {ms:8.4f} {100 * floor / ms:6.1f}%   (GPU time, CUDA graph)")
        except Exception as e:  # noqa: BLE001
            print(f"{shape:>14s} {name:26s} ERROR {type(e).__name__}: {str(e)[:300]}")
    tuning.CE_RESIDENT = True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x128256,8192x32000,4093x131072,2048x65536")
    ap.add_argument("--warps", default="8,16")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("ce_resident_study: no CUDA GPU here; nothing to measure")
        return 0

    print(f"resident kernel available: {resident.RESIDENT_AVAILABLE}; {torch.cuda.get_device_name()}")
    print(f"{'shape':>14s} {'variant':26s} {'ms':>8s} {'floor%':>7s} {'loss err':>9s} {'grad err':>9s}")
    warps = [int(s) for s in args.warps.split(",")]
    for shape in args.shapes.split(","):
        n, v = (int(s) for s in shape.split("x"))
        study_shape(n, v, warps)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

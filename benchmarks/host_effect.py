"""How steady is the lent machine's host? The same eager fwd+bwd timed again and again in one process.

    PYTHONPATH=.:/tmp/liger_peer_site python benchmarks/host_effect.py

The suite times the norms' fwd+bwd at 0.5-0.6 ms while ``host_floor.py`` timed the same code at 0.25 ms on the
same lease minutes earlier. Suspects: something the suite's process does (imports of liger-kernel and
transformers, torch.compile and its worker pool, a large float64 allocation, the cyclic GC over many objects).
Each is applied in turn and the same two steps are timed after it: ``do_bench`` (ms) and the host's own time
per call (a loop of 300 calls without synchronising: µs/call). If the host's speed moves as much between two
identical measurements as after any change, the suite's fwd+bwd number for these ops measures the machine's
host at that moment, and only the GPU time (CUDA-graph replay, the suite's ``gpu_ms``) describes the kernels.
"""

from __future__ import annotations

import cProfile
import gc
import os
import pstats
import sys
import threading
import time
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from liger_core.ops import layer_norm, rms_norm  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("host_effect: no GPU, nothing to time")
        return 0
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    steps = {
        "layer_norm": lambda: torch.autograd.backward(layer_norm(x, w, b, 1e-5), dy),
        "rms_norm": lambda: torch.autograd.backward(rms_norm(x, w, 1e-6), dy),
    }

    def host_us(fn, n: int = 300) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - start) / n * 1e6
        torch.cuda.synchronize()
        return host

    def measure(label: str) -> None:
        for name, fn in steps.items():
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=[x, w, b])
            print(
                f"{label:36s} {name:11s} do_bench {ms:.4f} ms  host {host_us(fn):6.1f} µs/call  "
                f"gc objects {len(gc.get_objects())}",
                flush=True,
            )

    cpu = os.popen("grep -m1 'model name' /proc/cpuinfo").read().strip()
    print(f"{cpu}; load {os.getloadavg()}; {os.cpu_count()} CPUs")
    measure("fresh")
    measure("fresh, again")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(200):
        steps["layer_norm"]()
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    try:
        import liger_kernel.transformers.functional  # noqa: F401

        measure("after importing liger_kernel")
    except ImportError:
        print("(liger-kernel not importable)")
    big = torch.randn(16384, 4096, device="cuda", dtype=torch.float64)
    del big
    measure("after a float64 allocation")
    compiled = torch.compile(
        lambda a, ww, bb: torch.nn.functional.layer_norm(a, (4096,), ww, bb, 1e-5), dynamic=False
    )
    torch.autograd.backward(compiled(x, w, b), dy)
    torch.cuda.synchronize()
    measure("after torch.compile fwd+bwd")
    torch._dynamo.reset()
    measure("after torch._dynamo.reset()")
    gc.collect()
    gc.freeze()
    measure("after gc.freeze()")
    gc.unfreeze()
    measure("again")
    print("threads:", [t.name for t in threading.enumerate()], "load", os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())

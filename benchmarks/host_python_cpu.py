"""Host (Python, autograd, allocation) time of each small op's fwd+bwd, on CPU with the launches stubbed.

    python benchmarks/host_python_cpu.py            # on any machine; no GPU needed

The norms' and RoPE's fwd+bwd on the lent H100 is bound by the host, not the GPU (benchmarks/NOTES.md), and
that host's speed is erratic, so host work is trimmed and compared here, on a CPU: Triton's interpreter is
enabled so the ops take their kernel path with CPU tensors, and every ``fast_launch`` kernel launch is
replaced by a no-op, leaving exactly the Python an eager call runs around its launches. Rows: an
autograd.Function that does nothing (the floor of any such op), ``host_floor.py``'s skeleton (RMSNorm's
allocations, three stubbed launches), and the ops at tiny shapes. Median of 7 x 3000 calls, µs per fwd+bwd.
Compare rows of one run only (machine load moves all of them).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the ops' kernel path on CPU tensors
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import liger_core.ops as ops  # noqa: E402
from liger_core.ops import _fastlaunch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_floor import _Identity, _Skeleton  # noqa: E402  (the same two floors the GPU script times)

_fastlaunch.FastKernel.__getitem__ = lambda self, grid: lambda *args, **kwargs: None  # launches: no-ops


def _us_per_call(step, n: int = 3000, reps: int = 7) -> float:
    for _ in range(300):
        step()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(n):
            step()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(samples)


def main() -> int:
    torch.manual_seed(0)
    x = torch.randn(16, 4096, requires_grad=True)
    w = torch.randn(4096, requires_grad=True)
    b = torch.randn(4096, requires_grad=True)
    dy = torch.randn(16, 4096)
    q = torch.randn(1, 16, 32, 128).transpose(1, 2).requires_grad_()  # HF layout (B, H, T, D) views
    k = torch.randn(1, 16, 8, 128).transpose(1, 2).requires_grad_()
    cos, sin = torch.randn(1, 16, 128), torch.randn(1, 16, 128)
    dq, dk = torch.randn(1, 16, 32, 128).transpose(1, 2), torch.randn(1, 16, 8, 128).transpose(1, 2)
    a, g = torch.randn(16, 1024, requires_grad=True), torch.randn(16, 1024, requires_grad=True)
    da = torch.randn(16, 1024)
    cases = {
        "no-op autograd.Function": lambda: torch.autograd.backward(_Identity.apply(x, w), dy),
        "skeleton (4 allocations, 3 launches)": lambda: torch.autograd.backward(_Skeleton.apply(x, w), dy),
        "rms_norm 16x4096": lambda: torch.autograd.backward(ops.rms_norm(x, w, 1e-6), dy),
        "layer_norm 16x4096": lambda: torch.autograd.backward(ops.layer_norm(x, w, b, 1e-5), dy),
        "rope q 1x32x16x128, k 8 heads": lambda: torch.autograd.backward(ops.rope(q, k, cos, sin), (dq, dk)),
        "swiglu 16x1024": lambda: torch.autograd.backward(ops.swiglu(a, g), da),
    }
    print(f"host µs per fwd+bwd, launches stubbed (median of 7 x 3000), torch {torch.__version__}, CPU")
    for name, step in cases.items():
        print(f"  {name:38s} {_us_per_call(step):7.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

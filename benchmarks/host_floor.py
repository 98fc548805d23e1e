"""How fast can an eager fwd+bwd of a norm-sized op be on this machine's host, whatever its kernels do?

    PYTHONPATH=.:/tmp/liger_peer_site python benchmarks/host_floor.py

At 16384 x 4096 the norms' GPU work for forward + backward is ~0.25 ms, close to what the host needs to run an
autograd.Function forward, ``torch.autograd.backward`` and the backward with its kernel launches. Timed by the
suite's own timer (``triton.testing.do_bench``: L2-flush memset, one event pair per run, median), fwd+bwd of:

- ``identity Function``: an autograd.Function whose forward returns a view and whose backward returns the
  incoming gradient: no allocation, no kernel; what remains is the harness, autograd and Python;
- ``launch skeleton``: the same with liger_core RMSNorm's allocations and three launches of an empty Triton
  kernel (forward 1, backward 2: the row kernel and the partial-sum kernel), through ``fast_launch``;
- ``torch layer_norm 16x4096``: the native op at a tiny shape (its C++ path; GPU work ~0);
- ``liger_core rms_norm / layer_norm 16x4096``: ours at a tiny shape (host time only);
- the same ops at 16384 x 4096, for comparison.
A row's time is ``max(GPU work, host time - the memset's ~85 µs head start)``, so the first rows are lower
bounds of any eager implementation with that much host work on this machine.

Then the GPU time alone of the same fwd+bwd at 16384 x 4096: the step captured in a CUDA graph and replayed by
``do_bench`` (L2 flushed between replays; no host in the way), for liger_core, torch eager and liger-kernel.
On CPU: nothing to time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from liger_core.ops import layer_norm, rms_norm  # noqa: E402
from liger_core.ops._fastlaunch import fast_launch  # noqa: E402


@fast_launch
@triton.jit
def _empty_kernel(x_ptr, n):
    pass


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class _Skeleton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        y = torch.empty_like(x)
        rstd = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        _empty_kernel[(1,)](x, x.shape[1])
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        partial = torch.empty(264, x.shape[1], dtype=torch.float32, device=x.device)
        _empty_kernel[(1,)](dy, x.shape[1])
        dw = torch.empty_like(w)
        _empty_kernel[(1,)](partial, x.shape[1])
        return dy, dw


def fwd_bwd_step(fn, rows: int, cols: int):
    """(step, x, w): one fwd+bwd of ``fn(x, w)`` on fresh bf16 inputs with a fixed output gradient."""
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)

    def step():
        torch.autograd.backward(fn(x, w), dy)

    return step, x, w


def fwd_bwd_ms(fn, rows: int, cols: int) -> float:
    import triton.testing

    step, x, w = fwd_bwd_step(fn, rows, cols)
    step()
    return float(triton.testing.do_bench(step, warmup=25, rep=200, grad_to_none=[x, w], return_mode="median"))


def graph_fwd_bwd_ms(fn, rows: int, cols: int) -> float:
    """GPU time of one fwd+bwd: captured once in a CUDA graph, replayed by do_bench."""
    import triton.testing

    step, x, w = fwd_bwd_step(fn, rows, cols)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles, allocator pools) off the capture
        for _ in range(3):
            x.grad = w.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = w.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return float(triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median"))


def main() -> int:
    if not torch.cuda.is_available():
        print("host_floor: no GPU, nothing to time")
        return 0
    cases = [
        ("identity Function", _Identity.apply, 16384),
        ("launch skeleton (RMSNorm's allocations, 3 empty launches)", _Skeleton.apply, 16384),
        ("torch F.layer_norm", lambda x, w: torch.nn.functional.layer_norm(x, (x.shape[1],), w), 16),
        ("liger_core rms_norm", lambda x, w: rms_norm(x, w, 1e-6), 16),
        ("liger_core layer_norm", lambda x, w: layer_norm(x, w, None, 1e-5), 16),
        ("torch F.layer_norm", lambda x, w: torch.nn.functional.layer_norm(x, (x.shape[1],), w), 16384),
        ("liger_core rms_norm", lambda x, w: rms_norm(x, w, 1e-6), 16384),
        ("liger_core layer_norm", lambda x, w: layer_norm(x, w, None, 1e-5), 16384),
    ]
    print(f"fwd+bwd median ms by do_bench on {torch.cuda.get_device_name()} (hidden 4096, bf16)")
    for name, fn, rows in cases:
        print(f"  {name:60s} {rows:6d} rows  {fwd_bwd_ms(fn, rows, 4096):.4f} ms", flush=True)
    graphed = [
        ("liger_core rms_norm", lambda x, w: rms_norm(x, w, 1e-6)),
        (
            "liger_core rms_norm in_place=True (the suite's setting)",
            lambda x, w: rms_norm(x, w, 1e-6, in_place=True),
        ),
        ("liger_core layer_norm", lambda x, w: layer_norm(x, w, None, 1e-5)),
        ("torch F.layer_norm", lambda x, w: torch.nn.functional.layer_norm(x, (x.shape[1],), w)),
    ]
    try:
        from liger_kernel.transformers.functional import liger_layer_norm, liger_rms_norm

        graphed += [
            ("liger-kernel rms_norm", lambda x, w: liger_rms_norm(x, w, 1e-6)),
            ("liger-kernel layer_norm", lambda x, w: liger_layer_norm(x, w, torch.zeros_like(w), 1e-5)),
        ]
    except ImportError:
        print("  (liger-kernel not importable: its rows are skipped)")
    print("GPU time of fwd+bwd (CUDA-graph replay, 16384 x 4096 bf16; floor 0.224 ms)")
    for name, fn in graphed:
        try:
            print(f"  {name:60s} {graph_fwd_bwd_ms(fn, 16384, 4096):.4f} ms", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"  {name:60s} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

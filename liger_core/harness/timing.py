"""Timers for the benchmark suite: ``triton.testing.do_bench`` for providers that leave their inputs alone,
a restoring loop for those that write into them, CUDA-graph timing, and peak extra memory of one run."""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable

import torch

from liger_core.harness.correctness import ProviderRun, as_tuple, restore_inputs


def make_step(run: ProviderRun, mode: str) -> Callable[[], None]:
    fn, args, grads = run.fn, run.args, run.grads
    if mode == "fwd":

        def step():
            fn(*args)

    else:

        def step():
            torch.autograd.backward(as_tuple(fn(*args)), grads)

    return step


@dataclasses.dataclass(frozen=True)
class Timing:
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    min_reps: int = 10
    max_reps: int = 2000


QUICK = Timing(warmup_ms=10.0, rep_ms=40.0, min_reps=5, max_reps=500)
_L2_FLUSH_BYTES = 256 * 2**20  # what triton.testing.do_bench zeroes between runs to flush the L2 cache


def _estimate_ms(step: Callable[[], None], restore: Callable[[], None] | None) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(3):
        if restore:
            restore()
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return max(sorted(times)[1], 1e-3)


def _replicas(run: ProviderRun, mode: str, count: int) -> list[tuple[Callable[[], None], list, list]]:
    """``count`` independent working copies of the inputs a provider writes into: (step, its restore pairs,
    its differentiable inputs) each; inputs it only reads are shared."""
    written = {id(work) for work, _ in run.restore_pairs}
    out = []
    for _ in range(count):
        fresh: dict[int, torch.Tensor] = {}

        def twin(t, fresh=fresh):
            if not isinstance(t, torch.Tensor) or id(t) not in written:
                return t
            c = t.detach().clone().requires_grad_(t.requires_grad)
            fresh[id(t)] = c
            return c

        args = tuple(twin(a) for a in run.args)
        grads = [twin(g) for g in run.grads]
        pairs = [(fresh[id(work)], pristine) for work, pristine in run.restore_pairs]
        diff = [fresh.get(id(t), t) for t in run.diff_tensors]
        replica = ProviderRun(run.fn, args, grads, diff, pairs, run.errors)
        out.append((make_step(replica, mode), pairs, diff))
    return out


def _replica_count(run: ProviderRun) -> int:
    """How many working copies of the written inputs fit in 30 % of free memory (at most 8)."""
    need = sum(work.numel() * work.element_size() for work, _ in run.restore_pairs)
    free, _ = torch.cuda.mem_get_info()
    return int(min(RESTORE_BATCH, (0.3 * free) // max(need, 1)))


RESTORE_BATCH = 8  # runs per batch of the restoring timer (each on its own copy of the written inputs)


def _bench_restoring(run: ProviderRun, mode: str, warmup_ms, rep_ms, max_reps, est_ms) -> list[float]:
    """triton.testing.do_bench's loop (L2 flush, one event pair per run, median) for a provider that writes
    into its inputs: runs go in batches of up to RESTORE_BATCH, each run on its own working copy of the
    written inputs, all restored from the pristine copy (and synchronized) before the batch, outside the timed
    region; each run starts with its differentiable inputs' gradients cleared, as do_bench's. Within a batch
    the host runs ahead of the GPU as in do_bench's loop; only a batch's first run starts from an idle GPU
    queue. (A restore copy queued right before each run would instead give every run a
    GPU head start that do_bench gives no host-bound provider; a synchronize before each run would make every
    run start from an idle queue, which do_bench does not either.)"""
    cache = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    replicas = _replicas(run, mode, max(1, _replica_count(run)))
    n_warmup = max(1, int(warmup_ms / est_ms))
    n_rep = min(max_reps, max(1, int(rep_ms / est_ms)))
    times: list[float] = []

    def batch(timed: bool) -> None:
        for _, pairs, diff in replicas:
            for t in diff:
                t.grad = None
            restore_inputs(pairs)
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in replicas
        ]
        torch.cuda.synchronize()
        for (step, _, diff), (start, end) in zip(replicas, events):
            # as do_bench's grad_to_none before every run: the replicas share the inputs they do not write,
            # so a gradient left by the previous run would make this run add into it (a full-size add that
            # would be charged to the in-place RMSNorms, whose x is shared)
            for t in diff:
                t.grad = None
            cache.zero_()
            start.record()
            step()
            end.record()
        torch.cuda.synchronize()
        if timed:
            times.extend(s.elapsed_time(e) for s, e in events)

    for _ in range(-(-n_warmup // len(replicas))):
        batch(False)
    while len(times) < n_rep:
        batch(True)
    replicas.clear()
    t = torch.tensor(times[: max(n_rep, 1)], dtype=torch.float64)
    return [float(torch.quantile(t, q)) for q in (0.5, 0.2, 0.8)]


def time_step(run: ProviderRun, mode: str, timing: Timing) -> tuple[float, float, float, str]:
    """(median, p20, p80) in ms and the timer used."""
    import triton.testing

    step = make_step(run, mode)
    restore = (lambda: restore_inputs(run.restore_pairs)) if run.restore_pairs else None
    # Time under the memory conditions of the peak-memory measurement: liger_core's fused linear CE sizes its
    # default chunk from the headroom under the process's peak, which the float64 reference or the gradients
    # left by the checked run would inflate (measured: 40 ms with their headroom vs 64 ms at 1.10 GiB).
    for t in run.diff_tensors:
        t.grad = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()  # warm (compilation happened in the checked run; this builds any mode-specific state)
    torch.cuda.synchronize()
    est = _estimate_ms(step, restore)
    rep = min(max(timing.rep_ms, timing.min_reps * est), timing.max_reps * est)
    warmup = max(timing.warmup_ms, est)
    if restore is None:
        q = triton.testing.do_bench(
            step, warmup=warmup, rep=rep, grad_to_none=run.diff_tensors, quantiles=[0.5, 0.2, 0.8]
        )
        timer = "do_bench"
    else:
        q = _bench_restoring(run, mode, warmup, rep, timing.max_reps, est)
        timer = "do_bench-batches+restore"
    for t in run.diff_tensors:
        t.grad = None
    return float(q[0]), float(q[1]), float(q[2]), timer


def _host_sync_in(step: Callable[[], None]) -> str | None:
    """Why ``step`` cannot be captured, found without capturing it: a host synchronisation (``.item()``, a
    device-to-host copy), raised by torch's sync debug mode; None when it ran without one. A failed capture
    is not harmless: it leaves allocations in the graph's private memory pool (the suite then ran out of
    memory several rows later) and the default CUDA generator in capture mode."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        return None
    except RuntimeError as e:
        return f"host sync: {short_error(e)}"
    finally:
        torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.synchronize()


def time_graph(
    run: ProviderRun, mode: str, timing: Timing, check_host_sync: bool = True
) -> tuple[float, str]:
    """(median ms, timer) of the same step captured once in a CUDA graph and replayed by
    ``triton.testing.do_bench`` (L2 flushed between replays): the GPU's time alone, without the host's.
    Where the host needs longer per step than the GPU (small ops: Python, autograd and launches take
    0.2-0.7 ms per fwd+bwd on an H100 host, and that speed varies by 2x between hosts and processes), ``ms``
    measures the host; this column measures the kernels. Replays run on the same buffers: a provider that
    writes into its inputs sees its own previous outputs there (its time does not depend on the values);
    the inputs are restored afterwards. (nan, reason) where the step cannot be captured: found first by
    ``_host_sync_in`` when ``check_host_sync`` (peers; liger_core's losses sync only outside a capture)."""
    import triton.testing

    step = make_step(run, mode)
    graph = None
    if check_host_sync:
        why = _host_sync_in(step)
        _reset_inputs(run)
        if why is not None:
            return math.nan, f"not capturable: {why}"
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (allocator pools, lazy state)
            for _ in range(2):
                for t in run.diff_tensors:
                    t.grad = None
                step()
        torch.cuda.current_stream().wait_stream(side)
        for t in run.diff_tensors:
            t.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        ms = triton.testing.do_bench(
            graph.replay, warmup=timing.warmup_ms, rep=timing.rep_ms, return_mode="median"
        )
        return float(ms), "cuda-graph replay"
    except Exception as e:  # noqa: BLE001 - a step that cannot be captured keeps its other columns
        _end_generator_capture()
        return math.nan, f"not capturable: {short_error(e)}"
    finally:
        del graph
        torch.cuda.synchronize()
        _reset_inputs(run)
        torch.cuda.empty_cache()


def _end_generator_capture() -> None:
    """After a failed capture: the default CUDA generator can stay in capture mode (the failed capture_end
    never ran its epilogue); an empty capture begins and ends one again, which should clear it. Best effort
    and not yet seen working (since ``_host_sync_in``, no capture has failed in a suite run); the suite draws
    its own inputs from ``_generator`` either way."""
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
        torch.randn(1, device="cuda")
    except Exception as e:  # noqa: BLE001
        print(f"  (default CUDA generator still unusable after a failed capture: {short_error(e)})")


def _reset_inputs(run: ProviderRun) -> None:
    """Gradients dropped, written inputs restored from their pristine copies, garbage collected."""
    for t in run.diff_tensors:
        t.grad = None
    if run.restore_pairs:
        restore_inputs(run.restore_pairs)
    gc.collect()


def peak_extra_bytes(run: ProviderRun, mode: str) -> int:
    """Peak memory of one run above what was allocated before it (inputs, pristine copies)."""
    step = make_step(run, mode)
    _reset_inputs(run)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    for t in run.diff_tensors:
        t.grad = None
    return peak


def short_error(e: BaseException) -> str:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "OOM"
    msg = f"{type(e).__name__}: {e}".replace("\n", " ")
    return msg[:300]

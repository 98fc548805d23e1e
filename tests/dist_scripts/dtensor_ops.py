"""liger_core ops with DTensor arguments, 2 CPU processes (gloo), against the same ops on plain tensors.

Run: `python -m torch.distributed.run --nproc_per_node 2 tests/dist_scripts/dtensor_ops.py`.
Cases (liger_core/sharding.py):
- sequence parallel: x Shard(1) with w Replicate, and with w Shard(0) (weight gathered, gradient
  reduce-scattered): output DTensor, x/w gradients equal to one process on the whole x;
- an FSDP2-style Shard(0) weight with a plain, per-rank x: the gradient is this rank's own, sliced;
- fused linear CE / JSD with a Shard(0) (uneven: 11 rows on 2 ranks) lm_head weight and plain hidden states;
- clear errors: x sharded along the normalised dimension, a plain weight next to a DTensor x, DTensor hidden.
Prints "OK: DTensor ops" on rank 0; exit status non-zero on any mismatch.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import liger_core.ops as ops

failures: list[str] = []


def close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float = 1e-5) -> None:
    if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol):
        err = (got - want).abs().max().item() if got.shape == want.shape else f"shape {tuple(got.shape)}"
        failures.append(f"{name}: differs ({err})")


def raises(name: str, exc: type[Exception], words: str, fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except exc as e:
        if words not in str(e):
            failures.append(f"{name}: {exc.__name__} without {words!r}: {e}")
        return
    except Exception as e:  # noqa: BLE001 - reported as a failure
        failures.append(f"{name}: expected {exc.__name__}, got {type(e).__name__}: {e}")
        return
    failures.append(f"{name}: no {exc.__name__} raised")


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def norm_cases(mesh, rank: int) -> None:
    torch.manual_seed(0)  # the same full tensors on every rank
    x, dy = torch.randn(2, 6, 5), torch.randn(2, 6, 5)
    w, b = 1 + 0.1 * torch.randn(5), 0.1 * torch.randn(5)
    for op, params in (("rms_norm", {"w": w}), ("layer_norm", {"w": w, "b": b})):
        fn = getattr(ops, op)
        ref_x, ref_p = leaf(x), {k: leaf(v) for k, v in params.items()}
        ref_y = fn(ref_x, **ref_p)
        (ref_y * dy).sum().backward()
        for w_placement in (Replicate(), Shard(0)):
            tag = f"{op} x Shard(1), w {w_placement}"
            x_dt = leaf(distribute_tensor(x, mesh, [Shard(1)]))
            p_dt = {k: leaf(distribute_tensor(v, mesh, [w_placement])) for k, v in params.items()}
            y = fn(x_dt, **p_dt)
            if not isinstance(y, DTensor) or tuple(y.placements) != (Shard(1),):
                failures.append(f"{tag}: output {type(y).__name__} {getattr(y, 'placements', None)}")
                continue
            close(f"{tag}: y", y.full_tensor(), ref_y.detach())
            (y * distribute_tensor(dy, mesh, [Shard(1)])).sum().backward()
            close(f"{tag}: dx", x_dt.grad.full_tensor(), ref_x.grad)
            for k, p in p_dt.items():
                close(f"{tag}: d{k}", p.grad.full_tensor(), ref_p[k].grad)

        # FSDP2-style sharded weight, plain per-rank x: this rank's gradient, sliced to its shard
        torch.manual_seed(100 + rank)
        x_local, dy_local = torch.randn(3, 5), torch.randn(3, 5)
        ref_x, ref_p = leaf(x_local), {k: leaf(v) for k, v in params.items()}
        (fn(ref_x, **ref_p) * dy_local).sum().backward()
        p_dt = {k: leaf(distribute_tensor(v, mesh, [Shard(0)])) for k, v in params.items()}
        x_plain = leaf(x_local)
        y = fn(x_plain, **p_dt)
        (y * dy_local).sum().backward()
        close(f"{op} plain x: dx", x_plain.grad, ref_x.grad)
        for k, p in p_dt.items():
            close(f"{op} plain x: d{k}", p.grad.to_local(), torch.chunk(ref_p[k].grad, 2)[rank])

        x_dt = distribute_tensor(x, mesh, [Shard(2)])
        p_dt = {k: distribute_tensor(v, mesh, [Replicate()]) for k, v in params.items()}
        raises(f"{op} x Shard(2)", ValueError, "last (normalised) dimension", fn, x_dt, **p_dt)
        x_dt = distribute_tensor(x, mesh, [Shard(1)])
        raises(f"{op} plain w", TypeError, "plain tensor", fn, x_dt, **params)


def loss_cases(mesh, rank: int) -> None:
    torch.manual_seed(1)
    weight, teacher_weight = torch.randn(11, 8), torch.randn(11, 6)  # 11 rows: uneven shards (6 + 5)
    torch.manual_seed(200 + rank)  # per-rank hidden states and targets
    hidden, teacher_hidden = torch.randn(7, 8), torch.randn(7, 6)
    target = torch.randint(0, 11, (7,))

    ref_h, ref_w = leaf(hidden), leaf(weight)
    ops.fused_linear_cross_entropy(ref_h, ref_w, target).backward()
    h, w_dt = leaf(hidden), leaf(distribute_tensor(weight, mesh, [Shard(0)]))
    loss = ops.fused_linear_cross_entropy(h, w_dt, target)
    loss.backward()
    close("flce: dh", h.grad, ref_h.grad)
    close("flce: dw (this rank's, sliced)", w_dt.grad.to_local(), torch.chunk(ref_w.grad, 2)[rank])
    h_dt = distribute_tensor(hidden, mesh, [Shard(0)])
    raises(
        "flce DTensor hidden",
        TypeError,
        "hidden.to_local()",
        ops.fused_linear_cross_entropy,
        h_dt,
        w_dt,
        target,
    )

    ref_h, ref_w = leaf(hidden), leaf(weight)
    ref = ops.fused_linear_jsd(ref_h, ref_w, teacher_hidden, teacher_weight)
    ref.backward()
    h, w_dt = leaf(hidden), leaf(distribute_tensor(weight, mesh, [Shard(0)]))
    t_dt = distribute_tensor(teacher_weight, mesh, [Shard(0)])
    loss = ops.fused_linear_jsd(h, w_dt, teacher_hidden, t_dt)
    close("fljsd: loss", loss.detach(), ref.detach())
    loss.backward()
    close("fljsd: dh", h.grad, ref_h.grad)
    close("fljsd: dw", w_dt.grad.to_local(), torch.chunk(ref_w.grad, 2)[rank])


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        print("run with 2 processes", flush=True)
        return 2
    mesh = init_device_mesh("cpu", (world,))
    norm_cases(mesh, rank)
    loss_cases(mesh, rank)
    for msg in failures:
        print(f"rank {rank}: MISMATCH {msg}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and not failures:
        print("OK: DTensor ops", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip the interpreter's teardown: a worker once aborted there after passing ("terminate called without an
    # active exception", a C++ thread destroyed at exit), failing the run on an exit code, not on a result
    os._exit(code)

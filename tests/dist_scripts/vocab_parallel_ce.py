"""vocab_parallel_cross_entropy on 2 CPU processes (gloo): logits split along the vocabulary (unevenly: 19 and
18 columns of 37), against the unsharded cross-entropy in float64 on every rank.

Run: `python -m torch.distributed.run --nproc_per_node 2 tests/dist_scripts/vocab_parallel_ce.py`.
Prints "OK: vocab parallel CE" on rank 0; exit status non-zero on any mismatch.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from liger_core import reference
from liger_core.modules import LigerVocabParallelCrossEntropy
from liger_core.ops import vocab_parallel_cross_entropy

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
group = dist.group.WORLD
failures: list[str] = []
torch.manual_seed(0)  # the same full logits and targets on every rank
vocab, split = 37, [19, 18]
start = sum(split[:rank])
for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
    full = (torch.randn(3, 5, vocab, dtype=torch.float64) * 4).to(dtype)
    full[0, 0, 3] = 1e4  # a dominant logit on rank 0's shard
    target = torch.randint(0, vocab, (3, 5))
    target[1, :2] = -100
    target[2, 0] = 36  # on the last rank
    go = torch.rand(3, 5, dtype=torch.float64)
    ref_in = full.double().requires_grad_()
    want = torch.nn.functional.cross_entropy(ref_in.transpose(1, 2), target, reduction="none")
    (want_grad,) = torch.autograd.grad(want, ref_in, go)
    for how in ("function", "module", "reference"):
        shard = full[..., start : start + split[rank]].clone().requires_grad_()
        if how == "function":
            got = vocab_parallel_cross_entropy(shard, target, start, group)
        elif how == "module":
            got = LigerVocabParallelCrossEntropy()(shard, target, group, start)
        else:
            got = reference.vocab_parallel_cross_entropy(shard, target, start, group)
        (grad,) = torch.autograd.grad(got, shard, go.to(got.dtype))
        scale = want.abs().max().item()
        if got.dtype != torch.float32 or not torch.allclose(got.double(), want, rtol=tol, atol=tol * scale):
            failures.append(
                f"rank {rank} {dtype} {how}: loss differs {(got.double() - want).abs().max():.3e}"
            )
        want_shard = want_grad[..., start : start + split[rank]]
        if grad.dtype != dtype or not torch.allclose(grad.double(), want_shard, rtol=tol, atol=tol):
            failures.append(
                f"rank {rank} {dtype} {how}: grad differs {(grad.double() - want_shard).abs().max():.3e}"
            )
# equal shards: vocab_start defaults to rank * V_local
full = torch.randn(4, 2 * 8, dtype=torch.float64)
target = torch.randint(0, 16, (4,))
got = vocab_parallel_cross_entropy(full[:, 8 * rank : 8 * rank + 8].float(), target, process_group=group)
want = torch.nn.functional.cross_entropy(full, target, reduction="none")
if not torch.allclose(got.double(), want, rtol=1e-6, atol=1e-6):
    failures.append(f"rank {rank}: default vocab_start differs")
# a target past the vocabulary, and shards that overlap, raise on every rank
for name, bad_target, bad_start in (("past the vocabulary", 16, 8 * rank), ("overlap", 3, 0)):
    try:
        vocab_parallel_cross_entropy(full[:, :8].float(), torch.full((4,), bad_target), bad_start, group)
        failures.append(f"rank {rank}: no error for {name}")
    except ValueError as e:
        if "target" not in str(e):
            failures.append(f"rank {rank}: {name}: {e}")

all_failures: list[list[str]] = [[] for _ in range(world)]
dist.all_gather_object(all_failures, failures)
dist.destroy_process_group()
code = 0
if rank == 0:
    flat = [f for fs in all_failures for f in fs]
    if flat:
        print("\n".join(flat))
        code = 1
    else:
        print("OK: vocab parallel CE")
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)  # skip the interpreter's teardown (see fsdp2_train.py)

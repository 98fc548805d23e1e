"""Reference vocabulary-parallel cross-entropy: the eager composition (Megatron's), fp32 math (float64 for
float64 logits).

    m = all_reduce_max(max(x)),  S = all_reduce_sum(sum exp(x - m)),  x_y = all_reduce_sum(x_y where held)
    loss = log(S) + m - x_y   (0 where target == ignore_index)

The all-reduces go through torch.distributed's autograd-free collectives: each rank's gradient is that of
its own shard, as in the kernel path.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    vocab_start: int | None = None,
    process_group: dist.ProcessGroup | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    distributed = process_group is not None and dist.get_world_size(process_group) > 1
    if vocab_start is None:
        vocab_start = (dist.get_rank(process_group) if distributed else 0) * logits.shape[-1]
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    row_max = x.detach().amax(dim=-1)
    if distributed:
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=process_group)
    shifted = x - row_max.unsqueeze(-1)
    sums = shifted.exp().sum(-1)
    local = target - vocab_start
    here = (target != ignore_index) & (local >= 0) & (local < x.shape[-1])
    picked = torch.where(
        here, shifted.gather(-1, local.clamp(0, x.shape[-1] - 1).unsqueeze(-1)).squeeze(-1), 0.0
    )
    held = here.to(x.dtype)
    if distributed:
        held = held.clone()
        dist.all_reduce(held, op=dist.ReduceOp.SUM, group=process_group)
    bad = (target != ignore_index) & (held != 1)
    if not torch.compiler.is_compiling() and bool(bad.any()):
        raise ValueError(
            f"target {int(target[bad][0])} lies in {int(held[bad][0])} ranks' vocabulary shards, not one: "
            "targets must be global class indices below the full vocabulary size, and the shards must tile "
            "the vocabulary"
        )
    if distributed:
        # the sums' gradients are local (d log S / d x_j = exp(x_j - m) / S on every rank): the all-reduce
        # only supplies the other ranks' values
        total = torch.stack([sums.detach(), picked.detach()])
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=process_group)
        sums = sums + (total[0] - sums.detach())
        picked = picked + (total[1] - picked.detach())
    loss = torch.where(target != ignore_index, torch.log(sums) - picked, 0.0)
    return loss.to(torch.promote_types(loss.dtype, torch.float32))

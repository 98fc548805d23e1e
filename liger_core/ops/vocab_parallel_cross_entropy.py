"""Cross-entropy over logits sharded along the vocabulary across the ranks of a process group (Megatron-style
tensor parallelism; Liger-Kernel's ``LigerVocabParallelCrossEntropy`` without label smoothing).

Each rank holds ``logits[..., vocab_start : vocab_start + V_local]``; target holds global class indices. Per
token (float64 math for fp32 logits, fp32 for bf16/fp16; the loss is fp32)::

    m    = all_reduce_max(max_j x_j)                       (a shift: any common value works, this one is safe)
    S    = all_reduce_sum(sum_j exp(x_j - m))
    x_y  = all_reduce_sum(x_y on the rank that holds y, 0 elsewhere)
    loss = log(S) + (m - x_y)                              (0 where target == ignore_index)
    dx_j = grad_loss * (exp(x_j - m) / S - [j == y])       (local: no communication in backward)

Two all-reduces in forward (the max; then S, x_y and the count of ranks holding y, which must be 1: a
ValueError otherwise), none in backward. Nothing of the vocabulary's size is
saved: backward reads the logits shard again (they are kept by reference). ``process_group=None`` (or a group
of one rank) is the plain, unsharded cross-entropy.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from liger_core import reference
from liger_core.dispatch import INDEX_DTYPES, check_same_device, check_shape, check_tensor, use_triton
from liger_core.ops._divergence_math import (
    as_rows,
    check_ignore_index,
    compute_dtype,
    exp_precise,
    row_tiles,
    tile_rows,
)


@triton.jit
def _vp_ce_fwd_kernel(
    x_ptr,
    x_row_stride,
    target_ptr,
    max_ptr,  # per-row global max (fp32)
    sum_ptr,  # out: per-row local sum of exp(x - max), float64
    picked_ptr,  # out: per-row target logit if this shard holds it, else 0, float64
    n_rows,
    n_cols,
    vocab_start,
    ignore_index,
    STATS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    y = tl.load(target_ptr + rows, mask=row_mask, other=ignore_index).to(tl.int64)
    keep = row_mask & (y != ignore_index)
    local = y - vocab_start
    here = keep & (local >= 0) & (local < n_cols)
    x_row = x_ptr + rows[:, None] * x_row_stride
    row_max = tl.load(max_ptr + rows, mask=keep, other=0.0).to(STATS)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=STATS)
    for start in range(0, n_cols, BLOCK_N):
        offsets = (start + cols)[None, :]
        mask = keep[:, None] & (offsets < n_cols)
        x = tl.load(x_row + offsets, mask=mask, other=float("-inf")).to(STATS)
        acc += exp_precise(x - row_max[:, None])
    tl.store(sum_ptr + rows, tl.sum(acc, axis=1).to(tl.float64), mask=row_mask)
    safe = tl.minimum(tl.maximum(local, 0), n_cols - 1)
    picked = tl.load(x_ptr + rows * x_row_stride + safe, mask=here, other=0.0).to(tl.float64)
    tl.store(picked_ptr + rows, picked, mask=row_mask)


@triton.jit
def _vp_ce_bwd_kernel(
    x_ptr,
    x_row_stride,
    target_ptr,
    max_ptr,  # fp32 global max per row
    scale_ptr,  # float64 per row: grad_loss / S (0 for ignored rows)
    grad_ptr,  # float64 per row: grad_loss
    dx_ptr,
    n_rows,
    n_cols,
    vocab_start,
    ignore_index,
    STATS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    y = tl.load(target_ptr + rows, mask=row_mask, other=ignore_index).to(tl.int64)
    keep = row_mask & (y != ignore_index)
    local = (y - vocab_start)[:, None]
    x_row = x_ptr + rows[:, None] * x_row_stride
    row_max = tl.load(max_ptr + rows, mask=keep, other=0.0).to(STATS)[:, None]
    scale = tl.load(scale_ptr + rows, mask=keep, other=0.0).to(STATS)[:, None]
    g = tl.load(grad_ptr + rows, mask=keep, other=0.0).to(STATS)[:, None]
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, n_cols, BLOCK_N):
        offsets = (start + cols)[None, :]
        col_mask = offsets < n_cols
        mask = keep[:, None] & col_mask
        x = tl.load(x_row + offsets, mask=mask, other=float("-inf")).to(STATS)
        dx = exp_precise(x - row_max) * scale - tl.where(offsets == local, g, 0.0)
        dx = tl.where(keep[:, None], dx, 0.0)
        tl.store(
            dx_ptr + rows[:, None] * n_cols + offsets,
            dx.to(dx_ptr.dtype.element_ty),
            mask=row_mask[:, None] & col_mask,
        )


def _check_held(held: torch.Tensor, keep: torch.Tensor, labels: torch.Tensor) -> None:
    """ValueError unless every kept target lies in exactly one rank's shard (a host sync, as the other
    cross-entropy ops' target check): a target past the vocabulary, or shards that leave a gap or overlap,
    would otherwise give a wrong loss silently."""
    if torch.compiler.is_compiling():
        return
    bad = keep & (held != 1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"target {int(labels[row])} (row {row}) lies in {int(held[row])} ranks' vocabulary shards, not "
            "one: targets must be global class indices below the full vocabulary size, and the shards "
            "[vocab_start, vocab_start + V_local) must tile the vocabulary"
        )


def _group_size(process_group: object) -> int:
    return 1 if process_group is None else dist.get_world_size(process_group)


class VocabParallelCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, vocab_start, process_group, ignore_index):
        x = as_rows(logits)
        labels = target.reshape(-1).contiguous()
        n_rows, n_cols = x.shape
        distributed = _group_size(process_group) > 1
        row_max = (
            x.amax(dim=-1).float() if n_cols else x.new_full((n_rows,), float("-inf"), dtype=torch.float32)
        )
        if distributed:
            dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=process_group)
        sums = torch.empty(n_rows, dtype=torch.float64, device=x.device)
        picked = torch.empty(n_rows, dtype=torch.float64, device=x.device)
        tiles = row_tiles(n_rows, max(n_cols, 1), x.device)
        if n_rows:
            _vp_ce_fwd_kernel[tiles.grid(n_rows)](
                x, x.stride(0), labels, row_max, sums, picked, n_rows, n_cols, vocab_start, ignore_index,
                STATS=compute_dtype(x.dtype), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                num_warps=tiles.num_warps,
            )  # fmt: skip
        keep = labels != ignore_index
        local = labels - vocab_start
        held = (keep & (local >= 0) & (local < n_cols)).to(torch.float64)  # 1 on the rank that holds target
        if distributed:
            stats = torch.stack([sums, picked, held])
            dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=process_group)
            sums, picked, held = stats[0], stats[1], stats[2]
        _check_held(held, keep, labels)
        loss = torch.where(keep, torch.log(sums) + (row_max.double() - picked), 0.0)
        ctx.save_for_backward(x, labels, row_max, sums)
        ctx.vocab_start, ctx.ignore_index, ctx.shape = vocab_start, ignore_index, logits.shape
        return loss.to(torch.float32).view(logits.shape[:-1])

    @staticmethod
    def backward(ctx, grad_loss):
        x, labels, row_max, sums = ctx.saved_tensors
        n_rows, n_cols = x.shape
        g = grad_loss.reshape(-1).to(torch.float64)
        scale = g / sums
        dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        tiles = row_tiles(n_rows, max(n_cols, 1), x.device)
        if n_rows and n_cols:
            _vp_ce_bwd_kernel[tiles.grid(n_rows)](
                x, x.stride(0), labels, row_max, scale, g, dx, n_rows, n_cols, ctx.vocab_start,
                ctx.ignore_index, STATS=compute_dtype(x.dtype), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                num_warps=tiles.num_warps,
            )  # fmt: skip
        return dx.view(ctx.shape), None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    vocab_start: int | None = None,
    process_group: dist.ProcessGroup | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Per-token cross-entropy (fp32, shape ``logits.shape[:-1]``, 0 where target is ignore_index) of logits
    sharded along the vocabulary: ``logits`` (..., V_local) is this rank's columns ``[vocab_start,
    vocab_start + V_local)`` of the full vocabulary, ``target`` (...) global class indices (identical on every
    rank of ``process_group``). ``vocab_start`` defaults to ``rank * V_local`` (equal shards). The gradient
    flows to this rank's shard only (each rank's is local). Module docstring: the math. No reduction: the
    caller divides by its own token count (which may span data-parallel ranks)."""
    check_tensor("logits", logits, min_ndim=1)
    check_tensor("target", target, dtypes=INDEX_DTYPES)
    check_shape("target", target, tuple(logits.shape[:-1]), "one class index per row of logits")
    check_same_device("logits", logits, target=target)
    ignore_index = check_ignore_index(ignore_index)
    if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(
            f"process_group must be a torch.distributed.ProcessGroup or None, got {process_group!r}"
        )
    rank = 0 if _group_size(process_group) == 1 else dist.get_rank(process_group)
    if vocab_start is None:
        vocab_start = rank * logits.shape[-1]
    elif isinstance(vocab_start, bool) or not isinstance(vocab_start, int) or vocab_start < 0:
        raise ValueError(f"vocab_start={vocab_start!r} must be a non-negative int")
    if not use_triton(logits):
        return reference.vocab_parallel_cross_entropy(
            logits, target, vocab_start, process_group, ignore_index
        )
    return VocabParallelCrossEntropyFunction.apply(logits, target, vocab_start, process_group, ignore_index)

"""Sharded parameters at the functional ops' boundary: DTensor (FSDP2, tensor parallel) and DeepSpeed ZeRO-3.

Base layer (imports torch only; ``torch.distributed.tensor`` is looked up in ``sys.modules``, so nothing is
imported for plain tensors). The ops call these helpers before their argument checks:

- ``on_local_shards`` (row-wise ops: RMSNorm, LayerNorm). When ``x`` is a DTensor (tensor/sequence parallel),
  the op runs on ``x.to_local()``, which is exact as long as the normalised last dimension is not sharded:
  the weights are gathered to ``Replicate`` (a no-op when they are already replicated) and their local
  gradient is declared ``Partial`` over the mesh dimensions that shard ``x`` (each rank saw only its rows),
  so DTensor's autograd sums it across those ranks, and reduce-scatters it when the weight itself is
  sharded. The output is a DTensor with ``x``'s placements. When ``x`` is a plain tensor and a weight is a
  DTensor (an FSDP2-sharded module called outside its own forward), the weight is ``full_tensor()``-ed: the
  gradient is this rank's own, exactly what ``w.full_tensor()`` in user code gives (no data-parallel
  reduction happens outside FSDP's hooks: run the module's forward for that).
- ``gather_weights`` (matmul losses: fused linear CE / JSD, whose loss reduces over the rows, so a
  row-sharded DTensor ``hidden`` has no single obvious meaning): DTensor weights are ``full_tensor()``-ed with
  a plain ``hidden``; a DTensor ``hidden`` (or target) is refused with a TypeError saying what to pass.
- ZeRO-3 partitioned parameters (``ds_id``/``ds_status``) reach an op as empty local tensors outside their
  module's forward: refused with a ValueError that names the way out (``liger_core.patching.distributed``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch


def _dtensor_class() -> type | None:
    module = sys.modules.get("torch.distributed.tensor")  # loaded by whoever made a DTensor
    return getattr(module, "DTensor", None)


def is_dtensor(t: object) -> bool:
    cls = _dtensor_class()
    return cls is not None and isinstance(t, cls)


def any_dtensor(*tensors: object) -> bool:
    cls = _dtensor_class()
    return cls is not None and any(isinstance(t, cls) for t in tensors)


def is_zero3_partitioned(t: object) -> bool:
    """A DeepSpeed ZeRO-3 parameter whose data is not gathered here (its local tensor is empty)."""
    return (
        getattr(t, "ds_id", None) is not None
        and hasattr(t, "ds_status")
        and isinstance(t, torch.Tensor)
        and t.numel() == 0
    )


def check_not_zero3_partitioned(**tensors: object) -> None:
    for name, t in tensors.items():
        if is_zero3_partitioned(t):
            raise ValueError(
                f"{name} is a DeepSpeed ZeRO-3 partitioned parameter (ds_id={t.ds_id}, empty on this rank): "
                "call the op inside its module's forward, where ZeRO-3 has gathered it "
                "(liger_core.patching.distributed.run_with_full_weight(module, fn, *args)), or under "
                "deepspeed.zero.GatheredParameters for a weight that needs no gradient"
            )


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


def on_local_shards(
    fn: Callable[..., torch.Tensor],
    x: torch.Tensor,
    params: Mapping[str, torch.Tensor | None],
    **kwargs: Any,
) -> torch.Tensor:
    """``fn(x, **params, **kwargs)`` for a row-wise op over the last dimension, with DTensor arguments.

    See the module doc for the gradient each case gives. Raises ValueError for a DTensor ``x`` sharded along
    its last dimension or with a pending (Partial) reduction, for a weight on another device mesh, and
    TypeError for a plain-tensor weight next to a DTensor ``x`` (its gradient would silently miss the other
    ranks' rows).
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate

    if not isinstance(x, DTensor):
        full = {name: p.full_tensor() if isinstance(p, DTensor) else p for name, p in params.items()}
        return fn(x, **full, **kwargs)

    mesh, placements = x.device_mesh, tuple(x.placements)
    for placement in placements:
        if placement.is_partial():
            raise ValueError(
                f"x is a DTensor with a Partial placement {placements}: redistribute it (e.g. to Replicate "
                "or Shard over the rows) before a normalisation"
            )
        if placement.is_shard() and placement.dim % x.dim() == x.dim() - 1:
            raise ValueError(
                f"x is a DTensor sharded along its last (normalised) dimension {placements}: every row must "
                "be whole on a rank; redistribute x (e.g. Shard over the sequence or Replicate) first"
            )
    # each rank normalises its own rows: the weights' local gradients are partial sums over the mesh
    # dimensions that shard x, and identical across the others
    grad_placements = [Partial() if p.is_shard() else Replicate() for p in placements]
    local: dict[str, torch.Tensor | None] = {}
    for name, p in params.items():
        if p is None:
            local[name] = None
        elif isinstance(p, DTensor):
            if p.device_mesh != mesh:
                raise ValueError(
                    f"{name} is a DTensor on another device mesh ({p.device_mesh}) than x ({mesh}); "
                    "put the weight on x's mesh (e.g. distribute it with Replicate placements)"
                )
            replicated = p.redistribute(mesh, [Replicate()] * mesh.ndim)
            local[name] = replicated.to_local(grad_placements=grad_placements)
        else:
            raise TypeError(
                f"x is a DTensor but {name} is a plain tensor: make {name} a DTensor on x's mesh "
                "(tensor parallel's SequenceParallel does), or pass x.to_local() / x.full_tensor()"
            )
    y = fn(x.to_local(), **local, **kwargs)
    return DTensor.from_local(
        y, mesh, placements, run_check=False, shape=x.shape, stride=_contiguous_strides(x.shape)
    )


def gather_weights(
    op: str, inputs: Mapping[str, object], weights: Mapping[str, torch.Tensor | None]
) -> dict[str, torch.Tensor | None]:
    """``weights`` with every DTensor ``full_tensor()``-ed (gradient: this rank's own, see the module doc).

    ``inputs`` (hidden states, targets) must be plain tensors: a TypeError says what to pass instead.
    """
    cls = _dtensor_class()
    for name, t in inputs.items():
        if cls is not None and isinstance(t, cls):
            raise TypeError(
                f"{op}: {name} is a DTensor ({tuple(t.placements)}); the loss is reduced over the rows it is "
                f"given, so pass {name}.to_local() (this rank's rows, then combine the losses yourself) or "
                f"{name}.full_tensor() (all rows on every rank)"
            )
    return {
        name: w.full_tensor() if cls is not None and isinstance(w, cls) else w for name, w in weights.items()
    }

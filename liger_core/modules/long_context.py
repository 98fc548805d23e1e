"""Memory for long sequences: an MLP run over sequence tiles; checkpointed layer inputs kept in host memory.

Both give the same loss and gradients as the code they replace (the same operations on the same values; only
where tensors live and the order in which weight-gradient partial sums are added change).

``tiled_mlp(fn, x, params, tile_tokens)``
    ``y = fn(x)`` for a token-wise ``fn`` (an MLP: each output row depends only on the same input row),
    computed over tiles of ``tile_tokens`` rows of ``x.reshape(-1, hidden)``. Forward runs each tile without
    autograd and keeps only ``x``; backward recomputes each tile with autograd and back-propagates it at once,
    so no more than one tile's intermediate activations (gate, up, act(gate) * up: tokens x intermediate
    each) exist at any time, instead of the whole sequence's. ``dL/dx`` is written tile by tile; the gradients
    of ``params`` (the tensors ``fn`` reads that need one: the MLP's trainable weights, LoRA adapters
    included) are summed over the tiles in fp32 and returned through autograd as one gradient per parameter,
    so they reach ``.grad`` (and any gradient hooks of data-parallel wrappers) once, as without tiling. Cost:
    one more forward of ``fn`` per step.

``offloaded_checkpoint(function, *args)``
    Activation checkpointing of ``function(*args)`` (``function`` replays the same computation when called
    again: a decoder layer with its keyword arguments bound) that keeps its tensor arguments of at least
    ``tuning.CHECKPOINT_OFFLOAD_MIN_BYTES`` in host memory between forward and backward: a layer's input
    (tokens x hidden) is copied to pinned host memory on a side stream right after the forward reads it and
    copied back, on the same side stream, when the backward of the layer after it starts (the layers'
    backwards run in reverse order), so the copy overlaps that layer's recompute and backward. Semantics are
    those of ``torch.utils.checkpoint.checkpoint(..., use_reentrant=True)`` (CPU and CUDA random states and
    the autocast state of the forward are restored for the recompute; the recompute's backward accumulates
    into the parameters' ``.grad``), except that the output needs a gradient whenever grad mode is on, so
    a layer whose input needs none (a frozen embedding under LoRA) still trains its own parameters. Gradients
    flow to the positional tensor arguments; ``function`` must not close over other tensors that need one.
    On a CPU tensor the "offload" is a copy in host memory (the original is released), which exercises the
    same bookkeeping. ``OFFLOAD_COUNTS`` counts tensors offloaded, fetched back and prefetched, and the bytes
    of host memory pinned (``pinned_bytes``: buffers are reused across layers and steps, see ``_PinnedPool``;
    ``release_pinned_memory()`` frees the idle ones).
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.checkpoint import get_device_states, set_device_states

from liger_core import tuning

__all__ = ["OFFLOAD_COUNTS", "offloaded_checkpoint", "release_pinned_memory", "tiled_mlp"]

OFFLOAD_COUNTS: collections.Counter = collections.Counter()


# ----------------------------------------------------------------------------------------------------------
# Tiled MLP
# ----------------------------------------------------------------------------------------------------------


class _TiledMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: Callable, tile_tokens: int, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.fn, ctx.tile_tokens = fn, tile_tokens
        ctx.params = params  # the parameters themselves (leaves): nothing is copied
        ctx.save_for_backward(x)
        rows = x.reshape(-1, x.shape[-1])
        out = None
        with torch.no_grad():
            for start in range(0, rows.shape[0], tile_tokens):
                y = fn(rows[start : start + tile_tokens])
                if out is None:
                    out = y.new_empty((rows.shape[0], y.shape[-1]))
                out[start : start + y.shape[0]] = y
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (x,) = ctx.saved_tensors
        fn, tile_tokens = ctx.fn, ctx.tile_tokens
        params = [p for p, needs in zip(ctx.params, ctx.needs_input_grad[3:]) if needs]
        rows = x.detach().reshape(-1, x.shape[-1])
        dy_rows = dy.reshape(-1, dy.shape[-1])
        dx = torch.empty_like(rows) if ctx.needs_input_grad[2] else None
        # fp32 sums of the per-tile weight gradients: one rounding to the parameter's dtype at the end, as a
        # single GEMM over all tokens does
        sums: list[torch.Tensor | None] = [None] * len(params)
        for start in range(0, rows.shape[0], tile_tokens):
            xt = rows[start : start + tile_tokens]
            if dx is not None:
                xt = xt.detach().requires_grad_(True)
            with torch.enable_grad():
                yt = fn(xt)
            inputs = ([xt] if dx is not None else []) + params
            grads = torch.autograd.grad(yt, inputs, dy_rows[start : start + yt.shape[0]], allow_unused=True)
            if dx is not None:
                dx[start : start + xt.shape[0]] = grads[0]
                grads = grads[1:]
            for i, g in enumerate(grads):
                if g is not None:
                    sums[i] = g.float() if sums[i] is None else sums[i].add_(g)
        out_params = iter(None if s is None else s.to(p.dtype) for s, p in zip(sums, params, strict=True))
        param_grads = [next(out_params) if needs else None for needs in ctx.needs_input_grad[3:]]
        return None, None, None if dx is None else dx.view_as(x), *param_grads


def tiled_mlp(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    params: Sequence[torch.Tensor],
    tile_tokens: int | None = None,
) -> torch.Tensor:
    """``fn(x)`` for a token-wise ``fn``, over tiles of ``tile_tokens`` tokens (module docstring); ``params``:
    the tensors ``fn`` reads that need gradients. ``tile_tokens`` defaults to ``tuning.MLP_TILE_TOKENS``; an
    input of at most that many tokens is passed to ``fn`` as it is."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x must have a last (hidden) dimension")
    tile = tuning.MLP_TILE_TOKENS if tile_tokens is None else tile_tokens
    if not isinstance(tile, int) or isinstance(tile, bool) or tile < 1:
        raise ValueError(f"tile_tokens must be a positive int, got {tile!r}")
    tokens = x.numel() // max(x.shape[-1], 1)
    if tokens <= tile:
        return fn(x)
    return _TiledMLP.apply(fn, tile, x, *params)


# ----------------------------------------------------------------------------------------------------------
# Checkpointed layer inputs in host memory
# ----------------------------------------------------------------------------------------------------------

_side_streams: dict[torch.device, Any] = {}


def _side_stream(device: torch.device):
    if device not in _side_streams:
        _side_streams[device] = torch.cuda.Stream(device)
    return _side_streams[device]


class _PinnedPool:
    """Page-locked host buffers, reused across layers and steps, kept per byte size.

    Plain host memory pinned with ``cudaHostRegister`` rather than ``torch.empty(..., pin_memory=True)``:
    torch's pinned allocator rounds each block up to a power of two, which for a layer input of 3.05 GiB
    (Llama-3.1-8B at 400K tokens) is 4 GiB, 31% more than the host holds for 32 layers. A buffer goes back
    to the pool with the event after which its last copy is done; the next user waits for that event.
    ``release_pinned_memory()`` unpins and frees the buffers not in use.
    """

    def __init__(self) -> None:
        self.free: dict[int, list[tuple[torch.Tensor, Any]]] = collections.defaultdict(list)

    def acquire(self, nbytes: int) -> torch.Tensor:
        if self.free[nbytes]:
            buf, done = self.free[nbytes].pop()
            if done is not None:
                done.synchronize()
            return buf
        buf = torch.empty(nbytes, dtype=torch.uint8)
        err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with CUDA error {int(err)}")
        OFFLOAD_COUNTS["pinned_bytes"] += nbytes
        return buf

    def release(self, buf: torch.Tensor, done: Any) -> None:
        self.free[buf.numel()].append((buf, done))

    def clear(self) -> int:
        freed = 0
        for bufs in self.free.values():
            for buf, done in bufs:
                if done is not None:
                    done.synchronize()
                torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())
                freed += buf.numel()
        self.free.clear()
        OFFLOAD_COUNTS["pinned_bytes"] -= freed
        return freed


_pool = _PinnedPool()


def release_pinned_memory() -> int:
    """Unpin and free the host buffers that ``offloaded_checkpoint`` keeps for reuse and that no layer holds
    now; returns the bytes freed."""
    return _pool.clear()


class _HostCopy:
    """One tensor kept in host memory between a layer's forward and its backward."""

    def __init__(self, t: torch.Tensor):
        self.device, self.cuda = t.device, t.device.type == "cuda"
        self.shape, self.dtype = t.shape, t.dtype
        self.ready = None
        self.back: torch.Tensor | None = None
        if self.cuda:
            stream = _side_stream(t.device)
            self.buf = _pool.acquire(t.numel() * t.element_size())
            self.host = self.buf.view(t.dtype).view(t.shape)
            stream.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(stream):
                self.host.copy_(t, non_blocking=True)
                self.done = torch.cuda.Event()
                self.done.record(stream)
            t.record_stream(stream)  # not reused by the allocator before the copy has read it
        else:
            self.host = t.detach().clone(memory_format=torch.contiguous_format)
        OFFLOAD_COUNTS["offloaded"] += 1

    def prefetch(self) -> None:
        """Start the copy back (on the side stream, after the copy out)."""
        if self.back is not None or self.host is None:
            return
        if self.cuda:
            stream = _side_stream(self.device)
            with torch.cuda.stream(stream):
                self.back = torch.empty(self.shape, dtype=self.dtype, device=self.device)
                self.back.copy_(self.host, non_blocking=True)
                self.ready = torch.cuda.Event()
                self.ready.record(stream)
        else:
            self.back = self.host
        OFFLOAD_COUNTS["prefetched"] += 1

    def fetch(self) -> torch.Tensor:
        self.prefetch()
        t, self.back, self.host = self.back, None, None
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(self.ready)
            t.record_stream(current)  # allocated on the side stream, used and freed on this one
            _pool.release(self.buf, self.ready)
            self.buf = None
        OFFLOAD_COUNTS["fetched"] += 1
        return t

    def __del__(self) -> None:
        # a forward whose backward never ran (an exception, a graph dropped): the buffer goes back after its
        # copy out (or copy back) is done
        buf = getattr(self, "buf", None)
        if buf is not None:
            self.buf = None
            _pool.release(buf, self.ready or self.done)


class _LayerStash:
    """A checkpointed call's tensor arguments: host copies or the tensors themselves (small ones), linked to
    the stash of the call before it, whose copies its backward prefetches."""

    _last: weakref.ref | None = None

    def __init__(self, args: tuple) -> None:
        self.items: list[Any] = []
        offloaded, min_bytes = False, tuning.CHECKPOINT_OFFLOAD_MIN_BYTES
        for a in args:
            if isinstance(a, torch.Tensor) and a.numel() * a.element_size() >= min_bytes:
                self.items.append(_HostCopy(a))
                offloaded = True
            else:
                self.items.append(a)
        self.previous = _LayerStash._last
        if offloaded:
            _LayerStash._last = weakref.ref(self)

    def prefetch(self) -> None:
        for item in self.items:
            if isinstance(item, _HostCopy):
                item.prefetch()

    def restore(self) -> list[Any]:
        values = [item.fetch() if isinstance(item, _HostCopy) else item for item in self.items]
        previous = self.previous() if self.previous is not None else None
        if previous is not None:
            previous.prefetch()
        self.items = []
        return values


def _autocast_states() -> list[tuple[str, bool, torch.dtype]]:
    return [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cuda", "cpu")]


class _OffloadedCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, function: Callable, anchor: torch.Tensor, *args: Any):
        ctx.function = function
        ctx.cpu_rng = torch.get_rng_state()
        ctx.devices, ctx.device_rng = get_device_states(*args)
        ctx.autocast = _autocast_states()
        ctx.needs = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
        with torch.no_grad():
            out = function(*args)
        ctx.stash = _LayerStash(args)
        return out

    @staticmethod
    def backward(ctx, *grads: Any):
        args = ctx.stash.restore()
        ctx.stash = None
        inputs = [
            a.detach().requires_grad_(needs) if isinstance(a, torch.Tensor) else a
            for a, needs in zip(args, ctx.needs)
        ]
        with torch.random.fork_rng(devices=ctx.devices):
            torch.set_rng_state(ctx.cpu_rng)
            set_device_states(ctx.devices, ctx.device_rng)
            with torch.enable_grad(), _restored_autocast(ctx.autocast):
                out = ctx.function(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        pairs = [
            (o, g)
            for o, g in zip(outs, grads)
            if isinstance(o, torch.Tensor) and o.requires_grad and g is not None
        ]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        input_grads = [
            i.grad if isinstance(i, torch.Tensor) and needs else None for i, needs in zip(inputs, ctx.needs)
        ]
        return None, None, *input_grads


class _restored_autocast:
    def __init__(self, states: list[tuple[str, bool, torch.dtype]]):
        self.contexts = [torch.autocast(device_type=d, dtype=dtype, enabled=on) for d, on, dtype in states]

    def __enter__(self):
        for c in self.contexts:
            c.__enter__()

    def __exit__(self, *exc):
        for c in reversed(self.contexts):
            c.__exit__(*exc)


def offloaded_checkpoint(function: Callable, *args: Any) -> Any:
    """``function(*args)`` checkpointed, its large tensor arguments kept in host memory until backward
    (module docstring). Without grad mode it is ``function(*args)``."""
    if not callable(function):
        raise TypeError(f"function must be callable, got {type(function).__name__}")
    if not torch.is_grad_enabled():
        return function(*args)
    # an input that needs a gradient makes the output need one too; a layer whose input needs none (a frozen
    # embedding under LoRA) still has trainable parameters, whose gradients the recompute's backward gives
    anchor = torch.empty(0, requires_grad=True)
    return _OffloadedCheckpoint.apply(function, anchor, *args)

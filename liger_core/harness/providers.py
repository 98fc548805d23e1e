"""The callable each benchmark provider runs for an op (liger_core, torch eager, torch.compile, peers)."""

from __future__ import annotations

from collections.abc import Callable

from liger_core.harness.peers import PEER_PACKAGES, peer_version
from liger_core.harness.registry import OpSpec, PackageImportError, available

# ------------------------------------------------------------------------------------------------------------
# Providers
# ------------------------------------------------------------------------------------------------------------


def provider_fn(
    spec: OpSpec, provider: str, compile_backend: str = "inductor"
) -> tuple[Callable | None, str]:
    """The callable for a provider, or (None, why not)."""
    try:
        return _provider_fn(spec, provider, compile_backend)
    except PackageImportError as e:
        return None, str(e)


def _provider_fn(spec: OpSpec, provider: str, compile_backend: str) -> tuple[Callable | None, str]:
    if provider == "liger_core":
        fn = available("ops", spec.name)
        if fn is None:
            return None, f"liger_core.ops.{spec.name} not implemented yet"
        if spec.name == "fused_linear_cross_entropy":
            fused_loss_without_headroom()
        if spec.ours_kwargs:
            kwargs = spec.ours_kwargs
            return (lambda *a: fn(*a, **kwargs)), ""
        return fn, ""
    if provider in ("torch", "torch.compile"):
        ref = spec.eager or available("reference", spec.name)
        if ref is None:
            return None, f"liger_core.reference.{spec.name} not implemented yet"
        if provider == "torch":
            return ref, ""
        import torch._dynamo

        torch._dynamo.reset()  # one compiled graph per (op, shape); no recompile limit across a sweep
        return torch.compile(ref, dynamic=False, backend=compile_backend), ""
    peer = spec.liger_kernel if provider == "liger_kernel" else spec.cce if provider == "cce" else None
    if peer is None:
        return None, "n/a"
    if peer_version(provider) is None:
        return None, f"{PEER_PACKAGES[provider][1]} not installed"
    return peer, ""


def fused_loss_without_headroom() -> None:
    """Sets ``liger_core.tuning.USE_HEADROOM = False`` for the rest of the benchmark process.

    The benchmark measures the fused loss alone at its default loop and memory. With headroom on, the op picks
    a loop or chunk from the free GPU memory, and the harness's own allocations (do_bench's estimate loop
    keeps a second set of gradients) would give the timed runs a different loop than the one-shot memory
    measurement (a row would pair one loop's time with another's memory). ``benchmarks/e2e_llama1b.py``
    measures the headroom loops inside a training step. Process-wide on purpose: a benchmark run times this
    setting only (``liger_core.tuning.override`` scopes it elsewhere).
    """
    from liger_core import tuning

    tuning.USE_HEADROOM = False

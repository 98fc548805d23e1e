"""Peer libraries (liger-kernel, cut-cross-entropy) and the Hugging Face eager code, as benchmark providers;
imported lazily, so a missing package only skips that provider."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable

import torch

# ------------------------------------------------------------------------------------------------------------
# Peers (imported lazily; a missing package only skips that provider)
# ------------------------------------------------------------------------------------------------------------


def liger_kernel_fn(name: str, **kwargs) -> Callable:
    def call(*args):
        from liger_kernel.transformers import functional

        return getattr(functional, name)(*args, **kwargs)

    call.__name__ = f"liger_kernel.{name}"
    return call


def liger_kernel_scaled_cross_entropy(hidden, weight, target):
    """liger-kernel's fused linear scaled cross-entropy (per-token nll; not in its functional module)."""
    from liger_kernel.ops import LigerFusedLinearScaledCrossEntropyFunction

    return LigerFusedLinearScaledCrossEntropyFunction.apply(hidden, weight, target)  # temperature 1, -100


def liger_kernel_group_norm(x, num_groups, weight, bias, eps):
    """liger-kernel's group norm in ``liger_core.ops.group_norm``'s argument order (it takes the channel
    count and the groups after the parameters)."""
    from liger_kernel.transformers import functional

    return functional.liger_group_norm(x, weight, bias, x.shape[1], num_groups, eps)


def cce_linear_cross_entropy(hidden, weight, target):
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy(hidden, weight, target)  # defaults: mean, ignore -100, filter_eps="high"


def hf_cross_entropy(logits, target):
    """What HF's ForCausalLMLoss runs: upcast the logits to fp32, then torch's cross-entropy (mean, -100)."""
    return torch.nn.functional.cross_entropy(logits.float(), target, ignore_index=-100)


def hf_linear_cross_entropy(hidden, weight, target):
    """HF's lm_head + ForCausalLMLoss: logits in the model dtype, upcast to fp32, cross-entropy."""
    return hf_cross_entropy(torch.nn.functional.linear(hidden, weight), target)


PEER_PACKAGES = {
    "liger_kernel": ("liger_kernel", "liger-kernel"),
    "cce": ("cut_cross_entropy", "cut-cross-entropy"),
}


def peer_version(provider: str) -> str | None:
    module, dist = PEER_PACKAGES[provider]
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"

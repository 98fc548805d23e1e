"""Numeric checks shared by the structural probes (``structural``, ``experts``): random inputs from a private
generator in the probed module's dtype and device, gradients, and the error measure and tolerance that decide
whether a liger replacement reproduces the original.
"""

from __future__ import annotations

import torch
from torch import nn


def tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype in (torch.float32, torch.float64) else 4 * torch.finfo(dtype).eps


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    if not isinstance(y, torch.Tensor) or not isinstance(ref, torch.Tensor):
        return float("inf")
    if y.shape != ref.shape or y.dtype != ref.dtype:
        return float("inf")
    y, ref = y.double(), ref.double()
    if not torch.isfinite(y).all():
        return float("inf")
    scale = ref.abs().max().item() if ref.numel() else 0.0
    return (y - ref).abs().max().item() / (scale if scale > 0 else 1.0) if y.numel() else 0.0


def max_err(pairs) -> float:
    return max(rel_err(a, b) for a, b in pairs)


def randn(shape, like: torch.Tensor, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(shape, generator=gen, dtype=torch.float32)).to(
        device=like.device, dtype=like.dtype
    )


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def grads(out: torch.Tensor, inputs: tuple[torch.Tensor, ...], dout: torch.Tensor) -> tuple:
    return torch.autograd.grad(out, inputs, dout, allow_unused=True)


def first_param(module: nn.Module) -> torch.Tensor | None:
    return next(iter(module.parameters()), None)


def usable(t: torch.Tensor | None) -> bool:
    return t is not None and t.device.type != "meta" and t.is_floating_point()

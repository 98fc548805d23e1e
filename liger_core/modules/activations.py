"""Elementwise and row activations as nn.Modules (drop-ins for ``torch.nn`` / transformers activations)."""

from __future__ import annotations

import torch
from torch import nn

from liger_core.ops.relu_squared import relu_squared
from liger_core.ops.softmax import softmax
from liger_core.ops.sparsemax import sparsemax


def _check_dim_type(dim: object) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")


class LigerReLUSquared(nn.Module):
    """``relu(x)^2``: drop-in for transformers' ``ReLUSquaredActivation`` (``ACT2FN["relu2"]``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_squared(x)


class LigerSoftmax(nn.Module):
    """``torch.nn.Softmax(dim)`` (default: the last dimension, as liger-kernel's ``LigerSoftmax``)."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        _check_dim_type(dim)  # its range is checked against each input
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LigerSparsemax(nn.Module):
    """Sparsemax along ``dim`` (liger-kernel's ``LigerSparsemax(dim=-1)``; ``liger_core.ops.sparsemax``)."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        _check_dim_type(dim)  # its range is checked against each input
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sparsemax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"

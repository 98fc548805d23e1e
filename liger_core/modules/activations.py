"""Elementwise and row activations as nn.Modules (drop-ins for ``torch.nn`` / transformers activations)."""

from __future__ import annotations

import torch
from torch import nn

from liger_core.ops.relu_squared import relu_squared


class LigerReLUSquared(nn.Module):
    """``relu(x)^2``: drop-in for transformers' ``ReLUSquaredActivation`` (``ACT2FN["relu2"]``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_squared(x)

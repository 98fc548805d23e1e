"""Reference GroupNorm: ``torch.nn.functional.group_norm`` (what ``nn.GroupNorm`` and HF models run); exact in
float64 (the ground truth of the tests). Same signature as ``liger_core.ops.group_norm``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    return F.group_norm(x, num_groups, weight, bias, eps)

"""Reference KL divergence: ``torch.nn.functional.kl_div``, the eager code it replaces, in the input dtype.

One deliberate difference: ``target`` is detached (like the Triton op, which differentiates w.r.t. ``input``
only, as Liger-Kernel's does), so the CPU fallback and the kernels give the same gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kl_div(
    input: torch.Tensor, target: torch.Tensor, reduction: str = "batchmean", log_target: bool = False
) -> torch.Tensor:
    return F.kl_div(input, target.detach(), reduction=reduction, log_target=log_target)

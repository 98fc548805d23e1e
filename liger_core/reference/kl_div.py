"""Reference KL divergence: ``torch.nn.functional.kl_div``, the eager code it replaces, on fp32 inputs (16-bit
ones are upcast, so the loss is fp32 for every input dtype, float64 for float64 inputs; the gradient is
rounded once to the input's dtype).

One deliberate difference: ``target`` is detached (like the Triton op, which differentiates w.r.t. ``input``
only, as Liger-Kernel's does), so the CPU fallback and the kernels give the same gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kl_div(
    input: torch.Tensor, target: torch.Tensor, reduction: str = "batchmean", log_target: bool = False
) -> torch.Tensor:
    dtype = torch.promote_types(input.dtype, torch.float32)
    return F.kl_div(input.to(dtype), target.detach().to(dtype), reduction=reduction, log_target=log_target)

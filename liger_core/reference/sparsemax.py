"""Reference sparsemax: the sort / cumulative-sum composition of Martins & Astudillo (2016), on fp32 values
(16-bit inputs are upcast, float64 stays float64; the result is rounded once to the input dtype), with its
autograd gradient. k is at least 1, so a row whose largest value is +inf or NaN gets tau = z_(1) - 1."""

import torch
import torch.nn.functional as F


def sparsemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if x.dim() == 0:
        return sparsemax(x.reshape(1), 0).reshape(())
    z = x.movedim(dim, -1).to(torch.promote_types(x.dtype, torch.float32))
    if z.numel() == 0:
        return x * 0
    zs = torch.sort(z, dim=-1, descending=True).values
    prefix = zs.cumsum(-1)
    rank = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    k = ((1 + rank * zs) > prefix).sum(-1, keepdim=True).clamp_min(1)
    tau = (prefix.gather(-1, k - 1) - 1) / k
    return F.relu(z - tau).to(x.dtype).movedim(-1, dim)

"""Reference LayerNorm over the last dimension: exactly ``torch.nn.functional.layer_norm``.

``mean = x.mean(-1)``, ``rstd = rsqrt(x.var(-1, unbiased=False) + eps)``, ``y = (x - mean) * rstd * w + b``.

``group_size``: each row normalised in groups of that many features, each group as ``F.layer_norm`` with
the slices of ``w`` and ``b`` at its position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_norm(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, eps: float = 1e-5, group_size=None
) -> torch.Tensor:
    if group_size is not None and group_size != x.shape[-1]:
        parts = [
            layer_norm(
                x[..., s : s + group_size],
                w[s : s + group_size],
                None if b is None else b[s : s + group_size],
                eps,
            )
            for s in range(0, x.shape[-1], group_size)
        ]
        return torch.cat(parts, dim=-1)
    if w.dtype != x.dtype and x.device.type != "cpu":
        # fp32 weight/bias with bf16/fp16 x: PyTorch's CPU kernel computes in fp32 and rounds once to x.dtype;
        # its CUDA kernel rejects the mix, so do the same computation explicitly there
        return F.layer_norm(x.float(), (x.shape[-1],), w.float(), None if b is None else b.float(), eps).to(
            x.dtype
        )
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)

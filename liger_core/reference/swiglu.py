"""Reference SwiGLU: exactly the eager composition it replaces, ``silu(a) * b``, in the input dtype; with
``alpha``/``limit``/``up_offset``, gpt-oss's clamped SwiGLU as transformers writes it."""

import torch
import torch.nn.functional as F


def swiglu(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    alpha: float = 1.0,
    limit: float | None = None,
    up_offset: float = 0.0,
) -> torch.Tensor:
    if alpha == 1.0 and limit is None and up_offset == 0.0:
        return F.silu(a) * b
    if limit is not None:
        a = a.clamp(min=None, max=limit)
        b = b.clamp(min=-limit, max=limit)
    glu = F.silu(a) if alpha == 1.0 else a * torch.sigmoid(a * alpha)
    return (b + up_offset) * glu if up_offset != 0.0 else glu * b

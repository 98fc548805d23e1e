"""Reference GeGLU: exactly the eager composition it replaces, ``gelu(a, approximate) * b``, in the input
dtype (Gemma's MLP: ``down(gelu_tanh(gate(x)) * up(x))``)."""

import torch
import torch.nn.functional as F


def geglu(a: torch.Tensor, b: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    return F.gelu(a, approximate=approximate) * b

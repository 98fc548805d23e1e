"""Reference GeGLU: the eager composition it replaces, ``gelu(a, approximate) * b``, in the input dtype
(Gemma's MLP: ``down(gelu_tanh(gate(x)) * up(x))``).

One deviation, at a single point: the erf GELU of +inf is +inf. PyTorch's formula
``a * 0.5 * (1 + erf(a / sqrt 2))`` gives that on CUDA, in float64 and on the CPU's scalar path, but the
CPU's vectorised float32/bfloat16 erf makes it NaN, so eager's answer there depends on where +inf sits in
the tensor.
"""

import torch
import torch.nn.functional as F


def geglu(a: torch.Tensor, b: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    gelu = F.gelu(a, approximate=approximate)
    if approximate == "none":
        # a itself at +inf (detached: the derivative there stays gelu's own, NaN, as in eager)
        gelu = torch.where(torch.isposinf(a), a.detach(), gelu)
    return gelu * b

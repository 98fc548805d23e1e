"""Reference squared ReLU: the eager composition it replaces, transformers' ``ReLUSquaredActivation``
(``torch.square(relu(x))``), in the input dtype."""

import torch
import torch.nn.functional as F


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))

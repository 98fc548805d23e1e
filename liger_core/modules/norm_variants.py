"""More norm modules: residual add + RMSNorm, RMSNorm without a weight, PolyNorm, Dynamic Tanh and GroupNorm
(parameter names as in the HF / reference modules they replace, so ``state_dict()`` keys carry over)."""

from __future__ import annotations

import torch
from torch import nn

from liger_core.dispatch import check_choice
from liger_core.modules.norms import _RMSNormBase, _scale_and_shift
from liger_core.ops.dyt import dyt
from liger_core.ops.fused_add_rms_norm import fused_add_rms_norm
from liger_core.ops.group_norm import group_norm
from liger_core.ops.modulated_rms_norm import modulated_rms_norm
from liger_core.ops.poly_norm import poly_norm
from liger_core.ops.rms_norm_no_weight import rms_norm_no_weight
from liger_core.reference.fused_add_rms_norm import CASTING_MODES


class LigerFusedAddRMSNorm(_RMSNormBase):
    """``forward(hidden_states, residual) -> (rms_norm(hidden_states + residual), hidden_states + residual)``
    (``liger_core.ops.fused_add_rms_norm``); defaults match ``LlamaRMSNorm`` applied to the residual sum."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        offset: float = 0.0,
        casting_mode: str = "llama",
        init_fn: str = "ones",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            hidden_size, eps, offset, casting_mode, init_fn, CASTING_MODES, device=device, dtype=dtype
        )

    def forward(
        self, hidden_states: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_add_rms_norm(
            hidden_states, residual, self.weight, self.variance_epsilon, self.offset, self.casting_mode
        )

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, {self._options_repr()}"


class LigerRMSNormNoWeight(nn.Module):
    """RMSNorm without a weight (``liger_core.ops.rms_norm_no_weight``): Gemma4's ``with_scale=False``."""

    def __init__(self, dim: int | None = None, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm_no_weight(hidden_states, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class LigerPolyNorm(nn.Module):
    """PolyNorm (``liger_core.ops.poly_norm``): ``w0 norm(x^3) + w1 norm(x^2) + w2 norm(x) + b``; weights
    initialised to 1/3 and a 0-dim bias to 1.0, as liger-kernel's module (``bias_shape=(1,)`` for PolyCom's
    ``torch.zeros(1)``-shaped bias)."""

    def __init__(
        self,
        eps: float = 1e-6,
        bias_shape: tuple[int, ...] = (),
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_choice("bias_shape", tuple(bias_shape), ((), (1,)))
        self.weight = nn.Parameter(torch.full((3,), 1.0 / 3.0, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.ones(bias_shape, device=device, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return poly_norm(hidden_states, self.weight, self.bias, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"eps={self.variance_epsilon}, bias_shape={tuple(self.bias.shape)}"


class LigerDyT(nn.Module):
    """Dynamic Tanh ``gamma * tanh(alpha * x) + beta`` (``liger_core.ops.dyt``), a LayerNorm replacement;
    parameters and initial values as the DyT paper's module (and liger-kernel's)."""

    def __init__(
        self,
        hidden_size: int,
        beta: bool = True,
        init_alpha: float = 0.5,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.init_alpha = init_alpha
        self.alpha = nn.Parameter(torch.full((1,), init_alpha, device=device, dtype=dtype))
        _scale_and_shift(self, hidden_size, beta, device, dtype, "gamma", "beta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dyt(x, self.alpha, self.gamma, self.beta)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, init_alpha={self.init_alpha}, beta={self.beta is not None}"


class LigerGroupNorm(nn.Module):
    """``nn.GroupNorm(num_groups, num_channels, eps, affine)`` (``liger_core.ops.group_norm``): same
    arguments, attributes and parameter names."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if num_groups <= 0 or num_channels % num_groups:
            raise ValueError(
                f"num_groups={num_groups} must be a positive divisor of num_channels={num_channels}"
            )
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        if affine:
            _scale_and_shift(self, num_channels, True, device, dtype)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class LigerModulatedRMSNorm(_RMSNormBase):
    """``forward(hidden_states, scale, shift=None) = rms_norm(hidden_states) * (1 + scale) + shift``
    (``liger_core.ops.modulated_rms_norm``): the AdaLN norm of Diffusion Transformers; arguments as
    liger-kernel's module (``elementwise_affine=False``: no weight)."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        offset: float = 0.0,
        casting_mode: str = "llama",
        init_fn: str = "ones",
        elementwise_affine: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            hidden_size, eps, offset, casting_mode, init_fn, CASTING_MODES, elementwise_affine, device, dtype
        )
        self.elementwise_affine = elementwise_affine

    def forward(
        self, hidden_states: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor | None = None
    ) -> torch.Tensor:
        return modulated_rms_norm(
            hidden_states, self.weight, scale, shift, self.variance_epsilon, self.offset, self.casting_mode
        )

    def extra_repr(self) -> str:
        return f"{self._options_repr()}, elementwise_affine={self.elementwise_affine}"

"""Norm modules: drop-ins for HF's LlamaRMSNorm / GemmaRMSNorm, its gated RMSNorms and ``nn.LayerNorm`` (same
parameter names, so ``state_dict()`` keys and checkpoints are interchangeable)."""

from __future__ import annotations

import torch
from torch import nn

from liger_core.dispatch import check_choice
from liger_core.ops.layer_norm import layer_norm
from liger_core.ops.rms_norm import rms_norm
from liger_core.ops.rms_norm_gated import rms_norm_gated
from liger_core.reference.rms_norm import CASTING_MODES
from liger_core.reference.rms_norm_gated import ACTIVATIONS as GATED_ACTIVATIONS
from liger_core.reference.rms_norm_gated import CASTING_MODES as GATED_CASTING_MODES


def _scale_and_shift(
    module: nn.Module,
    size: int,
    shift: bool,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    scale_name: str = "weight",
    shift_name: str = "bias",
) -> None:
    """Registers a ones-initialised scale of ``size`` and a zeros-initialised shift (None without ``shift``),
    as ``nn.LayerNorm`` initialises its affine parameters."""
    setattr(module, scale_name, nn.Parameter(torch.ones(size, device=device, dtype=dtype)))
    if shift:
        setattr(module, shift_name, nn.Parameter(torch.zeros(size, device=device, dtype=dtype)))
    else:
        module.register_parameter(shift_name, None)


class _RMSNormBase(nn.Module):
    """Weight (``init_fn`` "ones" or "zeros"; ``affine=False``: none), ``variance_epsilon``, ``offset`` and
    ``casting_mode`` of the RMSNorm modules."""

    def __init__(
        self,
        hidden_size: int,
        eps: float,
        offset: float,
        casting_mode: str,
        init_fn: str,
        casting_modes: tuple[str, ...],
        affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_choice("casting_mode", casting_mode, casting_modes)
        check_choice("init_fn", init_fn, ("ones", "zeros"))
        if affine:
            init = torch.ones if init_fn == "ones" else torch.zeros
            self.weight = nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.variance_epsilon = eps
        self.offset = offset
        self.casting_mode = casting_mode

    def _options_repr(self) -> str:
        return f"eps={self.variance_epsilon}, offset={self.offset}, casting_mode={self.casting_mode!r}"


class LigerRMSNorm(_RMSNormBase):
    """RMSNorm over the last dimension (``liger_core.ops.rms_norm``); defaults match ``LlamaRMSNorm``.

    ``init_fn``: "ones" (Llama: y = x * rstd * w) or "zeros" (Gemma, with offset=1: y = x * rstd * (1 + w)).
    """

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        offset: float = 0.0,
        casting_mode: str = "llama",
        in_place: bool = False,
        init_fn: str = "ones",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            hidden_size, eps, offset, casting_mode, init_fn, CASTING_MODES, device=device, dtype=dtype
        )
        self.in_place = in_place

    @property
    def eps(self) -> float:
        """GemmaRMSNorm's name for ``variance_epsilon``."""
        return self.variance_epsilon

    @eps.setter
    def eps(self, value: float) -> None:
        self.variance_epsilon = value

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(
            hidden_states, self.weight, self.variance_epsilon, self.offset, self.casting_mode, self.in_place
        )

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, {self._options_repr()}, in_place={self.in_place}"


class LigerRMSNormForGemma(LigerRMSNorm):
    """``GemmaRMSNorm``: zero-initialised weight used as ``1 + w``, all math in fp32."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        in_place: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            hidden_size, eps, offset=1.0, casting_mode="gemma", in_place=in_place, init_fn="zeros",
            device=device, dtype=dtype,
        )  # fmt: skip


class LigerRMSNormGated(nn.Module):
    """Gated RMSNorm (``liger_core.ops.rms_norm_gated``); defaults match ``Qwen3NextRMSNormGated``.

    Other HF classes: ``activation="sigmoid", casting_mode="gemma"`` (KimiLinear, BailingHybrid);
    ``norm_before_gate=False, group_size=...`` (MambaRMSNormGated and its copies); ``casting_mode="gemma"``
    with ``group_size = hidden_size // n_groups`` and either ``norm_before_gate`` (FalconH1). Without a gate
    (HF's ``gate=None``) it is the plain RMSNorm of the same rounding (one group only).
    """

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        activation: str = "silu",
        casting_mode: str = "llama",
        offset: float = 0.0,
        norm_before_gate: bool = True,
        group_size: int | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_choice("activation", activation, GATED_ACTIVATIONS)
        check_choice("casting_mode", casting_mode, GATED_CASTING_MODES)
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps
        self.activation = activation
        self.casting_mode = casting_mode
        self.offset = offset
        self.norm_before_gate = norm_before_gate
        self.group_size = group_size

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        if gate is None:
            if self.group_size not in (None, hidden_states.shape[-1]):
                raise ValueError("gate=None needs one group (group_size=None): grouped RMSNorm needs a gate")
            return rms_norm(hidden_states, self.weight, self.variance_epsilon, self.offset, self.casting_mode)
        return rms_norm_gated(
            hidden_states, gate, self.weight, self.variance_epsilon, activation=self.activation,
            casting_mode=self.casting_mode, offset=self.offset, norm_before_gate=self.norm_before_gate,
            group_size=self.group_size,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, activation={self.activation!r}, "
            f"casting_mode={self.casting_mode!r}, offset={self.offset}, "
            f"norm_before_gate={self.norm_before_gate}, group_size={self.group_size}"
        )


class LigerLayerNorm(nn.Module):
    """``nn.LayerNorm(hidden_size, eps, bias=bias)`` over the last dim (``liger_core.ops.layer_norm``)."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        bias: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = (hidden_size,)
        self.eps = eps
        self.elementwise_affine = True
        _scale_and_shift(self, hidden_size, bias, device, dtype)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return layer_norm(hidden_states, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, bias={self.bias is not None}"

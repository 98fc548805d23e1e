"""Gated MLPs with the fused activation kernels: drop-ins for Hugging Face's LlamaMLP and GemmaMLP.

Parameter names (``gate_proj``, ``up_proj``, ``down_proj``, plain ``nn.Linear``) and shapes are HF's, so
state_dicts load across both ways; only the activation-times-up product runs in one Triton kernel
(``swiglu`` / ``geglu``), which saves the activation's intermediate tensor in forward and backward. The
projections' outputs are used by nothing but the activation, so its backward writes their gradients over
them (``inplace_backward=True``): the backward allocates no tensor of the intermediate size for them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from liger_core import tuning
from liger_core.ops.geglu import geglu
from liger_core.ops.glu_down_proj import glu_down_proj
from liger_core.ops.swiglu import swiglu

# HF activation names (transformers.activations.ACT2FN) that each module computes exactly
SWIGLU_ACTIVATIONS = ("silu", "swish")
GELU_TANH_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_python_tanh", "gelu_new", "gelu_fast")
GELU_ERF_ACTIVATIONS = ("gelu", "gelu_python")


def _sizes(
    config_or_hidden: Any, intermediate_size: int | None, bias: bool | None, bias_attr: str | None
) -> tuple[int, int, bool]:
    """(hidden_size, intermediate_size, bias) from an HF config or from explicit sizes."""
    if isinstance(config_or_hidden, int):
        if intermediate_size is None:
            raise ValueError("intermediate_size is required when the first argument is hidden_size (an int)")
        return config_or_hidden, intermediate_size, bool(bias)
    for attr in ("hidden_size", "intermediate_size"):
        if not isinstance(getattr(config_or_hidden, attr, None), int):
            raise TypeError(
                f"config_or_hidden must be an int hidden_size or a config with int {attr!r}, "
                f"got {type(config_or_hidden).__name__}"
            )
    config_bias = bool(getattr(config_or_hidden, bias_attr, False)) if bias_attr else False
    return (
        config_or_hidden.hidden_size,
        config_or_hidden.intermediate_size if intermediate_size is None else intermediate_size,
        config_bias if bias is None else bias,
    )


class _GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, config: Any = None) -> None:
        super().__init__()
        if config is not None:
            self.config = config
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}"


class LigerSwiGLUMLP(_GatedMLP):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``: drop-in for HF ``LlamaMLP`` (and Mistral/Qwen2/...).

    ``LigerSwiGLUMLP(config)`` reads ``hidden_size``, ``intermediate_size``, ``mlp_bias`` (default False) and
    checks ``hidden_act`` is SiLU, like ``LlamaMLP(config)``; ``LigerSwiGLUMLP(hidden_size, intermediate_size,
    bias=False)`` builds one from sizes.
    """

    def __init__(self, config_or_hidden: Any, intermediate_size: int | None = None, bias: bool | None = None):
        hidden, inter, use_bias = _sizes(config_or_hidden, intermediate_size, bias, "mlp_bias")
        config = None if isinstance(config_or_hidden, int) else config_or_hidden
        act = getattr(config, "hidden_act", "silu") if config is not None else "silu"
        if act not in SWIGLU_ACTIVATIONS:
            raise ValueError(
                f"config.hidden_act={act!r} is not SiLU; LigerSwiGLUMLP supports {SWIGLU_ACTIVATIONS}"
            )
        super().__init__(hidden, inter, use_bias, config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # gate and up are ours alone (no other op saves or reads them): backward writes their grads over them
        gate, up = self.gate_proj(x), self.up_proj(x)
        if fusable_down_proj(self.down_proj, gate, up):
            return glu_down_proj(gate, up, self.down_proj.weight, self.down_proj.bias)
        return self.down_proj(swiglu(gate, up, inplace_backward=True))


def fusable_down_proj(down: nn.Module, gate: torch.Tensor, up: torch.Tensor) -> bool:
    """The down projection may be computed inside ``glu_down_proj`` (not through its module) only when
    nothing else has to see it run: a plain ``nn.Linear`` (not LoRA / quantised / FSDP-wrapped), no forward
    hooks on it or global ones (ZeRO-3 gathers parameters in such hooks), a local weight (no DTensor, no
    ZeRO-3 partition) of the activations' dtype, and autocast either off or computing in that dtype."""
    if (
        not tuning.FUSE_DOWN_PROJ
        or type(down) is not nn.Linear
        or down._forward_hooks
        or down._forward_pre_hooks
    ):
        return False
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return False
    weight = down.weight
    if type(weight) not in (nn.Parameter, torch.Tensor) or getattr(weight, "ds_id", None) is not None:
        return False
    if not (gate.dtype == up.dtype == weight.dtype) or gate.shape != up.shape:
        return False
    if down.bias is not None and down.bias.dtype != weight.dtype:
        return False
    device_type = gate.device.type
    if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) != gate.dtype:
        return False
    return True


def gelu_approximation(activation: str) -> str:
    """``approximate=`` of ``torch.nn.functional.gelu`` that computes the HF activation ``activation``."""
    if activation in GELU_TANH_ACTIVATIONS:
        return "tanh"
    if activation in GELU_ERF_ACTIVATIONS:
        return "none"
    raise ValueError(
        f"activation {activation!r} is not a GELU; LigerGEGLUMLP supports "
        f"{GELU_TANH_ACTIVATIONS + GELU_ERF_ACTIVATIONS}"
    )


class LigerGEGLUMLP(_GatedMLP):
    """``down_proj(gelu(gate_proj(x)) * up_proj(x))``: drop-in for HF ``GemmaMLP`` (Gemma 1/2/3).

    ``LigerGEGLUMLP(config)`` reads ``hidden_size``, ``intermediate_size`` and the activation as Gemma's MLPs
    do: ``config.hidden_activation`` (Gemma 2/3) when set, else ``config.hidden_act`` (Gemma 1), default
    ``"gelu_pytorch_tanh"``. Tanh-approximated names (``gelu_pytorch_tanh``, ``gelu_new``, ``gelu_fast``) run
    ``approximate="tanh"``, ``gelu`` runs the erf GELU. Gemma's MLP has no bias; ``bias=True`` adds one.
    ``LigerGEGLUMLP(hidden_size, intermediate_size, approximate="tanh")`` builds one from sizes.
    """

    def __init__(
        self,
        config_or_hidden: Any,
        intermediate_size: int | None = None,
        bias: bool | None = None,
        approximate: str | None = None,
    ):
        hidden, inter, use_bias = _sizes(config_or_hidden, intermediate_size, bias, None)
        config = None if isinstance(config_or_hidden, int) else config_or_hidden
        if approximate is None:
            activation = "gelu_pytorch_tanh"
            if config is not None:
                activation = (
                    getattr(config, "hidden_activation", None)
                    or getattr(config, "hidden_act", None)
                    or activation
                )
            approximate = gelu_approximation(activation)
        elif approximate not in ("tanh", "none"):
            raise ValueError(f"approximate={approximate!r} is not supported; choose one of ('tanh', 'none')")
        super().__init__(hidden, inter, use_bias, config)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # gate and up are ours alone (no other op saves or reads them): backward writes their grads over them
        gate, up = self.gate_proj(x), self.up_proj(x)
        if fusable_down_proj(self.down_proj, gate, up):
            return glu_down_proj(
                gate, up, self.down_proj.weight, self.down_proj.bias, "geglu", self.approximate
            )
        return self.down_proj(geglu(gate, up, self.approximate, inplace_backward=True))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, approximate={self.approximate!r}"

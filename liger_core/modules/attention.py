"""Attention modules on liger_core's attention ops (liger-kernel's ``LigerMultiTokenAttention`` and
``LigerFusedNeighborhoodAttention``, same constructor arguments)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.modules.utils import _pair

from liger_core.ops.fused_neighborhood_attention import fused_neighborhood_attention
from liger_core.ops.multi_token_attention import multi_token_attention


class LigerMultiTokenAttention(nn.Module):
    """Multi-token attention's score mixing: ``out = mask_0(conv2d(softmax(mask_-inf(scores))))`` over
    (B, in_channels, L, L) scores (``liger_core.ops.multi_token_attention``); ``sparse=True`` uses sparsemax.
    The weight is (out_channels, in_channels / groups, k, k), initialised as in ``nn.Conv2d``, the bias 0."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        sparse: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels), ("groups", groups)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups"
                f" ({groups})"
            )
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size)
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.kernel_size):
            raise ValueError(f"kernel_size must be a positive int or pair of them, got {kernel_size!r}")
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.groups, self.sparse = groups, sparse
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return multi_token_attention(
            scores, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups, self.sparse
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
            f"bias={self.bias is not None}, sparse={self.sparse}"
        )


class LigerFusedNeighborhoodAttention(nn.Module):
    """Self-attention restricted to a 1-D neighborhood of each position: q/k/v projections of
    (B, L, hidden_size) states, ``liger_core.ops.fused_neighborhood_attention`` per head, optional dropout and
    the output projection."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        kernel_size: int = 7,
        dilation: int = 1,
        bias: bool = True,
        dropout: float = 0.0,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        if num_heads < 1 or hidden_size % num_heads:
            raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd int, got {kernel_size}")
        if dilation < 1:
            raise ValueError(f"dilation must be >= 1, got {dilation}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout must be in [0, 1], got {dropout}")
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.head_dim = hidden_size // num_heads
        self.kernel_size, self.dilation = kernel_size, dilation
        self.scale = scale if scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.dropout_p = dropout
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.dropout = nn.Dropout(dropout) if dropout > 0.0 else None

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if attention_mask is not None:
            raise ValueError("attention_mask is not supported: the neighborhood is the only mask")
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                f"hidden_states must be (B, L, {self.hidden_size}), got {tuple(hidden_states.shape)}"
            )
        b, n, _ = hidden_states.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = (
            heads(self.q_proj(hidden_states)),
            heads(self.k_proj(hidden_states)),
            heads(self.v_proj(hidden_states)),
        )
        out = fused_neighborhood_attention(q, k, v, self.kernel_size, self.dilation, self.scale)
        out = out.transpose(1, 2).reshape(b, n, self.hidden_size)
        if self.dropout is not None:
            out = self.dropout(out)
        return self.out_proj(out)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"kernel_size={self.kernel_size}, dilation={self.dilation}, scale={self.scale}, "
            f"dropout={self.dropout_p}"
        )

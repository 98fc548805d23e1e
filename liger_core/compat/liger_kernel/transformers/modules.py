"""Liger-Kernel's module classes with its constructor parameters and forward conventions, backed by
``liger_core.modules`` and ``liger_core.ops``.

Classes liger_core does not have are looked up in ``liger_core.modules`` under the same name when
constructed, so they work once liger_core defines them; until then construction raises
``NotImplementedError`` naming the class.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from liger_core.compat.liger_kernel._lazy import liger_core_name, missing
from liger_core.compat.liger_kernel.transformers import functional as F
from liger_core.modules import LigerCrossEntropyLoss as _CoreCE
from liger_core.modules import LigerDyT as _CoreDyT
from liger_core.modules import LigerFusedAddRMSNorm as _CoreFusedAddRMSNorm
from liger_core.modules import LigerFusedLinearCrossEntropyLoss as _CoreFLCE
from liger_core.modules import LigerFusedLinearJSD as _CoreFLJSD
from liger_core.modules import LigerGEGLUMLP as _CoreGEGLUMLP
from liger_core.modules import LigerGroupNorm as _CoreGroupNorm
from liger_core.modules import LigerJSD, LigerSparsemax, LigerTVDLoss
from liger_core.modules import LigerKLDIVLoss as _CoreKL
from liger_core.modules import LigerLayerNorm as _CoreLayerNorm
from liger_core.modules import LigerModulatedRMSNorm as _CoreModulatedRMSNorm
from liger_core.modules import LigerPolyNorm as _CorePolyNorm
from liger_core.modules import LigerReLUSquared as _CoreReLUSquared
from liger_core.modules import LigerRMSNorm as _CoreRMSNorm
from liger_core.modules import LigerSoftmax as _CoreSoftmax
from liger_core.modules import LigerSwiGLUMLP as _CoreSwiGLUMLP
from liger_core.modules.long_context import tiled_mlp
from liger_core.ops.rms_norm_no_weight import rms_norm_no_weight
from liger_core.ops.swiglu import swiglu, swiglu_packed


def _check_init_fn(init_fn: str) -> None:
    if init_fn not in ("ones", "zeros"):
        raise ValueError(f"init_fn must be 'ones' or 'zeros', got {init_fn!r}")


def _liger_affine_init(module: nn.Module, init_fn: str, bias: bool) -> None:
    """Liger-Kernel's initialisation of a norm's weight (``init_fn``: ones or zeros) and always-present bias
    (N(0, 1) draws with ``bias=True``, zeros otherwise)."""
    with torch.no_grad():
        if init_fn == "zeros":
            module.weight.zero_()
        if bias:
            module.bias.normal_()


def _check_silu(config: Any) -> None:
    if config.hidden_act not in ("silu", "swish"):
        raise ValueError(f"config.hidden_act must be 'silu' or 'swish', got {config.hidden_act!r}")


class LigerRMSNorm(_CoreRMSNorm):
    """Liger-Kernel's ``LigerRMSNorm``: ``liger_core.modules.LigerRMSNorm`` with Liger-Kernel's parameter
    order and defaults (``in_place=True``). ``row_mode`` (Liger-Kernel's kernel-variant choice) is accepted
    and unused: the result is the same. ``elementwise_affine=False``: no weight (``weight`` is None), the
    forward is ``liger_core.ops.rms_norm_no_weight`` (``offset`` and ``casting_mode`` act on a weight only;
    the normalisation is computed in fp32 as in the llama and gemma modes)."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        offset: float = 0.0,
        casting_mode: str = "llama",
        init_fn: str = "ones",
        in_place: bool = True,
        row_mode: bool | None = None,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__(hidden_size, eps, offset, casting_mode, in_place=in_place, init_fn=init_fn)
        self.elementwise_affine = elementwise_affine
        if not elementwise_affine:
            self.weight = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return rms_norm_no_weight(hidden_states, self.variance_epsilon)
        return super().forward(hidden_states)

    def extra_repr(self) -> str:
        if self.weight is None:
            return f"weight=None, eps={self.variance_epsilon}"
        return super().extra_repr()


class LigerRMSNormForMuseGlimmerTextCentered(LigerRMSNorm):
    """Liger-Kernel's zero-centred Gemma-style RMSNorm: ``(1 + w) * x / rms(x)``, weight initialised to 0."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        offset: float = 1.0,
        casting_mode: str = "gemma",
        init_fn: str = "zeros",
        in_place: bool = False,
        row_mode: bool | None = None,
    ) -> None:
        super().__init__(hidden_size, eps, offset, casting_mode, init_fn, in_place, row_mode)


class LigerLayerNorm(_CoreLayerNorm):
    """Liger-Kernel's ``LigerLayerNorm``: weight and bias parameters always (``bias=True`` initialises the
    bias with N(0, 1) draws, ``bias=False`` with zeros); ``init_fn`` "ones" or "zeros" for the weight.
    ``impl``/``mode``/``backend`` (Liger-Kernel's kernel selection) must be None."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        bias: bool = False,
        init_fn: str = "ones",
        impl: Any = None,
        mode: Any = None,
        backend: Any = None,
    ) -> None:
        for name, value in (("impl", impl), ("mode", mode), ("backend", backend)):
            if value is not None:
                raise missing(f"LigerLayerNorm({name}={value!r})", "liger_core has one LayerNorm kernel.")
        _check_init_fn(init_fn)
        super().__init__(hidden_size, eps, bias=True)
        _liger_affine_init(self, init_fn, bias)


class LigerCrossEntropyLoss(_CoreCE):
    """Liger-Kernel's ``LigerCrossEntropyLoss``: its parameter order; ``forward(_input, target)`` returns the
    loss, or a ``CrossEntropyOutput`` when an extra output is asked for."""

    def __init__(
        self,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        lse_square_scale: float = 0.0,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        softcap: float | None = None,
        return_z_loss: bool = False,
        return_token_accuracy: bool = False,
        return_predicted_tokens: bool = False,
    ) -> None:
        super().__init__(
            weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss
        )
        self.return_token_accuracy = return_token_accuracy
        self.return_predicted_tokens = return_predicted_tokens

    def forward(self, _input: torch.Tensor, target: torch.Tensor) -> Any:  # type: ignore[override]
        if not (self.return_token_accuracy or self.return_predicted_tokens):
            return F._pack(super().forward(_input, target), self.return_z_loss, {})
        return F.liger_cross_entropy(
            _input,
            target,
            self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
            lse_square_scale=self.lse_square_scale,
            softcap=self.softcap,
            return_z_loss=self.return_z_loss,
            return_token_accuracy=self.return_token_accuracy,
            return_predicted_tokens=self.return_predicted_tokens,
        )


class LigerFusedLinearCrossEntropyLoss(_CoreFLCE):
    """Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss``: its parameter order;
    ``forward(lin_weight, _input, target, bias=None)`` returns the loss, or a ``CrossEntropyOutput`` when an
    extra output is asked for."""

    def __init__(
        self,
        ce_weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        lse_square_scale: float = 0.0,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        softcap: float | None = None,
        return_z_loss: bool = False,
        accum_dtype: torch.dtype | None = None,
        use_token_scaling: bool = False,
        return_token_accuracy: bool = False,
        return_predicted_tokens: bool = False,
    ) -> None:
        super().__init__(
            ce_weight,
            ignore_index,
            reduction,
            label_smoothing,
            lse_square_scale,
            softcap,
            return_z_loss,
            accum_dtype,
        )
        self.use_token_scaling = use_token_scaling
        self.return_token_accuracy = return_token_accuracy
        self.return_predicted_tokens = return_predicted_tokens

    def forward(  # type: ignore[override]
        self,
        lin_weight: torch.Tensor,
        _input: torch.Tensor,
        target: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> Any:
        if not (self.use_token_scaling or self.return_token_accuracy or self.return_predicted_tokens):
            return F._pack(super().forward(lin_weight, _input, target, bias), self.return_z_loss, {})
        return F.liger_fused_linear_cross_entropy(
            _input,
            lin_weight,
            target,
            bias,
            ce_weight=self.ce_weight,
            ignore_index=self.ignore_index,
            lse_square_scale=self.lse_square_scale,
            label_smoothing=self.label_smoothing,
            reduction=self.reduction,
            softcap=self.softcap,
            return_z_loss=self.return_z_loss,
            accum_dtype=self.accum_dtype,
            use_token_scaling=self.use_token_scaling,
            return_token_accuracy=self.return_token_accuracy,
            return_predicted_tokens=self.return_predicted_tokens,
        )


class LigerKLDIVLoss(_CoreKL):
    """Liger-Kernel's ``LigerKLDIVLoss(eps, *args, **kwargs)``: ``args``/``kwargs`` are ``nn.KLDivLoss``'s
    (default ``reduction="mean"``). ``eps`` is unused (see ``functional.liger_kl_div``)."""

    def __init__(self, eps: float = 1e-10, *args: Any, **kwargs: Any) -> None:
        reference = nn.KLDivLoss(*args, **kwargs)  # nn.KLDivLoss's own argument checks and legacy handling
        super().__init__(reduction=reference.reduction, log_target=reference.log_target)
        self.eps = eps


class LigerFusedLinearJSD(_CoreFLJSD):
    """Liger-Kernel's ``LigerFusedLinearJSD(jsd_beta, ignore_index, temperature, accum_dtype)``."""

    def __init__(
        self,
        jsd_beta: float = 0.5,
        ignore_index: int = -100,
        temperature: float = 1.0,
        accum_dtype: torch.dtype | None = None,
    ) -> None:
        if accum_dtype not in (None, torch.float32):
            raise missing(f"LigerFusedLinearJSD(accum_dtype={accum_dtype})", "It accumulates in float32.")
        super().__init__(beta=jsd_beta, ignore_index=ignore_index, temperature=temperature)


class LigerSwiGLUMLP(_CoreSwiGLUMLP):
    """``liger_core.modules.LigerSwiGLUMLP`` built from an HF ``config`` (Liger-Kernel's parameter names):
    ``down_proj(silu(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, config: Any, intermediate_size: int | None = None) -> None:
        super().__init__(config, intermediate_size)


class LigerGEGLUMLP(_CoreGEGLUMLP):
    """``liger_core.modules.LigerGEGLUMLP`` built from an HF ``config`` (Liger-Kernel's parameter names):
    ``down_proj(gelu(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)


class LigerQwen3MoeSwiGLUMLP(LigerSwiGLUMLP):
    """SwiGLU MLP of a Qwen3-MoE expert; ``intermediate_size`` defaults to
    ``config.moe_intermediate_size``."""

    def __init__(self, config: Any, intermediate_size: int | None = None) -> None:
        size = intermediate_size if intermediate_size is not None else config.moe_intermediate_size
        super().__init__(config, intermediate_size=size)


class LigerPhi3SwiGLUMLP(nn.Module):
    """Phi-3's MLP: ``down_proj(silu(g) * u)`` with ``g, u`` the halves of ``gate_up_proj(x)`` (one fused
    projection), on ``liger_core.ops.swiglu_packed``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        _check_silu(config)
        self.config = config
        self.hidden_size, self.intermediate_size = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Linear(self.hidden_size, 2 * self.intermediate_size, bias=False)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu_packed(self.gate_up_proj(x)))


class LigerBlockSparseTop2MLP(nn.Module):
    """The expert MLP of the ``w1/w2/w3`` Mixtral layout: ``w2(silu(w1 x) * w3 x)``
    (``liger_core.ops.swiglu``)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        _check_silu(config)
        self.ffn_dim, self.hidden_dim = config.intermediate_size, config.hidden_size
        self.w1 = nn.Linear(self.hidden_dim, self.ffn_dim, bias=False)
        self.w2 = nn.Linear(self.ffn_dim, self.hidden_dim, bias=False)
        self.w3 = nn.Linear(self.hidden_dim, self.ffn_dim, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.w2(swiglu(self.w1(hidden_states), self.w3(hidden_states)))


class LigerFusedAddRMSNorm(_CoreFusedAddRMSNorm):
    """``liger_core.modules.LigerFusedAddRMSNorm`` with Liger-Kernel's parameters: ``forward(hidden_states,
    residual)`` returns ``(RMSNorm(hidden_states + residual), hidden_states + residual)``. ``in_place`` is
    accepted and unused (Liger-Kernel's choice of overwriting the output gradient: the result is the same)."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        offset: float = 0.0,
        casting_mode: str = "llama",
        init_fn: str = "ones",
        in_place: bool = False,
    ) -> None:
        super().__init__(hidden_size, eps, offset, casting_mode, init_fn)
        self.in_place = in_place


class LigerModulatedRMSNorm(_CoreModulatedRMSNorm):
    """``liger_core.modules.LigerModulatedRMSNorm`` with Liger-Kernel's parameters: ``forward(hidden_states,
    scale, shift=None)`` is ``(1 + scale) * RMSNorm(hidden_states) + shift``. ``in_place`` is accepted and
    unused (as in ``LigerFusedAddRMSNorm``)."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        offset: float = 0.0,
        casting_mode: str = "llama",
        init_fn: str = "ones",
        in_place: bool = True,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__(hidden_size, eps, offset, casting_mode, init_fn, elementwise_affine)
        self.in_place = in_place


class LigerPolyNorm(_CorePolyNorm):
    """``liger_core.modules.LigerPolyNorm`` with Liger-Kernel's parameters (weights 1/3, scalar bias 1).
    ``in_place`` is accepted and unused (as in ``LigerFusedAddRMSNorm``)."""

    def __init__(self, eps: float = 1e-6, in_place: bool = True) -> None:
        super().__init__(eps)
        self.in_place = in_place


class LigerDyT(_CoreDyT):
    """``liger_core.modules.LigerDyT`` with Liger-Kernel's parameters: ``gamma * tanh(alpha * x) + beta``."""

    def __init__(self, hidden_size: int, beta: bool = True, init_alpha: float = 0.5) -> None:
        super().__init__(hidden_size, beta, init_alpha)


class LigerGroupNorm(_CoreGroupNorm):
    """``liger_core.modules.LigerGroupNorm`` with Liger-Kernel's parameters and initialisation: the weight is
    ones (``init_fn="ones"``) or zeros, the bias a trainable parameter, random normal with ``bias=True`` and
    zeros otherwise. Input ``(batch, num_channels, *)`` with at least 3 dimensions."""

    def __init__(
        self, num_channels: int, num_groups: int, eps: float = 1e-6, bias: bool = False, init_fn: str = "ones"
    ) -> None:
        _check_init_fn(init_fn)
        super().__init__(num_groups, num_channels, eps)
        _liger_affine_init(self, init_fn, bias)
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dim() < 3:
            raise ValueError(f"hidden_states must have at least 3 dimensions, got {hidden_states.dim()}")
        if hidden_states.shape[1] != self.num_channels:
            raise ValueError(
                f"hidden_states must have num_channels={self.num_channels} channels, "
                f"got {hidden_states.shape[1]}"
            )
        return super().forward(hidden_states)


class LigerReLUSquared(_CoreReLUSquared):
    """``liger_core.modules.LigerReLUSquared``: ``relu(x) ** 2``."""

    def __init__(self) -> None:
        super().__init__()


class LigerSoftmax(_CoreSoftmax):
    """``liger_core.modules.LigerSoftmax`` over the last dimension (Liger-Kernel's takes no ``dim``)."""

    def __init__(self) -> None:
        super().__init__(-1)


def _tile_tokens(x: torch.Tensor, num_shards: int | None) -> int:
    """Liger-Kernel's sharding in tokens: the sequence (``x.shape[-2]``) in ``num_shards`` chunks, default
    ``ceil(seqlen / hidden_size)``; each chunk holds that many positions of every leading row."""
    if x.dim() < 2:
        raise ValueError(f"x must be (..., seqlen, hidden_size), got shape {tuple(x.shape)}")
    seqlen, hidden = x.shape[-2], x.shape[-1]
    shards = max(1, -(-seqlen // hidden) if num_shards is None else num_shards)
    per_shard = -(-seqlen // shards)
    return max(1, per_shard * (x.numel() // max(seqlen * hidden, 1)))


class _Tiled(nn.Module):
    """The MLP after it in the class order, run through ``tiled_mlp`` in ``num_shards`` sequence chunks."""

    num_shards: int | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = [p for p in self.parameters() if p.requires_grad]
        return tiled_mlp(super().forward, x, params, _tile_tokens(x, self.num_shards))


class LigerTiledSwiGLUMLP(_Tiled, _CoreSwiGLUMLP):
    """Liger-Kernel's tiled SwiGLU MLP: ``liger_core.modules.LigerSwiGLUMLP`` run through
    ``liger_core.modules.long_context.tiled_mlp`` (forward without autograd tile by tile, backward recomputing
    one tile at a time), tiles of ``num_shards`` sequence chunks (default ``ceil(seqlen / hidden_size)``).
    Same result as the untiled MLP."""

    def __init__(self, config: Any, num_shards: int | None = None) -> None:
        super().__init__(config)
        self.num_shards = num_shards


class LigerTiledGEGLUMLP(_Tiled, _CoreGEGLUMLP):
    """Liger-Kernel's tiled GEGLU MLP (tanh-approximated GELU, as Liger-Kernel's for every GELU name):
    ``liger_core.modules.LigerGEGLUMLP`` run through ``tiled_mlp`` as ``LigerTiledSwiGLUMLP``."""

    def __init__(self, config: Any, num_shards: int | None = None) -> None:
        act = getattr(config, "hidden_act", None)
        if act is not None and act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"LigerTiledGEGLUMLP requires a GELU hidden_act, got {act!r}")
        super().__init__(config, approximate="tanh")
        self.num_shards = num_shards


class LigerVocabParallelCrossEntropy(nn.Module):
    """Vocab-parallel cross-entropy (``liger_core.modules.LigerVocabParallelCrossEntropy``): per-token loss
    ``[S, B]`` of ``vocab_parallel_logits [S, B, V_local]``, this rank's equal share of the vocabulary, with
    global ``target`` indices. Label smoothing is not available (0 only)."""

    def __init__(
        self,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "none",
        label_smoothing_formula: str = "pytorch",
        label_smoothing_mode: str = "global",
    ) -> None:
        super().__init__()
        if label_smoothing != 0.0:
            raise missing("LigerVocabParallelCrossEntropy(label_smoothing != 0)")
        if label_smoothing_formula not in ("pytorch", "megatron"):
            raise ValueError(f"label_smoothing_formula={label_smoothing_formula!r}: 'pytorch' or 'megatron'")
        if label_smoothing_mode not in ("global", "partition"):
            raise ValueError(f"label_smoothing_mode={label_smoothing_mode!r}: 'global' or 'partition'")
        core = liger_core_name("modules", "LigerVocabParallelCrossEntropy", "LigerVocabParallelCrossEntropy")
        self.core = core(ignore_index=ignore_index, reduction=reduction)

    def forward(
        self, vocab_parallel_logits: torch.Tensor, target: torch.Tensor, tp_group: Any = None
    ) -> torch.Tensor:
        if vocab_parallel_logits.dim() != 3:
            raise ValueError(
                "vocab_parallel_logits must be 3-D ([seq, batch, vocab]); got shape "
                f"{tuple(vocab_parallel_logits.shape)}"
            )
        return self.core(vocab_parallel_logits, target, tp_group)


def _deferred(name: str) -> type:
    """A class whose construction builds ``liger_core.modules.<name>`` (``NotImplementedError`` while
    liger_core has none)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> nn.Module:
        return liger_core_name("modules", name, name)(*args, **kwargs)

    doc = f"Liger-Kernel's ``{name}``: builds ``liger_core.modules.{name}`` (NotImplementedError until then)."
    return type(name, (nn.Module,), {"__new__": __new__, "__doc__": doc, "__module__": __name__})


# Liger-Kernel classes liger_core may gain under the same name in liger_core.modules.
DEFERRED = (
    "LigerExperts",
    "LigerFalconH1MLP",
    "LigerFalconH1SwiGLUMLP",
    "LigerFusedCETVDLoss",
    "LigerFusedLinearKLDivLoss",
    "LigerMHC",
    "LigerMLP",
    "LigerMultiTokenAttention",
    "LigerRMSNormForMuseGlimmer",
    "LigerSwiGLUMLPForMuseGlimmer",
)
for _name in DEFERRED:
    globals()[_name] = _deferred(_name)
del _name

__all__ = [
    "LigerBlockSparseTop2MLP",
    "LigerCrossEntropyLoss",
    "LigerDyT",
    "LigerFusedAddRMSNorm",
    "LigerFusedLinearCrossEntropyLoss",
    "LigerFusedLinearJSD",
    "LigerGEGLUMLP",
    "LigerGroupNorm",
    "LigerJSD",
    "LigerKLDIVLoss",
    "LigerLayerNorm",
    "LigerModulatedRMSNorm",
    "LigerPhi3SwiGLUMLP",
    "LigerPolyNorm",
    "LigerQwen3MoeSwiGLUMLP",
    "LigerRMSNorm",
    "LigerRMSNormForMuseGlimmerTextCentered",
    "LigerReLUSquared",
    "LigerSoftmax",
    "LigerSparsemax",
    "LigerSwiGLUMLP",
    "LigerTVDLoss",
    "LigerTiledGEGLUMLP",
    "LigerTiledSwiGLUMLP",
    "LigerVocabParallelCrossEntropy",
    *DEFERRED,
]

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
from liger_core.modules import LigerFusedLinearCrossEntropyLoss as _CoreFLCE
from liger_core.modules import LigerFusedLinearJSD as _CoreFLJSD
from liger_core.modules import LigerGEGLUMLP as _CoreGEGLUMLP
from liger_core.modules import LigerJSD
from liger_core.modules import LigerKLDIVLoss as _CoreKL
from liger_core.modules import LigerLayerNorm as _CoreLayerNorm
from liger_core.modules import LigerRMSNorm as _CoreRMSNorm
from liger_core.modules import LigerSwiGLUMLP as _CoreSwiGLUMLP
from liger_core.ops.swiglu import swiglu, swiglu_packed


class LigerRMSNorm(_CoreRMSNorm):
    """Liger-Kernel's ``LigerRMSNorm``: ``liger_core.modules.LigerRMSNorm`` with Liger-Kernel's parameter
    order and defaults (``in_place=True``). ``row_mode`` (Liger-Kernel's kernel-variant choice) is accepted
    and unused: the result is the same. ``elementwise_affine=False`` (no weight) is not available."""

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
        if not elementwise_affine:
            raise missing("LigerRMSNorm(elementwise_affine=False)")
        super().__init__(hidden_size, eps, offset, casting_mode, in_place=in_place, init_fn=init_fn)


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
        if init_fn not in ("ones", "zeros"):
            raise ValueError(f"init_fn must be 'ones' or 'zeros', got {init_fn!r}")
        super().__init__(hidden_size, eps, bias=True)
        with torch.no_grad():
            if init_fn == "zeros":
                self.weight.zero_()
            if bias:
                self.bias.normal_()


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
        if config.hidden_act not in ("silu", "swish"):
            raise ValueError(f"config.hidden_act must be 'silu' or 'swish', got {config.hidden_act!r}")
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
        if config.hidden_act not in ("silu", "swish"):
            raise ValueError(f"config.hidden_act must be 'silu' or 'swish', got {config.hidden_act!r}")
        self.ffn_dim, self.hidden_dim = config.intermediate_size, config.hidden_size
        self.w1 = nn.Linear(self.hidden_dim, self.ffn_dim, bias=False)
        self.w2 = nn.Linear(self.ffn_dim, self.hidden_dim, bias=False)
        self.w3 = nn.Linear(self.hidden_dim, self.ffn_dim, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.w2(swiglu(self.w1(hidden_states), self.w3(hidden_states)))


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
    "LigerDyT",
    "LigerExperts",
    "LigerFalconH1MLP",
    "LigerFalconH1SwiGLUMLP",
    "LigerFusedAddRMSNorm",
    "LigerFusedCETVDLoss",
    "LigerFusedLinearKLDivLoss",
    "LigerGroupNorm",
    "LigerMHC",
    "LigerMLP",
    "LigerModulatedRMSNorm",
    "LigerMultiTokenAttention",
    "LigerPolyNorm",
    "LigerRMSNormForMuseGlimmer",
    "LigerReLUSquared",
    "LigerSoftmax",
    "LigerSparsemax",
    "LigerSwiGLUMLPForMuseGlimmer",
    "LigerTVDLoss",
    "LigerTiledGEGLUMLP",
    "LigerTiledSwiGLUMLP",
)
for _name in DEFERRED:
    globals()[_name] = _deferred(_name)
del _name

__all__ = [
    "LigerBlockSparseTop2MLP",
    "LigerCrossEntropyLoss",
    "LigerFusedLinearCrossEntropyLoss",
    "LigerFusedLinearJSD",
    "LigerGEGLUMLP",
    "LigerJSD",
    "LigerKLDIVLoss",
    "LigerLayerNorm",
    "LigerPhi3SwiGLUMLP",
    "LigerQwen3MoeSwiGLUMLP",
    "LigerRMSNorm",
    "LigerRMSNormForMuseGlimmerTextCentered",
    "LigerSwiGLUMLP",
    "LigerVocabParallelCrossEntropy",
    *DEFERRED,
]

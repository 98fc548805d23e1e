"""Liger-Kernel 0.8.5's ``liger_kernel.transformers``, backed by liger_core.

- ``apply_liger_kernel_to_<model>`` (every model Liger-Kernel 0.8.5 has), ``_apply_liger_kernel``,
  ``_apply_liger_kernel_to_instance``: ``monkey_patch`` (flag mapping onto ``liger_core.patching``).
- ``AutoLigerKernelForCausalLM``: ``auto_model``.
- Module classes (``LigerRMSNorm``, ``LigerLayerNorm``, ``LigerSwiGLUMLP``, ``LigerGEGLUMLP``, the losses,
  ...): ``modules``. ``liger_rotary_pos_emb``: Hugging Face's ``apply_rotary_pos_emb`` signature.
- ``functional``: the ``liger_*`` functions.

Names are resolved on first use: importing this package imports neither transformers nor Triton.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_MODULE_CLASSES = (
    "LigerBlockSparseTop2MLP",
    "LigerCrossEntropyLoss",
    "LigerDyT",
    "LigerExperts",
    "LigerFalconH1MLP",
    "LigerFalconH1SwiGLUMLP",
    "LigerFusedAddRMSNorm",
    "LigerFusedCETVDLoss",
    "LigerFusedLinearCrossEntropyLoss",
    "LigerFusedLinearJSD",
    "LigerFusedLinearKLDivLoss",
    "LigerGEGLUMLP",
    "LigerGroupNorm",
    "LigerJSD",
    "LigerKLDIVLoss",
    "LigerLayerNorm",
    "LigerMHC",
    "LigerMLP",
    "LigerModulatedRMSNorm",
    "LigerMultiTokenAttention",
    "LigerPhi3SwiGLUMLP",
    "LigerPolyNorm",
    "LigerQwen3MoeSwiGLUMLP",
    "LigerRMSNorm",
    "LigerRMSNormForMuseGlimmer",
    "LigerRMSNormForMuseGlimmerTextCentered",
    "LigerReLUSquared",
    "LigerSoftmax",
    "LigerSparsemax",
    "LigerSwiGLUMLP",
    "LigerSwiGLUMLPForMuseGlimmer",
    "LigerTVDLoss",
    "LigerTiledGEGLUMLP",
    "LigerTiledSwiGLUMLP",
    "LigerVocabParallelCrossEntropy",
)
_ROPE = ("liger_rotary_pos_emb", "liger_llama4_text_rotary_pos_emb", "liger_llama4_vision_rotary_pos_emb")
_MODEL_TYPES = (
    "deepseek_v2", "deepseek_v3", "deepseek_v4", "exaone4", "falcon_h1", "gemma", "gemma2", "gemma3",
    "gemma3_text", "gemma4", "gemma4_text", "glm4", "glm4v", "glm4v_moe", "gpt_oss", "granite",
    "hunyuan_v1_dense", "hunyuan_v1_moe", "internvl", "llama", "llama4", "llava", "ministral", "mistral",
    "mixtral", "mllama", "muse_glimmer", "nemotron", "olmo2", "olmo3", "paligemma", "phi3", "pixtral",
    "qwen2", "qwen2_5_vl", "qwen2_vl", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_moe", "qwen3_next",
    "qwen3_vl", "qwen3_vl_moe", "smollm3", "smolvlm",
)  # fmt: skip
_PATCH_FUNCTIONS = (
    "_apply_liger_kernel",
    "_apply_liger_kernel_to_instance",
    *(f"apply_liger_kernel_to_{m}" for m in _MODEL_TYPES),
)

__all__ = [
    "is_transformers_available",
    *_MODULE_CLASSES,
    *_ROPE,
    "AutoLigerKernelForCausalLM",
    *_PATCH_FUNCTIONS,
]


def is_transformers_available() -> bool:
    """True if the ``transformers`` package can be imported."""
    return importlib.util.find_spec("transformers") is not None


def liger_rotary_pos_emb(
    q: Any,
    k: Any,
    cos: Any,
    sin: Any,
    position_ids: Any = None,
    unsqueeze_dim: int = 1,
    rotary_dim: Any = None,
) -> Any:
    """Hugging Face's ``apply_rotary_pos_emb`` on liger_core's rope kernel (``functional.liger_rope``)."""
    from liger_core.compat.liger_kernel.transformers.functional import liger_rope

    return liger_rope(q, k, cos, sin, position_ids, unsqueeze_dim, rotary_dim)


def liger_llama4_text_rotary_pos_emb(xq: Any, xk: Any, freqs_cis: Any) -> Any:
    """Llama 4's complex-valued rope: liger_core has no kernel for it (raises NotImplementedError)."""
    from liger_core.compat.liger_kernel._lazy import missing

    raise missing("liger_llama4_text_rotary_pos_emb (Llama 4's complex rope)")


def liger_llama4_vision_rotary_pos_emb(query: Any, key: Any, freqs_ci: Any) -> Any:
    """Llama 4's vision rope: liger_core has no kernel for it (raises NotImplementedError)."""
    from liger_core.compat.liger_kernel._lazy import missing

    raise missing("liger_llama4_vision_rotary_pos_emb (Llama 4's vision rope)")


def __getattr__(name: str) -> Any:
    if name in _MODULE_CLASSES:
        module = importlib.import_module(f"{__name__}.modules")
    elif name in _PATCH_FUNCTIONS:
        module = importlib.import_module(f"{__name__}.monkey_patch")
    elif name == "AutoLigerKernelForCausalLM":
        module = importlib.import_module(f"{__name__}.auto_model")
    elif name in ("functional", "modules", "monkey_patch", "auto_model"):
        return importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value

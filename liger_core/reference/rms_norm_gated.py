"""Reference gated RMSNorm: the Hugging Face code it replaces, bit for bit in fp32/bf16/fp16 (exact in
float64).

With ``dt = x.dtype``, ``f`` = "at least fp32" (float64 inputs stay float64: the tests' ground truth),
``a = act(gate.to(f))`` and ``norm(h) = h * rsqrt(mean(h**2) + eps)`` over each group of ``group_size``
features (the whole last dimension by default)::

    norm_before_gate=True (the gate multiplies the normalised output):
      "llama" (Qwen3NextRMSNormGated, Qwen3.5 / Qwen3.5-MoE, OlmoHybrid):
              (((offset + w) * norm(x.to(f)).to(dt)) * a).to(dt)
      "gemma" (KimiLinear, BailingHybrid, Glm5Next, LaraMini; FalconH1 with norm_before_gate):
              (((offset + w.to(f)) * norm(x.to(f))) * a).to(dt)
    norm_before_gate=False (the gate multiplies the input of the norm):
      "llama" (MambaRMSNormGated: Mamba2, Bamba, NemotronH, GraniteMoeHybrid, Zamba2):
              (offset + w) * norm(x.to(f) * a).to(dt)          -> dtype promote(w.dtype, dt), as in HF
      "gemma" (FalconH1RMSNormGated, norm_before_gate=False):
              ((offset + w.to(f)) * norm(x.to(f) * a)).to(dt)

``activation`` is "silu" or "sigmoid" (HF's ``ACT2FN`` entries: ``F.silu``, ``torch.sigmoid``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "sigmoid")
CASTING_MODES = ("llama", "gemma")


def output_dtype(x_dtype: torch.dtype, w_dtype: torch.dtype, casting_mode: str, norm_before_gate: bool):
    """HF's output dtype: the input's, except MambaRMSNormGated's final ``w * ...`` (type promotion)."""
    if casting_mode == "llama" and not norm_before_gate:
        return torch.promote_types(x_dtype, w_dtype)
    return x_dtype


def rms_norm_gated(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    activation: str = "silu",
    casting_mode: str = "llama",
    offset: float = 0.0,
    norm_before_gate: bool = True,
    group_size: int | None = None,
) -> torch.Tensor:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not supported; choose one of {ACTIVATIONS}")
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"casting_mode={casting_mode!r} is not supported; choose one of {CASTING_MODES}")
    act = F.silu if activation == "silu" else torch.sigmoid
    compute_dtype = torch.promote_types(torch.promote_types(x.dtype, gate.dtype), torch.float32)
    a = act(gate.to(compute_dtype))
    h = x.to(compute_dtype)
    if not norm_before_gate:
        h = h * a
    n = h.shape[-1]
    group_size = n if group_size is None else group_size
    groups = h.view(*h.shape[:-1], n // group_size, group_size)
    normed = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + eps)).view(h.shape)
    if casting_mode == "llama":
        y = (offset + weight) * normed.to(x.dtype)
        return (y * a).to(x.dtype) if norm_before_gate else y
    y = (offset + weight.to(compute_dtype)) * normed
    return (y * a if norm_before_gate else y).to(x.dtype)

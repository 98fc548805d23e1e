"""Reference RMSNorm: the Hugging Face code it replaces, bit for bit in fp32/bf16/fp16 (and exact in float64).

``casting_mode`` picks whose rounding is reproduced (``x`` of dtype ``dt``, ``w`` of dtype ``dw``)::

    "llama"  (LlamaRMSNorm, Mistral, Qwen2, ...):  (offset + w) * (x.float() * rstd).to(dt)
             -> dtype promote(dw, dt): an fp32 weight with a bf16 input gives an fp32 output, as in HF
    "gemma"  (GemmaRMSNorm, offset=1.0):            ((x.float() * rstd) * (offset + w.float())).to(dt)
    "none"   (a naive implementation):              x * rsqrt(mean(x**2) + eps) * (offset + w), in dt
             -> dtype promote(dw, dt)

with ``rstd = rsqrt(mean(x.float()**2, -1) + eps)``. "float()" means "at least fp32", so float64 inputs stay
float64 (that is the ground truth the tests compare against). ``group_size`` normalises each row in groups
of that many features (Qwen4-Exp): ``x`` viewed as (..., groups, group_size), ``w`` as (groups, group_size).
``in_place`` only matters to the kernel's
backward (it writes dx over dy); it is accepted here so the signature matches ``liger_core.ops.rms_norm``.
"""

from __future__ import annotations

import torch

CASTING_MODES = ("llama", "gemma", "none")


def rms_norm(
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float = 1e-6,
    offset: float = 0.0,
    casting_mode: str = "llama",
    in_place: bool = False,
    group_size: int | None = None,
) -> torch.Tensor:
    if group_size is not None and group_size != x.shape[-1]:
        groups = (x.shape[-1] // group_size, group_size)
        y = rms_norm(x.unflatten(-1, groups), w.view(groups), eps, offset, casting_mode)
        return y.flatten(-2)
    if casting_mode == "none":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + w)
    compute_dtype = torch.promote_types(x.dtype, torch.float32)
    x_up = x.to(compute_dtype)
    normed = x_up * torch.rsqrt(x_up.pow(2).mean(-1, keepdim=True) + eps)
    if casting_mode == "llama":
        # HF: `self.weight * hidden_states.to(input_dtype)`; `0.0 + w` is w itself (same values and dtype)
        return (offset + w) * normed.to(x.dtype)
    if casting_mode == "gemma":
        return (normed * (offset + w.to(compute_dtype))).to(x.dtype)
    raise ValueError(f"casting_mode={casting_mode!r} is not supported; choose one of {CASTING_MODES}")

"""Reference RoPE: exactly Hugging Face's ``apply_rotary_pos_emb`` (rotate_half convention), in the input
dtype.

Extensions over HF's function, each written the way HF's own callers write it:
- partial rotary (``cos.shape[-1] < q.shape[-1]``): rotate the first ``rotary_dim`` features, pass the rest
  through, then concatenate (as HF's Phi/GLM/StableLM attention does around ``apply_rotary_pos_emb``);
- ``position_ids``: HF's legacy signature, ``cos[position_ids]`` gathers rows of a
  ``(max_positions, rotary_dim)`` table before broadcasting. A 1-D ``position_ids`` of shape ``(T,)`` is
  taken as ``(1, T)``;
- ``interleaved=True``: DeepSeek-V3's ``apply_rotary_pos_emb_interleave`` (GPT-J pairs ``(x0, x1), (x2, x3),
  ...`` each rotated by one frequency, the first half of ``cos``/``sin``; the output is de-interleaved:
  rotated even features, then rotated odd ones), with partial rotary as above.
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return (x * cos) + (rotate_half(x) * sin)
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat(((x_rot * cos) + (rotate_half(x_rot) * sin), x_pass), dim=-1)


def _rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rotary_dim = cos.shape[-1]
    # HF: `cos`/`sin` are `cat(freqs, freqs)`; the first half holds the per-pair angle
    cos, sin = cos[..., : rotary_dim // 2], sin[..., : rotary_dim // 2]
    x_rot = x if rotary_dim == x.shape[-1] else x[..., :rotary_dim]
    x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return rotated if rotary_dim == x.shape[-1] else torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1,
    interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    if position_ids is not None:
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0)
        cos, sin = cos[position_ids], sin[position_ids]
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotate = _rotate_interleaved if interleaved else _rotate
    return rotate(q, cos, sin), rotate(k, cos, sin)

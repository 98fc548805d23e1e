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
  rotated even features, then rotated odd ones), with partial rotary as above;
- the layouts of other models' rotary functions, each computed as that function computes it
  (``x * cos + rotate(x) * sin`` with the tables expanded to the rotary width):
  ``deinterleave=False`` keeps interleaved pairs in place (GPT-J's ``rotate_every_two``, Cohere/GLM's
  ``rotate_half``); ``tables="pairs"`` takes ``repeat_interleave(freqs, 2)`` tables as they are (column
  ``j`` for feature ``j``); ``tables="freqs"`` takes one column per frequency (expanded as ``cat(f, f)`` or
  ``repeat_interleave(f, 2)``); ``negate_sin`` rotates by minus the angle; ``rotary_last`` rotates the last
  ``rotary_dim`` features; ``out_dtype`` computes in fp32 and casts to it (HF's upcasting functions).
"""

from __future__ import annotations

import functools

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


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """GPT-J's ``rotate_every_two``: (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _rotate_general(
    x, cos, sin, interleaved: bool, deinterleave: bool, tables: str, rotary_last: bool
) -> torch.Tensor:
    """``x * cos + rotate(x) * sin`` on the rotary features, the tables expanded to their width first."""
    if tables == "freqs":
        if interleaved:
            cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        else:
            cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    elif interleaved and tables == "halves":  # the first half holds the per-pair angle
        half = cos.shape[-1] // 2
        cos, sin = cos[..., :half].repeat_interleave(2, dim=-1), sin[..., :half].repeat_interleave(2, dim=-1)
    rotary_dim = cos.shape[-1]
    if rotary_last:
        x_pass, x_rot = x[..., : x.shape[-1] - rotary_dim], x[..., x.shape[-1] - rotary_dim :]
    else:
        x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    rotated = x_rot * cos + (rotate_pairs(x_rot) if interleaved else rotate_half(x_rot)) * sin
    if interleaved and deinterleave:  # the rotated pairs, gathered: even features, then odd ones
        rotated = torch.cat((rotated[..., 0::2], rotated[..., 1::2]), dim=-1)
    if x_pass.shape[-1] == 0:
        return rotated
    return torch.cat((x_pass, rotated) if rotary_last else (rotated, x_pass), dim=-1)


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1,
    interleaved: bool = False,
    *,
    deinterleave: bool = True,
    tables: str = "halves",
    negate_sin: bool = False,
    rotary_last: bool = False,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if position_ids is not None:
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0)
        cos, sin = cos[position_ids], sin[position_ids]
    if out_dtype is not None:
        compute = torch.promote_types(torch.promote_types(q.dtype, cos.dtype), torch.float32)
        q, k, cos, sin = q.to(compute), k.to(compute), cos.to(compute), sin.to(compute)
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    if negate_sin:
        sin = -sin
    if tables == "halves" and not rotary_last and (deinterleave or not interleaved):
        rotate = _rotate_interleaved if interleaved else _rotate
    else:
        rotate = functools.partial(
            _rotate_general,
            interleaved=interleaved,
            deinterleave=deinterleave,
            tables=tables,
            rotary_last=rotary_last,
        )
    q_embed, k_embed = rotate(q, cos, sin), rotate(k, cos, sin)
    if out_dtype is not None:
        q_embed, k_embed = q_embed.to(out_dtype), k_embed.to(out_dtype)
    return q_embed, k_embed

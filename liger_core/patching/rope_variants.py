"""Drop-ins for the rotary functions of Hugging Face models: Llama's ``apply_rotary_pos_emb`` (and its
cast-back, half-table and DeepSeek-V3 interleaved forms) and the others below.

Each takes the same arguments (names, order, defaults) as the functions it replaces and computes what they
compute through ``liger_core.ops.rope``'s layout keywords; structural patching (``rope_probe.ROPE_LAYOUTS``)
probes which one, if any, reproduces a model's function and installs it in place of that function's global
name in a copy of the attention forward (``forwards.forward_with_global``). The ``*_cast_back`` twins return
the input's dtype, computed in fp32 (the functions that upcast q/k and cast back); the others return
``promote_types(x.dtype, cos.dtype)``, as ``x * cos``.

What each layout is (the math of the function it replaces):

- vision towers (Qwen2-VL family, GLM-4V, Kimi-K2.5, ...): ``apply_rotary_pos_emb_vision(q, k, cos, sin)``,
  q/k tokens first ``(T, H, D)`` (or ``(B, T, H, D)``), tables ``(T, D)``, rotate-half in fp32, cast back;
  Inkling2's variant rotates interleaved pairs in place with its ``repeat_interleave`` tables;
- interleaved pairs rotated in place (``rotate_half`` = ``stack(-x[1::2], x[0::2]).flatten()``): Cohere's
  and Blt's with ``repeat_interleave(freqs, 2)`` tables (every column used), Helium/GLM/ERNIE-4.5's that
  take the first half of ``cat(freqs, freqs)`` tables and repeat-interleave it;
- NanoChat: rotate-half by minus the angle (its ``rotate_half`` is ``cat(x2, -x1)``);
- one tensor at a time ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)``: Gemma-3n/Gemma-4
  (rotate-half), DeepSeek-V4 (per-frequency tables, pairs in place, rotary features last, fp32, cast back);
  Qwen4-Exp's ``apply_rotary_pos_emb(q, k=None, cos=None, sin=None, ...)`` (k optional);
- Mistral-Large-4's ``apply_rotary_pos_emb_interleave(q, k, cos, sin, unsqueeze_dim=1)`` (DeepSeek-V3's math,
  k may be None);
- GPT-J/CodeGen's ``apply_rotary_pos_emb(tensor, sin, cos)``: ``(B, T, H, rotary_dim)``, per-frequency tables,
  pairs in place;
- complex tables ``apply_rotary_emb(xq, xk, freqs_cis)`` (Llama 4: q/k ``(B, T, H, D)``; DeepSeek-V2:
  ``(B, H, T, D)``): the product with ``freqs_cis`` rotates each pair ``(x[2i], x[2i+1])`` in place by the
  angle of ``freqs_cis[..., i]``, in fp32, cast back.
"""

from __future__ import annotations

import torch

import liger_core


def liger_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, *, position_ids=None):
    """Drop-in for HF's ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` (full or partial rotary)."""
    return liger_core.ops.rope(q, k, cos, sin, position_ids=position_ids, unsqueeze_dim=unsqueeze_dim)


def liger_rotary_pos_emb_cast_back(q, k, cos, sin, unsqueeze_dim=1, *, position_ids=None):
    """As above, returning q/k in their input dtype (OLMo-2's variant: its cos/sin are fp32)."""
    q_embed, k_embed = liger_core.ops.rope(
        q, k, cos, sin, position_ids=position_ids, unsqueeze_dim=unsqueeze_dim
    )
    return q_embed.to(q.dtype), k_embed.to(k.dtype)


def liger_rotary_pos_emb_half_tables(q, k, cos, sin, unsqueeze_dim=1):
    """For functions that take cos/sin of half the rotary width (one column per frequency, gpt-oss):
    ``x1 * cos - x2 * sin, x2 * cos + x1 * sin`` on the two halves is rotate_half with the tables doubled."""
    return liger_rotary_pos_emb(q, k, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1), unsqueeze_dim)


def liger_rotary_pos_emb_half_tables_cast_back(q, k, cos, sin, unsqueeze_dim=1):
    """``liger_rotary_pos_emb_half_tables`` returning q/k in their input dtype."""
    q_embed, k_embed = liger_rotary_pos_emb_half_tables(q, k, cos, sin, unsqueeze_dim)
    return q_embed.to(q.dtype), k_embed.to(k.dtype)


def liger_rotary_pos_emb_interleaved(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Drop-in for DeepSeek-V3's ``apply_rotary_pos_emb_interleave`` (pairs (x0, x1), (x2, x3), ...)."""
    return liger_core.ops.rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, interleaved=True)


def liger_rotary_pos_emb_interleaved_cast_back(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """``liger_rotary_pos_emb_interleaved`` returning q/k in their input dtype."""
    q_embed, k_embed = liger_rotary_pos_emb_interleaved(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    return q_embed.to(q.dtype), k_embed.to(k.dtype)


def rope_function(casts_back: bool):
    return liger_rotary_pos_emb_cast_back if casts_back else liger_rotary_pos_emb


_PAIRS = dict(interleaved=True, deinterleave=False)


def _rope(q, k, cos, sin, unsqueeze_dim=1, **options):
    if q.dim() == 3 and cos.dim() == 2:
        # rows of (N, H, D) with (N, R) tables (Qwen4-Exp's indexer keys): a batch of 1, the head axis where
        # cos.unsqueeze(unsqueeze_dim) puts its 1, moved by one
        head_axis = unsqueeze_dim % 3 + 1
        q_embed, k_embed = liger_core.ops.rope(
            q[None], k[None], cos[None], sin[None], unsqueeze_dim=head_axis, **options
        )
        return q_embed[0], k_embed[0]
    return liger_core.ops.rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, **options)


def _rope_one(x, cos, sin, unsqueeze_dim=1, **options):
    """ops.rope on one tensor: k is an empty slice of x's head axis (no work, no copy)."""
    head_axis = unsqueeze_dim % x.dim()  # where cos.unsqueeze(unsqueeze_dim) broadcasts over heads
    x_embed, _ = _rope(x, x.narrow(head_axis, 0, 0), cos, sin, unsqueeze_dim, **options)
    return x_embed


# ---- vision towers: tokens first -------------------------------------------------------------------------


def _rope_tokens_first(q, k, cos, sin, **options):
    """(T, H, D) or (B, T, H, D) q/k, (T, R) or (B, T, R) tables: a batch axis of 1 added where missing."""
    q4, k4 = (q, k) if q.dim() == 4 else (q.unsqueeze(0), k.unsqueeze(0))
    cos, sin = (cos, sin) if cos.dim() == 3 else (cos.unsqueeze(0), sin.unsqueeze(0))
    q_embed, k_embed = _rope(q4, k4, cos, sin, 2, out_dtype=q.dtype, **options)
    return q_embed.view(q.shape), k_embed.view(k.shape)


def liger_rotary_pos_emb_vision(q, k, cos, sin):
    """Drop-in for the vision towers' ``apply_rotary_pos_emb_vision`` (rotate-half, fp32, cast back)."""
    return _rope_tokens_first(q, k, cos, sin)


def liger_rotary_pos_emb_vision_pairs(q, k, cos, sin):
    """As ``liger_rotary_pos_emb_vision`` with interleaved pairs rotated in place (Inkling2's
    ``rotate_pairwise``), every table column used."""
    return _rope_tokens_first(q, k, cos, sin, tables="pairs", **_PAIRS)


# ---- interleaved pairs in place ------------------------------------------------------------------------


def liger_rotary_pos_emb_pairs(q, k, cos, sin, unsqueeze_dim=1):
    """Cohere/Blt's pairs in place with ``repeat_interleave(freqs, 2)`` tables (column j for feature j)."""
    return _rope(q, k, cos, sin, unsqueeze_dim, tables="pairs", **_PAIRS)


def liger_rotary_pos_emb_pairs_cast_back(q, k, cos, sin, unsqueeze_dim=1):
    """``liger_rotary_pos_emb_pairs`` in fp32, returned in q's dtype (Cohere, ERNIE-4.5-VL text)."""
    return _rope(q, k, cos, sin, unsqueeze_dim, tables="pairs", out_dtype=q.dtype, **_PAIRS)


def liger_rotary_pos_emb_pairs_first_half(q, k, cos, sin, unsqueeze_dim=1):
    """Helium/GLM's pairs in place, every pair's angle from the first half of ``cat(freqs, freqs)`` tables
    (``cos[..., :half].repeat_interleave(2)``); partial rotary passes the rest through."""
    return _rope(q, k, cos, sin, unsqueeze_dim, **_PAIRS)


def liger_rotary_pos_emb_pairs_first_half_cast_back(q, k, cos, sin, unsqueeze_dim=1):
    """``liger_rotary_pos_emb_pairs_first_half`` in fp32, returned in q's dtype (ERNIE-4.5)."""
    return _rope(q, k, cos, sin, unsqueeze_dim, out_dtype=q.dtype, **_PAIRS)


# ---- rotate-half variants ------------------------------------------------------------------------------


def liger_rotary_pos_emb_negated(q, k, cos, sin, unsqueeze_dim=1):
    """NanoChat's rotate-half with ``rotate_half(x) = cat(x2, -x1)``: the rotation by minus the angle."""
    return _rope(q, k, cos, sin, unsqueeze_dim, negate_sin=True)


def liger_rotary_pos_emb_negated_cast_back(q, k, cos, sin, unsqueeze_dim=1):
    """``liger_rotary_pos_emb_negated`` in fp32, returned in q's dtype."""
    return _rope(q, k, cos, sin, unsqueeze_dim, negate_sin=True, out_dtype=q.dtype)


def liger_rotary_pos_emb_optional_k(q, k=None, cos=None, sin=None, unsqueeze_dim=1):
    """Qwen4-Exp's ``apply_rotary_pos_emb`` (rotate-half, partial rotary), which takes k optionally and then
    returns q alone."""
    if k is None:
        return _rope_one(q, cos, sin, unsqueeze_dim)
    return _rope(q, k, cos, sin, unsqueeze_dim)


def liger_rotary_pos_emb_interleave_optional_k(q, k, cos, sin, unsqueeze_dim=1):
    """Mistral-Large-4's ``apply_rotary_pos_emb_interleave``: DeepSeek-V3's (pairs in, de-interleaved out,
    first-half tables); k may be None (then ``(q_embed, None)``)."""
    if k is None:
        return _rope_one(q, cos, sin, unsqueeze_dim, interleaved=True), None
    return _rope(q, k, cos, sin, unsqueeze_dim, interleaved=True)


# ---- one tensor ----------------------------------------------------------------------------------------


def liger_rotary_pos_emb_one(x, cos, sin, unsqueeze_dim=1):
    """Gemma-3n/Gemma-4's ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)``: rotate-half, one tensor."""
    return _rope_one(x, cos, sin, unsqueeze_dim)


def liger_rotary_pos_emb_one_cast_back(x, cos, sin, unsqueeze_dim=1):
    """``liger_rotary_pos_emb_one`` in fp32, returned in x's dtype."""
    return _rope_one(x, cos, sin, unsqueeze_dim, out_dtype=x.dtype)


def liger_rotary_pos_emb_one_pairs_last(x, cos, sin, unsqueeze_dim=1):
    """DeepSeek-V4's ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)``: per-frequency tables, pairs in
    place, the rotary features last in each head (``[nope | rope]``), fp32, cast back to x's dtype."""
    return _rope_one(
        x, cos, sin, unsqueeze_dim, tables="freqs", rotary_last=True, out_dtype=x.dtype, **_PAIRS
    )


def liger_rotary_pos_emb_gptj(tensor, sin, cos):
    """GPT-J/CodeGen's ``apply_rotary_pos_emb(tensor, sin, cos)``: ``tensor`` ``(B, T, H, rotary_dim)``,
    per-frequency ``sin``/``cos`` ``(B, T, rotary_dim / 2)``, pairs in place (``rotate_every_two``)."""
    return _rope_one(tensor, cos, sin, 2, tables="freqs", **_PAIRS)


# ---- complex tables ------------------------------------------------------------------------------------


def _rope_complex(xq, xk, freqs_cis, unsqueeze_dim):
    """``view_as_real(view_as_complex(x.float() pairs) * freqs_cis).flatten().type_as(x)``: each pair rotated
    in place by ``angle(freqs_cis)``, the tables' real and imaginary parts being cos and sin (HF's
    ``freqs_cis`` are unit ``polar(1, freqs)``)."""
    freqs = torch.view_as_real(freqs_cis)
    cos, sin = freqs[..., 0], freqs[..., 1]
    return _rope(xq, xk, cos, sin, unsqueeze_dim, tables="freqs", out_dtype=xq.dtype, **_PAIRS)


def liger_rotary_emb_complex(xq, xk, freqs_cis):
    """Llama 4's ``apply_rotary_emb(xq, xk, freqs_cis)``: q/k ``(B, T, H, D)``, freqs_cis ``(B, T, D/2)``."""
    return _rope_complex(xq, xk, freqs_cis, 2)


def liger_rotary_emb_complex_heads_first(xq, xk, freqs_cis):
    """DeepSeek-V2's ``apply_rotary_emb(xq, xk, freqs_cis)``: q/k ``(B, H, T, D)``, ``freqs_cis`` ``(B, T,
    D/2)``."""
    return _rope_complex(xq, xk, freqs_cis, 1)


for _fn in (
    liger_rotary_pos_emb,
    liger_rotary_pos_emb_cast_back,
    liger_rotary_pos_emb_half_tables,
    liger_rotary_pos_emb_half_tables_cast_back,
    liger_rotary_pos_emb_interleaved,
    liger_rotary_pos_emb_interleaved_cast_back,
    liger_rotary_pos_emb_vision,
    liger_rotary_pos_emb_vision_pairs,
    liger_rotary_pos_emb_pairs,
    liger_rotary_pos_emb_pairs_cast_back,
    liger_rotary_pos_emb_pairs_first_half,
    liger_rotary_pos_emb_pairs_first_half_cast_back,
    liger_rotary_pos_emb_negated,
    liger_rotary_pos_emb_negated_cast_back,
    liger_rotary_pos_emb_optional_k,
    liger_rotary_pos_emb_interleave_optional_k,
    liger_rotary_pos_emb_one,
    liger_rotary_pos_emb_one_cast_back,
    liger_rotary_pos_emb_one_pairs_last,
    liger_rotary_pos_emb_gptj,
    liger_rotary_emb_complex,
    liger_rotary_emb_complex_heads_first,
):
    _fn._liger_core_kind = "rope"
del _fn

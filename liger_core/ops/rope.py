"""Rotary position embedding (RoPE), Hugging Face's ``apply_rotary_pos_emb`` (rotate_half convention).

Math (fp32 inside the kernel, one rounding to the output dtype). With ``x1, x2`` the two halves of the first
``rotary_dim`` features of a head, ``c1, c2`` / ``s1, s2`` the halves of its ``cos`` / ``sin`` row::

    forward:   y1 = x1 * c1 - x2 * s1          (= x * cos + rotate_half(x) * sin)
               y2 = x2 * c2 + x1 * s2
    backward:  dx1 = dy1 * c1 + dy2 * s2       (the transpose of the forward map)
               dx2 = dy2 * c2 - dy1 * s1
    features past rotary_dim (partial rotary) pass through: y = x, dx = dy.

Interleaved (``interleaved=True``: DeepSeek-V3's ``apply_rotary_pos_emb_interleave``, GPT-J pairs): ``x1, x2``
are the even and odd features ``x[0::2], x[1::2]`` of the first ``rotary_dim`` (read by stride, no copy), only
the first halves of the tables are used (``c2 = c1``, ``s2 = s1``, HF's ``cat(freqs, freqs)``), and the
output is de-interleaved as HF's: ``y = cat(y1, y2)``. Its backward reads ``dy1, dy2`` as halves and writes
``dx1, dx2`` back to the even and odd features.

Other models' layouts (keywords of ``rope``, constexprs of the one kernel): pairs kept in place
(``deinterleave=False``: loads and stores both by stride 2, GPT-J/Cohere/GLM/Llama 4), tables of
``repeat_interleave(freqs, 2)`` (``tables="pairs"``: ``c1, c2 = cos[0::2], cos[1::2]``) or of one column per
frequency (``tables="freqs"``: ``c2 = c1``), sin negated, the rotary features last in the head (DeepSeek-V4),
and the output rounded to a given dtype (``out_dtype``: HF's functions that compute in fp32 and cast back).

The backward is the forward with ``(s1, s2)`` replaced by ``(-s2, -s1)`` (with HF's duplicated tables, where
``s1 == s2``, simply sin negated), so one kernel serves both passes.

One program per token (b, t): it loads that token's cos/sin row once and rotates every q head and every k
head of the token in one launch (any head counts, so GQA needs nothing special; head counts are compile-time
constants, one compilation per model config). q/k are read through their
strides, so HF's ``(B, T, H, D) -> transpose(1, 2)`` views are not copied. Minimal HBM traffic: read q, k
(cos/sin are re-read per token but stay in L2), write the two outputs; the backward reads dq_embed, dk_embed
and writes dq, dk.
Nothing is saved for backward (cos/sin are inputs).

HF's tables repeat their first half (``cat(freqs, freqs)``), so ``c2 == c1`` and ``s2 == s1``; once a table
pair is known to be bitwise so, the kernel is specialised not to load the second halves (at 8 q / 2 kv heads
the tables are 9 % of the bytes). The check runs on the device once per table object and version; its answer
reaches the host through pinned memory and an event, without a sync, and until it has arrived the kernel reads
both halves. HF builds the tables once per forward, and every layer, the recomputation of a checkpointed layer
and the backward get the same objects, so all but the first calls of a step read one half. Any table stays
exact. Under torch.compile and for inference-mode tables both halves are always read.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from liger_core import reference, tuning
from liger_core.dispatch import INDEX_DTYPES, check_same_device, check_tensor, launcher, use_triton
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._rope_math import (
    FREQ_TABLES,
    TABLES,
    TableHalves,
    check_table_halves,
    layout_bits,
    layout_constexprs,
)

# Elements of one [heads x half-rotary] tile per step of the head loop: ``tuning.ROPE_TILE_ELEMENTS``.
_NUM_WARPS = 4
# Few tokens with many heads each (B * T <= _FEW_TOKENS and (Hq + Hk) * rotary_dim >= _MANY_HEAD_ELEMENTS): 8
# warps. Measured (H100, bf16 fwd+bwd GPU time; script at 0aa2349: `python benchmarks/variants_glu_rope.py
# --only rope --rope-shapes ...`): q1x64x1024 kv16 0.0400 -> 0.0376 ms, q1x128x1024 kv32 0.0717 ->
# 0.0671 (liger-kernel 0.0368 / 0.0679); 8 warps lose elsewhere: q4x32x4096 kv8 0.2379 -> 0.2457, q1x32x65536
# kv8 0.924 -> 0.955, q1x8x4093 kv2 0.0247 -> 0.0266.
_NUM_WARPS_FEW_TOKENS_MANY_HEADS = 8
_FEW_TOKENS = 2048
_MANY_HEAD_ELEMENTS = 8192


@triton.jit
def _head_tile(
    stride_h,
    h0,
    N_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PAIRS: tl.constexpr,
):
    """(head offsets, first-half features, second-half features, mask) of the tile of heads [h0, h0 +
    BLOCK_H) of one token: the features [0, HALF) and [HALF, 2 HALF), or with PAIRS the even and odd ones
    (interleaved)."""
    heads = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads < N_HEADS)[:, None] & (cols < HALF)[None, :]
    if PAIRS:
        first, second = 2 * cols, 2 * cols + 1
    else:
        first, second = cols, cols + HALF
    return heads[:, None] * stride_h, first, second, mask


@triton.jit
def _load_halves(
    x_ptr,
    x_stride_h,
    h0,
    N_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PAIRS: tl.constexpr,
):
    """The two rotary halves of heads [h0, h0 + BLOCK_H) of one token (x_ptr: head 0, feature 0), fp32
    (``_head_tile``'s features)."""
    rows, first, second, mask = _head_tile(x_stride_h, h0, N_HEADS, HALF, BLOCK_H, BLOCK_HALF, PAIRS)
    x1 = tl.load(x_ptr + rows + first[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + rows + second[None, :], mask=mask, other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _store_rotated(
    y_ptr,
    y_stride_h,
    h0,
    x1,
    x2,
    c1,
    c2,
    s1,
    s2,
    N_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PAIRS: tl.constexpr,
):
    """y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2 for heads [h0, h0 + BLOCK_H), rounded once to y's dtype, stored
    as halves, or with PAIRS as the even and odd features (``_head_tile``)."""
    rows, first, second, mask = _head_tile(y_stride_h, h0, N_HEADS, HALF, BLOCK_H, BLOCK_HALF, PAIRS)
    y1 = x1 * c1[None, :] - x2 * s1[None, :]
    y2 = x2 * c2[None, :] + x1 * s2[None, :]
    tl.store(y_ptr + rows + first[None, :], y1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + rows + second[None, :], y2.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _table_halves(
    cos_row,
    sin_row,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    HALVES_EQUAL: tl.constexpr,
    PAIR_TABLES: tl.constexpr,
    NEGATE_SIN: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    """(c1, c2, s1, s2) of one token, fp32: the halves [0, HALF) and [HALF, 2 HALF) of its table rows, or with
    PAIR_TABLES their even and odd columns; with HALVES_EQUAL the first half twice (the second not loaded).
    NEGATE_SIN and the backward's transpose are applied."""
    cols = tl.arange(0, BLOCK_HALF)
    mask = cols < HALF
    if PAIR_TABLES:
        first, second = 2 * cols, 2 * cols + 1
    else:
        first, second = cols, cols + HALF
    c1 = tl.load(cos_row + first, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_row + first, mask=mask, other=0.0).to(tl.float32)
    if HALVES_EQUAL:
        c2 = c1
        s2 = s1
    else:
        c2 = tl.load(cos_row + second, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(sin_row + second, mask=mask, other=0.0).to(tl.float32)
    if NEGATE_SIN:
        s1, s2 = -s1, -s2
    if BACKWARD:
        # transpose of the rotation: (s1, s2) -> (-s2, -s1)
        s1, s2 = -s2, -s1
    return c1, c2, s1, s2


@triton.jit
def _copy_pass_through(
    x_ptr,
    x_stride_h,
    y_ptr,
    y_stride_h,
    N_HEADS: tl.constexpr,
    START: tl.constexpr,
    PASS_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    """Features [START, START + PASS_DIM) of every head (partial rotary) are copied unchanged."""
    cols = tl.arange(0, BLOCK_PASS)
    for h0 in tl.static_range(0, N_HEADS, BLOCK_H):
        heads = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
        mask = (heads < N_HEADS)[:, None] & (cols < PASS_DIM)[None, :]
        x = tl.load(x_ptr + heads[:, None] * x_stride_h + START + cols[None, :], mask=mask, other=0.0)
        tl.store(
            y_ptr + heads[:, None] * y_stride_h + START + cols[None, :],
            x.to(y_ptr.dtype.element_ty),
            mask=mask,
        )


@fast_launch
@triton.jit
def _rope_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    seq_len,
    q_stride_b,
    q_stride_t,
    q_stride_h,
    k_stride_b,
    k_stride_t,
    k_stride_h,
    cs_stride_b,
    cs_stride_t,
    N_Q_HEADS: tl.constexpr,
    N_K_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    PASS_DIM: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    BACKWARD: tl.constexpr,
    HALVES_EQUAL: tl.constexpr,  # c2 = c1, s2 = s1: the second table halves are not loaded
    PAIRS_IN: tl.constexpr,  # the forward's input is GPT-J pairs (the backward writes pairs)
    PAIRS_OUT: tl.constexpr,  # the forward's output is pairs (the backward reads pairs)
    PAIR_TABLES: tl.constexpr,  # c1, c2 = cos[0::2], cos[1::2] (repeat_interleave tables), same for sin
    NEGATE_SIN: tl.constexpr,  # rotate by minus the tables' angle
    ROTARY_LAST: tl.constexpr,  # the rotary features are the last 2 HALF of a head, the pass-through first
):
    # int64: B*T*H*D passes 2^31 at long contexts
    token = tl.program_id(0).to(tl.int64)
    b = token // seq_len
    t = token % seq_len

    cs_row = b * cs_stride_b + t * cs_stride_t  # cs_stride_b is 0 for a cos/sin batch of 1
    c1, c2, s1, s2 = _table_halves(
        cos_ptr + cs_row, sin_ptr + cs_row, HALF, BLOCK_HALF, HALVES_EQUAL, PAIR_TABLES, NEGATE_SIN, BACKWARD
    )

    # the rotary features start at ROT_START; the pass-through ones (partial rotary) at PASS_START
    ROT_START: tl.constexpr = PASS_DIM if ROTARY_LAST else 0
    PASS_START: tl.constexpr = 0 if ROTARY_LAST else 2 * HALF
    q_tok = q_ptr + b * q_stride_b + t * q_stride_t
    k_tok = k_ptr + b * k_stride_b + t * k_stride_t
    # the outputs have their input's strides (the launcher makes sure)
    q_out_tok = q_out_ptr + b * q_stride_b + t * q_stride_t
    k_out_tok = k_out_ptr + b * k_stride_b + t * k_stride_t
    q_in, k_in = q_tok + ROT_START, k_tok + ROT_START
    q_out, k_out = q_out_tok + ROT_START, k_out_tok + ROT_START
    # the backward is the transposed map: it reads what the forward writes and writes what it reads
    LOAD_PAIRS: tl.constexpr = PAIRS_OUT if BACKWARD else PAIRS_IN
    STORE_PAIRS: tl.constexpr = PAIRS_IN if BACKWARD else PAIRS_OUT
    if BLOCK_HQ >= N_Q_HEADS and BLOCK_HK >= N_K_HEADS:
        # one tile each: every load of the token in flight before the first store
        q1, q2 = _load_halves(q_in, q_stride_h, 0, N_Q_HEADS, HALF, BLOCK_HQ, BLOCK_HALF, LOAD_PAIRS)
        k1, k2 = _load_halves(k_in, k_stride_h, 0, N_K_HEADS, HALF, BLOCK_HK, BLOCK_HALF, LOAD_PAIRS)
        _store_rotated(
            q_out, q_stride_h, 0, q1, q2, c1, c2, s1, s2, N_Q_HEADS, HALF, BLOCK_HQ, BLOCK_HALF, STORE_PAIRS
        )
        _store_rotated(
            k_out, k_stride_h, 0, k1, k2, c1, c2, s1, s2, N_K_HEADS, HALF, BLOCK_HK, BLOCK_HALF, STORE_PAIRS
        )
    else:
        for h0 in tl.static_range(0, N_Q_HEADS, BLOCK_HQ):
            q1, q2 = _load_halves(q_in, q_stride_h, h0, N_Q_HEADS, HALF, BLOCK_HQ, BLOCK_HALF, LOAD_PAIRS)
            _store_rotated(
                q_out,
                q_stride_h,
                h0,
                q1,
                q2,
                c1,
                c2,
                s1,
                s2,
                N_Q_HEADS,
                HALF,
                BLOCK_HQ,
                BLOCK_HALF,
                STORE_PAIRS,
            )
        for h0 in tl.static_range(0, N_K_HEADS, BLOCK_HK):
            k1, k2 = _load_halves(k_in, k_stride_h, h0, N_K_HEADS, HALF, BLOCK_HK, BLOCK_HALF, LOAD_PAIRS)
            _store_rotated(
                k_out,
                k_stride_h,
                h0,
                k1,
                k2,
                c1,
                c2,
                s1,
                s2,
                N_K_HEADS,
                HALF,
                BLOCK_HK,
                BLOCK_HALF,
                STORE_PAIRS,
            )
    if PASS_DIM > 0:
        _copy_pass_through(
            q_tok, q_stride_h, q_out_tok, q_stride_h, N_Q_HEADS, PASS_START, PASS_DIM, BLOCK_HQ, BLOCK_PASS
        )
        _copy_pass_through(
            k_tok, k_stride_h, k_out_tok, k_stride_h, N_K_HEADS, PASS_START, PASS_DIM, BLOCK_HK, BLOCK_PASS
        )


def _pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1). Plain Python: triton.next_power_of_2 is a constexpr_function in
    recent Triton, with wrapper overhead on every launch."""
    return 1 << max(n - 1, 0).bit_length()


def _dense_strides(x: torch.Tensor) -> bool:
    """Whether ``empty_like(x)`` gets x's strides (x dense, no gaps): then the output keeps x's layout (HF's
    transposed q stays (B, T, H, D) in memory); otherwise x is read from a dense copy."""
    return torch.empty_like(x, device="meta").stride() == x.stride()


class _Plan(NamedTuple):
    """Everything a launch derives from the shapes and strides (cached: host time on every call)."""

    copy_q: bool  # read q / k from a dense copy (inputs with gaps)
    copy_k: bool
    grid: tuple[int]
    args: tuple[int, ...]  # the runtime int arguments: seq_len, then the strides
    constexprs: dict
    empty: bool  # nothing to launch


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 4096  # distinct shapes (variable sequence lengths); the cache starts over beyond this


def _plan(
    x_q: torch.Tensor,
    x_k: torch.Tensor,
    cos: torch.Tensor,
    unsqueeze_dim: int,
    backward: bool,
    layout: int = 0,
) -> _Plan:
    copy_q, copy_k = not _dense_strides(x_q), not _dense_strides(x_k)
    q_strides = torch.empty(x_q.shape, device="meta").stride() if copy_q else x_q.stride()  # the copy's
    k_strides = torch.empty(x_k.shape, device="meta").stride() if copy_k else x_k.stride()
    batch, dim_1, dim_2, head_dim = x_q.shape
    seq_len, n_q_heads = (dim_2, dim_1) if unsqueeze_dim == 1 else (dim_1, dim_2)
    n_k_heads = x_k.shape[unsqueeze_dim]
    half = cos.shape[-1] if layout & FREQ_TABLES else cos.shape[-1] // 2
    pass_dim = head_dim - 2 * half
    block_half = _pow2(half)
    heads_per_tile = max(1, tuning.ROPE_TILE_ELEMENTS // block_half)
    cs_stride_b, cs_stride_t, _ = cos.stride()

    def bthd(strides: tuple[int, ...]) -> tuple[int, int, int]:  # (batch, token, head) in either HF layout
        s_b, s_1, s_2, _ = strides
        return (s_b, s_2, s_1) if unsqueeze_dim == 1 else (s_b, s_1, s_2)

    args = (seq_len, *bthd(q_strides), *bthd(k_strides), cs_stride_b if cos.shape[0] > 1 else 0, cs_stride_t)
    constexprs = dict(
        N_Q_HEADS=n_q_heads,
        N_K_HEADS=n_k_heads,
        HALF=half,
        PASS_DIM=pass_dim,
        BLOCK_HQ=min(_pow2(n_q_heads), heads_per_tile),
        BLOCK_HK=min(_pow2(n_k_heads), heads_per_tile),
        BLOCK_HALF=block_half,
        BLOCK_PASS=_pow2(pass_dim),
        BACKWARD=backward,
        num_warps=(
            _NUM_WARPS_FEW_TOKENS_MANY_HEADS
            if batch * seq_len <= _FEW_TOKENS and (n_q_heads + n_k_heads) * 2 * half >= _MANY_HEAD_ELEMENTS
            else _NUM_WARPS
        ),
    )
    empty = batch * seq_len == 0 or head_dim == 0
    return _Plan(copy_q, copy_k, (batch * seq_len,), args, constexprs, empty)


def _launch(
    x_q: torch.Tensor,
    x_k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    halves_equal: bool,
    unsqueeze_dim: int,
    out_dtype: torch.dtype,
    backward: bool,
    layout: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    key = (
        x_q.shape, x_q.stride(), x_k.shape, x_k.stride(), cos.shape, cos.stride(), unsqueeze_dim, backward,
        layout, tuning.ROPE_TILE_ELEMENTS, _NUM_WARPS, _NUM_WARPS_FEW_TOKENS_MANY_HEADS, _FEW_TOKENS,
        _MANY_HEAD_ELEMENTS,
    )  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _plan(x_q, x_k, cos, unsqueeze_dim, backward, layout)
    if plan.copy_q:
        x_q = x_q.contiguous()
    if plan.copy_k:
        x_k = x_k.contiguous()
    y_q = torch.empty_like(x_q, dtype=out_dtype)
    y_k = torch.empty_like(x_k, dtype=out_dtype)
    if not plan.empty:
        _rope_kernel[plan.grid](
            x_q,
            x_k,
            cos,
            sin,
            y_q,
            y_k,
            *plan.args,
            **layout_constexprs(layout, halves_equal),
            **plan.constexprs,
        )
    return y_q, y_k


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces a patched
# model through them without graph breaks; the autograd Function below composes them, and in eager mode calls
# the plain implementations (``dispatch.launcher``: the dispatcher's host time per call is as long as the
# kernel at typical shapes). Inputs arrive validated: q/k 4-D with unit last stride, cos/sin (1 or B, T,
# rotary_dim) with equal strides and unit last stride.
def _rope_fwd_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    halves_equal: bool,
    unsqueeze_dim: int,
    layout: int,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(q, k, cos, sin, halves_equal, unsqueeze_dim, out_dtype, backward=False, layout=layout)


def _rope_bwd_impl(
    dq_embed: torch.Tensor,
    dk_embed: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    halves_equal: bool,
    unsqueeze_dim: int,
    grad_dtype: torch.dtype,
    layout: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(
        dq_embed, dk_embed, cos, sin, halves_equal, unsqueeze_dim, grad_dtype, backward=True, layout=layout
    )


_rope_fwd = torch.library.custom_op("liger_core::rope_fwd", _rope_fwd_impl, mutates_args=())
_rope_bwd = torch.library.custom_op("liger_core::rope_bwd", _rope_bwd_impl, mutates_args=())


@_rope_fwd.register_fake
def _(q, k, cos, sin, halves_equal, unsqueeze_dim, layout, out_dtype):
    return torch.empty_like(q, dtype=out_dtype), torch.empty_like(k, dtype=out_dtype)


@_rope_bwd.register_fake
def _(dq_embed, dk_embed, cos, sin, halves_equal, unsqueeze_dim, grad_dtype, layout):
    return torch.empty_like(dq_embed, dtype=grad_dtype), torch.empty_like(dk_embed, dtype=grad_dtype)


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


class RopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q, k, cos, sin, table_check: TableHalves | None, unsqueeze_dim: int, options: dict, out_dtype
    ):
        q, k = _unit_last_stride(q), _unit_last_stride(k)
        cos_strides = cos.stride()
        if cos_strides != sin.stride() or (cos_strides[-1] != 1 and cos.shape[-1] > 1):
            cos, sin = cos.contiguous(), sin.contiguous()
        ctx.unsqueeze_dim = unsqueeze_dim
        ctx.options = options  # the layout keywords of ``rope``
        layout = ctx.layout = layout_bits(**options)
        # cos/sin are saved (autograd fails on their in-place change before the backward), so the check still
        # holds there; by then its answer has usually arrived
        ctx.table_check = table_check
        halves_equal = table_check is not None and table_check.known_equal()
        ctx.q_dtype = q.dtype
        # cos/sin gradients are rare (HF builds them under no_grad) and need q, k: keep those only then
        needs = ctx.needs_input_grad
        ctx.table_grads = needs[2] or needs[3]
        if ctx.table_grads:
            ctx.save_for_backward(cos, sin, q, k)
        else:
            ctx.save_for_backward(cos, sin)
        ctx.out_dtype = out_dtype
        out_dtype = torch.promote_types(q.dtype, cos.dtype) if out_dtype is None else out_dtype
        return launcher(_rope_fwd, _rope_fwd_impl)(
            q, k, cos, sin, halves_equal, unsqueeze_dim, layout, out_dtype
        )

    @staticmethod
    def backward(ctx, dq_embed, dk_embed):
        cos, sin = ctx.saved_tensors[:2]
        dq_embed, dk_embed = _unit_last_stride(dq_embed), _unit_last_stride(dk_embed)
        bwd = launcher(_rope_bwd, _rope_bwd_impl)
        halves_equal = ctx.table_check is not None and ctx.table_check.known_equal()
        dq, dk = bwd(dq_embed, dk_embed, cos, sin, halves_equal, ctx.unsqueeze_dim, ctx.q_dtype, ctx.layout)
        dcos = dsin = None
        if ctx.table_grads:
            # eager autograd of the reference: these gradients are a reduction over heads, off the hot path
            q, k = ctx.saved_tensors[2:]
            with torch.enable_grad():
                cos_r, sin_r = cos.detach().requires_grad_(), sin.detach().requires_grad_()
                q_r, k_r = reference.rope(
                    q,
                    k,
                    cos_r,
                    sin_r,
                    unsqueeze_dim=ctx.unsqueeze_dim,
                    out_dtype=ctx.out_dtype,
                    **ctx.options,
                )
                dcos, dsin = torch.autograd.grad((q_r, k_r), (cos_r, sin_r), (dq_embed, dk_embed))
        return dq, dk, dcos, dsin, None, None, None, None


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
    """Apply rotary position embedding to ``q`` and ``k``, exactly as HF's ``apply_rotary_pos_emb`` (or, with
    ``interleaved=True``, DeepSeek-V3's ``apply_rotary_pos_emb_interleave``).

    Args:
        q: ``(B, n_q_heads, T, head_dim)`` for ``unsqueeze_dim=1`` (HF's default layout), or
            ``(B, T, n_q_heads, head_dim)`` for ``unsqueeze_dim=2``. Any strides (HF's transposed views are
            read in place).
        k: like ``q`` with any number of heads (GQA/MQA), same dtype, batch, T and head_dim.
        cos, sin: ``(1 or B, T, rotary_dim)``, same shape and dtype. ``rotary_dim`` must be even and at most
            ``head_dim``; when smaller (partial rotary, as in Phi/GLM/StableLM) only the first ``rotary_dim``
            features of each head are rotated and the rest pass through unchanged.
        position_ids: optional, HF's legacy argument: then ``cos``/``sin`` are ``(max_positions, rotary_dim)``
            tables and row ``position_ids[b, t]`` is used for token ``(b, t)`` (``cos[position_ids]``).
            ``position_ids`` is ``(1 or B, T)`` or ``(T,)`` (taken as ``(1, T)``), int32 or int64;
            out-of-range ids fail like any PyTorch indexing.
        unsqueeze_dim: 1 or 2 (also -3 or -2), as in HF: where the head axis of q/k is.
        interleaved: rotate the pairs ``(x0, x1), (x2, x3), ...`` of the first ``rotary_dim`` features by the
            angles of the first half of ``cos``/``sin`` (HF's tables are ``cat(freqs, freqs)``), and return
            them de-interleaved (the rotated even features, then the rotated odd ones), as HF's
            ``apply_rotary_pos_emb_interleave`` (DeepSeek-V2/V3, GPT-J-style checkpoints).
        deinterleave: with ``interleaved``: False keeps the rotated pairs in place (``y[2i], y[2i+1]``: GPT-J,
            Cohere, GLM, Llama 4's complex product).
        tables: how ``cos``/``sin`` hold the angles. ``"halves"``: HF's ``cat(freqs, freqs)`` (rotate-half
            uses both halves as given; ``interleaved`` uses the first half for every pair). ``"pairs"``
            (``interleaved`` only): ``repeat_interleave(freqs, 2)``, columns ``2i`` and ``2i + 1`` give the
            even and odd outputs of pair ``i`` (Cohere). ``"freqs"``: one column per frequency,
            ``rotary_dim = 2 * cos.shape[-1]`` (gpt-oss, GPT-J, DeepSeek-V4, complex tables' parts).
        negate_sin: rotate by minus the tables' angles (NanoChat's ``rotate_half`` is ``cat(x2, -x1)``).
        rotary_last: the rotary features are the LAST ``rotary_dim`` of each head, the pass-through ones
            first (DeepSeek-V4's ``[nope | rope]`` heads).
        out_dtype: the outputs' dtype. None: ``promote_types(q.dtype, cos.dtype)``, as HF's ``q * cos``
            (the reference path then computes in that dtype, as HF does). Given: computed in fp32 and rounded
            once to ``out_dtype``, as the HF functions that upcast to fp32 and cast back.

    Returns:
        ``(q_embed, k_embed)`` of dtype ``out_dtype`` (default ``promote_types(q.dtype, cos.dtype)``), in q's
        memory layout. Computed in fp32 and rounded once. Gradients flow to q and k (and to cos/sin, through
        an eager recomputation, if they require grad).
    """
    check_tensor("q", q, ndim=4)
    check_tensor("k", k, ndim=4)
    check_tensor("cos", cos)
    check_tensor("sin", sin)
    check_same_device("q", q, k=k, cos=cos, sin=sin, position_ids=position_ids)
    if k.dtype != q.dtype:
        raise TypeError(f"k has dtype {k.dtype} but q has dtype {q.dtype}; they must match")
    if sin.dtype != cos.dtype:
        raise TypeError(f"sin has dtype {sin.dtype} but cos has dtype {cos.dtype}; they must match")
    if unsqueeze_dim not in (1, 2, -3, -2):
        raise ValueError(
            f"unsqueeze_dim={unsqueeze_dim!r} is not supported; use 1 (q: B, H, T, D) or 2 (q: B, T, H, D)"
        )
    unsqueeze_dim = 1 if unsqueeze_dim in (1, -3) else 2
    if tables not in TABLES:
        raise ValueError(f"tables={tables!r} is not one of {TABLES}")
    if tables == "pairs" and not interleaved:
        raise ValueError('tables="pairs" needs interleaved=True (table column pairs for feature pairs)')
    if tuple(sin.shape) != tuple(cos.shape):
        raise ValueError(
            f"sin has shape {tuple(sin.shape)} but cos has shape {tuple(cos.shape)}; they must match"
        )

    head_dim = q.shape[-1]
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} (q.shape[-1]) must be even for rotary embedding")
    head_axis, token_axis = (1, 2) if unsqueeze_dim == 1 else (2, 1)
    batch, seq_len = q.shape[0], q.shape[token_axis]
    if k.shape[0] != batch or k.shape[token_axis] != seq_len or k.shape[-1] != head_dim:
        raise ValueError(
            f"k has shape {tuple(k.shape)}; it must match q {tuple(q.shape)} in every dimension but the "
            f"head dimension {head_axis} (unsqueeze_dim={unsqueeze_dim})"
        )

    if position_ids is not None:
        check_tensor("position_ids", position_ids, dtypes=INDEX_DTYPES)
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0)
        ids_shape = tuple(position_ids.shape)
        if len(ids_shape) != 2 or ids_shape[0] not in (1, batch) or ids_shape[1] != seq_len:
            raise ValueError(
                f"position_ids has shape {tuple(position_ids.shape)}; expected (1 or {batch}, {seq_len}) or "
                f"({seq_len},)"
            )
        if cos.dim() != 2:
            raise ValueError(
                f"cos has shape {tuple(cos.shape)}; with position_ids it must be a "
                "(max_positions, rotary_dim) table (without position_ids pass the gathered "
                "(1 or B, T, rotary_dim) rows)"
            )
        table_check = None
        plain = not interleaved and tables == "halves"
        if use_triton(q) and plain and cos.shape[-1] % 2 == 0 and 0 < cos.shape[-1] <= head_dim:
            table_check = check_table_halves(
                cos, sin
            )  # of the whole table: its gathered rows share the answer
        cos, sin = cos[position_ids], sin[position_ids]
    elif cos.dim() != 3 or cos.shape[0] not in (1, batch) or cos.shape[1] != seq_len:
        raise ValueError(f"cos has shape {tuple(cos.shape)}; expected (1 or {batch}, {seq_len}, rotary_dim)")
    rotary_dim = 2 * cos.shape[-1] if tables == "freqs" else cos.shape[-1]
    if rotary_dim % 2 or rotary_dim == 0 or rotary_dim > head_dim:
        raise ValueError(
            f"cos/sin have rotary_dim={rotary_dim} (from the last dimension, tables={tables!r}); it must be "
            f"even, positive and at most head_dim={head_dim}"
        )

    options = dict(
        interleaved=bool(interleaved),
        deinterleave=bool(deinterleave),
        tables=tables,
        negate_sin=bool(negate_sin),
        rotary_last=bool(rotary_last),
    )
    if not use_triton(q):
        return reference.rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, out_dtype=out_dtype, **options)
    if position_ids is None:
        # only rotate-half on cat(freqs, freqs) tables may read both halves: the others need no check
        table_check = check_table_halves(cos, sin) if not interleaved and tables == "halves" else None
    return RopeFunction.apply(q, k, cos, sin, table_check, unsqueeze_dim, options, out_dtype)

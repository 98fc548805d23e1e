"""RoPE probing for structural patching: find the module-level rotary function an attention forward calls,
and which layout of ``ROPE_LAYOUTS`` (data: call convention, q/k and table layouts, the liger replacement
from ``rope_variants``) reproduces it on random q/k/cos/sin, outputs and q/k gradients (see
``structural``'s docstring for what is recognised and the tolerances)."""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from liger_core.patching import probing as pr
from liger_core.patching import rope_variants as rv
from liger_core.patching.introspect import innermost_function

_ROPE_NAME = re.compile(r"rotary|rope|rotate|pos_emb", re.IGNORECASE)


def rope_global(m: nn.Module) -> tuple[str, types.FunctionType] | None:
    inner = innermost_function(type(m).forward)
    if inner is None:
        return None
    for name in inner.__code__.co_names:
        value = inner.__globals__.get(name)
        if _ROPE_NAME.search(name) and isinstance(value, types.FunctionType):
            return name, value
    return None


@dataclass(frozen=True)
class RopeLayout:
    """One way a model's rotary function may compute: how to probe it, and the liger function that replaces
    it when the probe matches.

    ``call``: the function's arguments, ``"q_k_cos_sin"`` (``fn(q, k, cos, sin)`` -> (q, k)), ``"x_cos_sin"``
    (one tensor), ``"x_sin_cos"`` (GPT-J's order), ``"q_k_freqs"`` (``fn(xq, xk, freqs_cis)``, complex
    tables). ``tokens``: the q/k layouts probed, each ``"bhtd"`` (B, H, T, D), ``"bthd"`` (B, T, H, D) or
    ``"thd"`` (T, H, D, vision towers; tables (T, R)); the function must match in every one (a ``(q, k,
    cos, sin)`` function that unsqueezes cos at 1 agrees with the vision layout on (T, H, D) tokens but not
    on (B, T, H, D)). ``tables``: the probe's cos/sin, ``"halves"`` (HF's
    ``cat(freqs, freqs)``), ``"any"`` (every column its own angle: a replacement that passes uses every
    column as the function does), ``"freqs"`` (one column per frequency) or ``"complex"`` (``polar``).
    ``promoted`` returns ``promote_types(q, cos)`` (as ``q * cos``), ``cast_back`` q's dtype (None: no such
    variant); the probe's dtype with fp32 tables picks one.
    """

    name: str
    call: str
    tokens: tuple[str, ...]
    tables: str
    promoted: Callable
    cast_back: Callable | None


ROPE_LAYOUTS = (
    RopeLayout(
        "rotate-half",
        "q_k_cos_sin",
        ("bhtd",),
        "halves",
        rv.liger_rotary_pos_emb,
        rv.liger_rotary_pos_emb_cast_back,
    ),
    RopeLayout(
        "half tables",
        "q_k_cos_sin",
        ("bhtd",),
        "freqs",
        rv.liger_rotary_pos_emb_half_tables,
        rv.liger_rotary_pos_emb_half_tables_cast_back,
    ),
    RopeLayout(
        "interleaved pairs",
        "q_k_cos_sin",
        ("bhtd",),
        "halves",
        rv.liger_rotary_pos_emb_interleaved,
        rv.liger_rotary_pos_emb_interleaved_cast_back,
    ),
    RopeLayout(
        "vision, tokens first", "q_k_cos_sin", ("thd", "bthd"), "halves", None, rv.liger_rotary_pos_emb_vision
    ),
    RopeLayout(
        "vision, pairs in place",
        "q_k_cos_sin",
        ("thd", "bthd"),
        "any",
        None,
        rv.liger_rotary_pos_emb_vision_pairs,
    ),
    RopeLayout(
        "pairs in place",
        "q_k_cos_sin",
        ("bhtd",),
        "any",
        rv.liger_rotary_pos_emb_pairs,
        rv.liger_rotary_pos_emb_pairs_cast_back,
    ),
    RopeLayout(
        "pairs in place, first-half tables",
        "q_k_cos_sin",
        ("bhtd",),
        "halves",
        rv.liger_rotary_pos_emb_pairs_first_half,
        rv.liger_rotary_pos_emb_pairs_first_half_cast_back,
    ),
    RopeLayout(
        "rotate-half by minus the angle",
        "q_k_cos_sin",
        ("bhtd",),
        "halves",
        rv.liger_rotary_pos_emb_negated,
        rv.liger_rotary_pos_emb_negated_cast_back,
    ),
    RopeLayout(
        "rotate-half, k optional",
        "q_k_cos_sin",
        ("bhtd",),
        "halves",
        rv.liger_rotary_pos_emb_optional_k,
        None,
    ),
    RopeLayout(
        "interleaved pairs, k optional",
        "q_k_cos_sin",
        ("bhtd",),
        "halves",
        rv.liger_rotary_pos_emb_interleave_optional_k,
        None,
    ),
    RopeLayout(
        "one tensor",
        "x_cos_sin",
        ("bhtd",),
        "halves",
        rv.liger_rotary_pos_emb_one,
        rv.liger_rotary_pos_emb_one_cast_back,
    ),
    RopeLayout(
        "one tensor, pairs in place, rotary last",
        "x_cos_sin",
        ("bhtd",),
        "freqs",
        None,
        rv.liger_rotary_pos_emb_one_pairs_last,
    ),
    RopeLayout("GPT-J sin/cos pairs", "x_sin_cos", ("bthd",), "freqs", rv.liger_rotary_pos_emb_gptj, None),
    RopeLayout("complex, heads third", "q_k_freqs", ("bthd",), "complex", None, rv.liger_rotary_emb_complex),
    RopeLayout(
        "complex, heads second",
        "q_k_freqs",
        ("bhtd",),
        "complex",
        None,
        rv.liger_rotary_emb_complex_heads_first,
    ),
)


def probe_rope(fn: types.FunctionType, dtype: torch.dtype, device, gen: torch.Generator):
    """liger's rope function that reproduces ``fn``, or a reason.

    Every layout of ``ROPE_LAYOUTS`` whose replacement takes ``fn``'s arguments is probed in turn, first
    match wins: random q/k (GQA head counts) and tables built as the layout says, at full rotary width and
    at half of it (a function that fails there is taken not to support partial rotary; one that returns
    must match there too, which tells rotary-first from rotary-last). Tables in the module's dtype (the
    math) and in fp32 (some models keep them in fp32: whether ``fn`` returns q's dtype or the promoted one
    picks the variant); outputs and q/k gradients.
    """
    failures = []
    for layout in ROPE_LAYOUTS:
        mismatch = signature_mismatch(fn, layout.promoted or layout.cast_back)
        if mismatch is not None:
            failures.append(f"{layout.name}: {mismatch}")
            continue
        verdict = _probe_rope_layout(fn, layout, dtype, device, gen)
        if not isinstance(verdict, str):
            return verdict
        failures.append(f"{layout.name}: {verdict}")
    return f"{fn.__name__} matches no liger rope layout ({'; '.join(failures)})"


def signature_mismatch(original, replacement) -> str | None:
    """Why ``replacement`` cannot take every call ``original`` can, or None.

    Positional parameters must match in name and order (a caller may pass any of them by position or by
    name), a parameter with a default must have one in the replacement too (a caller may leave it out), and
    keyword-only parameters must be accepted by name.
    """
    orig = inspect.signature(original).parameters.values()
    repl = inspect.signature(replacement).parameters
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    orig_pos = [p for p in orig if p.kind in positional]
    repl_pos = [p for p in repl.values() if p.kind in positional]
    for i, p in enumerate(orig_pos):
        if i >= len(repl_pos) or repl_pos[i].name != p.name:
            return f"its parameter {i} is {p.name!r}, the replacement's is not"
        if p.default is not inspect.Parameter.empty and repl_pos[i].default is inspect.Parameter.empty:
            return f"its {p.name!r} may be left out (default {p.default!r})"
    for p in orig:
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in repl:
            return f"its keyword {p.name!r} is not taken by the replacement"
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            return f"it takes *{p.name}"
    return None


def _rope_probe_inputs(layout: RopeLayout, tokens: str, rotary_dim: int, table_dtype, like, gen):
    """q, k (leaves' values) and the tables of one probe of ``layout``."""
    batch, seq, head_dim, n_q, n_k = 2, 5, 8, 4, 2
    shape = {"bhtd": lambda h: (batch, h, seq, head_dim), "bthd": lambda h: (batch, seq, h, head_dim)}
    shape["thd"] = lambda h: (seq, h, head_dim)
    q, k = pr.randn(shape[tokens](n_q), like, gen), pr.randn(shape[tokens](n_k), like, gen)
    lead = (seq,) if tokens == "thd" else (batch, seq)
    width = rotary_dim if layout.tables in ("halves", "any") else rotary_dim // 2
    angles = torch.rand((*lead, width if layout.tables != "halves" else width // 2), generator=gen) * 6.0
    if layout.tables == "complex":
        freqs = torch.polar(torch.ones_like(angles), angles)
        return q, k, (freqs.to(like.device, torch.complex128 if like.dtype == torch.float64 else None),)
    cos, sin = angles.cos(), angles.sin()
    if layout.tables == "halves":
        cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    cos, sin = cos.to(device=like.device, dtype=table_dtype), sin.to(device=like.device, dtype=table_dtype)
    return q, k, (sin, cos) if layout.call == "x_sin_cos" else (cos, sin)


def _rope_call(fn, layout: RopeLayout, inputs: tuple, tables: tuple) -> tuple | str:
    """``fn``'s outputs as a tuple of tensors (one for the one-tensor functions), or a reason."""
    out = fn(*inputs, *tables)
    outs = (out,) if len(inputs) == 1 else out
    if not (isinstance(outs, tuple) and all(isinstance(t, torch.Tensor) for t in outs)):
        return f"{fn.__name__} does not return {'x' if len(outs) == 1 else '(q, k)'}"
    return outs


def _probe_rope_layout(fn, layout: RopeLayout, dtype, device, gen: torch.Generator):
    like = torch.empty((), dtype=dtype, device=device)
    head_dim = 8
    chosen = layout.promoted or layout.cast_back
    table_dtypes = (None,) if layout.tables == "complex" else tuple(dict.fromkeys((dtype, torch.float32)))
    no_partial = set()  # q/k layouts where fn does not take partial rotary (the model never calls it so)
    for tokens in layout.tokens:
        for rotary_dim in (head_dim, head_dim // 2):
            for table_dtype in table_dtypes:
                if (tokens, rotary_dim) in no_partial:
                    continue
                q0, k0, tables = _rope_probe_inputs(layout, tokens, rotary_dim, table_dtype, like, gen)
                one = layout.call in ("x_cos_sin", "x_sin_cos")
                inputs = (pr.leaf(q0),) if one else (pr.leaf(q0), pr.leaf(k0))
                try:
                    with torch.enable_grad():
                        ref = _rope_call(fn, layout, inputs, tables)
                except Exception as e:  # noqa: BLE001 - a function with another signature is simply not ours
                    if rotary_dim < head_dim:
                        no_partial.add((tokens, rotary_dim))
                        continue
                    return f"{fn.__name__} failed on the probe ({type(e).__name__})"
                if isinstance(ref, str):
                    return ref
                if ref[0].dtype == q0.dtype and layout.cast_back is not None:
                    chosen = layout.cast_back
                elif layout.promoted is not None:
                    chosen = layout.promoted
                else:
                    return f"{fn.__name__} returns {ref[0].dtype} for {q0.dtype} q, the replacement does not"
                douts = [pr.randn(t.shape, t, gen) for t in ref]
                ours_in = tuple(pr.leaf(t) for t in (q0, k0)[: len(inputs)])
                with torch.enable_grad():
                    ref_grads = torch.autograd.grad(ref, inputs, douts)
                    ours = _rope_call(chosen, layout, ours_in, tables)
                    if isinstance(ours, str) or len(ours) != len(ref):
                        return "the replacement returns other outputs"
                    grads = torch.autograd.grad(ours, ours_in, douts)
                err = pr.max_err([*zip(ours, ref), *zip(grads, ref_grads)])
                if err > pr.tolerance(dtype):
                    partial = " at partial rotary" if rotary_dim < head_dim else ""
                    return f"probe rel. error {err:.1e}{partial} (q/k {tokens})"
    if layout.call == "q_k_cos_sin" and _k_may_be_left_out(fn):
        verdict = _probe_rope_without_k(fn, chosen, layout, like, gen)
        if verdict is not None:
            return verdict
    return chosen


def _k_may_be_left_out(fn) -> bool:
    k = inspect.signature(fn).parameters.get("k")
    return k is not None and k.default is None


def _probe_rope_without_k(fn, chosen, layout: RopeLayout, like: torch.Tensor, gen: torch.Generator):
    """A function whose ``k`` defaults to None is also called without keys (Qwen4-Exp's indexer): what it
    returns then (q alone, or a tuple) and q's gradient must match the replacement's too. None if they do."""
    q0, _, tables = _rope_probe_inputs(layout, layout.tokens[0], 8, None, like, gen)
    q, q2 = pr.leaf(q0), pr.leaf(q0)
    try:
        with torch.enable_grad():
            ref, ours = fn(q, None, *tables), chosen(q2, None, *tables)
    except Exception as e:  # noqa: BLE001 - a replacement that cannot take k=None is a mismatch
        return f"called without k, it or the replacement fails ({type(e).__name__})"
    ref_t, ours_t = (
        (ref,) if isinstance(ref, torch.Tensor) else ref,
        (ours,) if isinstance(ours, torch.Tensor) else ours,
    )
    same_structure = type(ref) is type(ours) and len(ref_t) == len(ours_t)
    if not same_structure or any(type(a) is not type(b) for a, b in zip(ref_t, ours_t)):
        return f"called without k, {fn.__name__} returns another structure than the replacement"
    pairs = [(a, b) for a, b in zip(ours_t, ref_t) if isinstance(a, torch.Tensor)]
    douts = [pr.randn(b.shape, b, gen) for _, b in pairs]
    with torch.enable_grad():
        (g_ref,) = torch.autograd.grad([b for _, b in pairs], (q,), douts)
        (g_ours,) = torch.autograd.grad([a for a, _ in pairs], (q2,), douts)
    err = pr.max_err([*pairs, (g_ours, g_ref)])
    if err > pr.tolerance(q0.dtype):
        return f"called without k: probe rel. error {err:.1e}"
    return None

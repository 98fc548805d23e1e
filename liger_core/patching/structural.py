"""Structural patching: for a model type without a recipe, recognise RMSNorm-like modules, gated MLPs, rotary
functions, LayerNorms and the causal-LM head by their structure, and swap each one only after its liger
replacement has reproduced the original on a random probe: outputs AND gradients (a numeric self-check at
patch time, run in the module's own dtype and device on a small batch, with a private RNG so the caller's
random state is untouched).

What is recognised (and what decides it):

- RMSNorm: a leaf module whose only parameter is a 1-D ``weight``, with a float ``variance_epsilon`` or
  ``eps``, no bias, and a forward that takes the hidden states alone. Three semantics are tried (Llama:
  ``w * xn.to(dt)``; Gemma: ``(xn * (1 + w)).to(dt)``; OLMo-2: ``(xn * w).to(dt)``) with a random,
  non-trivial weight put in place of the module's own for the probe (``torch.func.functional_call``: the
  parameter itself is not touched): a freshly initialised weight of zeros or ones would hide a wrong offset
  or a scale applied before the normalisation. The variant whose output, input gradient and weight gradient
  are all within tolerance is kept. A LayerNorm without bias is tried last (Cohere). A module naming a
  ``group_size`` is also probed as normalising groups of that many features (Qwen4-Exp), one naming
  ``num_heads`` with a (..., num_heads, head_dim) input normalised per head (xLSTM): liger's norms with
  ``group_size``, the weight indexed over the whole row.
- Gated RMSNorm: the same with ``forward(hidden_states, gate)``; the settings of
  ``liger_core.ops.rms_norm_gated`` (rounding, activation, gate before or after the norm, groups) are probed
  the same way, outputs and the x, gate and weight gradients. Called without a gate, the module runs its
  own forward.
- LayerNorm: exactly ``torch.nn.LayerNorm`` with a weight (and a bias, or none: DBRX).
- Gated MLP: ``gate_proj``/``up_proj``/``down_proj`` or ``gate_up_proj``/``down_proj`` submodules and an
  ``act_fn``/``activation_fn`` that computes silu or gelu; then the whole MLP forward and its input gradient
  are probed.
- RoPE: an attention-like module whose class forward (the function at the bottom of its decorator chain)
  calls a module-level function whose name contains "rotary", "rope", "rotate" or "pos_emb"; the function is
  probed on random q/k/cos/sin (GQA head counts) against each layout of ``_ROPE_LAYOUTS`` (data: the call
  convention, q/k and table layouts, and the replacement from ``forwards`` or ``rope_variants``), outputs
  and q/k gradients;
  on success the module gets a copy of its forward that calls liger's rope (``forwards.forward_with_global``).
- Loss head: a model with ``lm_head`` (nn.Linear), or an output Linear that ``get_output_embeddings()`` finds
  (inside a head module whose forward transforms the hidden states first, as RoBERTa's, or after another
  child, as ModernBERT-decoder's), ``config.vocab_size`` and a base model. Candidate ``LMSpec`` settings (the
  head layout, shifted or unshifted labels, the logits transforms the config names: soft-capping, scaling,
  a padded vocabulary; an encoder-decoder's decoder inputs from the labels) are tried in turn: the model's
  own loss and the gradients of the head's parameters, on a 6-token probe, are compared with the fused
  linear cross-entropy's (after the swaps above), and the first that matches is kept.

A probe that raises is a failed probe: the module is left as it is and the reason is reported; patching never
raises out of a probe. A recognised module whose probe fails is a miss (``report.missing``); a module no
kernel covers (another activation) is reported in ``report.skipped``.

Tolerances: relative max error 1e-5 in fp32 (float rounding differences only), 4 units of the dtype's
epsilon in bf16/fp16 (a rounding difference, not a different formula: a wrong offset, scale or activation
is off by > 10%).
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn
from torch.func import functional_call

import liger_core
from liger_core.patching import forwards as fw
from liger_core.patching import probing as pr
from liger_core.patching import rope_variants as rv
from liger_core.patching.experts import patch_experts
from liger_core.patching.introspect import RewrapError, innermost_function
from liger_core.patching.loss import patch_loss
from liger_core.patching.recipes import NormSpec
from liger_core.patching.report import PatchReport, summarize_reasons
from liger_core.patching.swaps import bind, foreign_forward, own_kind

_ROPE_NAME = re.compile(r"rotary|rope|rotate|pos_emb", re.IGNORECASE)
_NORM_VARIANTS = (
    NormSpec("structural", offset=0.0, casting_mode="llama", in_place=False),
    NormSpec("structural", offset=1.0, casting_mode="gemma", in_place=False),
    NormSpec("structural", offset=0.0, casting_mode="gemma", in_place=False),
)
_MLP_LAYOUTS = (
    dict(gate="gate_proj", up="up_proj", down="down_proj", gate_up=None),
    dict(gate=None, up=None, down="down_proj", gate_up="gate_up_proj"),
    # Phi-4 audio: LayerNorm first, ``up, gate = gate_up(x).chunk(2)``, dropout after act * up and after down
    dict(
        gate=None,
        up=None,
        down="down_proj",
        gate_up="gate_up_proj",
        gate_second=True,
        pre=("layer_norm",),
        dropout="dropout",
    ),
    # GLM-4V's vision patch merger: proj, LayerNorm and GELU first, then the gated MLP
    dict(
        gate="gate_proj",
        up="up_proj",
        down="down_proj",
        gate_up=None,
        pre=("proj", "post_projection_norm", "act1"),
    ),
)
_ACT_NAMES = ("act_fn", "activation_fn", "act")


class _Skip(Exception):
    """A recognised module that no liger kernel covers (reported in ``skipped``, not a miss)."""


def _extra_forward_params(m: nn.Module) -> list[str]:
    """The parameters of ``m``'s forward besides ``self`` and the one input (a liger forward takes one)."""
    inner = innermost_function(type(m).forward)
    if inner is None:
        return ["<not a Python function>"]
    params = list(inspect.signature(inner).parameters.values())[1:]
    return [p.name for p in params[1:]] if params else ["<no input>"]


# ----------------------------------------------------------------------------------------------------------
# Recognisers + probes. Each returns what to bind, or a reason string; a probe that raises is a failed probe.
# ----------------------------------------------------------------------------------------------------------


def _looks_like_rms_norm(m: nn.Module) -> bool:
    if type(m) in (nn.LayerNorm, nn.Embedding) or any(True for _ in m.children()):
        return False
    params = dict(m.named_parameters(recurse=False))
    if set(params) != {"weight"} or params["weight"].dim() != 1:
        return False
    eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
    return isinstance(eps, float) and getattr(m, "bias", None) is None


def _norm_layouts(m: nn.Module, hidden: int) -> list[tuple[tuple[int, ...], int | None, bool]]:
    """(probe input shape, group size, heads input?) to try on ``m``, from the sizes it names: whole rows,
    groups of its ``group_size`` features (Qwen4-Exp), or a (..., num_heads, head_dim) input normalised per
    head (xLSTM's multi-head LayerNorm)."""
    layouts = [((2, 3, hidden), None, False)]
    group = getattr(m, "group_size", None)
    if isinstance(group, int) and 0 < group < hidden and hidden % group == 0:
        layouts.insert(0, ((2, 3, hidden), group, False))
    heads = getattr(m, "num_heads", None)
    if isinstance(heads, int) and heads > 1 and hidden % heads == 0:
        layouts.append(((2, 3, heads, hidden // heads), hidden // heads, True))
    return layouts


def _probe_norm(m: nn.Module, gen: torch.Generator) -> NormSpec | str:
    extra = _extra_forward_params(m)
    if extra:
        raise _Skip(f"forward takes ({', '.join(extra)}) besides the hidden states: no liger kernel for it")
    w = m.weight
    if not pr.usable(w):
        return "weight not materialised"
    # a non-trivial weight (not the zeros/ones a fresh model starts with), so offsets and scales show
    hidden = w.shape[0]
    w_probe = pr.leaf(pr.randn((hidden,), w, gen, scale=0.5) + 0.75)
    best_err, failures = float("inf"), []
    for shape, group, heads_input in _norm_layouts(m, hidden):
        x = pr.leaf(pr.randn(shape, w, gen, scale=3.0))
        x_in = x.flatten(-2) if heads_input else x
        with torch.enable_grad():
            try:
                ref = functional_call(m, {"weight": w_probe}, (x,))
            except Exception as e:  # noqa: BLE001 - an input layout the module does not take: the next one
                failures.append(f"{type(e).__name__} on a {tuple(shape)} input")
                continue
            if not isinstance(ref, torch.Tensor) or ref.shape != x_in.shape:
                failures.append(f"no {tuple(x_in.shape)} tensor from a {tuple(shape)} input")
                continue
            dy = pr.randn(ref.shape, ref, gen)
            ref_grads = pr.grads(ref, (x, w_probe), dy)
            # the RMSNorm variants, then a LayerNorm without bias in the same shape (Cohere's: mean-centred,
            # fp32 statistics; xLSTM's per head)
            for spec in (*_NORM_VARIANTS, NormSpec("structural", casting_mode=LAYER_NORM, in_place=False)):
                y = _liger_norm(spec, x_in, w_probe, fw.norm_eps(m), group)
                err = pr.max_err([(y, ref), *zip(pr.grads(y, (x, w_probe), dy), ref_grads)])
                if err <= pr.tolerance(x.dtype):
                    return NormSpec(
                        "structural",
                        spec.offset,
                        spec.casting_mode,
                        False,
                        group_size=group,
                        heads_input=heads_input,
                    )
                best_err = min(best_err, err)
    if best_err == float("inf"):
        return f"probe failed ({'; '.join(failures)})"
    return (
        "output or gradients differ from every RMSNorm variant and from a LayerNorm without bias, over whole "
        f"rows and over the groups/heads it names (best rel. error {best_err:.1e})"
    )


def _liger_norm(spec: NormSpec, x: torch.Tensor, w: torch.Tensor, eps: float, group: int | None):
    if spec.casting_mode == LAYER_NORM:
        return liger_core.ops.layer_norm(x, w, None, eps, group_size=group)
    return liger_core.ops.rms_norm(x, w, eps, spec.offset, spec.casting_mode, group_size=group)


LAYER_NORM = "layer_norm"  # a NormSpec's casting_mode for a weight-only LayerNorm (Cohere, xLSTM's per-head)


def biasless_layer_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """A weight-only LayerNorm module's forward (``weight``, ``variance_epsilon``/``eps``, no bias), over
    whole rows or the groups/heads of its NormSpec."""
    spec = self._liger_core_norm_spec
    x = hidden_states.flatten(-2) if spec.heads_input else hidden_states
    return liger_core.ops.layer_norm(x, self.weight, None, fw.norm_eps(self), group_size=spec.group_size)


def _gated_norm_specs(m: nn.Module) -> list[fw.GatedNormSpec]:
    """The gated-norm settings to try on ``m``: its own group size and gate order where it names them."""
    hidden = m.weight.shape[0]
    groups = [None]
    if isinstance(getattr(m, "group_size", None), int) and m.group_size != hidden:
        groups = [m.group_size]
    elif isinstance(getattr(m, "n_groups", None), int) and m.n_groups > 1:
        groups = [hidden // m.n_groups]
    orders = [m.norm_before_gate] if isinstance(getattr(m, "norm_before_gate", None), bool) else [True, False]
    return [
        fw.GatedNormSpec(casting, activation, order, group)
        for group in groups
        for order in orders
        for casting, activation in _GATED_SETTINGS
    ]


# (casting mode, activation): what the gated norms of transformers' model zoo compute (ops/rms_norm_gated.py)
_GATED_SETTINGS = (("llama", "silu"), ("gemma", "sigmoid"), ("gemma", "silu"))


def _probe_gated_norm(m: nn.Module, gen: torch.Generator) -> fw.GatedNormSpec | str:
    w = m.weight
    if not pr.usable(w):
        return "weight not materialised"
    w_probe = pr.leaf(pr.randn((w.shape[0],), w, gen, scale=0.5) + 0.75)
    x = pr.leaf(pr.randn((2, 3, w.shape[0]), w, gen, scale=3.0))
    g = pr.leaf(pr.randn((2, 3, w.shape[0]), w, gen, scale=2.0))
    with torch.enable_grad():
        ref = functional_call(m, {"weight": w_probe}, (x, g))
        if not isinstance(ref, torch.Tensor):
            return "forward does not return a tensor"
        dy = pr.randn(ref.shape, ref, gen)
        ref_grads = pr.grads(ref, (x, g, w_probe), dy)
        best, best_err = None, float("inf")
        for spec in _gated_norm_specs(m):
            y = liger_core.ops.rms_norm_gated(
                x,
                g,
                w_probe,
                fw.norm_eps(m),
                activation=spec.activation,
                casting_mode=spec.casting_mode,
                norm_before_gate=spec.norm_before_gate,
                group_size=spec.group_size,
            )
            err = pr.max_err([(y, ref), *zip(pr.grads(y, (x, g, w_probe), dy), ref_grads)])
            if err < best_err:
                best, best_err = spec, err
    if best_err <= pr.tolerance(x.dtype):
        return best
    return f"output or gradients differ from every gated RMSNorm setting (best rel. error {best_err:.1e})"


def _probe_layer_norm(m: nn.LayerNorm, gen: torch.Generator) -> bool | str:
    if m.weight is None or len(m.normalized_shape) != 1:
        raise _Skip("not a LayerNorm with a weight over the last dimension")
    if not pr.usable(m.weight):
        return "weight not materialised"
    w = pr.leaf(pr.randn(m.weight.shape, m.weight, gen, scale=0.5) + 0.75)
    b = None if m.bias is None else pr.leaf(pr.randn(m.bias.shape, m.bias, gen, scale=0.5))
    x = pr.leaf(pr.randn((2, 3, m.normalized_shape[0]), m.weight, gen, scale=3.0))
    params = {"weight": w} if b is None else {"weight": w, "bias": b}
    with torch.enable_grad():
        ref = functional_call(m, params, (x,))
        dy = pr.randn(ref.shape, ref, gen)
        leaves = (x, *params.values())
        ref_grads = pr.grads(ref, leaves, dy)
        y = liger_core.ops.layer_norm(x, w, b, m.eps)
        err = pr.max_err([(y, ref), *zip(pr.grads(y, leaves, dy), ref_grads)])
    return True if err <= pr.tolerance(x.dtype) else f"probe mismatch (rel. error {err:.1e})"


def _probe_mlp(m: nn.Module, gen: torch.Generator) -> fw.ResolvedMLP | str | None:
    """None if the module is not a gated MLP at all; a reason if it is one that matches no layout.

    Every layout whose submodules ``m`` has is probed, outputs and input gradient, in ``m``'s own mode: the
    original and the replacement run from the same random state (dropout in training draws its masks in
    both; the caller's random state is restored afterwards), so a dropout called in another order or on
    other shapes is a mismatch.
    """
    failures = []
    for layout in _MLP_LAYOUTS:
        names = [n for k, n in layout.items() if isinstance(n, str)] + list(layout.get("pre", ()))
        if not all(isinstance(getattr(m, n, None), nn.Module) for n in names):
            continue
        extra = _extra_forward_params(m)
        if extra:
            raise _Skip(f"forward takes ({', '.join(extra)}) besides the hidden states")
        act = next((a for a in _ACT_NAMES if getattr(m, a, None) is not None), None)
        if act is None:
            raise _Skip("no act_fn/activation_fn attribute")
        resolved = fw.resolve_mlp(m, SimpleNamespace(act=act, **layout))
        if isinstance(resolved, str):
            raise _Skip(resolved)
        first = getattr(m, layout["gate_up"] or layout["gate"])
        weight = getattr(first, "weight", None)
        if not pr.usable(weight) or weight.dim() != 2:
            return "projection weight not materialised"
        # the input's width: that of the first pre-module with a weight matrix, else the projection's
        pre_weights = [getattr(getattr(m, n), "weight", None) for n in layout.get("pre", ())]
        width = next((w.shape[1] for w in pre_weights if pr.usable(w) and w.dim() == 2), weight.shape[1])
        x = pr.leaf(pr.randn((2, 3, width), weight, gen))
        seed = int(torch.randint(0, 2**62, (), generator=gen))
        devices = [weight.device] if weight.device.type == "cuda" else []
        with torch.enable_grad(), torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            ref = type(m).forward(m, x)
            if not isinstance(ref, torch.Tensor):
                return "forward does not return a tensor"
            dy = pr.randn(ref.shape, ref, gen)
            (ref_dx,) = pr.grads(ref, (x,), dy)
            torch.manual_seed(seed)
            y = fw.gated_mlp(m, resolved, x)
            (dx,) = pr.grads(y, (x,), dy)
        err = pr.max_err([(y, ref), (dx, ref_dx)])
        if err <= pr.tolerance(x.dtype):
            return resolved
        failures.append(f"{_layout_name(layout)}: probe rel. error {err:.1e}")
    if not failures:
        return None
    return f"forward is not down(act(gate(x)) * up(x)) in any MLP layout ({'; '.join(failures)})"


def _layout_name(layout: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in layout.items() if v)


def _rope_global(m: nn.Module) -> tuple[str, types.FunctionType] | None:
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


_ROPE_LAYOUTS = (
    RopeLayout(
        "rotate-half",
        "q_k_cos_sin",
        ("bhtd",),
        "halves",
        fw.liger_rotary_pos_emb,
        fw.liger_rotary_pos_emb_cast_back,
    ),
    RopeLayout(
        "half tables",
        "q_k_cos_sin",
        ("bhtd",),
        "freqs",
        fw.liger_rotary_pos_emb_half_tables,
        fw.liger_rotary_pos_emb_half_tables_cast_back,
    ),
    RopeLayout(
        "interleaved pairs",
        "q_k_cos_sin",
        ("bhtd",),
        "halves",
        fw.liger_rotary_pos_emb_interleaved,
        fw.liger_rotary_pos_emb_interleaved_cast_back,
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


def _probe_rope(fn: types.FunctionType, dtype: torch.dtype, device, gen: torch.Generator):
    """liger's rope function that reproduces ``fn``, or a reason.

    Every layout of ``_ROPE_LAYOUTS`` whose replacement takes ``fn``'s arguments is probed in turn, first
    match wins: random q/k (GQA head counts) and tables built as the layout says, at full rotary width and
    at half of it (a function that fails there is taken not to support partial rotary; one that returns
    must match there too, which tells rotary-first from rotary-last). Tables in the module's dtype (the
    math) and in fp32 (some models keep them in fp32: whether ``fn`` returns q's dtype or the promoted one
    picks the variant); outputs and q/k gradients.
    """
    failures = []
    for layout in _ROPE_LAYOUTS:
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


# ----------------------------------------------------------------------------------------------------------


# Config attributes the logits transforms of causal-LM heads are read from (first present wins); which of
# them a model applies, whether it shifts its labels and where its output Linear sits is decided by probing.
_SOFTCAP_ATTRS = ("final_logit_softcapping", "logits_soft_cap", "output_logit_soft_cap")
_SCALING_ATTRS = ("logits_scaling", "logits_mup_width_multiplier")  # logits / s (or the hidden states / s)
_MULTIPLIER_ATTRS = ("logit_scale", "output_multiplier")
_VOCAB_LIMIT_ATTRS = ("unpadded_vocab_size",)


def _present_attr(config, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` set (not None, not 0) in the config or its text config."""
    return next((n for n in names if fw._config_value(config, n)), None)


def _output_linear_path(root: nn.Module) -> str | None:
    """The path of the module ``get_output_embeddings()`` returns, when it is an ``nn.Linear`` under root."""
    try:
        out = root.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if not isinstance(out, nn.Linear):
        return None
    return next((name for name, m in root.named_modules() if m is out and name), None)


def _head_layouts(root: nn.Module) -> list[tuple[tuple[str, ...], str]]:
    """Candidate (head, linear) layouts of ``LMSpec``: ``lm_head`` as the Linear, then the output embeddings
    found by ``get_output_embeddings()``: the Linear inside a head module whose forward transforms the hidden
    states first, or a Linear of the model itself, applied alone or after another child module (a
    transform)."""
    layouts = []
    lm_head = getattr(root, "lm_head", None)
    if pr.usable(getattr(lm_head, "weight", None)):
        layouts.append((("lm_head",), "lm_head"))
    path = _output_linear_path(root)
    if path is not None and path != "lm_head":
        top = path.split(".")[0]
        if top != path:
            layouts.append(((top,), path))
        else:
            layouts.append(((path,), path))
            # a transform of the model's own before it (ModernBERT-decoder's lm_head, ELECTRA's
            # generator_predictions): any other child but the base model
            base = getattr(root, getattr(root, "base_model_prefix", ""), None)
            for name, child in root.named_children():
                if name != path and child is not base and any(True for _ in child.parameters()):
                    layouts.append(((name, path), path))
    return layouts


def _loss_candidates(root: nn.Module) -> list[fw.LMSpec]:
    """Every ``LMSpec`` the probe tries, most likely first: each head layout, labels shifted or not, with the
    logits transforms the config names (and without them, when it names any)."""
    config = root.config
    attrs = dict(
        softcap_attr=_present_attr(config, _SOFTCAP_ATTRS),
        logits_scaling_attr=_present_attr(config, _SCALING_ATTRS),
        logits_multiplier_attr=_present_attr(config, _MULTIPLIER_ATTRS),
        vocab_limit_attr=_present_attr(config, _VOCAB_LIMIT_ATTRS),
    )
    transforms = [attrs, dict.fromkeys(attrs)] if any(attrs.values()) else [attrs]
    # an encoder-decoder's decoder reads the labels shifted right, so its targets are the labels unshifted
    # (then decoder-only, where the config says encoder-decoder but the class runs the decoder alone)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    modes = (
        [(True, False), (False, True), (False, False)] if encoder_decoder else [(False, True), (False, False)]
    )
    return [
        fw.LMSpec(head=head, linear=linear, shift_labels=shift, encoder_decoder=enc, **t)
        for enc, shift in modes
        for head, linear in _head_layouts(root)
        for t in transforms
    ]


def _head_params(root: nn.Module, spec: fw.LMSpec) -> list[torch.Tensor]:
    """The parameters of the head's modules (the output Linear's weight and bias, and a transform's)."""
    params = {}
    for name in spec.head:
        for p in root.get_submodule(name).parameters():
            params[id(p)] = p
    return [p for p in params.values() if pr.usable(p)]


def _probe_loss(root: nn.Module, candidates: list[fw.LMSpec], gen: torch.Generator) -> fw.LMSpec | str:
    """The first candidate whose fused loss equals the model's own: the loss, and the gradient of every
    parameter of the head (the output Linear's weight and bias, a transform's before it).

    Everything below the head runs the same code in both, so the head's gradients are where a different loss
    shows. The model's own loss and gradients are computed once; each candidate then runs the patched
    forward. The head's parameters are made to require a gradient for the probe only (a frozen head, as under
    LoRA, included) and set back afterwards. Returns why none matched otherwise (the closest one's error).
    """
    if getattr(root, "config", None) is None or not candidates:
        return "no lm_head weight or config"
    fusable = [c for c in candidates if fw.has_fusable_head(root, c)]
    if not fusable:
        linear = fw.head_linear(root, candidates[0])
        return (
            f"{candidates[0].linear} ({type(linear).__name__}) is not a plain nn.Linear (LoRA, quantised or "
            "offloaded); the loss is computed by the model from its logits"
        )
    params = list({id(p): p for c in fusable for p in _head_params(root, c)}.values())
    weight = fw.head_linear(root, fusable[0]).weight
    requires = [p.requires_grad for p in params]
    ids = _probe_ids(root, gen).to(weight.device)
    training = root.training
    root.eval()
    reasons: list[tuple[float, str]] = []
    try:
        for p in params:
            p.requires_grad_(True)
        with torch.enable_grad():
            try:
                ref = type(root).forward(root, input_ids=ids, labels=ids, use_cache=False)
                ref_loss = getattr(ref, "loss", None)
                if not isinstance(ref_loss, torch.Tensor) or getattr(ref, "router_logits", None) is not None:
                    return "forward has no plain causal-LM loss (or is a mixture of experts)"
                ref_grads = torch.autograd.grad(ref_loss, params, allow_unused=True)
            except Exception as e:  # noqa: BLE001 - a forward with other conventions is left alone
                return f"probe forward failed ({type(e).__name__}: {e})"
            ref_grads = dict(zip(map(id, params), ref_grads))
            for spec in fusable:
                verdict = _probe_loss_spec(root, spec, ids, ref_loss, ref_grads, weight.dtype)
                if verdict is True:
                    return spec
                reasons.append(verdict)
    finally:
        for p, r in zip(params, requires):
            p.requires_grad_(r)
        root.train(training)
    return min(reasons)[1]


def _probe_loss_spec(root, spec, ids, ref_loss, ref_grads, dtype) -> bool | tuple[float, str]:
    """One candidate of ``_probe_loss``: True, or (error, why) (a forward that raises: infinite error)."""
    mine = _head_params(root, spec)
    try:
        ours = fw.causal_lm(root, spec, input_ids=ids, labels=ids, use_cache=False, skip_logits=True).loss
        grads = torch.autograd.grad(ours, mine, allow_unused=True)
    except Exception as e:  # noqa: BLE001 - this candidate's head cannot run: the next one is tried
        return float("inf"), f"probe forward failed ({type(e).__name__}: {e})"
    pairs = [(ours.to(ref_loss.dtype), ref_loss)]
    pairs += [
        (g, ref_grads[id(p)]) for p, g in zip(mine, grads) if not (g is None and ref_grads[id(p)] is None)
    ]
    err = pr.max_err(pairs)
    if err <= pr.tolerance(dtype):
        return True
    return err, f"loss or lm_head gradient differs from the model's own (rel. error {err:.1e})"


def _probe_ids(root: nn.Module, gen: torch.Generator, length: int = 6) -> torch.Tensor:
    """Random text token ids: below the vocabulary size, and none of the config's special ids (an image
    token without an image would make a multimodal model's forward fail)."""
    vocab = fw.vocab_size(root)
    try:
        embed = root.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embed = None
    vocab = min(vocab, getattr(embed, "num_embeddings", vocab))
    special = set()
    configs = [root.config, *(getattr(root.config, n, None) for n in ("text_config", "vision_config"))]
    for config in configs:
        for name, value in vars(config).items() if config is not None else ():
            if name.endswith(("_token_id", "_token_index", "_token_ids")) and value is not None:
                special.update(value if isinstance(value, (list, tuple)) else [value])
    allowed = torch.tensor([i for i in range(vocab) if i not in special] or [0])
    return allowed[torch.randint(0, len(allowed), (1, length), generator=gen)]


def _verdict(probe, *args):
    """The probe's verdict; a probe that raises gives a reason instead (patching never raises out of one)."""
    try:
        return probe(*args)
    except _Skip:
        raise
    except Exception as e:  # noqa: BLE001 - see docstring
        return f"probe failed ({type(e).__name__}: {e})"


def patch_structurally(root: nn.Module, flags: dict[str, bool], report: PatchReport) -> None:
    """Swap what is recognised and passes its probe; report every recognised module that was not swapped."""
    gen = torch.Generator().manual_seed(0)
    misses: list[tuple[str, str]] = []
    skips: list[str] = []
    rope_cache: dict[tuple, object] = {}
    for qualname, m in root.named_modules():
        if m is root:
            continue
        kind = own_kind(m)
        if kind is not None:
            report.count_already(kind)
            continue
        name = type(m).__name__
        try:
            if type(m) is nn.LayerNorm:
                if flags["layer_norm"]:
                    verdict = _verdict(_probe_layer_norm, m, gen)
                    if verdict is True and not foreign_forward(m):
                        bind(root, m, fw.layer_norm_forward, "layer_norm")
                        report.count("layer_norm")
                        report.modules[qualname] = "layer_norm"
                    else:
                        misses.append(("layer_norm", f"{name}: {_reason(m, verdict)}"))
                continue
            if _looks_like_rms_norm(m) and _extra_forward_params(m) == ["gate"]:
                if flags["rms_norm"]:
                    verdict = _verdict(_probe_gated_norm, m, gen)
                    if isinstance(verdict, fw.GatedNormSpec) and not foreign_forward(m):
                        bind(
                            root,
                            m,
                            fw.rms_norm_gated_forward,
                            "rms_norm_gated",
                            _liger_core_gated_spec=verdict,
                        )
                        report.count("rms_norm_gated")
                        report.modules[qualname] = "rms_norm_gated"
                    else:
                        misses.append(("rms_norm_gated", f"{name}: {_reason(m, verdict)}"))
                continue
            if _looks_like_rms_norm(m):
                if flags["rms_norm"]:
                    verdict = _verdict(_probe_norm, m, gen)
                    is_spec = isinstance(verdict, NormSpec)
                    if is_spec and verdict.casting_mode != LAYER_NORM and not foreign_forward(m):
                        bind(root, m, fw.rms_norm_forward, "rms_norm", _liger_core_norm_spec=verdict)
                        report.count("rms_norm")
                        report.modules[qualname] = "rms_norm"
                    elif is_spec and verdict.casting_mode == LAYER_NORM and not flags["layer_norm"]:
                        pass  # a LayerNorm, and that kernel is off
                    elif is_spec and verdict.casting_mode == LAYER_NORM and not foreign_forward(m):
                        bind(
                            root, m, biasless_layer_norm_forward, "layer_norm", _liger_core_norm_spec=verdict
                        )
                        report.count("layer_norm")
                        report.modules[qualname] = "layer_norm"
                    else:
                        misses.append(("rms_norm", f"{name}: {_reason(m, verdict)}"))
                continue
            if flags["swiglu"] or flags["geglu"]:
                verdict = _verdict(_probe_mlp, m, gen)
                if isinstance(verdict, fw.ResolvedMLP):
                    if flags[verdict.kind]:
                        if foreign_forward(m):
                            misses.append((verdict.kind, f"{name}: {_reason(m, verdict)}"))
                        else:
                            bind(root, m, fw.gated_mlp_forward, verdict.kind, _liger_core_mlp_spec=verdict)
                            report.count(verdict.kind)
                            report.modules[qualname] = verdict.kind
                    continue
                if verdict is not None:
                    misses.append(("swiglu" if flags["swiglu"] else "geglu", f"gated MLP {name}: {verdict}"))
                    continue
            if flags["rope"]:
                found = _rope_global(m)
                param = pr.first_param(m)
                if found is None or not pr.usable(param):
                    continue
                rope_name, fn = found
                key = (fn, param.dtype, param.device)
                if key not in rope_cache:
                    rope_cache[key] = _verdict(_probe_rope, fn, param.dtype, param.device, gen)
                verdict = rope_cache[key]
                if isinstance(verdict, str) or foreign_forward(m):
                    misses.append(("rope", f"{name}: {_reason(m, verdict)}"))
                    continue
                try:
                    patched = fw.forward_with_global(type(m).forward, rope_name, verdict)
                except RewrapError as e:
                    misses.append(("rope", f"{name}.forward: {e}"))
                    continue
                bind(root, m, patched, "rope")
                report.count("rope")
                report.modules[qualname] = "rope"
        except _Skip as why:
            skips.append(f"{name}: {why}")

    patch_experts(root, flags, report)
    if flags["fused_linear_cross_entropy"] or flags["cross_entropy"]:
        _patch_loss_structurally(root, flags, report, gen, misses, skips)
    for kind in dict.fromkeys(k for k, _ in misses):
        for reason in summarize_reasons([r for k, r in misses if k == kind]):
            report.miss(kind, reason)
    for reason in summarize_reasons(skips):
        report.skip(reason)


def _reason(m: nn.Module, verdict) -> str:
    if isinstance(verdict, str):
        return verdict
    return "has an instance-level forward from another library" if foreign_forward(m) else str(verdict)


def _patch_loss_structurally(root, flags, report, gen, misses, skips) -> None:
    kind = "fused_linear_cross_entropy" if flags["fused_linear_cross_entropy"] else "cross_entropy"
    has_head = isinstance(getattr(root, "lm_head", None), nn.Module) or _output_linear_path(root) is not None
    if own_kind(root) is not None:
        patch_loss(root, getattr(root, "_liger_core_lm_spec", fw.LMSpec()), flags, report)
    elif not has_head or not hasattr(root, "base_model_prefix"):
        skips.append(f"loss: {type(root).__name__} has no lm_head (not a causal LM)")
    elif flags["fused_linear_cross_entropy"]:
        verdict = _probe_loss(root, _loss_candidates(root), gen)
        if isinstance(verdict, fw.LMSpec):
            patch_loss(root, verdict, flags, report)
        else:
            misses.append((kind, verdict))
    else:
        inner = innermost_function(type(root).forward)
        if inner is not None and "loss_function" in inner.__code__.co_names:
            patch_loss(root, fw.LMSpec(), flags, report)
        else:
            misses.append((kind, "the model's forward does not use self.loss_function"))

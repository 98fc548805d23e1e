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
- Non-gated MLP (``down(act(up(x)))``): ``up_proj``/``down_proj``, ``fc1``/``fc2`` or
  ``dense_h_to_4h``/``dense_4h_to_h`` and no gate projection, with an activation that computes relu(x)^2
  (transformers' ``relu2``: Nemotron and others); probed the same way and patched with
  ``liger_core.ops.relu_squared`` (flag ``relu_squared``). Other activations of such MLPs (GELU, ReLU) are
  left alone without a report: liger has no kernel that replaces them.
- RoPE: an attention-like module whose class forward (the function at the bottom of its decorator chain)
  calls a module-level function whose name contains "rotary", "rope", "rotate" or "pos_emb"; the function is
  probed on random q/k/cos/sin (GQA head counts) against each layout of ``rope_probe.ROPE_LAYOUTS`` (data:
  the call convention, q/k and table layouts, and the replacement from ``rope_variants``), outputs and q/k
  gradients; on success the module gets a copy of its forward that calls liger's rope
  (``forwards.forward_with_global``).
- Loss head: a model with ``lm_head`` (nn.Linear), or an output Linear that ``get_output_embeddings()`` finds
  (inside a head module whose forward transforms the hidden states first, as RoBERTa's, or after another
  child, as ModernBERT-decoder's), ``config.vocab_size`` and a base model. Candidate ``LMSpec`` settings (the
  head layout, shifted or unshifted labels, the logits transforms the config names: soft-capping, scaling,
  a padded vocabulary; an encoder-decoder's decoder inputs from the labels) are tried in turn: the model's
  own loss and the gradients of the head's parameters, on a 6-token probe, are compared with the fused
  linear cross-entropy's (after the swaps above), and the first that matches is kept (``loss_probe``).

A probe that raises is a failed probe: the module is left as it is and the reason is reported; patching never
raises out of a probe. A recognised module whose probe fails is a miss (``report.missing``); a module no
kernel covers (another activation) is reported in ``report.skipped``.

Tolerances: relative max error 1e-5 in fp32 (float rounding differences only), 4 units of the dtype's
epsilon in bf16/fp16 (a rounding difference, not a different formula: a wrong offset, scale or activation
is off by > 10%).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import torch
from torch import nn
from torch.func import functional_call

import liger_core
from liger_core.patching import forwards as fw
from liger_core.patching import probing as pr
from liger_core.patching.experts import patch_experts
from liger_core.patching.introspect import RewrapError, innermost_function
from liger_core.patching.loss_probe import patch_loss_structurally
from liger_core.patching.recipes import NormSpec
from liger_core.patching.report import PatchReport, summarize_reasons
from liger_core.patching.rope_probe import probe_rope, rope_global
from liger_core.patching.swaps import bind, foreign_forward, own_kind

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
    # non-gated, down(act(up(x))): neither gate nor gate_up. Tried only on a module with none of the gate
    # submodules the gated layouts name, and only patched where the activation is relu(x)^2 (Nemotron,
    # Arcee, Jais-2, ...: up_proj/down_proj; NanoChat, Cosmos3-Edge: fc1/fc2; Persimmon, Fuyu:
    # dense_h_to_4h/dense_4h_to_h); another activation (GELU, ReLU) has no liger kernel of its own.
    dict(gate=None, up="up_proj", down="down_proj", gate_up=None),
    dict(gate=None, up="fc1", down="fc2", gate_up=None),
    dict(gate=None, up="dense_h_to_4h", down="dense_4h_to_h", gate_up=None),
)
_ACT_NAMES = ("act_fn", "activation_fn", "act")


def _is_plain(layout: dict) -> bool:
    return layout["gate"] is None and layout["gate_up"] is None


# a module with any of these is a gated MLP (or a look-alike), never a non-gated one
_GATE_NAMES = frozenset(
    layout["gate"] or layout["gate_up"] for layout in _MLP_LAYOUTS if not _is_plain(layout)
)


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


def _probe_mlp(m: nn.Module, gen: torch.Generator) -> fw.ResolvedMLP | tuple[str, str] | None:
    """None if the module is not an MLP liger covers at all; (kind, reason) if it is one that matches no
    layout (kind: the kernel left out, "gated" for a gated MLP).

    Every layout whose submodules ``m`` has is probed, outputs and input gradient, in ``m``'s own mode: the
    original and the replacement run from the same random state (dropout in training draws its masks in
    both; the caller's random state is restored afterwards), so a dropout called in another order or on
    other shapes is a mismatch. A non-gated layout is only probed where the activation computes relu(x)^2:
    a two-Linear MLP with another activation is not reported (there is no liger kernel for it).
    """
    failures, kinds = [], []
    for layout in _MLP_LAYOUTS:
        names = [n for k, n in layout.items() if isinstance(n, str)] + list(layout.get("pre", ()))
        if not all(isinstance(getattr(m, n, None), nn.Module) for n in names):
            continue
        plain = _is_plain(layout)
        if plain:
            if any(isinstance(getattr(m, n, None), nn.Module) for n in _GATE_NAMES):
                continue
            act = next((a for a in _ACT_NAMES if getattr(m, a, None) is not None), None)
            if act is None or fw.classify_plain_activation(getattr(m, act)) is None:
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
        family = resolved.kind if plain else "gated"
        first = getattr(m, layout["up"] if plain else layout["gate_up"] or layout["gate"])
        weight = getattr(first, "weight", None)
        if not pr.usable(weight) or weight.dim() != 2:
            return family, "projection weight not materialised"
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
                return family, "forward does not return a tensor"
            dy = pr.randn(ref.shape, ref, gen)
            (ref_dx,) = pr.grads(ref, (x,), dy)
            torch.manual_seed(seed)
            y = fw.mlp(m, resolved, x)
            (dx,) = pr.grads(y, (x,), dy)
        err = pr.max_err([(y, ref), (dx, ref_dx)])
        if err <= pr.tolerance(x.dtype):
            return resolved
        failures.append(f"{_layout_name(layout)}: probe rel. error {err:.1e}")
        kinds.append(family)
    if not failures:
        return None
    if all(k == "gated" for k in kinds):
        return "gated", f"forward is not down(act(gate(x)) * up(x)) in any MLP layout ({'; '.join(failures)})"
    return kinds[-1], f"forward is not down(act(up(x))) in any MLP layout ({'; '.join(failures)})"


# the flags under which MLPs are probed: the activation kernels and tiling
_MLP_FLAGS = ("swiglu", "geglu", *fw.PLAIN_KINDS, "tiled_mlp")


def _layout_name(layout: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in layout.items() if v)


def _verdict(probe, *args):
    """The probe's verdict; a probe that raises gives a reason instead (patching never raises out of one)."""
    try:
        return probe(*args)
    except _Skip:
        raise
    except Exception as e:  # noqa: BLE001 - see docstring
        return f"probe failed ({type(e).__name__}: {e})"


def bind_mlp(
    root: nn.Module,
    m: nn.Module,
    resolved: fw.ResolvedMLP,
    flags: dict[str, bool],
    report: PatchReport,
    name: str,
) -> None:
    """Bind the MLP forward the flags ask for: the activation kernel (``resolved.kind``: a GLU, or
    relu_squared in a non-gated MLP), run over sequence tiles with ``tiled_mlp`` (around the kernel, or
    around the class's own forward when the kernel is off)."""
    kernel = flags[resolved.kind]
    kind = resolved.kind if kernel else "tiled_mlp"
    if flags["tiled_mlp"]:
        inner = fw.mlp_forward if kernel else type(m).forward
        bind(
            root, m, fw.tiled_mlp_forward, kind, _liger_core_mlp_spec=resolved, _liger_core_tiled_inner=inner
        )
        report.count("tiled_mlp")
    else:
        bind(root, m, fw.mlp_forward, kind, _liger_core_mlp_spec=resolved)
    if kernel:
        report.count(resolved.kind)
    report.modules[name] = kind


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
            if any(flags[k] for k in _MLP_FLAGS):
                verdict = _verdict(_probe_mlp, m, gen)
                if isinstance(verdict, fw.ResolvedMLP):
                    kinds = [k for k in (verdict.kind, "tiled_mlp") if flags[k]]
                    if kinds and foreign_forward(m):
                        misses += [(k, f"{name}: {_reason(m, verdict)}") for k in kinds]
                    elif kinds:
                        bind_mlp(root, m, verdict, flags, report, qualname)
                    continue
                if isinstance(verdict, str):  # the probe raised; only relu^2 MLPs are probed without a gate
                    gated = any(isinstance(getattr(m, n, None), nn.Module) for n in _GATE_NAMES)
                    verdict = ("gated" if gated else "relu_squared", verdict)
                if verdict is not None:
                    family, reason = verdict
                    gated = family == "gated"
                    candidates = (("swiglu", "geglu") if gated else (family,)) + ("tiled_mlp",)
                    asked = [k for k in candidates if flags[k]]
                    if asked:
                        what = "gated MLP" if gated else "MLP"
                        misses.append((asked[0], f"{what} {name}: {reason}"))
                    continue
            if flags["rope"]:
                found = rope_global(m)
                param = pr.first_param(m)
                if found is None or not pr.usable(param):
                    continue
                rope_name, fn = found
                key = (fn, param.dtype, param.device)
                if key not in rope_cache:
                    rope_cache[key] = _verdict(probe_rope, fn, param.dtype, param.device, gen)
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
        patch_loss_structurally(root, flags, report, gen, misses, skips)
    for kind in dict.fromkeys(k for k, _ in misses):
        for reason in summarize_reasons([r for k, r in misses if k == kind]):
            report.miss(kind, reason)
    for reason in summarize_reasons(skips):
        report.skip(reason)


def _reason(m: nn.Module, verdict) -> str:
    if isinstance(verdict, str):
        return verdict
    return "has an instance-level forward from another library" if foreign_forward(m) else str(verdict)

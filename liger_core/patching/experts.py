"""Mixture-of-experts experts modules: the gated activation of every expert through liger's SwiGLU/GeGLU.

transformers keeps a layer's experts in one module with 3-D parameters (``gate_up_proj`` [E, 2I, H] and
``down_proj`` [E, H, I], or transposed [E, H, 2I] / [E, I, H], optionally with biases) and either loops over
the experts (eager) or runs one of its experts implementations (``use_experts_implementation``: grouped_mm,
batched_mm, ...), which call the module's ``_apply_gate(gate_up)`` for ``act(gate) * up``.

The patch puts two entries into the module's ``__dict__``:

- ``_apply_gate``: ``liger_core.ops.swiglu_packed`` on the [S, 2I] projection output (gate and up read in
  place, concatenated or interleaved; gpt-oss's clamped SwiGLU through its ``alpha``/``limit``/``up_offset``),
  or ``geglu`` on the two halves. Every forward that calls ``self._apply_gate`` then runs the kernel.
- ``forward``: the class forward when what it runs calls ``self._apply_gate`` (transformers' experts
  implementations, gpt-oss's eager loop); otherwise a loop over the hit experts with the same projections,
  routing weights and accumulation as transformers' eager loop, the activation being the kernel above
  (``dense`` forms, Llama-4's ``forward(hidden_states)`` over experts pre-grouped [E * T, H], run as bmm).

An experts module whose per-expert MLP is a child module called with that expert's weights (DBRX's
``DbrxExpertGLU(x, w1[e], v1[e], w2[e])``, ``EXPERT_GLU_LAYOUTS``) gets that child's forward swapped for one
computing the same projections around liger's gated activation (probed on random weights the same way).

What is recognised is DATA: ``EXPERTS_LAYOUTS`` (parameter names, transposed or not, biases, which halves are
gate and up) and the gate settings tried (``LIMIT_ATTRS``, ``ALPHA_ATTRS``, ``UP_OFFSETS``). Each module is
swapped only after a probe: random expert weights (hidden and intermediate sizes reduced to at most 16 / 12
where the forward allows it, all experts kept), random hidden states and routing, the patched forward against
the module's own: outputs and the gradients of the input, the routing weights and every expert parameter.
When the module's current implementation delegates, the eager loop is probed against its eager forward too
(a later ``set_experts_implementation("eager")`` stays exact). Probes of one class, shapes and settings are
shared by all its modules.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module

import liger_core
from liger_core.patching import forwards as fw
from liger_core.patching import probing as pr
from liger_core.patching.introspect import innermost_function
from liger_core.patching.report import PatchReport, summarize_reasons
from liger_core.patching.swaps import bind, foreign_forward, own_kind, set_entry


@dataclass(frozen=True)
class ExpertsLayout:
    """Where an experts module keeps its weights and how they are applied."""

    gate_up: str  # [E, 2I, H] (or [E, H, 2I] transposed): gate and up of every expert in one parameter
    down: str  # [E, H, I] (or [E, I, H] transposed)
    transposed: bool  # x @ W[e] instead of F.linear(x, W[e])
    gate_up_bias: str | None = None  # [E, 2I]
    down_bias: str | None = None  # [E, H]
    halves: tuple[bool, ...] = (False,)  # interleaved gate/up columns? (each value is tried by the probe)
    # gate_up holds more experts than down: the experts from down's count on are identity ("zero
    # computation") experts, whose output is their input times the routing weight (LongCat-Flash)
    identity_experts: bool = False


EXPERTS_LAYOUTS = (
    # Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3, GLM-4-MoE, ... (transformers' default layout)
    ExpertsLayout("gate_up_proj", "down_proj", transposed=False),
    # Llama-4, Aria
    ExpertsLayout("gate_up_proj", "down_proj", transposed=True),
    # gpt-oss (interleaved columns), OpenAI privacy filter (concatenated halves)
    ExpertsLayout(
        "gate_up_proj",
        "down_proj",
        transposed=True,
        gate_up_bias="gate_up_proj_bias",
        down_bias="down_proj_bias",
        halves=(True, False),
    ),
    ExpertsLayout(
        "gate_up_proj",
        "down_proj",
        transposed=False,
        gate_up_bias="gate_up_proj_bias",
        down_bias="down_proj_bias",
        halves=(False, True),
    ),
    # LongCat-Flash: routed experts plus identity (zero-computation) experts
    ExpertsLayout("gate_up_proj", "down_proj", transposed=False, identity_experts=True),
)


@dataclass(frozen=True)
class ExpertGLULayout:
    """One expert's gated MLP as a module whose forward takes that expert's weights as arguments
    (``forward(x, gate_w, up_w, down_w)``), the experts' weights kept flattened [E * I, H] in ``params``:
    ``gate = x @ gate_w.T``, ``up = x @ up_w.T``, out ``= (act(gate) * up) @ down_w`` (``down_w`` [I, H])."""

    params: tuple[str, str, str]  # gate, up, down


EXPERT_GLU_LAYOUTS = (ExpertGLULayout(("w1", "v1", "w2")),)  # DBRX's DbrxExpertGLU
GLU_SPEC_ATTR = "_liger_core_expert_glu_spec"


@dataclass(frozen=True)
class ExpertGLUSpec:
    layout: ExpertGLULayout
    kind: str  # "swiglu" | "geglu"
    approximate: str = "none"


def expert_glu_forward(self, x, gate_w, up_w, down_w):
    """An ``ExpertGLULayout`` module's forward with liger's gated activation."""
    spec = self.__dict__[GLU_SPEC_ATTR]
    gate, up = x.matmul(gate_w.T), x.matmul(up_w.T)
    if spec.kind == "swiglu":
        h = liger_core.ops.swiglu(gate, up)
    else:
        h = liger_core.ops.geglu(gate, up, approximate=spec.approximate)
    return h.matmul(down_w)


# Clamped SwiGLU settings (gpt-oss, DeepSeek-V4, GLM-5-Next, MiniMax-M3, ...): module attribute names, and
# the offsets of the up half that are tried ((up + 1) * glu in gpt-oss).
LIMIT_ATTRS = ("limit", "swiglu_limit")
ALPHA_ATTRS = ("alpha", "swiglu_alpha")
UP_OFFSETS = (0.0, 1.0)
_ACT_ATTRS = ("act_fn", "activation_fn", "act")
_PROBE_HIDDEN, _PROBE_INTER, _PROBE_TOKENS = 16, 12, 7
SPEC_ATTR = "_liger_core_experts_spec"


@dataclass(frozen=True)
class ExpertsSpec:
    """A recognised experts module: its layout, forward form and gated activation."""

    layout: ExpertsLayout
    form: str  # "routed": forward(hidden [T, H], top_k_index [T, K], top_k_weights [T, K]); "dense"
    kind: str  # "swiglu" | "geglu"
    interleaved: bool = False
    approximate: str = "none"  # geglu
    alpha: float = 1.0
    limit: float | None = None
    up_offset: float = 0.0


# ----------------------------------------------------------------------------------------------------------
# The patched functions
# ----------------------------------------------------------------------------------------------------------


def experts_gate(spec: ExpertsSpec, gate_up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up of a [..., 2I] projection output, as ``spec`` says."""
    if spec.kind == "swiglu":
        return liger_core.ops.swiglu_packed(
            gate_up,
            interleaved=spec.interleaved,
            alpha=spec.alpha,
            limit=spec.limit,
            up_offset=spec.up_offset,
        )
    gate, up = (gate_up[..., ::2], gate_up[..., 1::2]) if spec.interleaved else gate_up.chunk(2, dim=-1)
    return liger_core.ops.geglu(gate, up, approximate=spec.approximate)


def experts_apply_gate(self: nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
    return experts_gate(self.__dict__[SPEC_ATTR], gate_up)


def experts_forward(self: nn.Module, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    if calls_apply_gate(self):
        return type(self).forward(self, hidden_states, *args, **kwargs)
    return experts_loop(self, self.__dict__[SPEC_ATTR], hidden_states, *args, **kwargs)


def _project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool):
    if transposed:
        out = x @ weight
        return out if bias is None else out + bias
    return F.linear(x, weight, bias)


def experts_loop(module: nn.Module, spec: ExpertsSpec, hidden_states: torch.Tensor, *args, **kwargs):
    """transformers' eager experts computation with liger's gated activation."""
    layout = spec.layout
    w_gate_up, w_down = getattr(module, layout.gate_up), getattr(module, layout.down)
    if spec.form == "dense":
        x = hidden_states.view(w_gate_up.shape[0], -1, hidden_states.shape[-1])
        gate_up = torch.bmm(x, w_gate_up if layout.transposed else w_gate_up.transpose(1, 2))
        h = experts_gate(spec, gate_up)
        out = torch.bmm(h, w_down if layout.transposed else w_down.transpose(1, 2))
        return out.view(-1, hidden_states.shape[-1])
    top_k_index, top_k_weights = _routing(args, kwargs)
    b_gate_up = getattr(module, layout.gate_up_bias) if layout.gate_up_bias else None
    b_down = getattr(module, layout.down_bias) if layout.down_bias else None
    final = torch.zeros_like(hidden_states)
    num_experts, computed = w_gate_up.shape[0], w_down.shape[0]
    with torch.no_grad():
        hit = torch.unique(top_k_index[(top_k_index >= 0) & (top_k_index < num_experts)]).tolist()
    for e in hit:
        token_idx, k_pos = torch.where(top_k_index == e)
        current = hidden_states[token_idx]
        if layout.identity_experts and e >= computed:
            out = current * top_k_weights[token_idx, k_pos, None]
            final.index_add_(0, token_idx, out.to(final.dtype))
            continue
        gate_up = _project(
            current, w_gate_up[e], None if b_gate_up is None else b_gate_up[e], layout.transposed
        )
        h = experts_gate(spec, gate_up)
        out = _project(h, w_down[e], None if b_down is None else b_down[e], layout.transposed)
        out = out * top_k_weights[token_idx, k_pos, None]
        final.index_add_(0, token_idx, out.to(final.dtype))
    return final


def _routing(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(top_k_index, top_k_weights), passed by position or under transformers' names for them."""
    values = list(args)
    for names in (("top_k_index", "router_indices"), ("top_k_weights", "routing_weights")):
        for name in names:
            if name in kwargs:
                values.append(kwargs[name])
                break
    if len(values) != 2:
        raise TypeError("experts forward takes (hidden_states, top_k_index, top_k_weights)")
    return values[0], values[1]


def _dispatched(module: nn.Module):
    """The function the class forward runs now: transformers' experts implementation chosen by
    ``config._experts_implementation`` (read from the ``use_experts_implementation`` wrapper's own
    variables), else the forward at the bottom of the decorator chain."""
    forward = type(module).forward
    inner = innermost_function(forward)
    code = getattr(forward, "__code__", None)
    if code is not None and forward.__closure__ and "experts_interface" in code.co_freevars:
        interface = forward.__closure__[code.co_freevars.index("experts_interface")].cell_contents
        name = getattr(getattr(module, "config", None), "_experts_implementation", None)
        if name not in (None, "eager"):
            try:
                return interface[name]
            except Exception:  # noqa: BLE001 - an unknown name: the class forward raises its own error
                return inner
    return inner


def calls_apply_gate(module: nn.Module) -> bool:
    fn = _dispatched(module)
    return isinstance(fn, types.FunctionType) and "_apply_gate" in fn.__code__.co_names


# ----------------------------------------------------------------------------------------------------------
# Recognition and probe
# ----------------------------------------------------------------------------------------------------------


def _param(m: nn.Module, name: str | None, dim: int) -> torch.Tensor | None:
    t = getattr(m, name, None) if name else None
    return t if isinstance(t, torch.Tensor) and t.dim() == dim else None


def match_layout(m: nn.Module) -> tuple[ExpertsLayout, int, int, int] | None:
    """(layout, E, H, I) of the first layout whose parameters ``m`` has with consistent shapes."""
    for layout in EXPERTS_LAYOUTS:
        gu, down = _param(m, layout.gate_up, 3), _param(m, layout.down, 3)
        if gu is None or down is None:
            continue
        if gu.shape[0] != down.shape[0] and not (layout.identity_experts and gu.shape[0] > down.shape[0]):
            continue
        n, two_i, h = (gu.shape[0], gu.shape[2], gu.shape[1]) if layout.transposed else gu.shape
        d_h, d_i = (down.shape[2], down.shape[1]) if layout.transposed else (down.shape[1], down.shape[2])
        if two_i != 2 * d_i or h != d_h:
            continue
        biases = (_param(m, layout.gate_up_bias, 2), _param(m, layout.down_bias, 2))
        wanted = (layout.gate_up_bias, layout.down_bias)
        if any((b is None) != (w is None) for b, w in zip(biases, wanted)):
            continue
        if not any(wanted) and any(
            getattr(m, b, None) is not None for b in ("gate_up_proj_bias", "down_proj_bias")
        ):
            continue  # a biased module is not the bias-free layout
        return layout, n, h, d_i
    return None


def _float_attr(m: nn.Module, names: tuple[str, ...]) -> float | None:
    for name in names:
        value = getattr(m, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)  # an infinite limit clamps nothing: the plain activation
    return None


def gate_candidates(m: nn.Module, layout: ExpertsLayout) -> list[ExpertsSpec] | str:
    """The gated activations to try on ``m`` (without layout/form: filled in by the probe), or a reason."""
    found = None
    for name in _ACT_ATTRS:
        act = getattr(m, name, None)
        if act is not None:
            found = fw.classify_activation(act)
            break
    limit, alpha = _float_attr(m, LIMIT_ATTRS), _float_attr(m, ALPHA_ATTRS)
    out = []
    for interleaved in layout.halves:
        if found is not None:
            out.append(ExpertsSpec(layout, "", found[0], interleaved=interleaved, approximate=found[1]))
        if limit is not None and limit > 0 and (alpha or 1.0) > 0:
            for offset in UP_OFFSETS:
                out.append(
                    ExpertsSpec(
                        layout,
                        "",
                        "swiglu",
                        interleaved=interleaved,
                        alpha=alpha or 1.0,
                        limit=limit,
                        up_offset=offset,
                    )  # fmt: skip
                )
    if not out:
        return "its activation is neither silu nor gelu and it has no SwiGLU limit"
    return out


def _form(m: nn.Module) -> str | None:
    inner = innermost_function(type(m).forward)
    if inner is None:
        return None
    params = list(inspect.signature(inner).parameters)[1:]
    return {1: "dense", 3: "routed"}.get(len(params))


def _probe_params(m, layout, n, h, i, shrink: bool, like: torch.Tensor, gen) -> dict[str, torch.Tensor]:

    if shrink:
        h, i = min(h, _PROBE_HIDDEN), min(i, _PROBE_INTER)
    limit = _float_attr(m, LIMIT_ATTRS)
    # projections of unit inputs with a spread of about 1.5 limits (or 2): clamps and tails are reached
    scale = (1.5 * limit if limit else 2.0) / h**0.5
    gu_shape = (n, h, 2 * i) if layout.transposed else (n, 2 * i, h)
    n_down = getattr(m, layout.down).shape[0]  # fewer than n with identity experts
    down_shape = (n_down, i, h) if layout.transposed else (n_down, h, i)
    params = {
        layout.gate_up: pr.leaf(pr.randn(gu_shape, like, gen, scale=scale)),
        layout.down: pr.leaf(pr.randn(down_shape, like, gen, scale=1.0 / i**0.5)),
    }
    if layout.gate_up_bias:
        params[layout.gate_up_bias] = pr.leaf(pr.randn((n, 2 * i), like, gen, scale=0.5))
    if layout.down_bias:
        params[layout.down_bias] = pr.leaf(pr.randn((n_down, h), like, gen, scale=0.5))
    return params


def _probe_inputs(form: str, n: int, h: int, like: torch.Tensor, gen) -> tuple[torch.Tensor, ...]:

    if form == "dense":
        return (pr.leaf(pr.randn((n * 3, h), like, gen)),)
    k = min(2, n)
    index = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(_PROBE_TOKENS)]).to(like.device)
    weights = torch.rand((_PROBE_TOKENS, k), generator=gen).to(device=like.device, dtype=like.dtype)
    return pr.leaf(pr.randn((_PROBE_TOKENS, h), like, gen)), index, pr.leaf(weights)


def _run(m: nn.Module, params: dict, fn, inputs: tuple, dy: torch.Tensor | None, gen):
    """(output, gradients of the float inputs and params) of ``fn(m, *inputs)`` with ``params`` in place."""

    with torch.enable_grad(), _reparametrize_module(m, params):
        out = fn(m, *inputs)
    if not isinstance(out, torch.Tensor):
        raise TypeError("forward does not return a tensor")
    if dy is None:
        dy = pr.randn(out.shape, out, gen)
    leaves = [t for t in inputs if t.is_floating_point()] + list(params.values())
    grads = torch.autograd.grad(out, leaves, dy, allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)]
    return out, grads, dy


def _with_spec(m: nn.Module, spec: ExpertsSpec, fn):
    """``fn`` run with ``spec`` set on ``m`` and liger's ``_apply_gate`` in place (restored afterwards)."""

    def run(module, *inputs):
        saved = {k: module.__dict__[k] for k in (SPEC_ATTR, "_apply_gate") if k in module.__dict__}
        module.__dict__[SPEC_ATTR] = spec
        module.__dict__["_apply_gate"] = types.MethodType(experts_apply_gate, module)
        try:
            return fn(module, *inputs)
        finally:
            for k in (SPEC_ATTR, "_apply_gate"):
                module.__dict__.pop(k, None)
            module.__dict__.update(saved)

    return run


def probe_experts(m: nn.Module, gen: torch.Generator) -> ExpertsSpec | str:
    """The spec whose patched forward reproduces ``m``'s, or the reason none does."""

    found = match_layout(m)
    layout, n, h, i = found
    if not pr.usable(getattr(m, layout.gate_up)):
        return "expert weights not materialised"
    form = _form(m)
    if form is None:
        return "forward takes neither (hidden_states) nor (hidden_states, top_k_index, top_k_weights)"
    candidates = gate_candidates(m, layout)
    if isinstance(candidates, str):
        return candidates
    like = getattr(m, layout.gate_up)
    checks = [("forward", lambda mod, *a: type(mod).forward(mod, *a), experts_forward)]
    if calls_apply_gate(m):
        eager = innermost_function(type(m).forward)
        if eager is not None and "_apply_gate" not in eager.__code__.co_names:
            checks.append(("eager forward", eager, experts_loop_forward))
    failure = ""
    for shrink in (True, False):
        try:
            params = _probe_params(m, layout, n, h, i, shrink, like, gen)
            inputs = _probe_inputs(
                form, n, params[layout.gate_up].shape[1 if layout.transposed else 2], like, gen
            )
            refs = [_run(m, params, ref, inputs, None, gen) for _, ref, _ in checks]
        except Exception as e:  # noqa: BLE001 - a forward that needs its own sizes: retried at full size
            failure = f"probe forward failed ({type(e).__name__}: {e})"
            continue
        best = float("inf")
        for cand in candidates:
            spec = dataclasses.replace(cand, form=form)
            err = 0.0
            for (_, _, ours), (ref_out, ref_grads, dy) in zip(checks, refs):
                out, grads, _ = _run(m, params, _with_spec(m, spec, ours), inputs, dy, gen)
                err = max(err, pr.max_err([(out, ref_out), *zip(grads, ref_grads)]))
            if err <= pr.tolerance(like.dtype):
                return spec
            best = min(best, err)
        names = "/".join(name for name, _, _ in checks)
        return f"{names} differs from every gated activation tried (best rel. error {best:.1e})"
    return failure


def experts_loop_forward(self: nn.Module, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return experts_loop(self, self.__dict__[SPEC_ATTR], hidden_states, *args, **kwargs)


def match_glu_layout(m: nn.Module) -> ExpertGLULayout | None:
    """The ``EXPERT_GLU_LAYOUTS`` entry whose flattened [E * I, H] weights ``m`` has, with a forward taking
    (x, gate_w, up_w, down_w)."""
    for layout in EXPERT_GLU_LAYOUTS:
        ws = [_param(m, name, 2) for name in layout.params]
        if any(w is None for w in ws) or len({tuple(w.shape) for w in ws}) != 1:
            continue
        inner = innermost_function(type(m).forward)
        if inner is not None and len(inspect.signature(inner).parameters) == 5:
            return layout
    return None


def probe_expert_glu(m: nn.Module, layout: ExpertGLULayout, gen: torch.Generator) -> ExpertGLUSpec | str:
    """The spec whose forward reproduces ``m``'s on one expert's random weights (sizes reduced): outputs and
    the gradients of x and the three weights."""

    like = getattr(m, layout.params[0])
    if not pr.usable(like):
        return "expert weights not materialised"
    act = next((getattr(m, a) for a in _ACT_ATTRS if getattr(m, a, None) is not None), None)
    found = fw.classify_activation(act)
    if found is None:
        return f"activation {type(act).__name__} is neither silu nor gelu"
    spec = ExpertGLUSpec(layout, *found)
    h, i = min(like.shape[1], _PROBE_HIDDEN), _PROBE_INTER
    x = pr.leaf(pr.randn((_PROBE_TOKENS, h), like, gen))
    ws = [pr.leaf(pr.randn((i, h), like, gen, scale=2.0 / h**0.5)) for _ in range(3)]
    with torch.enable_grad():
        ref = type(m).forward(m, x, *ws)
        if not isinstance(ref, torch.Tensor):
            return "forward does not return a tensor"
        dy = pr.randn(ref.shape, ref, gen)
        ref_grads = torch.autograd.grad(ref, (x, *ws), dy)
        m.__dict__[GLU_SPEC_ATTR] = spec
        try:
            out = expert_glu_forward(m, x, *ws)
        finally:
            m.__dict__.pop(GLU_SPEC_ATTR)
        grads = torch.autograd.grad(out, (x, *ws), dy)
    err = pr.max_err([(out, ref), *zip(grads, ref_grads)])
    if err <= pr.tolerance(like.dtype):
        return spec
    return f"forward is not (act(x @ gate.T) * (x @ up.T)) @ down (probe rel. error {err:.1e})"


def _unmatched(m: nn.Module) -> tuple[str, str] | None:
    """("skip" | "miss", reason) for a module with experts weights that no layout matches; None otherwise.

    3-D ``up_proj``/``down_proj`` without a gate (act(up) only) is not a gated activation: skipped. Other
    parameters of a module named like experts (DBRX's flattened w1/v1/w2) may be gated: a miss."""
    own = [n for n, _ in m.named_parameters(recurse=False)]
    three_d = [n for n, p in m.named_parameters(recurse=False) if p.dim() == 3]
    if "down_proj" in three_d and "up_proj" in three_d and "gate_up_proj" not in three_d:
        return "skip", f"experts weights ({', '.join(three_d)}) have no gate: no liger kernel for act(up)"
    if "expert" in type(m).__name__.lower() and len(own) >= 2:
        return "miss", f"parameters ({', '.join(own)}) match no layout of EXPERTS_LAYOUTS"
    return None


def patch_experts(root: nn.Module, flags: dict[str, bool], report: PatchReport) -> None:
    """Swap every experts module whose probe passes; misses and skips go to the report with reasons."""
    if not flags.get("moe_experts"):
        return
    gen = torch.Generator().manual_seed(0)
    cache: dict[tuple, object] = {}
    misses: list[str] = []
    for qualname, m in root.named_modules():
        if m is root or own_kind(m) is not None:
            continue
        glu = match_glu_layout(m) if match_layout(m) is None else None
        if glu is not None:
            _patch_expert_glu(root, qualname, m, glu, gen, cache, misses, report)
            continue
        if match_layout(m) is None:
            unmatched = _unmatched(m)
            if unmatched is not None and unmatched[0] == "skip":
                report.skip(f"{type(m).__name__}: {unmatched[1]}")
            elif unmatched is not None:
                misses.append(f"{type(m).__name__}: {unmatched[1]}")
            continue
        key = (
            type(m),
            tuple((k, tuple(p.shape), p.dtype, p.device) for k, p in m.named_parameters(recurse=False)),
            tuple(_float_attr(m, names) for names in (LIMIT_ATTRS, ALPHA_ATTRS)),
            getattr(getattr(m, "config", None), "_experts_implementation", None),
        )
        if key not in cache:
            try:
                cache[key] = probe_experts(m, gen)
            except Exception as e:  # noqa: BLE001 - patching never raises out of a probe
                cache[key] = f"probe failed ({type(e).__name__}: {e})"
        verdict = cache[key]
        name = type(m).__name__
        if isinstance(verdict, str):
            misses.append(f"{name}: {verdict}")
            continue
        if foreign_forward(m) or "_apply_gate" in m.__dict__:
            misses.append(f"{name}: has an instance-level forward or _apply_gate from another library")
            continue
        bind(root, m, experts_forward, "moe_experts", **{SPEC_ATTR: verdict})
        set_entry(root, m, "_apply_gate", types.MethodType(experts_apply_gate, m), "moe_experts")
        report.count("moe_experts")
        report.modules[qualname] = "moe_experts"
    for reason in summarize_reasons(misses):
        report.miss("moe_experts", reason)


def _patch_expert_glu(root, qualname, m, layout, gen, cache, misses, report) -> None:
    key = (type(m), layout, tuple((k, p.dtype, p.device) for k, p in m.named_parameters(recurse=False)))
    if key not in cache:
        try:
            cache[key] = probe_expert_glu(m, layout, gen)
        except Exception as e:  # noqa: BLE001 - patching never raises out of a probe
            cache[key] = f"probe failed ({type(e).__name__}: {e})"
    verdict, name = cache[key], type(m).__name__
    if isinstance(verdict, str):
        misses.append(f"{name}: {verdict}")
    elif foreign_forward(m):
        misses.append(f"{name}: has an instance-level forward from another library")
    else:
        bind(root, m, expert_glu_forward, "moe_experts", **{GLU_SPEC_ATTR: verdict})
        report.count("moe_experts")
        report.modules[qualname] = "moe_experts"

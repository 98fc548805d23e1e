"""The norm, MLP and RoPE forwards that patching puts into Hugging Face models (the causal-LM loss forward
is in ``causal_lm``, the rotary drop-ins in ``rope_variants``).

Each forward is one module-level function shared by instance patching (bound into a module's ``__dict__`` with
``types.MethodType``) and class-level patching (set on a generated subclass or on the causal-LM class), and it
reads what it needs from attributes of the module it is bound to (``_liger_core_norm_spec``, ...). Parameters
are only ever read: no parameter is created, copied or renamed, so ``state_dict()`` is unchanged.

Only ``liger_core.ops``' functional API is called here (never Triton): on CUDA tensors the Triton kernels run,
on CPU the interpreter or the reference path (``liger_core.dispatch``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import liger_core  # `liger_core.ops` is imported on first use: importing patching does not import Triton
from liger_core.patching.introspect import RewrapError, innermost_function, rewrap, with_global

# ----------------------------------------------------------------------------------------------------------
# RMSNorm / LayerNorm
# ----------------------------------------------------------------------------------------------------------


def norm_eps(module: nn.Module) -> float:
    """HF's RMSNorm classes call epsilon ``variance_epsilon`` (Llama family) or ``eps`` (Gemma, OLMo-2)."""
    eps = getattr(module, "variance_epsilon", None)
    if eps is None:
        eps = getattr(module, "eps", None)
    if eps is None:
        raise AttributeError(f"{type(module).__name__} has neither `variance_epsilon` nor `eps`")
    return float(eps)


def rms_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    spec = self._liger_core_norm_spec
    return liger_core.ops.rms_norm(
        hidden_states.flatten(-2) if spec.heads_input else hidden_states,
        self.weight,
        norm_eps(self),
        offset=spec.offset,
        casting_mode=spec.casting_mode,
        in_place=spec.in_place,
        group_size=spec.group_size,
    )


@dataclass(frozen=True)
class GatedNormSpec:
    """How a gated RMSNorm rounds and gates (the options of ``liger_core.ops.rms_norm_gated``)."""

    casting_mode: str = "llama"
    activation: str = "silu"
    norm_before_gate: bool = True
    group_size: int | None = None


def rms_norm_gated_forward(self: nn.Module, hidden_states: torch.Tensor, gate: torch.Tensor | None = None):
    """A gated RMSNorm's forward: ``liger_core.ops.rms_norm_gated``; without a gate, the module's own."""
    if gate is None:
        return type(self).forward(self, hidden_states)
    spec = self._liger_core_gated_spec
    return liger_core.ops.rms_norm_gated(
        hidden_states,
        gate,
        self.weight,
        norm_eps(self),
        activation=spec.activation,
        casting_mode=spec.casting_mode,
        norm_before_gate=spec.norm_before_gate,
        group_size=spec.group_size,
    )


def layer_norm_forward(self: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return liger_core.ops.layer_norm(x, self.weight, self.bias, self.eps)


# ----------------------------------------------------------------------------------------------------------
# MLPs: only the activation (gated: act(gate) * up) is swapped; the projections are still called as
# submodules (for LoRA)
# ----------------------------------------------------------------------------------------------------------

# The kinds of a non-gated MLP, ``down(act(up(x)))``: no gate, one activation on the up projection's output
PLAIN_KINDS = ("relu_squared",)


@dataclass(frozen=True)
class ResolvedMLP:
    """An MLP's attribute names plus the activation recognised on the built module. Gated
    (``down(act(gate(x)) * up(x))``) for the kinds "swiglu" and "geglu"; non-gated (``down(act(up(x)))``:
    ``gate`` and ``gate_up`` None) for the ``PLAIN_KINDS``."""

    gate: str | None
    up: str | None
    down: str
    gate_up: str | None
    kind: str  # "swiglu" | "geglu" | "relu_squared"
    approximate: str = "none"  # geglu only: "tanh" or "none"
    gate_second: bool = False  # gate_up's output is (up, gate), not (gate, up) (Phi-4 audio)
    # submodules applied to the input first, in order (Phi-4 audio's LayerNorm; GLM-4V's patch merger:
    # projection, LayerNorm, GELU)
    pre: tuple[str, ...] = ()
    dropout: str | None = None  # a dropout module applied to act(gate) * up and to the output


def _dropout_active(dropout: nn.Module) -> bool:
    """Whether calling ``dropout`` can change a tensor (a p=0 or eval-mode nn.Dropout returns its input
    itself and draws no random numbers)."""
    return not (isinstance(dropout, nn.Dropout) and (dropout.p == 0 or not dropout.training))


def gated_mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return gated_mlp(self, self._liger_core_mlp_spec, x)


def mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A gated or a non-gated MLP's forward, as its ``_liger_core_mlp_spec`` says."""
    return mlp(self, self._liger_core_mlp_spec, x)


def mlp(module: nn.Module, spec: ResolvedMLP, x: torch.Tensor) -> torch.Tensor:
    return plain_mlp(module, spec, x) if spec.kind in PLAIN_KINDS else gated_mlp(module, spec, x)


def plain_mlp(module: nn.Module, spec: ResolvedMLP, x: torch.Tensor) -> torch.Tensor:
    """``down(act(up(x)))`` with liger's activation (``relu_squared``: ``relu(up(x))^2``)."""
    if spec.kind != "relu_squared":
        raise ValueError(f"spec.kind must be one of {PLAIN_KINDS} for a non-gated MLP, got {spec.kind!r}")
    for name in spec.pre:
        x = getattr(module, name)(x)
    return getattr(module, spec.down)(liger_core.ops.relu_squared(getattr(module, spec.up)(x)))


def gated_mlp(module: nn.Module, spec: ResolvedMLP, x: torch.Tensor) -> torch.Tensor:
    self = module
    for name in spec.pre:
        x = getattr(self, name)(x)
    if spec.gate_up is not None:
        gate, up = getattr(self, spec.gate_up)(x).chunk(2, dim=-1)
        if spec.gate_second:
            gate, up = up, gate
    else:
        gate, up = getattr(self, spec.gate)(x), getattr(self, spec.up)(x)
    # gate and up are read by nothing but the activation (the projections save their input, not their
    # output), so the activation's backward may write their gradients over them
    down = getattr(self, spec.down)
    dropout = getattr(self, spec.dropout) if spec.dropout is not None else None
    if dropout is not None and _dropout_active(dropout):
        # called as the original does, in the same order on the same shapes: the same random masks
        if spec.kind == "swiglu":
            h = liger_core.ops.swiglu(gate, up, inplace_backward=True)
        else:
            h = liger_core.ops.geglu(gate, up, approximate=spec.approximate, inplace_backward=True)
        return dropout(down(dropout(h)))
    from liger_core.modules.mlp import fusable_down_proj  # imports Triton: not at patching's import

    if fusable_down_proj(down, gate, up):
        # the activation and a plain down projection as one op that does not keep act(gate) * up for
        # backward: one intermediate-sized tensor less at the MLP backward's peak (ops/glu_down_proj.py)
        return liger_core.ops.glu_down_proj(
            gate, up, down.weight, down.bias, activation=spec.kind, approximate=spec.approximate
        )
    if spec.kind == "swiglu":
        h = liger_core.ops.swiglu(gate, up, inplace_backward=True)
    else:
        h = liger_core.ops.geglu(gate, up, approximate=spec.approximate, inplace_backward=True)
    return down(h)


def tiled_mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A gated MLP's forward over sequence tiles (``liger_core.modules.long_context.tiled_mlp``): each tile
    runs ``self._liger_core_tiled_inner(self, tile)`` (``gated_mlp_forward`` with the GLU kernels, else the
    class's own forward). An MLP whose dropout draws random numbers runs untiled: tiles would draw other
    masks than one call over the whole input."""
    inner = self._liger_core_tiled_inner
    spec = self._liger_core_mlp_spec
    if spec.dropout is not None and _dropout_active(getattr(self, spec.dropout)):
        return inner(self, x)
    from liger_core.modules.long_context import tiled_mlp

    params = [p for p in self.parameters() if p.requires_grad]
    return tiled_mlp(functools.partial(inner, self), x, params)


_ACT_PROBE_TOL = 1e-6


@functools.lru_cache(maxsize=1)
def _act_probe() -> torch.Tensor:
    # both tails and the curved middle; explicit device: HF may build models under a meta device context
    return torch.linspace(-8.0, 8.0, 321, dtype=torch.float32, device="cpu")


def classify_activation(act: object) -> tuple[str, str] | None:
    """Recognise an activation module by what it computes: ("swiglu", "none"), ("geglu", "tanh"|"none"), None.

    By value, not by class name: transformers renames these classes between releases (SiLUActivation, nn.SiLU,
    GELUTanh, PytorchGELUTanh, NewGELUActivation ...). Modules with parameters (learnable activations) never
    match.
    """
    if not callable(act) or (isinstance(act, nn.Module) and any(True for _ in act.parameters())):
        return None
    x = _act_probe()
    try:
        with torch.no_grad():
            y = act(x.clone())
    except Exception:  # noqa: BLE001 - anything that cannot take a plain fp32 tensor is not one of ours
        return None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype:
        return None
    for kind, approximate, ref in (
        ("swiglu", "none", F.silu(x)),
        ("geglu", "tanh", F.gelu(x, approximate="tanh")),
        ("geglu", "none", F.gelu(x)),
    ):
        if (y - ref).abs().max().item() <= _ACT_PROBE_TOL:
            return kind, approximate
    return None


def classify_plain_activation(act: object) -> str | None:
    """Recognise a non-gated MLP's activation by what it computes: "relu_squared" (``relu(x)^2``,
    transformers' ``ACT2FN["relu2"]``), or None (an activation no liger kernel replaces on its own: GELU,
    ReLU, ...). By value, as ``classify_activation``."""
    if not callable(act) or (isinstance(act, nn.Module) and any(True for _ in act.parameters())):
        return None
    x = _act_probe()
    try:
        with torch.no_grad():
            y = act(x.clone())
    except Exception:  # noqa: BLE001 - anything that cannot take a plain fp32 tensor is not one of ours
        return None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype:
        return None
    # relu(x)^2 reaches 64 on the probe: the same relative tolerance as the gated activations'
    if (y - torch.relu(x).square()).abs().max().item() <= _ACT_PROBE_TOL * 64:
        return "relu_squared"
    return None


def resolve_mlp(module: nn.Module, spec: Any) -> ResolvedMLP | str:
    """The ResolvedMLP for ``module`` from an MLPSpec-like ``spec``, or why it cannot be patched. A spec
    with neither ``gate`` nor ``gate_up`` is a non-gated MLP (``classify_plain_activation``)."""
    names = [n for n in (spec.gate, spec.up, spec.down, spec.gate_up) if n is not None]
    missing = [n for n in names if not isinstance(getattr(module, n, None), nn.Module)]
    if missing:
        return f"has no submodule {missing[0]!r}"
    act = getattr(module, spec.act, None)
    if spec.gate is None and spec.gate_up is None:
        if spec.up is None:
            return "a non-gated MLP needs an up projection"
        plain = classify_plain_activation(act)
        if plain is None:
            return f"activation {type(act).__name__} of a non-gated MLP is not relu(x)^2"
        found = (plain, "none")
    else:
        found = classify_activation(act)
    if found is None:
        return f"activation {type(act).__name__} is neither silu nor gelu"
    kind, approximate = found
    pre, dropout = tuple(getattr(spec, "pre", ())), getattr(spec, "dropout", None)
    if dropout is not None and kind in PLAIN_KINDS:
        return "a non-gated MLP with a dropout module: no liger forward for it"
    missing = [
        n for n in (*pre, dropout) if n is not None and not isinstance(getattr(module, n, None), nn.Module)
    ]
    if missing:
        return f"has no submodule {missing[0]!r}"
    return ResolvedMLP(
        spec.gate,
        spec.up,
        spec.down,
        spec.gate_up,
        kind,
        approximate,
        getattr(spec, "gate_second", False),
        pre=pre,
        dropout=dropout,
    )


# ----------------------------------------------------------------------------------------------------------
# RoPE
# ----------------------------------------------------------------------------------------------------------


_rebound_forwards: dict[tuple[Any, str, Any], Any] = {}


def forward_with_global(func: Any, name: str, replacement: Any) -> Any:
    """A copy of the forward ``func`` whose own code sees ``replacement`` for the global ``name``.

    This is how RoPE is patched on one model instance: HF attention forwards call the modeling module's
    ``apply_rotary_pos_emb`` through their globals, so swapping the module attribute would change every model
    of that type in the process (a frozen reference model in DPO/distillation included). Instead the patched
    attention module gets this copy of its class's forward. When decorators wrap the forward (transformers'
    ``deprecate_kwarg`` and others), the function at the bottom of the chain is copied and the chain is
    rebuilt around the copy, so every decorator still runs (``introspect.rewrap``; ``RewrapError`` if a
    decorator cannot be rebuilt). The copy of the globals is taken when the model is patched (a later
    monkey-patch of *another* name in that modeling module is not seen by patched attention modules).
    One copy per (function, name, replacement) is cached, so N layers share one function object.
    """
    key = (func, name, replacement)
    cached = _rebound_forwards.get(key)
    if cached is not None:
        return cached
    inner = innermost_function(func)
    if inner is None:
        raise RewrapError(f"{getattr(func, '__qualname__', func)!r} is not a Python function")
    new = rewrap(func, with_global(inner, name, replacement))
    new._liger_core_rope = replacement
    _rebound_forwards[key] = new
    return new

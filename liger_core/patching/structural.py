"""Structural patching: for a model type without a recipe, recognise RMSNorm-like modules, gated MLPs, rotary
functions, LayerNorms and the causal-LM head by their structure, and swap each one only after its liger
replacement has reproduced the original on a random probe (a numeric self-check at patch time, run in the
module's own dtype and device on a small batch, under ``torch.no_grad``, with a private RNG so the caller's
random state is untouched).

What is recognised (and what decides it):

- RMSNorm: a leaf module whose only parameter is a 1-D ``weight``, with a float ``variance_epsilon`` or
  ``eps`` and no bias. Three semantics are tried (Llama: ``w * xn.to(dt)``; Gemma: ``(xn * (1 + w)).to(dt)``;
  OLMo-2: ``(xn * w).to(dt)``); the one closest to the module's own output is kept if it is within tolerance.
- LayerNorm: exactly ``torch.nn.LayerNorm`` with weight and bias.
- Gated MLP: ``gate_proj``/``up_proj``/``down_proj`` or ``gate_up_proj``/``down_proj`` submodules and an
  ``act_fn``/``activation_fn`` that computes silu or gelu; then the whole MLP forward is probed.
- RoPE: an attention-like module whose class forward calls a module-level function whose name contains
  "rotary", "rope", "rotate" or "pos_emb"; the function is probed on random q/k/cos/sin (GQA head counts)
  against ``liger_core.ops.rope``; on success the module gets a copy of its forward that calls liger's rope
  (``forwards.forward_with_global``).
- Loss head: a model with ``lm_head`` (nn.Linear), ``config.vocab_size`` and a base model; its own forward's
  loss on a 6-token probe is compared with the fused linear cross-entropy loss (after the swaps above).

Tolerances: relative max error 1e-5 in fp32 (float rounding differences only), 4 units of the dtype's
epsilon in bf16/fp16 (a rounding difference, not a different formula: a wrong offset, scale or activation
is off by > 10%).
"""

from __future__ import annotations

import re
import types
from types import SimpleNamespace

import torch
from torch import nn

import liger_core
from liger_core.patching import forwards as fw
from liger_core.patching.instance import _swaps, bind, foreign_forward, own_kind, patch_loss
from liger_core.patching.recipes import NormSpec
from liger_core.patching.report import PatchReport, summarize_reasons

_ROPE_NAME = re.compile(r"rotary|rope|rotate|pos_emb", re.IGNORECASE)
_NORM_VARIANTS = (
    NormSpec("structural", offset=0.0, casting_mode="llama", in_place=False),
    NormSpec("structural", offset=1.0, casting_mode="gemma", in_place=False),
    NormSpec("structural", offset=0.0, casting_mode="gemma", in_place=False),
)
_MLP_LAYOUTS = (
    dict(gate="gate_proj", up="up_proj", down="down_proj", gate_up=None),
    dict(gate=None, up=None, down="down_proj", gate_up="gate_up_proj"),
)
_ACT_NAMES = ("act_fn", "activation_fn", "act")


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype in (torch.float32, torch.float64) else 4 * torch.finfo(dtype).eps


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    if y.shape != ref.shape or y.dtype != ref.dtype:
        return float("inf")
    y, ref = y.double(), ref.double()
    if not torch.isfinite(y).all():
        return float("inf")
    scale = ref.abs().max().item()
    return (y - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def _randn(shape, like: torch.Tensor, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(shape, generator=gen, dtype=torch.float32)).to(
        device=like.device, dtype=like.dtype
    )


def _first_param(module: nn.Module) -> torch.Tensor | None:
    return next(iter(module.parameters()), None)


def _usable(t: torch.Tensor | None) -> bool:
    return t is not None and t.device.type != "meta" and t.is_floating_point()


# ----------------------------------------------------------------------------------------------------------
# Recognisers + probes. Each returns what to bind, or a reason string.
# ----------------------------------------------------------------------------------------------------------


def _looks_like_rms_norm(m: nn.Module) -> bool:
    if type(m) in (nn.LayerNorm, nn.Embedding) or any(True for _ in m.children()):
        return False
    params = dict(m.named_parameters(recurse=False))
    if set(params) != {"weight"} or params["weight"].dim() != 1:
        return False
    eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
    return isinstance(eps, float) and getattr(m, "bias", None) is None


def _probe_norm(m: nn.Module, gen: torch.Generator) -> NormSpec | str:
    w = m.weight
    if not _usable(w):
        return "weight not materialised"
    x = _randn((2, 3, w.shape[0]), w, gen, scale=3.0)
    with torch.no_grad():
        ref = type(m).forward(m, x)
        if not isinstance(ref, torch.Tensor):
            return "forward does not return a tensor"
        best, best_err = None, float("inf")
        for spec in _NORM_VARIANTS:
            y = liger_core.ops.rms_norm(
                x, w, fw.norm_eps(m), offset=spec.offset, casting_mode=spec.casting_mode
            )
            err = _rel_err(y, ref)
            if err < best_err:
                best, best_err = spec, err
    if best_err <= _tolerance(x.dtype):
        return best
    return f"output differs from every RMSNorm variant (best rel. error {best_err:.1e})"


def _probe_layer_norm(m: nn.LayerNorm, gen: torch.Generator) -> bool | str:
    if m.weight is None or m.bias is None or len(m.normalized_shape) != 1:
        return "not an affine LayerNorm over the last dimension"
    if not _usable(m.weight):
        return "weight not materialised"
    x = _randn((2, 3, m.normalized_shape[0]), m.weight, gen, scale=3.0)
    with torch.no_grad():
        err = _rel_err(liger_core.ops.layer_norm(x, m.weight, m.bias, m.eps), type(m).forward(m, x))
    return True if err <= _tolerance(x.dtype) else f"probe mismatch (rel. error {err:.1e})"


def _probe_mlp(m: nn.Module, gen: torch.Generator) -> fw.ResolvedMLP | str | None:
    """None if the module is not a gated MLP at all; a reason if it is one that does not match."""
    for layout in _MLP_LAYOUTS:
        if not all(isinstance(getattr(m, n, None), nn.Module) for n in layout.values() if n is not None):
            continue
        act = next((a for a in _ACT_NAMES if getattr(m, a, None) is not None), None)
        if act is None:
            return "no act_fn/activation_fn attribute"
        resolved = fw.resolve_mlp(m, SimpleNamespace(act=act, **layout))
        if isinstance(resolved, str):
            return resolved
        first = getattr(m, layout["gate_up"] or layout["gate"])
        weight = getattr(first, "weight", None)
        if not _usable(weight) or weight.dim() != 2:
            return "projection weight not materialised"
        x = _randn((2, 3, weight.shape[1]), weight, gen)
        with torch.no_grad():
            err = _rel_err(fw.gated_mlp(m, resolved, x), type(m).forward(m, x))
        if err <= _tolerance(x.dtype):
            return resolved
        return f"forward is not down(act(gate(x)) * up(x)) (probe rel. error {err:.1e})"
    return None


def _rope_global(m: nn.Module) -> tuple[str, types.FunctionType] | None:
    forward = type(m).forward
    if not isinstance(forward, types.FunctionType):
        return None
    for name in forward.__code__.co_names:
        value = forward.__globals__.get(name)
        if _ROPE_NAME.search(name) and isinstance(value, types.FunctionType):
            return name, value
    return None


def _probe_rope(fn: types.FunctionType, dtype: torch.dtype, device, gen: torch.Generator):
    """liger's rope function that reproduces ``fn`` (also its output dtype with fp32 cos/sin), or a reason.

    Probed with cos/sin in the module's dtype (the math) and in fp32 (some models keep the tables in fp32:
    whether ``fn`` returns q's dtype or the promoted one picks the variant).
    """
    like = torch.empty((), dtype=dtype, device=device)
    batch, seq, head_dim = 2, 5, 8
    q = _randn((batch, 4, seq, head_dim), like, gen)
    k = _randn((batch, 2, seq, head_dim), like, gen)
    angles = torch.rand((batch, seq, head_dim // 2), generator=gen) * 6.0
    chosen = fw.liger_rotary_pos_emb
    for table_dtype in dict.fromkeys((dtype, torch.float32)):
        cos = torch.cat((angles.cos(), angles.cos()), -1).to(device=device, dtype=table_dtype)
        sin = torch.cat((angles.sin(), angles.sin()), -1).to(device=device, dtype=table_dtype)
        try:
            with torch.no_grad():
                ref_q, ref_k = fn(q, k, cos, sin)
        except Exception as e:  # noqa: BLE001 - a function with another signature is simply not ours
            return f"{fn.__name__}(q, k, cos, sin) failed on the probe ({type(e).__name__})"
        if not (isinstance(ref_q, torch.Tensor) and isinstance(ref_k, torch.Tensor)):
            return f"{fn.__name__} does not return (q, k)"
        chosen = fw.liger_rotary_pos_emb_cast_back if ref_q.dtype == q.dtype else fw.liger_rotary_pos_emb
        with torch.no_grad():
            out_q, out_k = chosen(q, k, cos, sin)
        err = max(_rel_err(out_q, ref_q), _rel_err(out_k, ref_k))
        if err > _tolerance(dtype):
            return f"{fn.__name__} is not HF's rotate_half rotary embedding (probe rel. error {err:.1e})"
    return chosen


# ----------------------------------------------------------------------------------------------------------


def _probe_loss(root: nn.Module, spec: fw.LMSpec, gen: torch.Generator) -> bool | str:
    weight = getattr(getattr(root, "lm_head", None), "weight", None)
    vocab = getattr(getattr(root, "config", None), "vocab_size", None)
    if not _usable(weight) or not isinstance(vocab, int):
        return "no lm_head/vocab_size"
    ids = torch.randint(0, vocab, (1, 6), generator=gen).to(weight.device)
    training = root.training
    root.eval()
    try:
        with torch.no_grad():
            ref = type(root).forward(root, input_ids=ids, labels=ids)
            ours = fw.causal_lm(root, spec, input_ids=ids, labels=ids, skip_logits=True)
    except Exception as e:  # noqa: BLE001 - a forward with other conventions is left alone
        return f"probe forward failed ({type(e).__name__}: {e})"
    finally:
        root.train(training)
    ref_loss = getattr(ref, "loss", None)
    if not isinstance(ref_loss, torch.Tensor) or getattr(ref, "router_logits", None) is not None:
        return "forward has no plain causal-LM loss (or is a mixture of experts)"
    err = _rel_err(ours.loss.to(ref_loss.dtype), ref_loss)
    return (
        True
        if err <= _tolerance(weight.dtype)
        else f"loss differs from the model's own (rel. error {err:.1e})"
    )


def patch_structurally(root: nn.Module, flags: dict[str, bool], report: PatchReport) -> None:
    """Swap what is recognised and passes its probe; count and explain the rest in ``report``."""
    gen = torch.Generator().manual_seed(0)
    swaps = _swaps(root)
    reasons: list[str] = []
    rope_cache: dict[tuple, object] = {}
    for m in root.modules():
        if m is root:
            continue
        kind = own_kind(m)
        if kind is not None:
            report.count_already(kind)
            continue
        name = type(m).__name__
        if foreign_forward(m):
            continue
        if type(m) is nn.LayerNorm:
            if flags["layer_norm"]:
                verdict = _probe_layer_norm(m, gen)
                if verdict is True:
                    bind(m, fw.layer_norm_forward, "layer_norm", swaps)
                    report.count("layer_norm")
                else:
                    reasons.append(f"layer_norm {name}: {verdict}")
            continue
        if _looks_like_rms_norm(m):
            if flags["rms_norm"]:
                verdict = _probe_norm(m, gen)
                if isinstance(verdict, NormSpec):
                    bind(m, fw.rms_norm_forward, "rms_norm", swaps, _liger_core_norm_spec=verdict)
                    report.count("rms_norm")
                else:
                    reasons.append(f"rms_norm {name}: {verdict}")
            continue
        if flags["swiglu"] or flags["geglu"]:
            verdict = _probe_mlp(m, gen)
            if isinstance(verdict, fw.ResolvedMLP):
                if flags[verdict.kind]:
                    bind(m, fw.gated_mlp_forward, verdict.kind, swaps, _liger_core_mlp_spec=verdict)
                    report.count(verdict.kind)
                continue
            if verdict is not None:
                reasons.append(f"gated MLP {name}: {verdict}")
                continue
        if flags["rope"]:
            found = _rope_global(m)
            param = _first_param(m)
            if found is None or not _usable(param):
                continue
            rope_name, fn = found
            key = (fn, param.dtype, param.device)
            if key not in rope_cache:
                rope_cache[key] = _probe_rope(fn, param.dtype, param.device, gen)
            verdict = rope_cache[key]
            if isinstance(verdict, str):
                reasons.append(f"rope in {name}: {verdict}")
                continue
            bind(m, fw.forward_with_global(type(m).forward, rope_name, verdict), "rope", swaps)
            report.count("rope")

    if flags["fused_linear_cross_entropy"] or flags["cross_entropy"]:
        config = getattr(root, "config", None)
        spec = fw.LMSpec(
            softcap_attr="final_logit_softcapping"
            if getattr(config, "final_logit_softcapping", None)
            else None,
            logits_scaling_attr="logits_scaling" if getattr(config, "logits_scaling", None) else None,
        )
        if own_kind(root) is not None:
            patch_loss(root, spec, flags, report)
        elif not isinstance(getattr(root, "lm_head", None), nn.Module) or not hasattr(
            root, "base_model_prefix"
        ):
            reasons.append(f"loss: {type(root).__name__} has no lm_head (not a causal LM)")
        elif flags["fused_linear_cross_entropy"]:
            verdict = _probe_loss(root, spec, gen)
            if verdict is True:
                patch_loss(root, spec, flags, report)
            else:
                reasons.append(f"fused_linear_cross_entropy: {verdict}")
        elif "loss_function" in type(root).forward.__code__.co_names:
            patch_loss(root, spec, flags, report)
        else:
            reasons.append("cross_entropy: the model's forward does not use self.loss_function")
    for reason in summarize_reasons(reasons):
        report.skip(reason)

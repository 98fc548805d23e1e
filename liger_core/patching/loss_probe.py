"""Loss-head probing for structural patching: the candidate ``LMSpec`` settings of a causal-LM head (head
layout, shifted or unshifted labels, the logits transforms the config names) and the probe that keeps the
first whose fused linear cross-entropy reproduces the model's own loss and head gradients (see
``structural``'s docstring)."""

from __future__ import annotations

import torch
from torch import nn

from liger_core.patching import causal_lm as cl
from liger_core.patching import probing as pr
from liger_core.patching.introspect import innermost_function
from liger_core.patching.loss import patch_loss
from liger_core.patching.swaps import own_kind

# Config attributes the logits transforms of causal-LM heads are read from (first present wins); which of
# them a model applies, whether it shifts its labels and where its output Linear sits is decided by probing.
_SOFTCAP_ATTRS = ("final_logit_softcapping", "logits_soft_cap", "output_logit_soft_cap")
_SCALING_ATTRS = ("logits_scaling", "logits_mup_width_multiplier")  # logits / s (or the hidden states / s)
_MULTIPLIER_ATTRS = ("logit_scale", "output_multiplier")
_VOCAB_LIMIT_ATTRS = ("unpadded_vocab_size",)


def _present_attr(config, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` set (not None, not 0) in the config or its text config."""
    return next((n for n in names if cl.config_value(config, n)), None)


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


def _loss_candidates(root: nn.Module) -> list[cl.LMSpec]:
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
        cl.LMSpec(head=head, linear=linear, shift_labels=shift, encoder_decoder=enc, **t)
        for enc, shift in modes
        for head, linear in _head_layouts(root)
        for t in transforms
    ]


def _head_params(root: nn.Module, spec: cl.LMSpec) -> list[torch.Tensor]:
    """The parameters of the head's modules (the output Linear's weight and bias, and a transform's)."""
    params = {}
    for name in spec.head:
        for p in root.get_submodule(name).parameters():
            params[id(p)] = p
    return [p for p in params.values() if pr.usable(p)]


def _probe_loss(root: nn.Module, candidates: list[cl.LMSpec], gen: torch.Generator) -> cl.LMSpec | str:
    """The first candidate whose fused loss equals the model's own: the loss, and the gradient of every
    parameter of the head (the output Linear's weight and bias, a transform's before it).

    Everything below the head runs the same code in both, so the head's gradients are where a different loss
    shows. The model's own loss and gradients are computed once; each candidate then runs the patched
    forward. The head's parameters are made to require a gradient for the probe only (a frozen head, as under
    LoRA, included) and set back afterwards. Returns why none matched otherwise (the closest one's error).
    """
    if getattr(root, "config", None) is None or not candidates:
        return "no lm_head weight or config"
    fusable = [c for c in candidates if cl.has_fusable_head(root, c)]
    if not fusable:
        linear = cl.head_linear(root, candidates[0])
        return (
            f"{candidates[0].linear} ({type(linear).__name__}) is not a plain nn.Linear (LoRA, quantised or "
            "offloaded); the loss is computed by the model from its logits"
        )
    params = list({id(p): p for c in fusable for p in _head_params(root, c)}.values())
    weight = cl.head_linear(root, fusable[0]).weight
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
        ours = cl.causal_lm(root, spec, input_ids=ids, labels=ids, use_cache=False, skip_logits=True).loss
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
    vocab = cl.vocab_size(root)
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


def patch_loss_structurally(root, flags, report, gen, misses, skips) -> None:
    kind = "fused_linear_cross_entropy" if flags["fused_linear_cross_entropy"] else "cross_entropy"
    has_head = isinstance(getattr(root, "lm_head", None), nn.Module) or _output_linear_path(root) is not None
    if own_kind(root) is not None:
        patch_loss(root, getattr(root, "_liger_core_lm_spec", cl.LMSpec()), flags, report)
    elif not has_head or not hasattr(root, "base_model_prefix"):
        skips.append(f"loss: {type(root).__name__} has no lm_head (not a causal LM)")
    elif flags["fused_linear_cross_entropy"]:
        verdict = _probe_loss(root, _loss_candidates(root), gen)
        if isinstance(verdict, cl.LMSpec):
            patch_loss(root, verdict, flags, report)
        else:
            misses.append((kind, verdict))
    else:
        inner = innermost_function(type(root).forward)
        if inner is not None and "loss_function" in inner.__code__.co_names:
            patch_loss(root, cl.LMSpec(), flags, report)
        else:
            misses.append((kind, "the model's forward does not use self.loss_function"))

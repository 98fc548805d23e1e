"""The causal-LM loss that patching puts into Hugging Face models: cross-entropy on logits
(``liger_causal_lm_loss``, the model's ``loss_function``) and fused linear + cross-entropy on the hidden
states inside a patched causal-LM forward (``causal_lm_forward``), with ``LMSpec`` describing the head it
reads (layout, label shift, logits transforms).

As in ``forwards``: the forward is one module-level function shared by instance and class-level patching,
parameters are only read (``state_dict()`` is unchanged), and only ``liger_core.ops``' functional API is
called.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import liger_core  # `liger_core.ops` is imported on first use: importing patching does not import Triton
from liger_core.patching.distributed import call_as_forward, redirected_linear
from liger_core.patching.introspect import RewrapError, innermost_function, rewrap


def _shifted_targets(labels, shift_labels, ignore_index: int) -> torch.Tensor:
    """HF's causal-LM target convention: pad with ignore_index and shift left (or take ``shift_labels``)."""
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    return shift_labels.reshape(-1)


def liger_causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    vocab_size: int,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """HF's ``ForCausalLMLoss`` (same arguments and reductions) via ``liger_core.ops.cross_entropy``.

    Sum divided by ``num_items_in_batch`` when given (gradient accumulation), else the mean over non-ignored
    targets.
    """
    targets = _shifted_targets(labels, shift_labels, ignore_index).to(logits.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    # Upcast as HF's ForCausalLMLoss does, so the logits' gradient is computed and rounded as HF's is (the
    # loss itself is fp32 for any logits dtype). The upcast copy exists for this loss alone, so the op may
    # write its gradient over it (one logits-sized fp32 buffer less); fp32 logits are not copied by .float()
    # and are the model's output, so those are never overwritten.
    upcast_copy = logits.dtype != torch.float32
    logits = logits.float()
    return liger_core.ops.cross_entropy(
        logits.reshape(-1, vocab_size),
        targets,
        ignore_index=ignore_index,
        reduction=reduction,
        inplace_backward=upcast_copy,
        denominator=num_items_in_batch,  # divided inside the op: its stored gradient rounds once
    )


liger_causal_lm_loss._liger_core_kind = "cross_entropy"


@dataclass(frozen=True)
class LMSpec:
    """What the causal-LM forward needs to know beyond the standard HF layout.

    The head: ``head`` names the modules applied to the last hidden states in turn, the last of them holding
    the output ``nn.Linear`` at the path ``linear`` (``lm_head`` itself by default). When the Linear sits
    inside that module (RoBERTa's ``lm_head.decoder`` after dense -> gelu -> LayerNorm), the module's own
    forward runs on the hidden states with the Linear as the identity, and the fused loss takes its output
    with the Linear's weight and bias. Config attributes are read from the model's config, else from its
    (decoder) text config.
    """

    softcap_attr: str | None = None  # config attribute: logits = c * tanh(logits / c)
    logits_scaling_attr: str | None = None  # config attribute: logits = lm_head(h) / s (Granite)
    logits_multiplier_attr: str | None = None  # config attribute: logits = lm_head(h) * m (Cohere)
    vocab_limit_attr: str | None = None  # config attribute: logits[..., :n] when set (a padded vocabulary)
    shift_labels: bool = True  # False: labels[..., i] is the target of position i (no shift in the model)
    # an encoder-decoder: with labels and no decoder inputs, the decoder reads the labels shifted right
    # (``decoder_inputs_from_labels``) and the output is a Seq2SeqLMOutput
    encoder_decoder: bool = False
    head: tuple[str, ...] = ("lm_head",)
    linear: str = "lm_head"
    moe: bool = False
    aux_loss_fn: Any = None  # the modeling module's load_balancing_loss_func (MoE)


def head_linear(model: nn.Module, spec: LMSpec) -> nn.Module:
    """The module at ``spec.linear``: the output Linear (or whatever wraps it: LoRA, PEFT, FSDP2)."""
    return model.get_submodule(spec.linear)


def _identity(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return x


class _WithoutLinear:
    """Stands in for ``module`` as ``self`` of its class forward, with the submodule at ``path`` (dotted)
    replaced by the identity: the module's own code computes what it would feed that Linear. Every other
    attribute is the module's (its methods bound to the stand-in, so a forward that calls a helper method
    still reaches the stand-in); a module on the path is stood in for the same way. Nothing is modified."""

    __slots__ = ("_module", "_path")

    def __init__(self, module: nn.Module, path: str):
        self._module = module
        self._path = path

    def __getattr__(self, name: str) -> Any:
        first, _, rest = self._path.partition(".")
        if name == first:
            return _WithoutLinear(getattr(self._module, name), rest) if rest else _identity
        value = getattr(self._module, name)
        if isinstance(value, types.MethodType) and value.__self__ is self._module:
            return types.MethodType(value.__func__, self)  # its other methods see the stand-in too
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return type(self._module).forward(self, *args, **kwargs)


def _first(output: Any) -> torch.Tensor:
    """A head module's output: the tensor, or the first element of the tuple some heads return (XLM's)."""
    return output[0] if isinstance(output, (tuple, list)) else output


def head_input(model: nn.Module, spec: LMSpec, hidden: torch.Tensor) -> torch.Tensor:
    """What the output Linear of ``spec``'s head is applied to, from the last hidden states."""
    for name in spec.head[:-1]:
        hidden = _first(model.get_submodule(name)(hidden))
    last = spec.head[-1]
    if spec.linear != last:
        hidden = _first(_WithoutLinear(model.get_submodule(last), spec.linear[len(last) + 1 :])(hidden))
    return hidden


def fusable_linear(lm_head: nn.Module) -> nn.Linear | None:
    """The plain ``nn.Linear`` that ``lm_head(h)`` applies, or None when the fused loss must not bypass it.

    PEFT's ModulesToSaveWrapper is resolved to the copy it would call (the active adapter's, or the original
    when adapters are disabled). Anything that is not exactly an ``nn.Linear`` with an ordinary weight and no
    hooks (a LoRA-wrapped lm_head, a quantised layer, an accelerate offload hook, a meta weight) returns None,
    and the caller computes the logits through ``lm_head`` instead: slower, never wrong.
    """
    module = lm_head
    if hasattr(module, "modules_to_save") and hasattr(module, "original_module"):
        active = list(getattr(module, "active_adapters", []) or [])
        if (
            getattr(module, "disable_adapters", False)
            or not active
            or active[0] not in module.modules_to_save
        ):
            module = module.original_module
        else:
            module = module.modules_to_save[active[0]]
    if type(module) is not nn.Linear:  # also FSDP2's FSDPLinear (see patching/distributed.py)
        return None
    if module._forward_hooks or module._forward_pre_hooks or getattr(module, "_hf_hook", None) is not None:
        return None
    weight = module.weight
    if type(weight) not in (torch.Tensor, nn.Parameter) or weight.device.type == "meta":
        return None
    if getattr(weight, "ds_id", None) is not None or weight.dim() != 2:  # ZeRO-3: patching/distributed.py
        return None
    return module


_warned_unfused: set[type] = set()


def _warn_unfused(lm_head: nn.Module) -> None:
    if type(lm_head) not in _warned_unfused:
        _warned_unfused.add(type(lm_head))
        warnings.warn(
            f"liger_core: lm_head ({type(lm_head).__name__}) is not a plain nn.Linear with a local weight "
            "or an FSDP2/ZeRO-3 sharded one (LoRA, quantised, offloaded or hooked); the loss is computed "
            "from materialised logits instead of the fused linear cross-entropy (exact, but without its "
            "memory saving)",
            stacklevel=3,
        )


_UNRESOLVED = object()
# transformers' slice_logits_to_keep (ints, index tensors, boolean masks), looked up once when a forward is
# patched: an import attempt inside the forward would stop torch.compile where the name does not exist (5.0)
_slice_logits_to_keep: Any = _UNRESOLVED


def resolve_transformers_helpers() -> None:
    global _slice_logits_to_keep
    try:
        from transformers.modeling_utils import slice_logits_to_keep
    except ImportError:
        slice_logits_to_keep = None
    _slice_logits_to_keep = slice_logits_to_keep


def _slice_to_keep(hidden: torch.Tensor, logits_to_keep) -> torch.Tensor:
    if _slice_logits_to_keep is _UNRESOLVED:
        resolve_transformers_helpers()
    if _slice_logits_to_keep is not None:
        return _slice_logits_to_keep(hidden, logits_to_keep)
    if isinstance(logits_to_keep, int):
        return hidden if logits_to_keep == 0 else hidden[:, -logits_to_keep:, :]
    return hidden[:, logits_to_keep, :]


def config_value(config, attr: str | None):
    """``config.<attr>``, else the (decoder) text config's (a VLM or an encoder-decoder keeps it there)."""
    if not attr:
        return None
    value = getattr(config, attr, None)
    if value is None and hasattr(config, "get_text_config"):
        try:
            text = config.get_text_config(decoder=True)
        except (TypeError, ValueError):
            text = None
        if text is not None and text is not config:
            value = getattr(text, attr, None)
    return value


# ``max_chunk_bytes`` of the fused loss inside the patched causal-LM forward (None: the op's default, which
# also uses the headroom under the process's peak). Users trading memory for speed set it (bytes): a budget
# holding every logit (tokens x vocab x 2) or fp32 copies of the gradients selects a faster exact loop.
FLCE_MAX_CHUNK_BYTES: int | None = None


def _targets(labels, shift_labels, ignore_index: int, spec: LMSpec) -> torch.Tensor:
    if not spec.shift_labels and shift_labels is None:
        return labels.reshape(-1)
    return _shifted_targets(labels, shift_labels, ignore_index)


def fused_linear_ce_loss(
    model: nn.Module,
    linear: nn.Linear,
    hidden: torch.Tensor,
    labels: torch.Tensor | None,
    shift_labels: torch.Tensor | None,
    num_items_in_batch,
    ignore_index: int,
    spec: LMSpec,
) -> torch.Tensor:
    """The causal-LM loss straight from the Linear's input: the (tokens x vocab) logits are never
    materialised. ``hidden`` is what ``linear`` is applied to (``head_input``)."""
    hidden_2d = hidden.reshape(-1, hidden.shape[-1])
    targets = _targets(labels, shift_labels, ignore_index, spec).to(hidden_2d.device)
    weight, bias = linear.weight, linear.bias
    limit = config_value(model.config, spec.vocab_limit_attr)
    if limit is not None and limit < weight.shape[0]:
        # logits[..., :n] are the logits of the first n rows of the weight (views: their gradient flows back)
        weight = weight[:limit]
        bias = bias[:limit] if bias is not None else None
    scaling = config_value(model.config, spec.logits_scaling_attr)
    multiplier = config_value(model.config, spec.logits_multiplier_attr)
    # (h @ W^T + b) / s == (h / s) @ W^T + b / s: the same logits, folded into the (much smaller) hidden
    # states and bias
    if scaling is not None and scaling != 1:
        hidden_2d = hidden_2d / scaling
        bias = bias / scaling if bias is not None else None
    if multiplier is not None and multiplier != 1:
        hidden_2d = hidden_2d * multiplier
        bias = bias * multiplier if bias is not None else None
    softcap = config_value(model.config, spec.softcap_attr)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = liger_core.ops.fused_linear_cross_entropy(
        hidden_2d,
        weight,
        targets,
        bias=bias,
        ignore_index=ignore_index,
        reduction=reduction,
        softcap=softcap,
        max_chunk_bytes=FLCE_MAX_CHUNK_BYTES,
        # divided inside the op: the gradients it stores in forward then round once, not again in backward
        denominator=num_items_in_batch,
    )
    return loss


def _logits(model: nn.Module, hidden: torch.Tensor, spec: LMSpec) -> torch.Tensor:
    """Exactly the HF logits: the head, a padded vocabulary cut, Granite's or Cohere's scaling, or Gemma's
    final soft-capping."""
    logits = hidden
    for name in spec.head:
        logits = _first(model.get_submodule(name)(logits))
    limit = config_value(model.config, spec.vocab_limit_attr)
    if limit is not None and limit < logits.shape[-1]:
        logits = logits[..., :limit]
    scaling = config_value(model.config, spec.logits_scaling_attr)
    if scaling is not None:
        logits = logits / scaling
    multiplier = config_value(model.config, spec.logits_multiplier_attr)
    if multiplier is not None:
        logits = logits * multiplier
    softcap = config_value(model.config, spec.softcap_attr)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def decoder_inputs_from_labels(model: nn.Module, labels: torch.Tensor) -> torch.Tensor:
    """An encoder-decoder's decoder input ids for ``labels``: the model's own
    ``prepare_decoder_input_ids_from_labels``, else the labels shifted right after the decoder start token,
    ignored positions (-100) replaced by the pad token (what transformers' ``shift_tokens_right`` does)."""
    prepare = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    if prepare is not None:
        return prepare(labels)
    start = config_value(model.config, "decoder_start_token_id")
    pad = config_value(model.config, "pad_token_id")
    if start is None or pad is None:
        raise ValueError(
            f"{type(model).__name__} has no decoder_start_token_id or pad_token_id: pass decoder_input_ids"
        )
    shifted = labels.new_full(labels.shape, start)
    shifted[..., 1:] = labels[..., :-1]
    return shifted.masked_fill(shifted == -100, pad)


def causal_lm_forward(
    self: nn.Module,
    input_ids: torch.LongTensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.LongTensor | None = None,
    cache: Any = None,
    inputs_embeds: torch.Tensor | None = None,
    labels: torch.LongTensor | None = None,
    use_cache: bool | None = None,
    logits_to_keep: int | torch.Tensor = 0,
    skip_logits: bool | None = None,
    **kwargs: Any,
):
    """``*ForCausalLM.forward`` with the loss computed by ``liger_core.ops.fused_linear_cross_entropy``.

    Same arguments and outputs as HF's, plus ``skip_logits``. By default (``skip_logits=None``) the logits are
    skipped exactly when training with labels (or ``shift_labels``): then ``loss`` is the fused loss and
    ``logits`` is None. Otherwise (eval, generation, ``skip_logits=False``) the logits are computed as HF does
    and the loss, when labels are given, by the model's own ``loss_function``. ``num_items_in_batch`` (HF's
    gradient-accumulation fix) turns the mean into sum / num_items_in_batch in both paths.

    The key/value cache is the fourth argument, as in HF's forwards; transformers 5.24 renamed it from
    ``past_key_values`` to ``cache``. Both names are accepted here, and the base model and the output get it
    under the name the installed release uses (``cache_argument_name``). Patching installs this function
    inside the class forward's own decorators (``causal_lm_forward_for``), so they still run.
    """
    return causal_lm(
        self,
        self._liger_core_lm_spec,
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        inputs_embeds=inputs_embeds,
        labels=labels,
        use_cache=use_cache,
        logits_to_keep=logits_to_keep,
        skip_logits=skip_logits,
        **kwargs,
    )


def causal_lm_forward_for(class_forward: Any) -> Any:
    """``causal_lm_forward`` inside the decorators that wrap ``class_forward`` (itself when none do).

    transformers decorates ``*ForCausalLM.forward`` (``deprecate_kwarg`` renames old argument names with a
    warning, ``can_return_tuple`` honours ``return_dict``): the patched forward keeps that behaviour. A chain
    that cannot be rebuilt leaves the plain ``causal_lm_forward``, which handles both cache names and
    ``return_dict`` itself.
    """
    resolve_transformers_helpers()
    try:
        forward = rewrap(class_forward, causal_lm_forward)
    except RewrapError:
        forward = causal_lm_forward
    return _with_signature_of(class_forward, forward)


def _with_signature_of(class_forward: Any, forward: Any) -> Any:
    """``forward``, reporting ``class_forward``'s signature to ``inspect.signature``.

    The HF Trainer keeps only the dataset columns that the model's forward names (``remove_unused_columns``,
    on by default): with ``causal_lm_forward``'s own signature it would drop ``pixel_values``,
    ``image_grid_thw``, ``token_type_ids`` and every other input of a vision-language or other model that the
    patched forward passes on through ``**kwargs``. ``causal_lm_forward`` itself is shared by every patched
    class, so when nothing decorates the class forward, a thin per-class wrapper carries the signature.
    """
    try:
        signature = inspect.signature(class_forward)
    except (TypeError, ValueError):  # a callable without one: nothing to report
        return forward
    if forward is causal_lm_forward:

        @functools.wraps(causal_lm_forward)
        def forward(self: nn.Module, *args: Any, **kwargs: Any):
            return causal_lm_forward(self, *args, **kwargs)

    forward.__signature__ = signature
    return forward


def is_causal_lm_forward(forward: Any) -> bool:
    """True for ``causal_lm_forward`` itself or inside a decorator chain (``causal_lm_forward_for``)."""
    return forward is not None and innermost_function(forward) is causal_lm_forward


_CACHE_NAMES = ("cache", "past_key_values")


@torch.compiler.assume_constant_result  # a fact about a function: torch.compile takes the value, not the code
def cache_argument_name(forward: Any) -> str:
    """The name of ``forward``'s key/value cache argument in the installed transformers."""
    inner = innermost_function(forward)
    if inner is not None:
        params = inspect.signature(inner).parameters
        for name in _CACHE_NAMES:
            if name in params:
                return name
    return _CACHE_NAMES[1]


@torch.compiler.assume_constant_result
def _output_cache_field(output_cls: type) -> str:
    """The field of a transformers output dataclass that holds the key/value cache."""
    names = {f.name for f in dataclasses.fields(output_cls)}
    return next((n for n in _CACHE_NAMES if n in names), _CACHE_NAMES[1])


# The class forward a patched causal-LM forward stands in for (instance ``__dict__`` or class attribute): it
# serves every call that wants logits, so evaluation and generation are exactly the model's own.
ORIGINAL_FORWARD = "_liger_core_original_forward"


def has_fusable_head(model: nn.Module, spec: LMSpec) -> bool:
    """Whether the head's output Linear is one the fused loss can read (see ``fusable_linear``)."""
    try:
        linear = head_linear(model, spec)
    except AttributeError:  # the head was replaced by a module without that path
        return False
    return fusable_linear(linear) is not None or redirected_linear(linear) is not None


def _base_model(model: nn.Module) -> nn.Module:
    """The module under the head: named by ``base_model_prefix``, or ``model`` where a causal-LM class of a
    multimodal family keeps its decoder there under another prefix (Mllama's text model)."""
    for name in (model.base_model_prefix, "model"):
        base = getattr(model, name, None)
        if isinstance(base, nn.Module) and base is not model:
            return base
    raise AttributeError(
        f"{type(model).__name__} has no base model under {model.base_model_prefix!r} or 'model'"
    )


def vocab_size(model: nn.Module) -> int:
    """The size of the model's output vocabulary (a VLM keeps it in its text config)."""
    config = model.config
    size = getattr(config, "vocab_size", None)
    if size is None and hasattr(config, "get_text_config"):
        size = getattr(config.get_text_config(), "vocab_size", None)
    if size is None:
        size = model.lm_head.out_features
    return size


def causal_lm(
    self: nn.Module,
    spec: LMSpec,
    input_ids: torch.LongTensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.LongTensor | None = None,
    cache: Any = None,
    inputs_embeds: torch.Tensor | None = None,
    labels: torch.LongTensor | None = None,
    use_cache: bool | None = None,
    logits_to_keep: int | torch.Tensor = 0,
    skip_logits: bool | None = None,
    **kwargs: Any,
):
    """``causal_lm_forward`` with an explicit spec (structural patching probes a candidate spec with it)."""
    if "past_key_values" in kwargs:
        old = kwargs.pop("past_key_values")
        if cache is not None and old is not None:
            raise ValueError("pass the key/value cache as `cache` or as `past_key_values`, not both")
        cache = old if cache is None else cache
    return_dict = kwargs.pop("return_dict", None)
    shift_labels = kwargs.get("shift_labels")
    num_items_in_batch = kwargs.get("num_items_in_batch")
    ignore_index = kwargs.get("ignore_index", -100)
    has_targets = labels is not None or shift_labels is not None
    if skip_logits is None:
        skip_logits = self.training and has_targets
    if skip_logits and not has_targets:
        raise ValueError(
            "skip_logits=True needs `labels` or `shift_labels`: without them there is nothing to return"
        )
    original = self.__dict__.get(ORIGINAL_FORWARD, getattr(type(self), ORIGINAL_FORWARD, None))
    if original is not None and not (skip_logits and has_fusable_head(self, spec)):
        # logits are wanted (eval, generation) or the head cannot be fused: the model's own forward, which
        # also returns whatever else its output class carries (a VLM's rope deltas, image states, ...)
        if skip_logits:  # asked not to return logits, but lm_head could not be fused (see fusable_linear)
            _warn_unfused(head_linear(self, spec))
        output = original(
            self,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
            **{cache_argument_name(original): cache},
            **({} if return_dict is None else {"return_dict": return_dict}),
            **kwargs,
        )
        if skip_logits and not isinstance(output, tuple):
            output.logits = None
        return output

    model_kwargs = dict(kwargs)
    output_router_logits = False
    if spec.moe:
        output_router_logits = kwargs.pop("output_router_logits", None)
        if output_router_logits is None:
            output_router_logits = getattr(self.config, "output_router_logits", False)
        model_kwargs["output_router_logits"] = output_router_logits

    if (
        spec.encoder_decoder
        and labels is not None
        and model_kwargs.get("decoder_input_ids") is None
        and model_kwargs.get("decoder_inputs_embeds") is None
    ):
        model_kwargs["decoder_input_ids"] = decoder_inputs_from_labels(self, labels)
        use_cache = False  # as the models' own forwards do when given labels

    base = _base_model(self)
    model_kwargs[cache_argument_name(type(base).forward)] = cache
    outputs = base(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        inputs_embeds=inputs_embeds,
        use_cache=use_cache,
        **model_kwargs,
    )
    hidden = _slice_to_keep(outputs[0], logits_to_keep)

    output_linear = head_linear(self, spec) if skip_logits else None
    linear = fusable_linear(output_linear) if skip_logits else None
    # FSDP2 (lm_head its own unit) or ZeRO-3: the weight is whole only inside lm_head's own forward, so the
    # fused loss runs as that forward (patching/distributed.py)
    sharded_head = redirected_linear(output_linear) if skip_logits and linear is None else None
    logits = loss = None
    if linear is not None:
        loss = fused_linear_ce_loss(
            self,
            linear,
            head_input(self, spec, hidden),
            labels,
            shift_labels,
            num_items_in_batch,
            ignore_index,
            spec,
        )
    elif sharded_head is not None:
        loss = call_as_forward(
            sharded_head,
            lambda h: fused_linear_ce_loss(
                self, sharded_head, h, labels, shift_labels, num_items_in_batch, ignore_index, spec
            ),
            head_input(self, spec, hidden),
        )
    else:
        logits = _logits(self, hidden, spec)
        if has_targets:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=vocab_size(self), **kwargs)
        if skip_logits:  # asked not to return logits, but lm_head could not be fused (see fusable_linear)
            _warn_unfused(output_linear)
            logits = None

    from transformers.modeling_outputs import (
        CausalLMOutputWithPast,
        MoeCausalLMOutputWithPast,
        Seq2SeqLMOutput,
    )

    returned_cache = None
    if not isinstance(outputs, tuple):
        returned_cache = getattr(outputs, _output_cache_field(type(outputs)), None)
    if spec.encoder_decoder:
        fields = [f.name for f in dataclasses.fields(Seq2SeqLMOutput)]
        cache_field = _output_cache_field(Seq2SeqLMOutput)
        rest = {n: getattr(outputs, n, None) for n in fields if n not in ("loss", "logits", cache_field)}
        output = Seq2SeqLMOutput(loss=loss, logits=logits, **{cache_field: returned_cache}, **rest)
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return output if return_dict else output.to_tuple()

    output_cls = MoeCausalLMOutputWithPast if spec.moe else CausalLMOutputWithPast
    common = dict(
        loss=loss,
        logits=logits,
        **{_output_cache_field(output_cls): returned_cache},
        hidden_states=getattr(outputs, "hidden_states", None),
        attentions=getattr(outputs, "attentions", None),
    )
    if spec.moe:
        aux_loss = None
        router_logits = getattr(outputs, "router_logits", None)
        if output_router_logits and spec.aux_loss_fn is not None:
            aux_loss = spec.aux_loss_fn(
                router_logits, self.num_experts, self.num_experts_per_tok, attention_mask
            )
            if loss is not None:
                loss = loss + self.router_aux_loss_coef * aux_loss.to(loss.device)
                common["loss"] = loss
        output = MoeCausalLMOutputWithPast(aux_loss=aux_loss, router_logits=router_logits, **common)
    else:
        output = CausalLMOutputWithPast(**common)
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    return output if return_dict else output.to_tuple()

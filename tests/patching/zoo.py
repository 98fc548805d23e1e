"""The model zoo: every model type the installed transformers builds for causal-LM training, tiny and random,
patched with ``liger_core.apply_liger_kernel`` and compared with itself unpatched.

- ``model_types()``: the types of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` and
  ``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`` (vision-language models run a text-only forward).
- ``cases()``: those types, plus ``<type>:vlm`` where a type's image-text-to-text class differs from its
  causal-LM class.
- ``build_tiny(model_type)``: a shrunk fp32 model (2 layers, hidden 32, 4 heads / 2 kv heads, head_dim 8,
  vocab 128, 4 experts, dropout off), or a string saying why it cannot be built here.
- ``run_case(model_type)``: loss and every parameter gradient on a fixed batch, unpatched then patched;
  returns a ``CaseResult`` (what the patch report says, whether patching raised, whether the numbers match).

CLI (writes the generated coverage table and/or the raw results; docs/coverage.md is generated with the
real kernels, in Triton's interpreter, about 15 minutes on one core, together with the package data that
``liger_core.supported_model_types()`` reads):

    TRITON_INTERPRET=1 python tests/patching/zoo.py --out docs/coverage.md \
        --package-data liger_core/patching/zoo_coverage.json [--json out.json] [--types llama]

The kernels take whatever path the process has: the pure-PyTorch reference path on CPU, or Triton's
interpreter when ``TRITON_INTERPRET=1`` is set before Triton is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field

# Tolerances for fp32: the kernels do the same math as the model, only the order of summation may differ.
LOSS_TOL = dict(rtol=1e-5, atol=1e-6)
GRAD_TOL = dict(rtol=1e-4, atol=1e-5)

VOCAB = 128
HIDDEN = 32
INTERMEDIATE = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 8
EXPERTS = 4
EXPERTS_PER_TOK = 2
BATCH, SEQ = 2, 8
SEED = 0

# Config attribute name -> the value it gets. Names are matched exactly, in the config and every sub-config.
_SIZES: dict[str, object] = {
    **dict.fromkeys(
        ("hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "word_embed_proj_dim", "dim"), HIDDEN
    ),
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "n_inner",
            "d_ff",
            "ffn_hidden_size",
            "decoder_ffn_dim",
            "encoder_ffn_dim",
            "hidden_dim",
            "inner_dim",
        ),
        INTERMEDIATE,
    ),
    **dict.fromkeys(
        (
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "expert_intermediate_size",
            "moe_ffn_hidden_size",
            "expert_ffn_hidden_size",
            "shared_intermediate_size",
            "moe_shared_expert_intermediate_size",
        ),
        32,
    ),
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "n_layer",
            "n_layers",
            "num_layers",
            "decoder_layers",
            "encoder_layers",
            "num_decoder_layers",
            "num_encoder_layers",
            "text_layers",
            "depth",
        ),
        LAYERS,
    ),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "n_heads",
            "num_heads",
            "decoder_attention_heads",
            "encoder_attention_heads",
        ),
        HEADS,
    ),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"), KV_HEADS),
    **dict.fromkeys(("head_dim", "kv_channels", "attention_head_dim"), HEAD_DIM),
    **dict.fromkeys(("vocab_size",), VOCAB),
    **dict.fromkeys(
        ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts"),
        EXPERTS,
    ),
    **dict.fromkeys(
        ("num_experts_per_tok", "moe_topk", "moe_top_k", "num_experts_per_token", "top_k_experts"),
        EXPERTS_PER_TOK,
    ),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts"), 1),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length"), 64),
    **dict.fromkeys(("router_jitter_noise", "jitter_noise"), 0.0),
}

# More sizes: multi-head latent attention (DeepSeek-V2/V3 and kin), partial rotary, per-layer inputs
# (Gemma-3n), sparse-attention indexers, sliding windows shorter than the batch's sequence.
_SIZES.update(
    {
        **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "index_head_dim"), HEAD_DIM),
        **dict.fromkeys(("kv_lora_rank", "q_lora_rank", "laurel_rank"), 16),
        "rotary_dim": HEAD_DIM // 2,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": VOCAB,
        "index_n_heads": 2,
        "sliding_window": 4,
        "num_kv_shared_layers": 0,
        # Widths another config must match (a vision or audio tower's output is the text model's input).
        **dict.fromkeys(("out_hidden_size", "text_hidden_size", "embedding_dim", "codebook_dim"), HIDDEN),
        # State-space (Mamba) blocks: heads * head width = expand (2) * hidden.
        **dict.fromkeys(("mamba_n_heads", "mamba_num_heads"), 4),
        **dict.fromkeys(("mamba_d_head", "mamba_head_dim"), 2 * HIDDEN // 4),
        **dict.fromkeys(("mamba_d_state", "ssm_state_size", "state_size"), 8),
        **dict.fromkeys(("mamba_d_ssm",), 2 * HIDDEN),
        **dict.fromkeys(("n_groups", "mamba_n_groups", "mamba_ngroups"), 1),
        **dict.fromkeys(("time_step_rank", "mamba_dt_rank"), 8),
        # Other names for the same sizes.
        "moe_k": EXPERTS_PER_TOK,
        "moe_num_shared_experts": 1,
        "num_blocks": LAYERS,
        # Convolutional image/audio tokenizers (VQ-GAN encoders, audio conv stems).
        **dict.fromkeys(("base_channels", "latent_channels", "downsample_hidden_size"), 32),  # GroupNorm(32)
        "num_res_blocks": 1,
        # Group-limited routing (DeepSeek-V3): groups must divide the experts.
        **dict.fromkeys(("n_group", "num_expert_group"), 2),
        "topk_group": 1,
        **dict.fromkeys(
            ("adapter_in_dim", "adapter_input_size", "adapter_out_dim", "hidden_size_global"), HIDDEN
        ),
        # Leading dense layers before the sparse ones: one of each kind.
        **dict.fromkeys(("first_k_dense_replace", "num_dense_layers", "first_dense_layers"), 1),
    }
)

# Attributes that are the index of the last layer of some kind.
_LAST_LAYER_INDEX = ("moe_layer_end_index",)

_ROPE_PER_LAYER_TYPE = {
    t: {"rope_type": "default", "rope_theta": 10000.0} for t in ("full_attention", "sliding_attention")
}

# The sparse-attention indexer of Qwen4-exp has no defaults.
_QWEN4_INDEXER = dict(
    indexer_n_heads=2,
    indexer_kv_heads=1,
    indexer_head_dim=HEAD_DIM,
    indexer_budget=4,
    indexer_compress_ratio=2,
)

# Per-type kwargs of the full-size default config, where transformers' own defaults fail its validation.
DEFAULTS: dict[str, dict] = {
    "gemma4_assistant": dict(text_config=dict(hidden_size_per_layer_input=0, vocab_size_per_layer_input=0)),
}

# Per-type config overrides, applied after the generic shrink (only where the generic rules do not suffice).
OVERRIDES: dict[str, dict] = {
    "mamba2": dict(head_dim=16),  # num_heads * head_dim must be expand * hidden_size
    # Default configs whose models cannot be built: rope per layer type but none given, no layer types,
    # no image vocabulary.
    "cohere_compass_text": dict(rope_parameters=_ROPE_PER_LAYER_TYPE),
    "cohere_compass": dict(text_config=dict(rope_parameters=_ROPE_PER_LAYER_TYPE)),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"]),
    "chameleon": dict(vocabulary_map={"<image>": VOCAB - 1}),
    "emu3": dict(vocabulary_map={"<image>": VOCAB - 1}),
    # one sparse and one dense MLP layer, as in tests/patching/tiny_models.py
    "qwen3_moe": dict(mlp_only_layers=[1]),
    # Token ranges of the discrete image and audio codes inside the (tiny) vocabulary.
    "apertus1p5": dict(
        image_token_offset=64,
        audio_token_offset=80,
        vision_config=dict(codebook_size=16),
        audio_config=dict(codebook_size=16),
    ),
    "qwen4_exp_text": _QWEN4_INDEXER,
    "qwen4_exp": dict(text_config=_QWEN4_INDEXER),
    "dbrx": dict(attn_config=dict(rope_theta=10000.0, clip_qkv=8.0)),
    "step3p7": dict(text_config=dict(sliding_window=4)),
    "udop": dict(decoder_start_token_id=0),
    # Zamba ties the shared transformer of every hybrid layer to the first one's: it needs two.
    "zamba": dict(num_hidden_layers=3, layers_block_type=["linear_attention", "hybrid", "hybrid"]),
    # Reformer: a decoder, axial position shape multiplying to the sequence length, chunks that divide it.
    "reformer": dict(
        is_decoder=True,
        axial_pos_shape=[2, SEQ // 2],
        axial_pos_embds_dim=[HIDDEN // 2, HIDDEN // 2],
        local_attn_chunk_length=4,
        lsh_attn_chunk_length=4,
        num_buckets=2,
        attn_layers=["local", "lsh"],
    ),
    "deepseek_ocr2": dict(text_config=dict(mlp_layer_types=["dense", "sparse"])),
    # The Q-Former gets vision hidden // 64 heads; features of vision layer -1 go into text layer 0.
    "granite4_vision": dict(
        vision_config=dict(hidden_size=64),
        deepstack_layer_map=[[-1, 0]],
        spatial_target_layers=[0, 1, 0, 1],
        downsample_rate="1/2",
    ),
}


@dataclass
class CaseResult:
    model_type: str  # the case: a model type, or <type>:vlm
    built: bool = False
    unbuildable: str | None = None  # why the model cannot be built here
    model_class: str = ""
    vlm: bool = False  # the class is an image-text-to-text one: it runs a text-only forward
    forward_error: str | None = None  # the unpatched model's own training step failed
    method: str | None = None
    swapped: dict[str, int] = field(default_factory=dict)
    missing: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    patch_error: str | None = None  # apply_liger_kernel raised
    patched_forward_error: str | None = None  # the patched model's training step raised
    loss_ref: float | None = None
    loss_patched: float | None = None
    loss_equal: bool | None = None
    grads_equal: bool | None = None
    grad_mismatches: list[str] = field(default_factory=list)  # "name: max abs diff (max |ref|)"
    seconds: float = 0.0

    @property
    def exact(self) -> bool:
        return bool(self.loss_equal and self.grads_equal)

    @property
    def status(self) -> str:
        if not self.built:
            return "unbuildable"
        if self.forward_error:
            return "forward_error"
        if self.patch_error:
            return "patch_raised"
        if self.patched_forward_error:
            return "patched_forward_raised"
        return "exact" if self.exact else "wrong"


def model_types() -> list[str]:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    return sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES))


VLM_SUFFIX = ":vlm"


def cases() -> list[str]:
    """Every model type, plus ``<type>:vlm`` for the types whose image-text-to-text class is another class
    than their causal-LM one (``qwen3_5``: ``Qwen3_5ForCausalLM`` and ``Qwen3_5ForConditionalGeneration``)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    both = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) & set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    vlm = [
        t + VLM_SUFFIX
        for t in both
        if MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[t] != MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[t]
    ]
    return sorted(model_types() + vlm)


def _model_class_name(case: str) -> tuple[str, bool]:
    """The class the zoo builds for ``case`` (a model type, or ``<type>:vlm``) and whether it is a
    vision-language model."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    model_type = case.removesuffix(VLM_SUFFIX)
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not case.endswith(VLM_SUFFIX):
        name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
        return name, name == MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(model_type)
    return MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type], True


def _layer_count(config) -> int | None:
    for name in ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "depth"):
        value = vars(config).get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _layer_picks(config, n_layers: int) -> list[int]:
    """Which of the ``n_layers`` original layers the 2 tiny ones stand for: layer 0, then the first layer that
    differs from those picked in any per-layer list (layer_types, mlp_layer_types...), so a hybrid model
    keeps one layer of each kind."""
    lists = [v for v in vars(config).values() if isinstance(v, (list, tuple)) and len(v) == n_layers]
    signature = [tuple(repr(v[i]) for v in lists) for i in range(n_layers)]
    picks = [0]
    for i in range(n_layers):
        if len(picks) < LAYERS and signature[i] not in {signature[j] for j in picks}:
            picks.append(i)
    picks += [i for i in range(n_layers) if i not in picks][: LAYERS - len(picks)]
    return sorted(picks)


_NONE_MEANS_UNSET = (
    *("n_shared_experts", "num_shared_experts"),
    *("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts"),
    *("num_experts_per_tok", "moe_topk", "moe_top_k", "num_experts_per_token", "moe_k", "top_k_experts"),
    "moe_intermediate_size",
)


_KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
_HEADS_OF = {"n_kv_heads": "n_heads"}


def _mrope_section(section: list[int], old_head_dim: int) -> list[int]:
    """Multimodal rope sections (sum = rotary half-width) rescaled to the tiny head_dim, each at least 1."""
    total = max(len(section), round(sum(section) * HEAD_DIM / old_head_dim))
    new = [max(1, int(s * total / sum(section))) for s in section]
    new[-1] += total - sum(new)
    return new


def _shrink_value(name: str, value, config):
    """The tiny value of one attribute, or ``_KEEP``."""
    if isinstance(value, bool) or value == 0:
        return _KEEP  # a flag, or a size of 0 that switches a part off (NoPE layers, no shared expert)
    if name in _SIZES and isinstance(value, (int, float)):
        new = _SIZES[name]
        if isinstance(value, int) and 0 < value < new and not name.startswith("vocab_size"):
            return _KEEP  # already small (1 kv head, 1 expert per token)
        if name in _KV_HEADS and value == vars(config).get(_HEADS_OF.get(name, "num_attention_heads")):
            return HEADS  # multi-head attention (every MLA model) stays multi-head
        return new
    if (
        name in _SIZES
        and isinstance(value, (list, tuple))
        and len(value) == _layer_count(config)
        and all(isinstance(v, int) for v in value)
    ):
        return [_SIZES[name]] * LAYERS  # a size per layer (Gemma-3n intermediate_size)
    if name in _KV_HEADS and value is None and "num_attention_heads" in vars(config):
        return KV_HEADS  # some configs default to None, which their attention cannot use
    if name in _NONE_MEANS_UNSET and value is None:
        return _SIZES[name]  # MoE configs whose defaults leave these None, which their router cannot use
    if name == "vision_feature_layer" and isinstance(value, (list, tuple)) and len(value) <= LAYERS:
        return [-1 - i for i in range(len(value))]  # the last layers of the tiny vision tower
    if name in _LAST_LAYER_INDEX and isinstance(value, int):
        return min(value, LAYERS - 1)
    if name == "head_dim" and value is None and "num_attention_heads" in vars(config):
        return HEAD_DIM  # some configs default to None, which their attention cannot use
    if ("dropout" in name or "pdrop" in name or name.endswith("_drop")) and isinstance(value, float):
        return 0.0
    if name == "rope_parameters" and isinstance(value, dict):
        old_head_dim = vars(config).get("head_dim") or 128
        rope = _shrink_rope(value, old_head_dim)
        if (
            "mrope_section" not in rope
            and "rope_type" in rope
            and _modeling_source_has(config, "mrope_section")
        ):
            # the model falls back to the full-size checkpoint's sections: give the tiny head's
            partial = rope.get("partial_rotary_factor") or vars(config).get("partial_rotary_factor") or 1.0
            half = int(HEAD_DIM * partial) // 2
            rope["mrope_section"] = [half // 3, half // 3, half - 2 * (half // 3)]
        return rope
    return _KEEP


def _modeling_source_has(config, text: str) -> bool:
    """Whether the modeling module next to ``config``'s configuration module mentions ``text``."""
    import importlib.util

    name = type(config).__module__.replace(".configuration_", ".modeling_")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin:
        return False
    with open(spec.origin) as f:
        return text in f.read()


def _shrink_rope(params: dict, old_head_dim: int) -> dict:
    out = {}
    for k, v in params.items():
        if isinstance(v, dict):
            out[k] = _shrink_rope(v, old_head_dim)
        elif k == "mrope_section" and isinstance(v, (list, tuple)):
            out[k] = _mrope_section(list(v), old_head_dim)
        else:
            out[k] = v
    return out


_KEEP = object()
# Fields a config derives from others (per-layer overrides keyed by the full-size layer indices).
_DERIVED = ("per_layer_config",)


def shrink_kwargs(config) -> dict:
    """The config kwargs that make ``config`` tiny: only the attributes that change (so every field the config
    derives from them is derived again), and each sub-config as its full dict with its own changes (a parent
    may read fields of a sub-config that its own defaults do not fill in)."""
    from transformers import PretrainedConfig

    kwargs: dict = {}
    attrs = {k: v for k, v in vars(config).items() if not k.startswith("_")}
    for name, value in attrs.items():
        if isinstance(value, PretrainedConfig):
            sub = {k: v for k, v in value.to_dict().items() if k not in _DERIVED}
            kwargs[name] = {**sub, **shrink_kwargs(value)}
            continue
        new = _shrink_value(name, value, config)
        if new is not _KEEP:
            kwargs[name] = new
    rope_dim, nope_dim = attrs.get("qk_rope_head_dim"), attrs.get("qk_nope_head_dim")
    if (
        isinstance(rope_dim, int)
        and isinstance(nope_dim, int)
        and attrs.get("head_dim") == rope_dim + nope_dim
    ):
        kwargs["head_dim"] = 2 * HEAD_DIM  # multi-head latent attention whose head_dim is rope + nope
    n_layers = _layer_count(config)
    if n_layers and n_layers > LAYERS:
        picks = _layer_picks(config, n_layers)
        for name, value in attrs.items():
            if isinstance(value, (list, tuple)) and len(value) == n_layers and name not in kwargs:
                kwargs[name] = [value[i] for i in picks]
            elif (
                name.endswith("_layers")
                and isinstance(value, (list, tuple))
                and all(isinstance(i, int) for i in value)
            ):
                kwargs[name] = [new for new, old in enumerate(picks) if old in value]  # layer indices
    # Special token ids beyond the tiny vocabulary move to its top (an embedding's padding_idx must fit).
    top = VOCAB - 1
    for name, value in sorted(_token_ids(config).items()):
        if value >= VOCAB or value < 0:
            kwargs[name] = top
            top -= 1
    return kwargs


def _token_ids(config) -> dict[str, int]:
    ids = {}
    for name, value in vars(config).items():
        if (name.endswith("token_id") or name.endswith("token_index")) and isinstance(value, int):
            ids[name] = value
    return ids


def _merge(base: dict, extra: dict) -> dict:
    """``base`` updated with ``extra``, nested dicts (sub-configs) merged key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def shrink_config(config, overrides: dict | None = None):
    """A tiny config of ``config``'s class: ``shrink_kwargs`` plus ``overrides`` (sub-configs merged)."""
    return type(config)(**_merge(shrink_kwargs(config), overrides or {}))


def _special_ids(config) -> set[int]:
    from transformers import PretrainedConfig

    ids = set(_token_ids(config).values())
    for value in vars(config).values():
        if isinstance(value, PretrainedConfig):
            ids |= _special_ids(value)
    return ids


def build_tiny(model_type: str):
    """A tiny random fp32 model of ``model_type`` (of its image-text-to-text class for ``<type>:vlm``) on
    CPU, or a string saying why it cannot be built here. 1-D parameters (norm weights, biases) are perturbed
    away from their 0/1 init, which would hide an offset or casting bug."""
    import torch
    import transformers
    from transformers import AutoConfig

    class_name, _ = _model_class_name(model_type)
    model_type = model_type.removesuffix(VLM_SUFFIX)
    model_cls = getattr(transformers, class_name, None)
    if model_cls is None:
        return f"transformers has no {class_name}"
    try:
        default = AutoConfig.for_model(model_type, **DEFAULTS.get(model_type, {}))
        config = shrink_config(default, OVERRIDES.get(model_type))
    except ImportError as e:
        return _missing_package(e)
    wanted = getattr(model_cls, "config_class", None)
    if isinstance(wanted, type) and not isinstance(config, wanted):
        # e.g. Qwen3_5ForCausalLM takes the text config of the composite qwen3_5 config
        config = next((v for v in vars(config).values() if isinstance(v, wanted)), config)
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    try:
        model = model_cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    except ImportError as e:
        return _missing_package(e)
    with torch.no_grad():
        g = torch.Generator().manual_seed(SEED + 1)
        for p in model.parameters():
            if p.dim() == 1 and p.is_floating_point():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.float()


def make_batch(model) -> dict:
    """The inputs of one training step: ``input_ids`` and ``labels`` of shape (BATCH, SEQ), random ids below
    the vocabulary that are no special token (an image token without its image would be an error), the first
    3 labels of row 0 ignored; ``mm_token_type_ids`` of zeros (all text) where the forward takes them;
    ``BATCHES[model_type]`` reshapes them where a model wants other shapes."""
    import inspect

    import torch

    config = model.config
    text = getattr(config, "text_config", None) or config
    vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", VOCAB)
    special = _special_ids(config)
    allowed = torch.tensor([i for i in range(3, min(vocab, VOCAB)) if i not in special])
    g = torch.Generator().manual_seed(SEED + 2)
    ids = allowed[torch.randint(len(allowed), (BATCH, SEQ), generator=g)]
    labels = ids.clone()
    labels[0, :3] = -100
    batch = dict(input_ids=ids, labels=labels)
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        batch["mm_token_type_ids"] = torch.zeros_like(ids)
    hook = BATCHES.get(config.model_type)
    return hook(model, batch) if hook else batch


def _codebook_batch(model, batch: dict) -> dict:
    """MusicGen: input_ids (BATCH * codebooks, SEQ), labels (BATCH, SEQ, codebooks)."""
    import torch

    k = model.config.num_codebooks
    ids = torch.cat([batch["input_ids"].roll(i, dims=1) for i in range(k)])  # codebook-major, like the model
    labels = ids.view(k, BATCH, SEQ).permute(1, 2, 0).clone()
    labels[0, :3] = -100
    return dict(input_ids=ids, labels=labels)


def _bbox_batch(model, batch: dict) -> dict:
    """UDOP: a bounding box per token (its layout bias needs them), here all (0, 0, 1, 1)."""
    import torch

    bbox = torch.tensor([0.0, 0.0, 1.0, 1.0]).expand(*batch["input_ids"].shape, 4).contiguous()
    return dict(batch, bbox=bbox)


# model_type -> f(model, batch) -> batch, for models whose inputs are not (input_ids, labels) of one shape.
BATCHES = {
    "musicgen_decoder": _codebook_batch,
    "musicgen_melody_decoder": _codebook_batch,
    "udop": _bbox_batch,
}


def _set_language(model) -> None:
    model.set_default_language(next(iter(model.config.languages)))


# model_type -> f(model), run once after building: models that need a call before their first forward.
PREPARE = {"xmod": _set_language}


def _missing_package(e: ImportError) -> str:
    match = re.search(r"requires the (\S+) librar|No module named '([^'.]+)", str(e))
    name = next((g for g in match.groups() if g), None) if match else None
    return f"needs {name}, which is not installed" if name else f"needs a package that is not installed: {e}"


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _message(e: BaseException) -> str:
    """The whole error message on one line (patching errors name every reason; they are the findings)."""
    return " ".join(f"{type(e).__name__}: {e}".split())


def _where(e: BaseException) -> str:
    """The innermost frame of the traceback, " [file:line in function]", to show where an error comes from."""
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return ""
    f = tb[-1]
    path = (
        f.filename.split("site-packages/")[-1]
        if "site-packages" in f.filename
        else os.path.relpath(f.filename)
    )
    return f" [{path}:{f.lineno} in {f.name}]"


class NoLoss(Exception):
    """The model returns no loss for ``labels``: it does not train as a causal LM."""


def train_step(model, batch: dict):
    """Loss and every parameter gradient (name -> tensor) of one training step; the RNG is reseeded so any
    remaining randomness repeats."""
    import torch

    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(SEED + 3)
    out = model(**batch, use_cache=False)
    loss = out.loss if hasattr(out, "loss") else out[0]
    if not isinstance(loss, torch.Tensor):
        raise NoLoss(f"{type(model).__name__} returns no loss for labels")
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach().clone(), grads


def _compare(result: CaseResult, ref, new) -> None:
    import torch

    (loss_ref, grads_ref), (loss_new, grads_new) = ref, new
    result.loss_ref, result.loss_patched = float(loss_ref), float(loss_new)
    result.loss_equal = bool(torch.isclose(loss_new, loss_ref, **LOSS_TOL).item())
    mismatches = []
    for name in sorted(set(grads_ref) | set(grads_new)):
        if name not in grads_new:
            mismatches.append(f"{name}: no gradient after patching")
        elif name not in grads_ref:
            mismatches.append(f"{name}: gradient only after patching")
        else:
            a, b = grads_new[name], grads_ref[name]
            if not torch.allclose(a, b, **GRAD_TOL) or a.isnan().any() != b.isnan().any():
                diff = (a - b).abs().max().item()
                scale = b.abs().max().item()
                mismatches.append(f"{name}: max abs diff {diff:.3g} (max |ref| {scale:.3g})")
    result.grad_mismatches = mismatches
    result.grads_equal = not mismatches and bool(grads_ref)


def run_case(model_type: str) -> CaseResult:
    """Build, train one step unpatched, patch, train the same step again, compare (module docstring)."""
    import torch

    import liger_core

    start = time.perf_counter()
    result = CaseResult(model_type)
    _, result.vlm = _model_class_name(model_type)
    try:
        with _quiet():
            model = build_tiny(model_type)
    except Exception as e:  # noqa: BLE001 - any failure to build is recorded, not raised
        model = f"cannot build: {_first_line(e)}{_where(e)}"
    if isinstance(model, str):
        result.unbuildable = model
        result.seconds = time.perf_counter() - start
        return result
    result.built = True
    result.model_class = type(model).__name__
    prepare = PREPARE.get(model.config.model_type)
    if prepare:
        prepare(model)
    batch = make_batch(model)
    try:
        with _quiet():
            ref = train_step(model, batch)
    except Exception as e:  # noqa: BLE001
        result.forward_error = f"{_first_line(e)}{_where(e)}"
        result.seconds = time.perf_counter() - start
        return result
    try:
        with _quiet():
            report = liger_core.apply_liger_kernel(model)
    except Exception as e:  # noqa: BLE001
        result.patch_error = f"{_message(e)}{_where(e)}"
        result.seconds = time.perf_counter() - start
        return result
    result.method = report.method
    result.swapped = {k: v for k, v in report.swapped.items() if v}
    result.missing = {k: list(v) for k, v in report.missing.items()}
    result.skipped = list(report.skipped)
    try:
        with _quiet():
            new = train_step(model, batch)
    except Exception as e:  # noqa: BLE001
        result.patched_forward_error = f"{_message(e)}{_where(e)}"
        result.seconds = time.perf_counter() - start
        return result
    with torch.no_grad():
        _compare(result, ref, new)
    result.seconds = time.perf_counter() - start
    return result


@contextlib.contextmanager
def _quiet():
    """Silence transformers' and liger_core's warnings and logs (the report carries what matters)."""
    loggers = [logging.getLogger(n) for n in ("liger_core", "transformers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


# ---------------------------------------------------------------------------------------------------------
# Coverage table


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _generic_reason(reason: str) -> str:
    """A missing-kernel reason without its class name, count and error sizes, to group equal causes."""
    reason = re.sub(r" \(x\d+\)$", "", reason)
    reason = re.sub(r"^[A-Za-z0-9_]+(\.forward)?: ", "[class]: ", reason)
    reason = re.sub(r"gated MLP [A-Za-z0-9_]+:", "gated MLP [class]:", reason)
    return re.sub(r"\d+(\.\d+)?e[+-]\d+", "[err]", reason)


def _distinct(reasons: list[str]) -> list[str]:
    """One reason per cause (equal up to class name and error sizes), with a count where it repeats."""
    groups: dict[str, list[str]] = {}
    for r in reasons:
        groups.setdefault(_generic_reason(r), []).append(re.sub(r" \(x\d+\)$", "", r))
    return [g[0] if len(g) == 1 else f"{g[0]} (and {len(g) - 1} alike)" for g in groups.values()]


def summary(results: list[CaseResult]) -> dict:
    """Counts per status, types per missing kind with their most common reasons, and the failing types."""
    missing: dict[str, Counter] = {}
    for r in results:
        for kind, reasons in r.missing.items():
            for reason in dict.fromkeys(_generic_reason(x) for x in reasons):
                missing.setdefault(kind, Counter())[reason] += 1
    return dict(
        types=len(results),
        buildable=sum(r.built for r in results),
        status=Counter(r.status for r in results),
        missing_types={k: sum(k in r.missing for r in results) for k in missing},
        missing_reasons=missing,
        failures=[r for r in results if r.status in ("patch_raised", "patched_forward_raised", "wrong")],
    )


def _verdict(r: CaseResult) -> str:
    if not r.built:
        return f"not buildable: {r.unbuildable}"
    if r.forward_error:
        return f"no text-only training step: {r.forward_error}"
    if r.patch_error:
        return f"NO: patching raised {r.patch_error}"
    if r.patched_forward_error:
        return f"NO: the patched model raised {r.patched_forward_error}"
    if r.exact:
        return "yes"
    what = []
    if not r.loss_equal:
        what.append(f"loss {r.loss_patched:.7g} vs {r.loss_ref:.7g}")
    if r.grad_mismatches:
        what.append(f"{len(r.grad_mismatches)} gradients differ, e.g. {r.grad_mismatches[0]}")
    return "NO: " + "; ".join(what)


_STATUS_WORDS = {
    "exact": "patched, loss and gradients exact",
    "wrong": "patched, loss or gradients differ",
    "patch_raised": "apply_liger_kernel raised",
    "patched_forward_raised": "the patched model raised",
    "forward_error": "no text-only training step (needs images or other inputs)",
    "unbuildable": "cannot be built on CPU",
}


def coverage_markdown(results: list[CaseResult], header: str, command: str) -> str:
    info = summary(results)
    lines = [
        "# Patching coverage: every causal-LM and image-text-to-text model type",
        "",
        f"<!-- Generated by `{command}`; do not edit by hand. -->",
        "",
        header,
        "",
        "Each model is built tiny and random in fp32 on CPU (2 layers, hidden 32, 4 heads / 2 kv heads, "
        "head_dim 8, vocab 128, 4 experts, dropout off; vision-language models run a text-only forward), "
        "trained one step on a fixed batch, patched with `liger_core.apply_liger_kernel(model)` and trained "
        f"the same step again. *Exact*: the loss (rtol {LOSS_TOL['rtol']:g}, atol {LOSS_TOL['atol']:g}) and "
        f"every parameter gradient (rtol {GRAD_TOL['rtol']:g}, atol {GRAD_TOL['atol']:g}) equal the "
        "unpatched model's. *Missing*: kernels the model could use but did not get (`PatchReport.missing`).",
        "",
        f"## Summary: {info['types']} types, {info['buildable']} buildable",
        "",
    ]
    for status, words in _STATUS_WORDS.items():
        lines.append(f"- {words}: {info['status'].get(status, 0)}")
    if info["failures"]:
        lines += ["", "Patching raised, or the patched model raised or computed something else:", ""]
        lines += [f"- `{r.model_type}`: {_verdict(r)[4:]}" for r in info["failures"]]
    lines += ["", "## Missing kernels by kind (types; most common reasons)", ""]
    for kind, n in sorted(info["missing_types"].items(), key=lambda kv: -kv[1]):
        lines.append(f"- {kind}: {n} type{'s' if n != 1 else ''}")
        for reason, m in info["missing_reasons"][kind].most_common(5):
            lines.append(f"  - {m} x {reason}")
    lines += [
        "",
        "## Every type",
        "",
        "| type | class | method | kernels applied | missing (reason) | exact |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        kernels = ", ".join(f"{k} x{v}" for k, v in r.swapped.items())
        missing = "; ".join(f"{k}: {', '.join(_distinct(reasons))}" for k, reasons in r.missing.items())
        name = r.model_type + (" (VLM, text only)" if r.vlm else "")
        verdict = _verdict(r)
        if r in info["failures"] and len(verdict) > 200:
            verdict = verdict[:200] + "... (see the summary)"
        cells = (name, r.model_class, r.method or "", kernels, missing, verdict)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Package data: liger_core/patching/zoo_coverage.json, what liger_core.supported_model_types() and
# liger_core.model_coverage() read (liger_core/patching/coverage_data.py describes the records)


def package_record(r: CaseResult) -> dict:
    """One case as the package keeps it: the patch report's content, the verdict, and why when not exact."""
    record = dict(
        model_class=r.model_class,
        vlm=r.vlm,
        status=r.status,
        exact=r.exact,
        method=r.method,
        swapped=dict(r.swapped),
        missing={kind: _distinct(reasons) for kind, reasons in r.missing.items()},
    )
    if not r.exact:
        record["reason"] = _verdict(r)
    return record


def package_data(results: list[CaseResult], versions: dict, kernels: str, command: str) -> dict:
    return dict(
        generated_by=command,
        **versions,
        kernels=kernels,
        tolerances=dict(loss=LOSS_TOL, grads=GRAD_TOL),
        types={r.model_type: package_record(r) for r in results},
    )


def write_package_data(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")


def run_all(types: list[str], progress: bool = False) -> list[CaseResult]:
    results = []
    for t in types:
        r = run_case(t)
        results.append(r)
        if progress:
            print(f"{t:32s} {r.status:24s} {r.seconds:6.2f}s", file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the coverage table (Markdown) here")
    parser.add_argument("--json", help="write the raw results (one object per type) here")
    parser.add_argument("--types", help="comma-separated cases: model types or <type>:vlm (default: all)")
    parser.add_argument(
        "--package-data",
        help="write what liger_core.supported_model_types() reads here "
        "(liger_core/patching/zoo_coverage.json); every case, so not with --types",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.package_data and args.types:
        parser.error("--package-data lists every case: run it without --types")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import transformers

    import liger_core
    from liger_core.dispatch import triton_status

    torch.set_num_threads(1)
    types = args.types.split(",") if args.types else cases()
    start = time.perf_counter()
    results = run_all(types, progress=not args.quiet)
    # The zoo runs on CPU: Triton's interpreter if it was asked for, else the pure-PyTorch reference path.
    path = "Triton interpreter" if triton_status() == "interpreted" else "pure-PyTorch reference path"
    header = (
        f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"liger_core {getattr(liger_core, '__version__', '?')}; kernels on the {path}."
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(asdict(r), status=r.status, exact=r.exact) for r in results], f, indent=1)
    interpreted = "TRITON_INTERPRET=1 " if triton_status() == "interpreted" else ""
    options = (("--out", args.out), ("--package-data", args.package_data))
    command = f"{interpreted}python tests/patching/zoo.py" + "".join(f" {o} {v}" for o, v in options if v)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(coverage_markdown(results, header, command))
    if args.package_data:
        versions = dict(
            transformers=transformers.__version__,
            torch=torch.__version__,
            liger_core=getattr(liger_core, "__version__", "?"),
        )
        write_package_data(args.package_data, package_data(results, versions, path, command))
    info = summary(results)
    print(
        f"{len(results)} types in {time.perf_counter() - start:.0f} s: "
        + ", ".join(f"{k} {v}" for k, v in sorted(info["status"].items())),
        file=sys.stderr,
    )
    for r in info["failures"]:
        print(f"  {r.model_type}: {_verdict(r)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

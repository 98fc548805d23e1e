"""Tiny random-init configs for every model type in the patching table (no downloads), and helpers.

Sizes are the smallest that still exercise each architecture's quirks: GQA (4 query / 2 kv heads), head_dim 8,
two layers (Gemma-2/3: one sliding + one full attention layer; Qwen3-MoE: one sparse + one dense MLP layer;
SmolLM3: one NoPE layer), Phi-3 with partial rotary, Granite with logits scaling, Gemma-2/3 with logit
soft-capping.
"""

from __future__ import annotations

import torch

VOCAB = 160
HIDDEN = 32

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)

_EXTRA: dict[str, dict] = {
    "llama": {},
    "mistral": dict(sliding_window=None),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0),
    "qwen2": {},
    "qwen3": {},
    "qwen3_moe": dict(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
    ),
    "gemma": dict(hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True),
    "gemma2": dict(
        hidden_activation="gelu_pytorch_tanh",
        sliding_window=4,
        query_pre_attn_scalar=8,
        final_logit_softcapping=3.0,
        attn_logit_softcapping=50.0,
        tie_word_embeddings=True,
    ),
    "gemma3_text": dict(
        hidden_activation="gelu_pytorch_tanh",
        sliding_window=4,
        query_pre_attn_scalar=8,
        final_logit_softcapping=3.0,
        layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=True,
    ),
    "phi3": dict(partial_rotary_factor=0.5),
    "granite": dict(
        logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2
    ),
    "olmo2": {},
    "smollm3": dict(no_rope_layers=[1, 0], tie_word_embeddings=True),
}

MODEL_TYPES = tuple(_EXTRA)

# Types without a recipe (structural patching) that tests build the same way: Nemotron's non-gated relu^2
# MLP (its default hidden_act "relu2"), LayerNorm1P norms and partial rotary.
_STRUCTURAL_EXTRA: dict[str, dict] = {
    "nemotron": dict(hidden_act="relu2", partial_rotary_factor=0.5),
}


def tiny_config(model_type: str, attn_implementation: str = "eager", **overrides):
    from transformers import AutoConfig

    extra = _EXTRA[model_type] if model_type in _EXTRA else _STRUCTURAL_EXTRA[model_type]
    kwargs = {**_COMMON, **extra, **overrides}
    config = AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = attn_implementation
    # MoE experts: transformers' default grouped_mm kernel has no float64 (the tests' reference dtype)
    config._experts_implementation = "eager"
    return config


def tiny_model(model_type: str, dtype: torch.dtype = torch.float32, seed: int = 0, **overrides):
    """A random-init causal LM, same weights for the same seed; weights perturbed away from HF's init (norm
    weights of exactly 1 or 0 would hide an offset or casting bug)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:  # norm weights: HF initialises them to 1 (or 0 for Gemma's 1 + w)
                p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype)


def batch(seed: int, batch_size: int = 2, seq_len: int = 11, ignore_some: bool = True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch_size, seq_len), generator=g)
    labels = ids.clone()
    if ignore_some:
        labels[0, :3] = -100  # a prompt that is not trained on
    return ids, labels

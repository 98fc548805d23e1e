"""Structural patching's rope probe on the rotary functions of transformers' models: each is matched by the
liger replacement that reproduces it (outputs and q/k gradients, fp32 and bf16), and the vision layout is not
taken for a (q, k, cos, sin) function that broadcasts its tables over (B, H, T, D) heads."""

from __future__ import annotations

import importlib

import pytest
import torch

from liger_core.patching import rope_probe
from liger_core.patching import rope_variants as rv

# (model module, function, the replacement for bf16 probes, for fp32 ones)
CASES = [
    ("qwen2_5_vl", "apply_rotary_pos_emb_vision", rv.liger_rotary_pos_emb_vision, None),
    ("inkling2", "apply_rotary_pos_emb_vision", rv.liger_rotary_pos_emb_vision_pairs, None),
    ("cohere", "apply_rotary_pos_emb", rv.liger_rotary_pos_emb_pairs_cast_back, None),
    ("blt", "apply_rotary_pos_emb", rv.liger_rotary_pos_emb_pairs, rv.liger_rotary_pos_emb_pairs_cast_back),
    ("helium", "apply_rotary_pos_emb", rv.liger_rotary_pos_emb_pairs_first_half, None),
    ("glm4", "apply_rotary_pos_emb", rv.liger_rotary_pos_emb_pairs_first_half, None),
    ("ernie4_5", "apply_rotary_pos_emb", rv.liger_rotary_pos_emb_pairs_first_half_cast_back, None),
    ("nanochat", "apply_rotary_pos_emb", rv.liger_rotary_pos_emb_negated, None),
    ("gemma4", "apply_rotary_pos_emb", rv.liger_rotary_pos_emb_one, None),
    ("deepseek_v4", "apply_rotary_pos_emb", rv.liger_rotary_pos_emb_one_pairs_last, None),
    ("qwen4_exp", "apply_rotary_pos_emb", rv.liger_rotary_pos_emb_optional_k, None),
    (
        "mistral_large4",
        "apply_rotary_pos_emb_interleave",
        rv.liger_rotary_pos_emb_interleave_optional_k,
        None,
    ),
    ("gptj", "apply_rotary_pos_emb", rv.liger_rotary_pos_emb_gptj, None),
    ("llama4", "apply_rotary_emb", rv.liger_rotary_emb_complex, None),
    ("deepseek_v2", "apply_rotary_emb", rv.liger_rotary_emb_complex_heads_first, None),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("module, name, bf16, fp32", CASES, ids=[c[0] for c in CASES])
def test_rope_probe_matches_hf_function(module, name, bf16, fp32, dtype):
    fn = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    verdict = rope_probe.probe_rope(fn, dtype, torch.device("cpu"), torch.Generator().manual_seed(0))
    expected = bf16 if dtype == torch.bfloat16 or fp32 is None else fp32
    # fp32: the cast-back and promoted twins compute the same; the probe keeps the one it found first
    assert verdict is expected or (
        dtype == torch.float32
        and verdict.__name__.removesuffix("_cast_back") == expected.__name__.removesuffix("_cast_back")
    ), verdict


def _pairs_unsqueezed_at_1(q, k, cos, sin):
    def rot(x):
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def test_rope_probe_tells_vision_from_heads_first():
    """On (T, H, D) tokens this function computes what the vision replacement does; on (B, H, T, D) q/k it is
    the in-place pairs layout, which is what the probe must pick."""
    verdict = rope_probe.probe_rope(
        _pairs_unsqueezed_at_1, torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0)
    )
    assert verdict in (rv.liger_rotary_pos_emb_pairs, rv.liger_rotary_pos_emb_pairs_cast_back), verdict


def test_rope_probe_reports_every_layout():
    def not_a_rotation(q, k, cos, sin):
        return q * cos, k * sin

    verdict = rope_probe.probe_rope(not_a_rotation, torch.float32, torch.device("cpu"), torch.Generator())
    assert isinstance(verdict, str) and "matches no liger rope layout" in verdict
    for layout in rope_probe.ROPE_LAYOUTS:
        assert f"{layout.name}:" in verdict

"""rope's layout keywords against the Hugging Face functions they reproduce: outputs and q/k gradients no
worse than the HF function in the same dtype, both measured against the float64 reference (odd shapes:
head_dim 34, GQA 12/4 heads, 5 tokens; fp32 and bf16; HF's transposed, (B, T, H, D) and strided q/k)."""

import importlib

import pytest
import torch
from helpers import assert_no_worse_than_eager, devices, leaf
from test_rope import PARTIAL_ROTARY, SHAPES, _check_strided, _strided, make_qk

from liger_core import reference
from liger_core.ops import rope


def _hf(module: str, name: str):
    return getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)


def _pair_fn(module, name):
    """HF's (q, k, cos, sin, unsqueeze_dim) function."""
    fn = _hf(module, name)
    return lambda q, k, cos, sin, unsqueeze_dim: fn(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


def _one_fn(module, name):
    """HF's one-tensor (x, cos, sin, unsqueeze_dim) function, on q and on k."""
    fn = _hf(module, name)
    return lambda q, k, cos, sin, unsqueeze_dim: (
        fn(q, cos, sin, unsqueeze_dim),
        fn(k, cos, sin, unsqueeze_dim),
    )


def _gptj(q, k, cos, sin, unsqueeze_dim):
    fn = _hf("gptj", "apply_rotary_pos_emb")  # (tensor, sin, cos), tensor (B, T, H, D)
    return fn(q, sin, cos), fn(k, sin, cos)


def _complex(module):
    """Llama 4 / DeepSeek-V2's apply_rotary_emb(xq, xk, freqs_cis), freqs_cis = cos + i sin (complex64)."""
    fn = _hf(module, "apply_rotary_emb")
    return lambda q, k, cos, sin, unsqueeze_dim: fn(q, k, torch.complex(cos.float(), sin.float()))


def _vision(q, k, cos, sin, unsqueeze_dim):
    """Qwen2.5-VL's apply_rotary_pos_emb_vision on (T, H, D) tokens (the batch of 1 dropped and put back)."""
    fn = _hf("qwen2_5_vl", "apply_rotary_pos_emb_vision")
    q_e, k_e = fn(q[0], k[0], cos[0], sin[0])
    return q_e[None], k_e[None]


PAIRS = dict(interleaved=True, deinterleave=False)
# name: (HF function on (q, k, cos, sin, unsqueeze_dim), rope keywords, how the tables are built, q/k layouts,
# partial rotary supported by the HF function, whether it casts back to q's dtype (fp32 math))
CASES = {
    "cohere": (
        _pair_fn("cohere", "apply_rotary_pos_emb"),
        dict(tables="pairs", **PAIRS),
        "pairs",
        1,
        False,
        True,
    ),
    "blt": (_pair_fn("blt", "apply_rotary_pos_emb"), dict(tables="pairs", **PAIRS), "pairs", 1, False, False),
    "glm4v_text": (
        _pair_fn("glm4v", "apply_rotary_pos_emb"),
        dict(tables="pairs", **PAIRS),
        "any",
        1,
        True,
        False,
    ),
    "helium": (_pair_fn("helium", "apply_rotary_pos_emb"), PAIRS, "halves", 1, False, False),
    "glm": (_pair_fn("glm", "apply_rotary_pos_emb"), PAIRS, "halves", 1, True, False),
    "ernie4_5": (_pair_fn("ernie4_5", "apply_rotary_pos_emb"), PAIRS, "halves", 1, False, True),
    "nanochat": (
        _pair_fn("nanochat", "apply_rotary_pos_emb"),
        dict(negate_sin=True),
        "halves",
        1,
        False,
        False,
    ),
    "gemma4": (_one_fn("gemma4", "apply_rotary_pos_emb"), {}, "halves", 2, False, False),
    "deepseek_v4": (
        _one_fn("deepseek_v4", "apply_rotary_pos_emb"),
        dict(tables="freqs", rotary_last=True, **PAIRS),
        "freqs",
        1,
        True,
        True,
    ),
    "gptj": (_gptj, dict(tables="freqs", **PAIRS), "freqs", 2, False, False),
    "llama4": (_complex("llama4"), dict(tables="freqs", **PAIRS), "freqs", 2, False, True),
    "deepseek_v2": (_complex("deepseek_v2"), dict(tables="freqs", **PAIRS), "freqs", 1, False, True),
    "qwen2_5_vl_vision": (_vision, {}, "halves", 2, False, True),
}


def make_tables(kind, batch, seq_len, rotary_dim, dtype, device, gen=None):
    """HF-style angles t * inv_freq laid out as ``kind``: "halves" cat(f, f), "pairs" repeat_interleave(f, 2),
    "freqs" f alone; "any": every column its own random angle."""
    if kind == "any":
        angles = torch.rand(batch, seq_len, rotary_dim, dtype=torch.float64, device=device) * 6.0
        return angles.cos().to(dtype), angles.sin().to(dtype)
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim
    offsets = torch.randint(0, 1000, (batch, 1), device=device)
    positions = torch.arange(seq_len, dtype=torch.float64, device=device) + offsets
    freqs = positions[..., None] / 10000**exponents
    emb = {
        "halves": lambda: torch.cat((freqs, freqs), -1),
        "pairs": lambda: freqs.repeat_interleave(2, -1),
        "freqs": lambda: freqs,
    }[kind]()
    return emb.cos().to(dtype), emb.sin().to(dtype)


def check_case(q, k, cos, sin, unsqueeze_dim, eager_fn, cast_back, **kwargs):
    """Forward and q/k grads of rope vs the HF function in the same dtype, both vs float64 reference."""
    q, k = leaf(q), leaf(k)
    q_e, k_e = leaf(q), leaf(k)
    q_r, k_r = leaf(q, torch.float64), leaf(k, torch.float64)
    out_dtype = q.dtype if cast_back else None
    out = rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, out_dtype=out_dtype, **kwargs)
    out_e = eager_fn(q_e, k_e, cos, sin, unsqueeze_dim)
    out_r = reference.rope(q_r, k_r, cos.double(), sin.double(), unsqueeze_dim=unsqueeze_dim, **kwargs)
    for name, o, o_e, o_r in zip(("q_embed", "k_embed"), out, out_e, out_r):
        assert o.dtype == o_e.dtype and o.shape == o_e.shape, name
        assert_no_worse_than_eager(name, o, o_e, o_r)
    grads_out = [torch.randn(o.shape, dtype=torch.float64, device=o.device).to(o.dtype) for o in out]
    grads = torch.autograd.grad(out, (q, k), grads_out)
    grads_e = torch.autograd.grad(out_e, (q_e, k_e), grads_out)
    grads_r = torch.autograd.grad(out_r, (q_r, k_r), [g.double() for g in grads_out])
    for name, g, g_e, g_r, t in zip(("dq", "dk"), grads, grads_e, grads_r, (q, k)):
        assert g.dtype == t.dtype and g.shape == t.shape
        assert_no_worse_than_eager(name, g, g_e, g_r)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["hf_transpose", "noncontiguous"])
@pytest.mark.parametrize(
    "case,rotary",
    # partial rotary only where the HF function takes it (others rotate the whole head)
    [(case, rot) for case in CASES for rot in ("full", "partial") if rot == "full" or CASES[case][4]],
)
def test_rope_layout_matches_hf(device, dtype, layout, rotary, case):
    eager_fn, kwargs, tables, unsqueeze_dim, _, cast_back = CASES[case]
    shape = SHAPES[device]
    batch, _, _, seq_len, head_dim = shape
    if case == "qwen2_5_vl_vision":
        shape, batch = (1, *shape[1:]), 1
    q, k, _ = make_qk(shape, "bthd" if unsqueeze_dim == 2 else layout, dtype, device)
    if unsqueeze_dim == 2 and layout == "noncontiguous":
        q, k = _strided(q, "step2"), _strided(k, "step2")
    rotary_dim = head_dim if rotary == "full" else PARTIAL_ROTARY[device]
    width = rotary_dim // 2 if tables == "freqs" else rotary_dim
    cos, sin = make_tables(
        tables, batch, seq_len, rotary_dim if tables != "freqs" else width * 2, dtype, device
    )
    check_case(q, k, cos, sin, unsqueeze_dim, eager_fn, cast_back, **kwargs)


@pytest.mark.parametrize("device", devices())
def test_rope_layout_fp32_tables(device):
    """Cohere-style cast back with fp32 tables and bf16 q/k: q's dtype out; without out_dtype the promoted one
    (Blt's q * cos)."""
    shape = SHAPES[device]
    batch, _, _, seq_len, head_dim = shape
    q, k, unsqueeze_dim = make_qk(shape, "hf_transpose", torch.bfloat16, device)
    cos, sin = make_tables("pairs", 1, seq_len, head_dim, torch.float32, device)
    for case in ("cohere", "blt"):
        eager_fn, kwargs, _, _, _, cast_back = CASES[case]
        check_case(q, k, cos, sin, unsqueeze_dim, eager_fn, cast_back, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "gaps", "transposed"])
@pytest.mark.parametrize(
    "options",
    [
        dict(tables="pairs", **PAIRS),
        dict(PAIRS),
        dict(negate_sin=True),
        dict(tables="freqs", rotary_last=True, **PAIRS),
        dict(tables="freqs", interleaved=True),
    ],
    ids=["pairs-tables", "pairs-first-half", "negate-sin", "freqs-rotary-last", "freqs-deinterleave"],
)
def test_rope_layout_strided_arguments(path_device, dtype, how, options):  # noqa: F811 - the fixture
    """q, k, cos, sin and the incoming gradients non-contiguous, partial rotary: no worse than the reference
    in the same dtype (the HF functions' own math) on the same views."""
    device = path_device
    shape = SHAPES[device]
    batch, _, _, seq_len, head_dim = shape
    q, k, unsqueeze_dim = make_qk(shape, "contiguous", dtype, device)
    rotary_dim = PARTIAL_ROTARY[device]
    tables = options.get("tables", "halves")
    width = rotary_dim // 2 if tables == "freqs" else rotary_dim
    cos, sin = make_tables("any", batch, seq_len, width, dtype, device)
    cos, sin = _strided(cos, how), _strided(sin, how)
    _check_strided(_strided(q, how), _strided(k, how), cos, sin, unsqueeze_dim, how, **options)


@pytest.mark.parametrize("device", devices())
def test_rope_layout_empty_k_and_tokens(device):
    """One tensor (k with no heads), and no tokens: the reference's shapes and dtypes, no launch error."""
    shape = SHAPES[device]
    batch, n_q, _, seq_len, head_dim = shape
    for tokens in (seq_len, 0):
        q = torch.randn(batch, n_q, tokens, head_dim, device=device, requires_grad=True)
        k = q.narrow(1, 0, 0)
        cos, sin = make_tables("freqs", 1, tokens, head_dim, torch.float32, device)
        options = dict(tables="freqs", rotary_last=True, **PAIRS)
        out = rope(q, k, cos, sin, out_dtype=torch.float32, **options)
        ref = reference.rope(q.detach().double(), k.detach().double(), cos.double(), sin.double(), **options)
        assert out[1].shape == k.shape and out[0].dtype == torch.float32
        torch.testing.assert_close(out[0].double(), ref[0], rtol=1e-5, atol=1e-5)
        (dq,) = torch.autograd.grad(out[0].sum(), q)
        assert dq.shape == q.shape


def test_rope_layout_bad_tables():
    q = torch.randn(1, 2, 3, 8)
    cos = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="tables"):
        rope(q, q, cos, cos, tables="nope")
    with pytest.raises(ValueError, match="interleaved"):
        rope(q, q, cos, cos, tables="pairs")
    with pytest.raises(ValueError, match="rotary_dim"):
        rope(q, q, cos, cos, tables="freqs", interleaved=True)  # 2 * 8 > head_dim

import functools
import importlib

import pytest
import torch
from helpers import (
    INF,
    NAN,
    assert_no_worse_than_eager,
    assert_same_nonfinite,
    devices,
    leaf,
    noncontiguous,
    with_values_at_random,
)
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from liger_core import reference
from liger_core.ops import rope

# (batch, q heads, kv heads, tokens, head_dim): odd sizes, GQA, head_dim/2 not a power of two. The interpreter
# pays per program (one per token), so the CPU shape gets its thousands of elements from heads, not tokens.
SHAPES = {"cpu": (2, 12, 4, 5, 34), "cuda": (2, 32, 8, 1024, 128)}
PARTIAL_ROTARY = {"cpu": 22, "cuda": 64}  # rotary_dim < head_dim (Phi/GLM-style partial rotary)
LAYOUTS = ["hf_transpose", "contiguous", "bthd", "noncontiguous"]
# the module itself (liger_core.ops binds the name `rope` to the function)
rope_module = importlib.import_module("liger_core.ops.rope")
rope_math = importlib.import_module("liger_core.ops._rope_math")


def make_qk(shape, layout, dtype, device):
    """q, k in one of the layouts HF produces. Returns (q, k, unsqueeze_dim)."""
    batch, n_q, n_k, seq_len, head_dim = shape

    def one(n_heads):
        x = torch.randn(batch, seq_len, n_heads, head_dim, dtype=torch.float64, device=device).to(dtype)
        if layout == "hf_transpose":  # HF: q_proj(x).view(B, T, H, D).transpose(1, 2)
            return x.transpose(1, 2)
        if layout == "contiguous":
            return x.transpose(1, 2).contiguous()
        if layout == "bthd":
            return x
        return noncontiguous(x.transpose(1, 2))  # last-dim stride 2: the op makes it contiguous

    return one(n_q), one(n_k), 2 if layout == "bthd" else 1


def make_cos_sin(batch, seq_len, rotary_dim, dtype, device):
    """HF-style tables: angles t * inv_freq, duplicated halves, batch `batch` (1 or B)."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim
    inv_freq = 1.0 / 10000**exponents
    offsets = torch.randint(0, 1000, (batch, 1), device=device)  # each row starts at its own position
    positions = torch.arange(seq_len, dtype=torch.float64, device=device) + offsets
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def check_against_eager(q, k, cos, sin, unsqueeze_dim, eager_fn, **kwargs):
    """Forward and both input grads of liger rope vs eager_fn in the same dtype, vs float64 reference."""
    q, k = leaf(q), leaf(k)
    q_e, k_e = leaf(q), leaf(k)
    q_r, k_r = leaf(q, torch.float64), leaf(k, torch.float64)
    out = rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, **kwargs)
    out_e = eager_fn(q_e, k_e, cos, sin, unsqueeze_dim=unsqueeze_dim)
    out_r = reference.rope(q_r, k_r, cos.double(), sin.double(), unsqueeze_dim=unsqueeze_dim, **kwargs)
    for name, o, o_e, o_r in zip(("q_embed", "k_embed"), out, out_e, out_r):
        assert o.dtype == o_e.dtype and o.shape == o_e.shape, name
        assert_no_worse_than_eager(name, o, o_e, o_r)
    grads_out = [torch.randn(o.shape, dtype=torch.float64, device=o.device).to(o.dtype) for o in out]
    dq, dk = torch.autograd.grad(out, (q, k), grads_out)
    dq_e, dk_e = torch.autograd.grad(out_e, (q_e, k_e), grads_out)
    dq_r, dk_r = torch.autograd.grad(out_r, (q_r, k_r), [g.double() for g in grads_out])
    assert dq.dtype == q.dtype and dk.dtype == k.dtype
    assert_no_worse_than_eager("dq", dq, dq_e, dq_r)
    assert_no_worse_than_eager("dk", dk, dk_e, dk_r)
    return out


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cos_batch, rotary", [("1", "full"), ("B", "partial")])
def test_rope_matches_float64(device, dtype, layout, cos_batch, rotary, poison_empty):
    shape = SHAPES[device]
    batch, _, _, seq_len, head_dim = shape
    q, k, unsqueeze_dim = make_qk(shape, layout, dtype, device)
    rotary_dim = head_dim if rotary == "full" else PARTIAL_ROTARY[device]
    cos, sin = make_cos_sin(1 if cos_batch == "1" else batch, seq_len, rotary_dim, dtype, device)
    # full rotary: HF's own function is the eager baseline; partial: HF's split/rotate/cat composition
    eager = apply_rotary_pos_emb if rotary == "full" else reference.rope
    q_embed, _ = check_against_eager(q, k, cos, sin, unsqueeze_dim, eager)
    if layout == "hf_transpose":  # the output keeps q's memory layout: (B, T, H, D) underneath
        assert q_embed.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("device", devices())
def test_rope_fp16_mqa_full_rotary_batch_tables(device):
    batch, n_q, _, seq_len, head_dim = SHAPES[device]
    q, k, unsqueeze_dim = make_qk((batch, n_q, 1, seq_len, head_dim), "hf_transpose", torch.float16, device)
    cos, sin = make_cos_sin(batch, seq_len, head_dim, torch.float16, device)
    check_against_eager(q, k, cos, sin, unsqueeze_dim, apply_rotary_pos_emb)


@pytest.mark.parametrize("device", devices())
def test_rope_fp32_tables_promote_like_hf(device):
    """bf16 q/k with fp32 cos/sin: HF's q * cos promotes to fp32, and so do we; grads come back in bf16."""
    shape = SHAPES[device]
    q, k, unsqueeze_dim = make_qk(shape, "hf_transpose", torch.bfloat16, device)
    cos, sin = make_cos_sin(1, shape[3], shape[4], torch.float32, device)
    q_embed, k_embed = check_against_eager(q, k, cos, sin, unsqueeze_dim, apply_rotary_pos_emb)
    assert q_embed.dtype == k_embed.dtype == torch.float32


def test_rope_reference_is_hf_exactly():
    """The reference (the CPU fallback and the eager baseline for partial rotary) is bitwise HF."""
    q, k, unsqueeze_dim = make_qk((2, 6, 2, 5, 16), "hf_transpose", torch.bfloat16, "cpu")
    cos, sin = make_cos_sin(2, 5, 16, torch.bfloat16, "cpu")
    q, k, q_h, k_h = leaf(q), leaf(k), leaf(q), leaf(k)
    out = reference.rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    out_h = apply_rotary_pos_emb(q_h, k_h, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for o, o_h in zip(out, out_h):
        assert torch.equal(o, o_h)
    dy = [torch.randn_like(o) for o in out]
    for g, g_h in zip(torch.autograd.grad(out, (q, k), dy), torch.autograd.grad(out_h, (q_h, k_h), dy)):
        assert torch.equal(g, g_h)


def test_rope_head_loop(tune):
    """Head counts above one tile: programs loop over head chunks, the last one partial."""
    tune(rope_tile_elements=32)  # block_half 16 -> 2 heads per step
    q, k, unsqueeze_dim = make_qk((1, 5, 3, 7, 30), "hf_transpose", torch.float32, "cpu")
    cos, sin = make_cos_sin(1, 7, 30, torch.float32, "cpu")
    check_against_eager(q, k, cos, sin, unsqueeze_dim, apply_rotary_pos_emb)


@pytest.mark.parametrize(
    "batch,tokens,q_heads,k_heads,warps",
    [(1, 1024, 64, 16, 8), (2, 1024, 64, 16, 8), (1, 1024, 128, 32, 8), (1, 4096, 64, 16, 4),
     (4, 4096, 32, 8, 4), (1, 1024, 32, 8, 4), (1, 4093, 8, 2, 4)],
)  # fmt: skip
def test_rope_launch_warps(batch, tokens, q_heads, k_heads, warps):
    """8 warps only for few tokens with many heads each (where they were measured faster), 4 elsewhere."""
    q = torch.empty(batch, q_heads, tokens, 128, device="meta")
    k = torch.empty(batch, k_heads, tokens, 128, device="meta")
    cos = torch.empty(1, tokens, 128, device="meta")
    for backward in (False, True):
        assert rope_module._plan(q, k, cos, 1, backward).constexprs["num_warps"] == warps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_arbitrary_tables(dtype):
    """HF's formula holds for any cos/sin, not only tables with equal halves (where the backward's transpose
    and a plain sign flip coincide): random tables catch a kernel that assumes the halves are equal."""
    q, k, unsqueeze_dim = make_qk((2, 3, 2, 5, 14), "hf_transpose", dtype, "cpu")
    cos = torch.randn(2, 5, 14, dtype=torch.float64).to(dtype)
    sin = torch.randn(2, 5, 14, dtype=torch.float64).to(dtype)
    check_against_eager(q, k, cos, sin, unsqueeze_dim, apply_rotary_pos_emb)


@pytest.mark.parametrize("ids_shape", ["B,T", "1,T", "T"])
def test_rope_position_ids_gather_table_rows(ids_shape):
    batch, n_q, n_k, seq_len, head_dim = SHAPES["cpu"]
    q, k, unsqueeze_dim = make_qk(SHAPES["cpu"], "hf_transpose", torch.bfloat16, "cpu")
    cos_table, sin_table = make_cos_sin(1, 40, head_dim, torch.bfloat16, "cpu")
    cos_table, sin_table = cos_table[0], sin_table[0]
    ids = {"B,T": (batch, seq_len), "1,T": (1, seq_len), "T": (seq_len,)}[ids_shape]
    position_ids = torch.randint(0, 40, ids)

    def eager(q, k, cos, sin, unsqueeze_dim):  # HF's legacy cos[position_ids] gather, then HF's function
        ids2d = position_ids if position_ids.dim() == 2 else position_ids[None]
        return apply_rotary_pos_emb(q, k, cos[ids2d], sin[ids2d], unsqueeze_dim=unsqueeze_dim)

    check_against_eager(q, k, cos_table, sin_table, unsqueeze_dim, eager, position_ids=position_ids)


def _flag(cos, sin):
    check = rope_math.check_table_halves(cos, sin)
    return None if check is None else check.known_equal()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_table_check_cached_and_never_stale(dtype, poison_empty):
    """HF's tables (equal halves) are checked once per table object; an in-place change of a table (version
    bump) checks again, so the kernel reads the second half again and stays exact."""
    shape = SHAPES["cpu"]
    q, k, unsqueeze_dim = make_qk(shape, "hf_transpose", dtype, "cpu")
    cos, sin = make_cos_sin(1, shape[3], shape[4], dtype, "cpu")
    check_against_eager(q, k, cos, sin, unsqueeze_dim, apply_rotary_pos_emb)
    check = rope_math.check_table_halves(cos, sin)
    assert check.known_equal()
    assert rope_math.check_table_halves(cos, sin) is check  # cached: no second check
    assert _flag(cos.clone(), sin)  # another object: its own check
    half = shape[4] // 2
    with torch.no_grad():
        sin[..., half:] *= 0.75  # the halves differ now (in place: same object, new version)
    assert _flag(cos, sin) is False
    check_against_eager(q, k, cos, sin, unsqueeze_dim, reference.rope)  # exact with the new second half


def test_rope_table_check_is_bitwise():
    """0.0 and -0.0 compare equal but are different bits: not the same halves (the output's zeros keep their
    sign); inference-mode tables are not checked (both halves read)."""
    cos, sin = make_cos_sin(1, 5, 8, torch.float32, "cpu")
    assert _flag(cos, sin) is True
    signed = sin.clone()
    signed[0, 0, 0], signed[0, 0, 4] = 0.0, -0.0
    assert _flag(cos, signed) is False
    with torch.inference_mode():
        cos_i, sin_i = make_cos_sin(1, 5, 8, torch.float32, "cpu")
        assert _flag(cos_i, sin_i) is None
        q, k, unsqueeze_dim = make_qk((1, 2, 1, 5, 8), "hf_transpose", torch.float32, "cpu")
        for o, o_h in zip(rope(q, k, cos_i, sin_i), apply_rotary_pos_emb(q, k, cos_i, sin_i)):
            torch.testing.assert_close(o, o_h)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_rope_table_check_arrives_without_sync_cuda():
    """On the GPU the answer arrives through an event: before it, both halves are read; after it, one; the
    outputs are bitwise the same either way (the second half equals the first)."""
    shape = (2, 8, 2, 1024, 128)
    q, k, unsqueeze_dim = make_qk(shape, "hf_transpose", torch.bfloat16, "cuda")
    cos, sin = make_cos_sin(1, 1024, 128, torch.bfloat16, "cuda")
    check = rope_math.check_table_halves(cos, sin)
    torch.cuda.synchronize()
    assert check.known_equal()
    both = rope_module._launch(q, k, cos, sin, False, unsqueeze_dim, torch.bfloat16, False)
    one = rope_module._launch(q, k, cos, sin, True, unsqueeze_dim, torch.bfloat16, False)
    assert all(torch.equal(a, b) for a, b in zip(both, one))
    check_against_eager(q, k, cos, sin, unsqueeze_dim, apply_rotary_pos_emb)


def test_rope_position_ids_tables_with_unequal_halves():
    """With position_ids the flag comes from the whole table; a table whose halves differ stays exact."""
    batch, _, _, seq_len, head_dim = SHAPES["cpu"]
    q, k, unsqueeze_dim = make_qk(SHAPES["cpu"], "hf_transpose", torch.float32, "cpu")
    cos_table = torch.randn(40, head_dim, dtype=torch.float64).float()
    sin_table = torch.randn(40, head_dim, dtype=torch.float64).float()
    assert _flag(cos_table, sin_table) == 0
    position_ids = torch.randint(0, 40, (batch, seq_len))

    def eager(q, k, cos, sin, unsqueeze_dim):
        return reference.rope(q, k, cos[position_ids], sin[position_ids], unsqueeze_dim=unsqueeze_dim)

    check_against_eager(q, k, cos_table, sin_table, unsqueeze_dim, eager, position_ids=position_ids)


def test_rope_cos_sin_grads():
    """cos/sin that require grad (HF builds them under no_grad, but a user may not) get eager-exact grads."""
    q, k, unsqueeze_dim = make_qk((2, 3, 1, 5, 12), "hf_transpose", torch.float32, "cpu")
    cos, sin = make_cos_sin(2, 5, 8, torch.float32, "cpu")
    tensors = [leaf(t) for t in (q, k, cos, sin)]
    tensors_r = [leaf(t, torch.float64) for t in (q, k, cos, sin)]
    out = rope(*tensors, unsqueeze_dim=unsqueeze_dim)
    out_r = reference.rope(*tensors_r, unsqueeze_dim=unsqueeze_dim)
    dy = [torch.randn_like(o) for o in out]
    for g, g_r in zip(torch.autograd.grad(out, tensors, dy), torch.autograd.grad(out_r, tensors_r, dy)):
        torch.testing.assert_close(g.double(), g_r, rtol=1e-5, atol=1e-5)


def test_rope_empty_and_no_grad():
    q, k, unsqueeze_dim = make_qk((2, 4, 2, 0, 8), "hf_transpose", torch.float32, "cpu")
    cos, sin = make_cos_sin(1, 0, 8, torch.float32, "cpu")
    q_embed, k_embed = rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    assert q_embed.shape == q.shape and k_embed.shape == k.shape
    q, k, unsqueeze_dim = make_qk((1, 2, 2, 3, 8), "bthd", torch.float32, "cpu")
    cos, sin = make_cos_sin(1, 3, 8, torch.float32, "cpu")
    with torch.no_grad():
        out = rope(q, k, cos, sin, unsqueeze_dim=-2)
    for o, o_h in zip(out, apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)):
        torch.testing.assert_close(o, o_h)


def test_rope_bad_input():
    q = torch.randn(2, 4, 5, 8)
    k = torch.randn(2, 2, 5, 8)
    cos, sin = torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    with pytest.raises(ValueError, match="head_dim"):
        rope(torch.randn(2, 4, 5, 7), torch.randn(2, 2, 5, 7), cos[..., :7], sin[..., :7])
    with pytest.raises(ValueError, match="q"):
        rope(q[0], k, cos, sin)
    with pytest.raises(ValueError, match="k"):
        rope(q, torch.randn(3, 2, 5, 8), cos, sin)
    with pytest.raises(ValueError, match="k"):
        rope(q, torch.randn(2, 2, 6, 8), cos, sin)
    with pytest.raises(TypeError, match="k"):
        rope(q, k.double(), cos, sin)
    with pytest.raises(TypeError, match="sin"):
        rope(q, k, cos, sin.half())
    with pytest.raises(TypeError, match="cos"):
        rope(q, k, cos.long(), sin.long())
    with pytest.raises(ValueError, match="sin"):
        rope(q, k, cos, torch.randn(1, 5, 6))
    with pytest.raises(ValueError, match="cos"):
        rope(q, k, torch.randn(3, 5, 8), torch.randn(3, 5, 8))  # batch neither 1 nor B
    with pytest.raises(ValueError, match="cos"):
        rope(q, k, torch.randn(1, 4, 8), torch.randn(1, 4, 8))  # T mismatch
    with pytest.raises(ValueError, match="rotary_dim"):
        rope(q, k, torch.randn(1, 5, 10), torch.randn(1, 5, 10))  # wider than head_dim
    with pytest.raises(ValueError, match="rotary_dim"):
        rope(q, k, torch.randn(1, 5, 5), torch.randn(1, 5, 5))  # odd
    with pytest.raises(ValueError, match="unsqueeze_dim"):
        rope(q, k, cos, sin, unsqueeze_dim=3)
    with pytest.raises(ValueError, match="cos"):
        rope(q, k, cos.to("meta"), sin.to("meta"))
    with pytest.raises(TypeError, match="position_ids"):
        rope(q, k, cos[0], sin[0], position_ids=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="position_ids"):
        rope(q, k, cos[0], sin[0], position_ids=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="cos"):
        rope(q, k, cos, sin, position_ids=torch.zeros(2, 5, dtype=torch.long))  # table must be 2-D
    with pytest.raises(TypeError, match="q"):
        rope(q.numpy(), k, cos, sin)


@pytest.mark.parametrize("device", devices())
def test_rope_fused_qkv_slices(device):
    """q/k sliced out of one fused qkv projection (Phi-3 style): unit last stride but gaps between heads and
    tokens (read through a dense copy); forward and the fused buffer's gradient exact."""
    batch, n_q, n_k, seq_len, head_dim = SHAPES[device]
    width = n_q + 2 * n_k
    qkv = torch.randn(batch, seq_len, width, head_dim, dtype=torch.float64, device=device).to(torch.bfloat16)
    cos, sin = make_cos_sin(batch, seq_len, head_dim, torch.bfloat16, device)
    dy = [torch.randn(batch, n, seq_len, head_dim, device=device).to(torch.bfloat16) for n in (n_q, n_k)]

    def run(fn, qkv_leaf, cos, sin):
        q = qkv_leaf[:, :, :n_q].transpose(1, 2)
        k = qkv_leaf[:, :, n_q : n_q + n_k].transpose(1, 2)
        out = fn(q, k, cos, sin, unsqueeze_dim=1)
        (dqkv,) = torch.autograd.grad(out, qkv_leaf, [g.to(out[0].dtype) for g in dy])
        return (*out, dqkv)

    qkv_ours = leaf(qkv)
    assert not qkv_ours[:, :, :n_q].is_contiguous() and qkv_ours.stride(-1) == 1
    ours = run(rope, qkv_ours, cos, sin)
    eager = run(apply_rotary_pos_emb, leaf(qkv), cos, sin)
    ref = run(reference.rope, leaf(qkv, torch.float64), cos.double(), sin.double())
    for name, o, o_e, o_r in zip(("q_embed", "k_embed", "dqkv"), ours, eager, ref):
        assert_no_worse_than_eager(name, o, o_e, o_r)


# ----------------------------------------------------------------------------------------------------------
# Any strides, non-finite values and empty inputs, on every path: the Triton kernels (interpreter on CPU, or
# the GPU) and the pure-PyTorch reference path.
# ----------------------------------------------------------------------------------------------------------


def _strided(t, how):
    """t's values in a non-contiguous layout: "step2" takes every other element of the last dimension and
    "gaps" every other row (index of dimension -2), with the skipped elements of the buffer NaN (0 for
    integers); "transposed" reverses the storage order of the dimensions."""
    if how == "transposed":
        dims = list(reversed(range(t.dim())))
        out = t.permute(dims).contiguous().permute(dims)
    else:
        dim = t.dim() - 1 if how == "step2" else t.dim() - 2
        shape = list(t.shape)
        shape[dim] *= 2
        buf = torch.full(shape, float("nan") if t.is_floating_point() else 0, dtype=t.dtype, device=t.device)
        index = [slice(None)] * t.dim()
        index[dim] = slice(None, None, 2)
        buf[tuple(index)] = t
        out = buf[tuple(index)]
    assert not out.is_contiguous() or t.numel() <= 1
    return out


def _check_strided(q, k, cos, sin, unsqueeze_dim, how, **kwargs):
    """rope on the given views, with the incoming gradients in layout ``how``: outputs and dq, dk no worse
    than HF's code on the same views, gradients in the inputs' shapes."""
    q, k = q.requires_grad_(), k.requires_grad_()
    q_e, k_e = _strided(q.detach(), how).requires_grad_(), _strided(k.detach(), how).requires_grad_()
    q_r, k_r = leaf(q, torch.float64), leaf(k, torch.float64)
    out = rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, **kwargs)
    out_e = reference.rope(q_e, k_e, cos, sin, unsqueeze_dim=unsqueeze_dim, **kwargs)
    out_r = reference.rope(q_r, k_r, cos.double(), sin.double(), unsqueeze_dim=unsqueeze_dim, **kwargs)
    for name, o, o_e, o_r in zip(("q_embed", "k_embed"), out, out_e, out_r):
        assert o.dtype == o_e.dtype and o.shape == o_e.shape, name
        assert_no_worse_than_eager(name, o, o_e, o_r)
    dy = [_strided(torch.randn(o.shape, dtype=torch.float64, device=o.device).to(o.dtype), how) for o in out]
    grads = torch.autograd.grad(out, (q, k), dy)
    grads_e = torch.autograd.grad(out_e, (q_e, k_e), dy)
    grads_r = torch.autograd.grad(out_r, (q_r, k_r), [g.double() for g in dy])
    for name, g, g_e, g_r, t in zip(("dq", "dk"), grads, grads_e, grads_r, (q, k)):
        assert g.shape == t.shape and g.dtype == t.dtype
        assert_no_worse_than_eager(name, g, g_e, g_r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "gaps", "transposed"])
@pytest.mark.parametrize("sin_layout", ["like cos", "contiguous"])
@pytest.mark.parametrize("cos_batch, rotary", [("1", "full"), ("B", "partial")])
def test_rope_strided_arguments(path_device, dtype, how, sin_layout, cos_batch, rotary):
    """q, k, cos, sin and the incoming gradients non-contiguous (last-dimension stride 2, gaps between rows,
    or transposed storage; sin in cos's layout or not): outputs and gradients no worse than HF's code."""
    device = path_device
    shape = SHAPES[device]
    batch, _, _, seq_len, head_dim = shape
    q, k, unsqueeze_dim = make_qk(shape, "contiguous", dtype, device)
    rotary_dim = head_dim if rotary == "full" else PARTIAL_ROTARY[device]
    cos, sin = make_cos_sin(1 if cos_batch == "1" else batch, seq_len, rotary_dim, dtype, device)
    cos = _strided(cos, how)
    sin = _strided(sin, how) if sin_layout == "like cos" else sin
    _check_strided(_strided(q, how), _strided(k, how), cos, sin, unsqueeze_dim, how)


@pytest.mark.parametrize("how", ["step2", "gaps", "transposed"])
def test_rope_strided_tables_and_position_ids(path_device, how):
    """position_ids and the (max_positions, rotary_dim) tables it indexes non-contiguous too."""
    device = path_device
    batch, _, _, seq_len, head_dim = SHAPES[device]
    q, k, unsqueeze_dim = make_qk(SHAPES[device], "bthd", torch.float32, device)
    cos_table, sin_table = (t[0] for t in make_cos_sin(1, 40, head_dim, torch.float32, device))
    position_ids = torch.randint(0, 40, (batch, seq_len), device=device)
    kwargs = dict(position_ids=_strided(position_ids, "step2" if how == "transposed" else how))
    _check_strided(
        _strided(q, how), _strided(k, how), _strided(cos_table, how), _strided(sin_table, how), unsqueeze_dim,
        how, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_broadcast_tables_and_heads(path_device, dtype):
    """Stride-0 views: cos/sin expanded over the batch, k's heads expanded from one (MQA written as a
    broadcast); outputs and gradients as HF's code gives them."""
    device = path_device
    batch, _, n_k, seq_len, head_dim = SHAPES[device]
    q, k, unsqueeze_dim = make_qk(SHAPES[device], "hf_transpose", dtype, device)
    k = k[:, :1].expand(batch, n_k, seq_len, head_dim)
    cos, sin = (t.expand(batch, seq_len, head_dim) for t in make_cos_sin(1, seq_len, head_dim, dtype, device))
    assert cos.stride(0) == 0 and k.stride(1) == 0
    check_against_eager(q, k.contiguous(), cos, sin, unsqueeze_dim, apply_rotary_pos_emb)
    k = k.detach().requires_grad_()  # the expanded view itself as the input (not a contiguous copy)
    k_e, k_r = k.detach().requires_grad_(), k.detach().double().requires_grad_()
    k_embed = rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)[1]
    k_embed_e = apply_rotary_pos_emb(q, k_e, cos, sin, unsqueeze_dim=unsqueeze_dim)[1]
    k_embed_r = reference.rope(q.double(), k_r, cos.double(), sin.double(), unsqueeze_dim=unsqueeze_dim)[1]
    assert_no_worse_than_eager("k_embed", k_embed, k_embed_e, k_embed_r)
    dy = torch.randn(k_embed.shape, dtype=torch.float64, device=device).to(k_embed.dtype)
    (dk,) = torch.autograd.grad(k_embed, k, dy)
    (dk_e,) = torch.autograd.grad(k_embed_e, k_e, dy)
    (dk_r,) = torch.autograd.grad(k_embed_r, k_r, dy.double())
    assert_no_worse_than_eager("dk", dk, dk_e, dk_r)


# bf16 as fp32: HF's bf16 products and sum overflow nowhere here (|cos|, |sin| <= 1), so NaN/inf are alike
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target", ["q,k", "cos,sin"])
@pytest.mark.parametrize("rotary", ["full", "partial"])
def test_rope_nonfinite_inputs_follow_eager(path_device, dtype, target, rotary):
    """+-inf and NaN in q and k, or in cos and sin: the outputs and dq, dk are NaN / +-inf where HF's
    ``apply_rotary_pos_emb`` (and its autograd) gives them, and exact elsewhere."""
    device = path_device
    batch, _, _, seq_len, head_dim = SHAPES[device]
    q, k, unsqueeze_dim = make_qk(SHAPES[device], "contiguous", dtype, device)
    cos, sin = make_cos_sin(
        batch, seq_len, head_dim if rotary == "full" else PARTIAL_ROTARY[device], dtype, device
    )
    values = [INF, -INF, NAN, INF, -INF, NAN]
    if target == "q,k":
        q, k = (with_values_at_random(t, values) for t in (q, k))
    else:
        cos, sin = (with_values_at_random(t, values[:3]) for t in (cos, sin))
    _check_nonfinite_like_eager(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


def _check_nonfinite_like_eager(q, k, cos, sin, **options):
    """q_embed, k_embed, dq and dk NaN / +-inf where the reference (HF's code) and its autograd give them, and
    no worse than it elsewhere (against the float64 reference)."""
    q_e, k_e, q_r, k_r = leaf(q), leaf(k), leaf(q, torch.float64), leaf(k, torch.float64)
    q, k = leaf(q), leaf(k)
    out = rope(q, k, cos, sin, **options)
    out_e = reference.rope(q_e, k_e, cos, sin, **options)
    out_r = reference.rope(q_r, k_r, cos.double(), sin.double(), **options)
    for name, o, o_e, o_r in zip(("q_embed", "k_embed"), out, out_e, out_r):
        assert_same_nonfinite(name, o, o_e, o_r)
    dy = [torch.randn(o.shape, dtype=torch.float64, device=q.device).to(o.dtype) for o in out]
    grads = torch.autograd.grad(out, (q, k), dy)
    grads_e = torch.autograd.grad(out_e, (q_e, k_e), dy)
    grads_r = torch.autograd.grad(out_r, (q_r, k_r), [g.double() for g in dy])
    for name, g, g_e, g_r in zip(("dq", "dk"), grads, grads_e, grads_r):
        assert_same_nonfinite(name, g, g_e, g_r)


@pytest.mark.parametrize("empty", ["batch", "tokens"])
@pytest.mark.parametrize("layout", ["hf_transpose", "bthd"])
def test_rope_empty_like_eager(path_device, empty, layout):
    """0 sequences or 0 tokens: the same empty outputs and gradients as HF's code, on every path."""
    device = path_device
    batch, seq_len = (0, 5) if empty == "batch" else (2, 0)
    q, k, unsqueeze_dim = make_qk((batch, 4, 2, seq_len, 8), layout, torch.float32, device)
    cos, sin = make_cos_sin(1, seq_len, 8, torch.float32, device)
    q_e, k_e = leaf(q), leaf(k)
    q, k = leaf(q), leaf(k)
    out = rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    out_e = apply_rotary_pos_emb(q_e, k_e, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for o, o_e in zip(out, out_e):
        assert o.dtype == o_e.dtype and o.shape == o_e.shape
    dy = [torch.randn(o.shape, device=device) for o in out]
    for g, g_e in zip(torch.autograd.grad(out, (q, k), dy), torch.autograd.grad(out_e, (q_e, k_e), dy)):
        assert g.dtype == g_e.dtype and torch.equal(g, g_e)


# ----------------------------------------------------------------------------------------------------------
# interleaved=True: DeepSeek-V3's apply_rotary_pos_emb_interleave (GPT-J pairs, de-interleaved output).
# ----------------------------------------------------------------------------------------------------------


def _interleaved_eager(rotary):
    """HF's function for full rotary; partial rotary: the reference's split/rotate/cat around it."""
    if rotary == "full":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

        return apply_rotary_pos_emb_interleave
    return functools.partial(reference.rope, interleaved=True)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cos_batch, rotary", [("1", "full"), ("B", "partial")])
def test_rope_interleaved_matches_float64(device, dtype, layout, cos_batch, rotary, poison_empty):
    shape = SHAPES[device]
    batch, _, _, seq_len, head_dim = shape
    q, k, unsqueeze_dim = make_qk(shape, layout, dtype, device)
    rotary_dim = head_dim if rotary == "full" else PARTIAL_ROTARY[device]
    cos, sin = make_cos_sin(1 if cos_batch == "1" else batch, seq_len, rotary_dim, dtype, device)
    q_embed, _ = check_against_eager(
        q, k, cos, sin, unsqueeze_dim, _interleaved_eager(rotary), interleaved=True
    )
    if layout == "hf_transpose":
        assert q_embed.transpose(1, 2).is_contiguous()


def test_rope_interleaved_reference_is_hf_exactly():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    q, k, unsqueeze_dim = make_qk((2, 6, 2, 5, 16), "hf_transpose", torch.bfloat16, "cpu")
    cos, sin = make_cos_sin(2, 5, 16, torch.bfloat16, "cpu")
    q, k, q_h, k_h = leaf(q), leaf(k), leaf(q), leaf(k)
    out = reference.rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, interleaved=True)
    out_h = apply_rotary_pos_emb_interleave(q_h, k_h, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for o, o_h in zip(out, out_h):
        assert torch.equal(o, o_h)
    dy = [torch.randn_like(o) for o in out]
    for g, g_h in zip(torch.autograd.grad(out, (q, k), dy), torch.autograd.grad(out_h, (q_h, k_h), dy)):
        assert torch.equal(g, g_h)


def test_rope_interleaved_reads_first_half_of_tables_and_loops_heads(tune):
    """Tables whose halves differ (only the first is HF's angle), position_ids, and head counts above one
    tile; cos/sin gradients through the eager recomputation."""
    tune(rope_tile_elements=32)
    q, k, unsqueeze_dim = make_qk((2, 5, 3, 7, 30), "bthd", torch.float32, "cpu")
    cos, sin = torch.randn(9, 30), torch.randn(9, 30)
    ids = torch.randint(0, 9, (2, 7))

    def eager(q, k, c, s, unsqueeze_dim):
        return _interleaved_eager("full")(q, k, c[ids], s[ids], unsqueeze_dim=unsqueeze_dim)

    check_against_eager(q, k, cos, sin, unsqueeze_dim, eager, interleaved=True, position_ids=ids)
    q, k = leaf(q), leaf(k)
    cos_t, sin_t = leaf(cos[ids]), leaf(sin[ids])
    cos_e, sin_e = leaf(cos_t), leaf(sin_t)
    out = rope(q, k, cos_t, sin_t, unsqueeze_dim=unsqueeze_dim, interleaved=True)
    out_e = reference.rope(q, k, cos_e, sin_e, unsqueeze_dim=unsqueeze_dim, interleaved=True)
    dy = [torch.randn_like(o) for o in out]
    for g, g_e in zip(
        torch.autograd.grad(out, (cos_t, sin_t), dy), torch.autograd.grad(out_e, (cos_e, sin_e), dy)
    ):
        torch.testing.assert_close(g, g_e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "gaps", "transposed"])
@pytest.mark.parametrize("rotary", ["full", "partial"])
def test_rope_interleaved_strided_arguments(path_device, dtype, how, rotary):
    device = path_device
    shape = SHAPES[device]
    batch, _, _, seq_len, head_dim = shape
    q, k, unsqueeze_dim = make_qk(shape, "contiguous", dtype, device)
    rotary_dim = head_dim if rotary == "full" else PARTIAL_ROTARY[device]
    cos, sin = (_strided(t, how) for t in make_cos_sin(batch, seq_len, rotary_dim, dtype, device))
    _check_strided(_strided(q, how), _strided(k, how), cos, sin, unsqueeze_dim, how, interleaved=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target", ["q,k", "cos,sin"])
def test_rope_interleaved_nonfinite_inputs_follow_eager(path_device, dtype, target):
    device = path_device
    batch, _, _, seq_len, head_dim = SHAPES[device]
    q, k, unsqueeze_dim = make_qk(SHAPES[device], "contiguous", dtype, device)
    cos, sin = make_cos_sin(batch, seq_len, head_dim, dtype, device)
    values = [INF, -INF, NAN, INF, -INF, NAN]
    if target == "q,k":
        q, k = (with_values_at_random(t, values) for t in (q, k))
    else:  # in the first halves: the angles HF reads
        half = head_dim // 2
        cos, sin = (
            torch.cat((with_values_at_random(t[..., :half], values[:3]),) * 2, -1) for t in (cos, sin)
        )
    _check_nonfinite_like_eager(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, interleaved=True)


@pytest.mark.parametrize("empty", ["batch", "tokens"])
def test_rope_interleaved_empty_like_eager(path_device, empty):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    device = path_device
    batch, seq_len = (0, 5) if empty == "batch" else (2, 0)
    q, k, unsqueeze_dim = make_qk((batch, 4, 2, seq_len, 8), "hf_transpose", torch.float32, device)
    cos, sin = make_cos_sin(1, seq_len, 8, torch.float32, device)
    q_e, k_e = leaf(q), leaf(k)
    q, k = leaf(q), leaf(k)
    out = rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, interleaved=True)
    out_e = apply_rotary_pos_emb_interleave(q_e, k_e, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for o, o_e in zip(out, out_e):
        assert o.dtype == o_e.dtype and o.shape == o_e.shape
    dy = [torch.randn(o.shape, device=device) for o in out]
    for g, g_e in zip(torch.autograd.grad(out, (q, k), dy), torch.autograd.grad(out_e, (q_e, k_e), dy)):
        assert g.dtype == g_e.dtype and torch.equal(g, g_e)

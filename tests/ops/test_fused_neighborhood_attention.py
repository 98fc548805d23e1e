"""fused_neighborhood_attention: softmax(scale Q K^T) over a dilated 1-D window, times V, forward and backward
(query, key, value) vs the float64 reference and no worse than eager in the same dtype; the module; argument
errors."""

import math

import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, assert_same_nonfinite, devices, leaf, strided

from liger_core import reference
from liger_core.modules import LigerFusedNeighborhoodAttention
from liger_core.ops import fused_neighborhood_attention

# ((B, H, L, D), kernel_size, dilation, scale)
CONFIGS = {
    "cpu": [
        ((2, 3, 11, 5), 5, 2, None),
        ((1, 2, 13, 8), 3, 1, 0.3),
        ((2, 1, 9, 3), 31, 1, None),  # the window covers the sequence: full attention
        ((1, 2, 17, 4), 7, 3, None),
    ],
    "cuda": [((2, 8, 1024, 64), 7, 2, None)],
}


def make(shape, device="cpu", dtype=torch.float32):
    return [torch.randn(shape, dtype=torch.float64).to(device=device, dtype=dtype) for _ in range(3)]


def check(q, k, v, kernel_size, dilation, scale, dout_layout=None):
    ins = (q, k, v)
    ours, eager, ref = [leaf(t) for t in ins], [leaf(t) for t in ins], [leaf(t, torch.float64) for t in ins]
    y = fused_neighborhood_attention(*ours, kernel_size, dilation, scale)
    y_e = reference.fused_neighborhood_attention(*eager, kernel_size, dilation, scale)
    y_r = reference.fused_neighborhood_attention(*ref, kernel_size, dilation, scale)
    assert y.dtype == q.dtype and y.shape == q.shape
    assert_no_worse_than_eager("out", y, y_e, y_r)
    dout = torch.randn(y.shape, dtype=torch.float64).to(device=y.device, dtype=y.dtype)
    if dout_layout is not None:
        dout = dout_layout(dout)
    g = torch.autograd.grad(y, ours, dout)
    g_e = torch.autograd.grad(y_e, eager, dout)
    g_r = torch.autograd.grad(y_r, ref, dout.double())
    for name, a, e, r in zip(("d_query", "d_key", "d_value"), g, g_e, g_r):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert_no_worse_than_eager(name, a, e, r)
    return y, g


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fna_matches_float64(device, dtype, poison_empty):
    for shape, kernel_size, dilation, scale in CONFIGS[device]:
        check(*make(shape, device, dtype), kernel_size, dilation, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fna_paths_strided(path_device, dtype):
    """(B, L, H, D) projections transposed to (B, H, L, D), as the module passes them, and a strided output
    gradient; both the Triton and the reference path."""
    q, k, v = [t.transpose(1, 2) for t in make((2, 10, 3, 6), path_device, dtype)]
    check(q, k, v, 5, 2, None, dout_layout=lambda t: strided(t, "step2"))


def test_fna_window_of_one(path_device):
    """kernel_size 1: each query sees only itself, so out = value and the query / key gradients are 0."""
    q, k, v = make((2, 2, 7, 5), path_device)
    y, (dq, dk, dv) = check(q, k, v, 1, 1, None)
    assert torch.equal(y, v)
    assert (dq == 0).all() and (dk == 0).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf arithmetic
def test_fna_nonfinite_follow_eager(path_device):
    """A NaN query element makes its row NaN; a NaN key element the rows whose window holds it; +-1e4 logits
    stay finite."""
    q, k, v = make((1, 2, 12, 4), path_device)
    q[0, 0, 3, 1] = NAN
    k[0, 1, 9, 0] = NAN
    q[0, 1, 2] = 1e4 / 4
    q[0, 0, 6, 2] = -INF
    ins = [leaf(t) for t in (q, k, v)]
    y = fused_neighborhood_attention(*ins, 3, 2)
    y_e = reference.fused_neighborhood_attention(*[leaf(t) for t in (q, k, v)], 3, 2)
    y_r = reference.fused_neighborhood_attention(*[leaf(t, torch.float64) for t in (q, k, v)], 3, 2)
    assert_same_nonfinite("out", y, y_e, y_r)


def test_fna_empty(path_device):
    q, k, v = make((0, 2, 5, 4), path_device)
    assert fused_neighborhood_attention(q, k, v).shape == (0, 2, 5, 4)


def test_fna_module():
    """LigerFusedNeighborhoodAttention: projections, the op per head, the output projection."""
    torch.manual_seed(0)
    module = LigerFusedNeighborhoodAttention(12, 3, kernel_size=5, dilation=2)
    assert module.head_dim == 4 and math.isclose(module.scale, 0.5)
    x = torch.randn(2, 9, 12)
    y = module(x)

    def heads(t):
        return t.view(2, 9, 3, 4).transpose(1, 2)

    attn = fused_neighborhood_attention(
        heads(module.q_proj(x)), heads(module.k_proj(x)), heads(module.v_proj(x)), 5, 2, 0.5
    )
    want = module.out_proj(attn.transpose(1, 2).reshape(2, 9, 12))
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    y.sum().backward()
    assert module.q_proj.weight.grad is not None
    with pytest.raises(ValueError, match="attention_mask"):
        module(x, attention_mask=torch.ones(2, 9))
    with pytest.raises(ValueError, match="num_heads"):
        LigerFusedNeighborhoodAttention(10, 3)
    with pytest.raises(ValueError, match="kernel_size"):
        LigerFusedNeighborhoodAttention(12, 3, kernel_size=4)
    with pytest.raises(ValueError, match="dilation"):
        LigerFusedNeighborhoodAttention(12, 3, dilation=0)


def test_fna_bad_arguments():
    q, k, v = make((1, 2, 5, 4))
    cases = [
        (dict(query=q[0]), ValueError, "query"),
        (dict(query=q.long()), TypeError, "query"),
        (dict(key=k[..., :3]), ValueError, "key"),
        (dict(value=v.double()), TypeError, "value"),
        (dict(kernel_size=4), ValueError, "kernel_size"),
        (dict(kernel_size=0), ValueError, "kernel_size"),
        (dict(kernel_size=3.0), TypeError, "kernel_size"),
        (dict(dilation=0), ValueError, "dilation"),
        (dict(scale=float("nan")), ValueError, "scale"),
        (dict(scale="x"), ValueError, "scale"),
    ]
    for change, error, name in cases:
        kw = dict(query=q, key=k, value=v) | change
        with pytest.raises(error, match=name):
            fused_neighborhood_attention(**kw)


def test_fna_custom_ops_and_compile(tune):
    """The torch.library custom ops (schemas, fake kernels) in eager mode, and torch.compile without graph
    breaks; both equal to the plain launch."""
    q, k, v = make((1, 2, 9, 4))
    want = fused_neighborhood_attention(q, k, v, 3, 2)
    tune(eager_via_custom_ops=True)
    assert torch.equal(fused_neighborhood_attention(q, k, v, 3, 2), want)
    q = leaf(q)
    compiled = torch.compile(lambda q: fused_neighborhood_attention(q, k, v, 3, 2), fullgraph=True)
    y = compiled(q)
    torch.testing.assert_close(y, want)
    y.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()

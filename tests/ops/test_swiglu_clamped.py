"""The clamped, scaled SwiGLU variant (gpt-oss experts: ``alpha``, ``limit``, ``up_offset``) and the packed
entry point ``swiglu_packed`` (gate and up in one tensor, concatenated or interleaved), against a float64
reference of transformers' eager composition, forward and backward, on every path."""

import pytest
import torch
from helpers import INF, NAN, assert_no_worse_than_eager, leaf, noncontiguous

from liger_core import reference
from liger_core.ops.swiglu import swiglu, swiglu_packed

GPT_OSS = dict(alpha=1.702, limit=7.0, up_offset=1.0)
VARIANTS = [
    pytest.param(GPT_OSS, id="gpt_oss"),
    pytest.param(dict(limit=10.0), id="limit_only"),
    pytest.param(dict(alpha=0.5, up_offset=-2.0), id="alpha_offset"),
    pytest.param({}, id="plain"),
]


def _halves(x, interleaved):
    return (x[..., ::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)


def _eager(gate, up, alpha=1.0, limit=None, up_offset=0.0):
    """transformers' GptOssExperts._apply_gate, written out (the reference path must equal it too)."""
    if limit is not None:
        gate = gate.clamp(min=None, max=limit)
        up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return (up + up_offset) * glu


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 7, 123), (257, 11)])
def test_swiglu_variant_matches_float64(path_device, variant, dtype, shape, poison_empty):
    """Values beyond the limit on both sides (scale 6 against limit 7/10), odd shapes, strided b."""
    a64 = torch.randn(shape, dtype=torch.float64, device=path_device) * 6
    b64 = torch.randn(shape, dtype=torch.float64, device=path_device) * 6
    a, b = leaf(a64.to(dtype)), leaf(noncontiguous(b64.to(dtype)))
    a_e, b_e = leaf(a), leaf(b)
    a_r, b_r = leaf(a, torch.float64), leaf(b, torch.float64)
    y = swiglu(a, b, **variant)
    y_e, y_r = _eager(a_e, b_e, **variant), _eager(a_r, b_r, **variant)
    assert y.dtype == dtype and y.shape == shape
    assert_no_worse_than_eager("y", y, y_e, y_r)
    dy = torch.randn(shape, dtype=torch.float64, device=path_device).to(dtype)
    for name, g, g_e, g_r in zip(
        ("da", "db"),
        torch.autograd.grad(y, (a, b), dy),
        torch.autograd.grad(y_e, (a_e, b_e), dy),
        torch.autograd.grad(y_r, (a_r, b_r), dy.double()),
    ):
        assert_no_worse_than_eager(name, g, g_e, g_r)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_swiglu_packed_matches_float64(path_device, variant, dtype, interleaved, poison_empty):
    """One [..., 2I] tensor: y [..., I] and the gradient of the whole tensor, both layouts, odd I."""
    shape = (2, 19, 2 * 45)
    x64 = torch.randn(shape, dtype=torch.float64, device=path_device) * 6
    x = leaf(x64.to(dtype))
    x_e, x_r = leaf(x), leaf(x, torch.float64)
    y = swiglu_packed(x, interleaved=interleaved, **variant)
    y_e = _eager(*_halves(x_e, interleaved), **variant)
    y_r = _eager(*_halves(x_r, interleaved), **variant)
    assert y.dtype == dtype and y.shape == (2, 19, 45)
    assert_no_worse_than_eager("y", y, y_e, y_r)
    dy = torch.randn(y.shape, dtype=torch.float64, device=path_device).to(dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_e,) = torch.autograd.grad(y_e, x_e, dy)
    (dx_r,) = torch.autograd.grad(y_r, x_r, dy.double())
    assert dx.shape == shape
    assert_no_worse_than_eager("dx", dx, dx_e, dx_r)


# the clamp boundary itself (7.0: the gradient passes, as torch.clamp's), beyond it, non-finite values
SPECIAL = [INF, -INF, NAN, 0.0, 7.0, -7.0, 7.5, -7.5, 200.0, -200.0, 1.5]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf * 0
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_swiglu_packed_nonfinite_follow_eager(path_device, dtype, interleaved):
    """+-inf, NaN and the clamp boundary in gate and up: y and the gradient NaN / +-inf exactly where the
    eager composition's are (clamp turns +-inf into +-limit; its gradient is 0 outside and at NaN), and no
    worse than eager elsewhere."""
    n = len(SPECIAL)
    gate = torch.tensor(SPECIAL, dtype=torch.float64).repeat_interleave(n)
    up = torch.tensor(SPECIAL, dtype=torch.float64).repeat(n)
    gate = torch.cat([gate, torch.randn(999, dtype=torch.float64) * 6]).view(-1, 10)
    up = torch.cat([up, torch.randn(999, dtype=torch.float64) * 6]).view(-1, 10)
    x64 = torch.stack((gate, up), -1).flatten(-2) if interleaved else torch.cat((gate, up), -1)
    x = leaf(x64.to(device=path_device, dtype=dtype))
    x_e, x_r = leaf(x), leaf(x, torch.float64)
    y = swiglu_packed(x, interleaved=interleaved, **GPT_OSS)
    y_e = _eager(*_halves(x_e, interleaved), **GPT_OSS)
    y_r = _eager(*_halves(x_r, interleaved), **GPT_OSS)
    dy = torch.randn(y.shape, dtype=torch.float64, device=path_device).to(dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_e,) = torch.autograd.grad(y_e, x_e, dy)
    (dx_r,) = torch.autograd.grad(y_r, x_r, dy.double())
    for name, ours, eager, ref in (("y", y, y_e, y_r), ("dx", dx, dx_e, dx_r)):
        for kind, where in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
            assert torch.equal(where(ours), where(eager)), f"{name}: {kind} at other positions than eager's"
        finite = torch.isfinite(eager)
        assert_no_worse_than_eager(name, ours[finite], eager[finite], ref[finite])


@pytest.mark.parametrize("interleaved", [False, True])
def test_swiglu_packed_empty_like_eager(path_device, interleaved):
    x = leaf(torch.randn(0, 5, 18, device=path_device))
    x_e = leaf(x)
    y = swiglu_packed(x, interleaved=interleaved, **GPT_OSS)
    y_e = _eager(*_halves(x_e, interleaved), **GPT_OSS)
    assert y.shape == y_e.shape == (0, 5, 9)
    dy = torch.randn(y.shape, device=path_device)
    assert torch.equal(torch.autograd.grad(y, x, dy)[0], torch.autograd.grad(y_e, x_e, dy)[0])


def test_swiglu_plain_variant_is_the_plain_op(path_device):
    """alpha=1, no limit, no offset is silu(a) * b bit for bit (the same kernel branch or reference)."""
    a, b = torch.randn(7, 33, device=path_device) * 3, torch.randn(7, 33, device=path_device)
    assert torch.equal(swiglu(a, b, alpha=1.0, limit=None, up_offset=0.0), swiglu(a, b))
    x = torch.cat((a, b), -1)
    assert torch.equal(swiglu_packed(x), swiglu(*x.chunk(2, dim=-1)))


def test_swiglu_variant_bad_arguments():
    a = torch.randn(4, 8)
    with pytest.raises(ValueError, match="alpha"):
        swiglu(a, a, alpha=0.0)
    with pytest.raises(ValueError, match="limit"):
        swiglu(a, a, limit=-1.0)
    with pytest.raises(TypeError, match="limit"):
        swiglu(a, a, limit=float("inf"))
    with pytest.raises(ValueError, match="even"):
        swiglu_packed(torch.randn(4, 7))


def test_reference_path_is_transformers_expression():
    """The reference path (CPU without Triton) computes what gpt-oss's _apply_gate computes, bit for bit."""
    g, u = torch.randn(5, 31, dtype=torch.bfloat16) * 8, torch.randn(5, 31, dtype=torch.bfloat16) * 8
    assert torch.equal(reference.swiglu(g, u, **GPT_OSS), _eager(g, u, **GPT_OSS))

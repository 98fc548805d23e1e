"""multi_token_attention: causal softmax (or sparsemax), conv2d over the score plane and the causal zero mask,
forward and backward (scores, weight, bias) vs the float64 reference and no worse than eager in the same
dtype; the module; argument errors."""

import pytest
import torch
from helpers import INF, NAN, SLACK, assert_no_worse_than_eager, devices, leaf, strided

from liger_core import reference
from liger_core.modules import LigerMultiTokenAttention
from liger_core.ops import multi_token_attention

# (B, C_in, L, C_out, kernel, conv keyword arguments)
CONFIGS = {
    "cpu": [
        (2, 3, 7, 4, 3, dict(padding=1)),
        (2, 4, 9, 2, (3, 5), dict(padding=(1, 2), groups=2)),
        (2, 2, 11, 3, 3, dict(stride=2, dilation=2)),
        (2, 6, 12, 3, 1, dict(groups=3)),
    ],
    "cuda": [(2, 16, 512, 16, 5, dict(padding=2))],
}


def make(b, c_in, n, c_out, kernel, groups=1, device="cpu", dtype=torch.float32, scale=3.0):
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    scores = (torch.randn(b, c_in, n, n, dtype=torch.float64) * scale).to(device=device, dtype=dtype)
    weight = (torch.randn(c_out, c_in // groups, kh, kw, dtype=torch.float64) / (kh * kw) ** 0.5).to(
        device, dtype
    )
    bias = torch.randn(c_out, dtype=torch.float64).to(device=device, dtype=dtype)
    return scores, weight, bias


def check(scores, weight, bias, dout_layout=None, **kw):
    ins = [t for t in (scores, weight, bias) if t is not None]
    ours, eager, ref = [leaf(t) for t in ins], [leaf(t) for t in ins], [leaf(t, torch.float64) for t in ins]
    if bias is None:
        ours, eager, ref = ours + [None], eager + [None], ref + [None]
    y = multi_token_attention(*ours, **kw)
    y_e = reference.multi_token_attention(*eager, **kw)
    y_r = reference.multi_token_attention(*ref, **kw)
    assert y.dtype == scores.dtype and y.shape == y_e.shape
    assert_no_worse_than_eager("out", y, y_e, y_r)
    above = torch.ones(y.shape[-2:], dtype=torch.bool, device=y.device).triu(1)
    assert (y[..., above] == 0).all(), "entries above the diagonal must be 0"
    dout = torch.randn(y.shape, dtype=torch.float64).to(device=y.device, dtype=y.dtype)
    if dout_layout is not None:
        dout = dout_layout(dout)
    n = len(ins)
    g = torch.autograd.grad(y, ours[:n], dout)
    g_e = torch.autograd.grad(y_e, eager[:n], dout)
    g_r = torch.autograd.grad(y_r, ref[:n], dout.double())
    for name, a, e, r in zip(("d_scores", "d_weight", "d_bias"), g, g_e, g_r):
        assert a.dtype == e.dtype and a.shape == e.shape
        # d_weight is torch's conv weight gradient on both sides, fed probabilities that differ by an ulp
        # (ours correctly rounded): its error is the same conv's rounding drawn twice, whose ratio runs past
        # 1.25 in a few percent of draws (median 0.85)
        assert_no_worse_than_eager(name, a, e, r, slack=2 * SLACK if name == "d_weight" else SLACK)
    return g


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sparse", [False, True])
def test_mta_matches_float64(device, dtype, sparse, poison_empty):
    for b, c_in, n, c_out, kernel, kw in CONFIGS[device]:
        scores, weight, bias = make(b, c_in, n, c_out, kernel, kw.get("groups", 1), device, dtype)
        check(scores, weight, bias, sparse=sparse, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mta_paths_strided_no_bias(path_device, dtype):
    """Non-contiguous scores and output gradient (NaN between the elements a stride-blind kernel would
    read), no bias; both the Triton and the reference path."""
    scores, weight, _ = make(2, 3, 8, 3, 3, device=path_device, dtype=dtype)
    check(strided(scores, "transposed"), weight, None, dout_layout=lambda t: strided(t, "step2"), padding=1)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf arithmetic
@pytest.mark.parametrize("sparse", [False, True])
def test_mta_masked_rows_and_extremes(path_device, sparse):
    """Rows whose visible scores are all -inf get zero probabilities and a zero gradient; NaN / inf above the
    diagonal are never read; +-1e4 scores."""
    scores, weight, bias = make(2, 3, 9, 4, 3, device=path_device, scale=1.0)
    scores = scores.double()
    scores[0, 1, 4, :5] = -INF  # row 4 fully masked
    scores[1, 0, 0, 0] = -INF  # the first row has one visible key
    scores[1, 2, 6, :7] = -INF
    scores[0, 0, 2, 3:] = NAN  # above the diagonal
    scores[1, 1, 3, 4:] = INF
    scores[0, 2, 7, :3] = 1e4
    scores[1, 0, 8, 2:6] = -1e4
    g = check(scores.float(), weight, bias, sparse=sparse, padding=1)
    d_scores = g[0]
    assert torch.isfinite(d_scores).all()
    for bi, c, row in ((0, 1, 4), (1, 0, 0), (1, 2, 6)):
        assert (d_scores[bi, c, row] == 0).all()
    above = torch.ones(9, 9, dtype=torch.bool).triu(1)
    assert (d_scores[..., above] == 0).all()


def test_mta_empty_batch(path_device):
    scores, weight, bias = make(0, 2, 5, 2, 3, device=path_device)
    y = multi_token_attention(scores, weight, bias, padding=1)
    assert y.shape == (0, 2, 5, 5)


@pytest.mark.parametrize("sparse", [False, True])
def test_mta_module(sparse):
    """LigerMultiTokenAttention holds (C_out, C_in / groups, k, k) weight and (C_out,) bias and calls the op
    with its settings."""
    torch.manual_seed(0)
    module = LigerMultiTokenAttention(4, 6, 3, padding=1, groups=2, sparse=sparse)
    assert module.weight.shape == (6, 2, 3, 3) and module.bias.shape == (6,)
    assert (module.bias == 0).all()
    scores = torch.randn(2, 4, 7, 7)
    y = module(scores)
    want = multi_token_attention(scores, module.weight, module.bias, 1, 1, 1, 2, sparse)
    assert torch.equal(y, want)
    y.sum().backward()
    assert module.weight.grad is not None and module.bias.grad is not None
    assert LigerMultiTokenAttention(2, 2, 3, bias=False).bias is None
    with pytest.raises(ValueError, match="groups"):
        LigerMultiTokenAttention(4, 5, 3, groups=2)


def test_mta_bad_arguments():
    scores, weight, bias = make(1, 2, 5, 2, 3)
    cases = [
        (dict(scores=scores[0]), ValueError, "scores"),
        (dict(scores=scores[..., :4]), ValueError, "scores"),
        (dict(scores=scores.long()), TypeError, "scores"),
        (dict(weight=weight.double()), TypeError, "weight"),
        (dict(weight=weight[0]), ValueError, "weight"),
        (dict(weight=torch.randn(2, 3, 3, 3)), ValueError, "weight"),
        (dict(bias=bias[:1]), ValueError, "bias"),
        (dict(bias=bias.double()), TypeError, "bias"),
        (dict(stride=0), ValueError, "stride"),
        (dict(stride=(1, 2, 3)), TypeError, "stride"),
        (dict(padding=-1), ValueError, "padding"),
        (dict(dilation=0), ValueError, "dilation"),
        (dict(groups=0), ValueError, "groups"),
        (dict(groups=3), ValueError, "weight"),
        (dict(sparse=1), TypeError, "sparse"),
    ]
    for change, error, name in cases:
        kw = dict(scores=scores, weight=weight, bias=bias) | change
        with pytest.raises(error, match=name):
            multi_token_attention(**kw)


def test_mta_custom_ops_and_compile(tune):
    """The torch.library custom ops (schemas, fake kernels) in eager mode, and torch.compile without graph
    breaks; both equal to the plain launch."""
    scores, weight, bias = make(2, 3, 7, 3, 3)
    want = multi_token_attention(scores, weight, bias, 1, 1)
    tune(eager_via_custom_ops=True)
    assert torch.equal(multi_token_attention(scores, weight, bias, 1, 1), want)
    s = leaf(scores)
    compiled = torch.compile(lambda s: multi_token_attention(s, weight, bias, 1, 1), fullgraph=True)
    y = compiled(s)
    torch.testing.assert_close(y, want)
    y.sum().backward()
    assert s.grad is not None and torch.isfinite(s.grad).all()

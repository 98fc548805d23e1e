"""tvd: total variation distance 0.5 * |p - q| with liger-kernel's signature (shift_labels, reduction,
ignore_index), vs the float64 reference of the same inputs, no worse than the eager composition in the same
dtype; gradients for both p and q."""

import pytest
import torch
from helpers import (
    INF,
    NAN,
    assert_no_worse_than_eager,
    assert_same_nonfinite,
    devices,
    leaf,
    strided,
)

from liger_core import reference
from liger_core.modules import LigerTVDLoss
from liger_core.ops import tvd

SHAPES = {"cpu": [(37, 131), (3, 5, 67)], "cuda": [(1024, 128256), (3, 333, 32000)]}
REDUCTIONS = ["none", "sum", "mean", "batchmean"]


def probs(shape, dtype, device):
    """Softmax rows of moderate spread, with exact ties (p == q) and zeros in some columns."""
    p = torch.softmax(torch.randn(shape, dtype=torch.float64, device=device) * 2, -1)
    q = torch.softmax(torch.randn(shape, dtype=torch.float64, device=device) * 2, -1)
    q[..., ::7] = p[..., ::7]
    p[..., 3::11] = 0.0
    return p.to(dtype), q.to(dtype)


def labels_for(shape, device):
    labels = torch.randint(0, 50, shape[:-1], device=device)
    labels.view(-1)[::3] = -100
    return labels


def check(p, q, reduction, labels=None, dy_layout=None):
    p, q = leaf(p), leaf(q)
    p_e, q_e = leaf(p), leaf(q)
    p_r, q_r = leaf(p, torch.float64), leaf(q, torch.float64)
    y = tvd(p, q, labels, reduction)
    y_e = reference.tvd(p_e, q_e, labels, reduction)
    y_r = reference.tvd(p_r, q_r, labels, reduction)
    assert y.dtype == torch.float32 and y.shape == y_e.shape
    assert_no_worse_than_eager("loss", y, y_e, y_r)
    dy = torch.randn(y.shape, dtype=torch.float64, device=p.device).float()
    if dy_layout is not None:
        dy = dy_layout(dy)
    grads = torch.autograd.grad(y, (p, q), dy)
    grads_e = torch.autograd.grad(y_e, (p_e, q_e), dy)
    grads_r = torch.autograd.grad(y_r, (p_r, q_r), dy.double())
    for name, g, g_e, g_r in zip(("dp", "dq"), grads, grads_e, grads_r):
        assert g.dtype == p.dtype and g.shape == p.shape
        assert_no_worse_than_eager(name, g, g_e, g_r)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("with_labels", [False, True])
def test_tvd_matches_float64(device, dtype, reduction, with_labels, poison_empty):
    for shape in SHAPES[device]:
        p, q = probs(shape, dtype, device)
        check(p, q, reduction, labels_for(shape, device) if with_labels else None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "batchmean"])
@pytest.mark.parametrize("how", ["step2", "transposed"])
def test_tvd_strided(path_device, dtype, reduction, how):
    """p, q (and the elementwise loss's gradient) non-contiguous, NaN between the elements a stride-blind
    kernel would read; a label tensor that is a strided view too."""
    p, q = probs((9, 37), dtype, path_device)
    # labels a column of a wider buffer whose other columns are ignore_index: a stride-blind read drops rows
    buf = torch.full((9, 3), -100, device=path_device)
    buf[:, 1] = labels_for((9, 37), path_device)
    labels = buf[:, 1]
    assert not labels.is_contiguous()
    check(strided(p, how), strided(q, how), reduction, labels, lambda t: strided(t, how) if t.dim() else t)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_tvd_nonfinite_follow_eager(path_device, dtype, reduction):
    """NaN and +-inf in p and q (and NaN in an ignored row, which must not leak): loss and gradients NaN /
    +-inf where the eager composition has them (its gradient is 0 where p - q is NaN: torch.sign(NaN) = 0),
    exact elsewhere."""
    p, q = probs((13, 23), dtype, path_device)
    p[0, :4] = torch.tensor([INF, -INF, NAN, INF], dtype=dtype)
    q[0, :4] = torch.tensor([1.0, 0.5, 0.0, INF], dtype=dtype)
    p[5, 2] = NAN
    q[7, 9] = -INF
    labels = torch.arange(13, device=path_device)
    labels[5] = -100
    p, q = leaf(p), leaf(q)
    p_e, q_e, p_r, q_r = leaf(p), leaf(q), leaf(p, torch.float64), leaf(q, torch.float64)
    y = tvd(p, q, labels, reduction)
    y_e, y_r = (reference.tvd(*a, labels, reduction) for a in ((p_e, q_e), (p_r, q_r)))
    if reduction == "none":
        assert_same_nonfinite("loss", y, y_e, y_r)
    else:
        assert torch.isnan(y) and torch.isnan(y_e)
    dy = torch.randn(y.shape, dtype=torch.float64, device=path_device).float()
    for name, g, g_e, g_r in zip(
        ("dp", "dq"),
        torch.autograd.grad(y, (p, q), dy),
        torch.autograd.grad(y_e, (p_e, q_e), dy),
        torch.autograd.grad(y_r, (p_r, q_r), dy.double()),
    ):
        assert_same_nonfinite(name, g, g_e, g_r)
        assert torch.equal(g[5], torch.zeros_like(g[5]))  # the ignored row's NaN reaches nothing


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_tvd_ties_and_ignored_rows(path_device, reduction):
    """p == q gives gradient 0 (torch's sign(0)); every row ignored gives loss 0 and zero gradients for the
    reduced losses (the mean over no row taken as 0)."""
    p = leaf(torch.softmax(torch.randn(4, 9, device=path_device), -1))
    q = leaf(p)
    y = tvd(p, q, reduction=reduction)
    dp, dq = torch.autograd.grad(y, (p, q), torch.ones_like(y))
    assert torch.equal(dp, torch.zeros_like(dp)) and torch.equal(dq, torch.zeros_like(dq))
    r = leaf(torch.softmax(torch.randn(4, 9, device=path_device), -1))
    labels = torch.full((4,), -7, device=path_device)
    y = tvd(p, r, labels, reduction, ignore_index=-7)
    assert torch.equal(y, torch.zeros_like(y))
    dp, dr = torch.autograd.grad(y, (p, r), torch.ones_like(y))
    assert torch.equal(dp, torch.zeros_like(dp)) and torch.equal(dr, torch.zeros_like(dr))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_tvd_empty(path_device, reduction):
    p, q = leaf(torch.empty(0, 11, device=path_device)), leaf(torch.empty(0, 11, device=path_device))
    y = tvd(p, q, reduction=reduction)
    y_e = reference.tvd(leaf(p), leaf(q), reduction=reduction)
    assert y.shape == y_e.shape and torch.equal(y, y_e)
    dp, dq = torch.autograd.grad(y, (p, q), torch.ones_like(y))
    assert dp.shape == dq.shape == (0, 11)


def test_tvd_gradient_for_one_input_only():
    """q a constant (the teacher's distribution): only p gets a gradient, the same as when both do."""
    p, q = probs((7, 29), torch.float32, "cpu")
    p1, p2, q2 = leaf(p), leaf(p), leaf(q)
    (g1,) = torch.autograd.grad(tvd(p1, q), p1)
    g2, _ = torch.autograd.grad(tvd(p2, q2), (p2, q2))
    assert torch.equal(g1, g2)


def test_tvd_module():
    p, q = probs((5, 3, 17), torch.float32, "cpu")
    labels = labels_for((5, 3, 17), "cpu")
    loss = LigerTVDLoss(reduction="mean", ignore_index=-100)
    torch.testing.assert_close(loss(p, q, labels), tvd(p, q, labels, "mean"), rtol=0, atol=0)
    assert "mean" in repr(loss)
    with pytest.raises(ValueError, match="reduction"):
        LigerTVDLoss(reduction="avg")


def test_tvd_bad_input():
    p = torch.rand(4, 8)
    with pytest.raises(ValueError, match="q"):
        tvd(p, torch.rand(4, 9))
    with pytest.raises(TypeError, match="q"):
        tvd(p, p.double())
    with pytest.raises(TypeError, match="p"):
        tvd(p.long(), p.long())
    with pytest.raises(ValueError, match="reduction"):
        tvd(p, p, reduction="avg")
    with pytest.raises(TypeError, match="ignore_index"):
        tvd(p, p, ignore_index=1.5)
    with pytest.raises(ValueError, match="shift_labels"):
        tvd(p, p, torch.zeros(5, dtype=torch.long))
    with pytest.raises(TypeError, match="shift_labels"):
        tvd(p, p, torch.zeros(4))
    with pytest.raises(ValueError, match="p"):
        tvd(torch.rand(4, 0), torch.rand(4, 0))
    with pytest.raises(ValueError, match="q"):
        tvd(p, p.to("meta"))


def test_tvd_compiles_without_graph_break():
    """torch.compile(fullgraph=True) traces the op (its custom ops are opaque in the graph): the same values
    and gradients as eager."""
    torch._dynamo.reset()
    inputs = [torch.softmax(torch.randn(5, 37), -1), torch.softmax(torch.randn(5, 37), -1)]
    labels = torch.tensor([1, -100, 2, 3, 4])

    def fn(p, q):
        return tvd(p, q, labels, "mean")

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for run in (compiled, fn):
        leaves = [leaf(t) for t in inputs]
        y = run(*leaves)
        grads = torch.autograd.grad(y, leaves, torch.ones_like(y))
        if run is compiled:
            want = (y, grads)
    assert torch.equal(want[0], y) and all(torch.equal(a, b) for a, b in zip(want[1], grads))

"""cross_entropy_tvd: per-token cross-entropy and total variation distance to a teacher in one kernel, vs the
float64 reference and no worse than the eager composition (full softmaxes); Liger-Kernel's definition."""

import pytest
import torch
from helpers import assert_no_worse_than_eager, leaf, noncontiguous, use_reference_path

from liger_core import reference
from liger_core.modules import LigerFusedCETVDLoss
from liger_core.ops import cross_entropy_tvd


def make(shape, vocab, dtype, scale=2.0):
    zs = (torch.randn(*shape, vocab, dtype=torch.float64) * scale).to(dtype)
    zt = (torch.randn(*shape, vocab, dtype=torch.float64) * scale).to(dtype)
    target = torch.randint(0, vocab, shape)
    target[torch.rand(shape) < 0.25] = -100
    return zs, zt, target


def run(fn, zs, zt, target, g_ce, g_tvd, dtype=None):
    x = leaf(zs, dtype)
    ce, tvd = fn(x, zt.to(dtype or zt.dtype), target)
    (dx,) = torch.autograd.grad((ce, tvd), x, (g_ce.to(ce.dtype), g_tvd.to(tvd.dtype)))
    return ce, tvd, dx


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_float64(dtype):
    """(3, 11) rows of a 1031-entry vocabulary, strided logits, +-1e4 entries, a quarter ignored, random
    per-token gradients for both outputs."""
    zs, zt, target = make((3, 11), 1031, dtype)
    zs, zt = noncontiguous(zs), noncontiguous(zt)
    zs[0, 0, 3], zt[1, 1, 4], zs[2, 2, 5] = 1e4, 1e4, -1e4
    g_ce, g_tvd = torch.rand(3, 11, dtype=torch.float64), torch.rand(3, 11, dtype=torch.float64)
    ours = run(cross_entropy_tvd, zs, zt, target, g_ce, g_tvd)
    eager = run(reference.cross_entropy_tvd, zs, zt, target, g_ce, g_tvd)
    ref = run(reference.cross_entropy_tvd, zs, zt, target, g_ce, g_tvd, torch.float64)
    assert ours[0].dtype == ours[1].dtype == torch.float32 and ours[2].dtype == dtype
    for name, a, e, r in zip(("ce", "tvd", "grad"), ours, eager, ref):
        assert_no_worse_than_eager(name, a, e, r)
    ignored = target == -100
    assert (ours[0][ignored] == 0).all() and (ours[1][ignored] == 0).all() and (ours[2][ignored] == 0).all()


def test_liger_kernel_definition_and_one_output_used():
    """ce is F.cross_entropy's, tvd 0.5 * sum |p - q| (liger_core.ops.tvd on the softmaxes); a loss of one
    output only gives that output's gradient."""
    zs, zt, target = make((17,), 40, torch.float32)
    ce, tvd = cross_entropy_tvd(zs, zt, target)
    keep = target != -100
    want_ce = torch.nn.functional.cross_entropy(zs.double(), target, reduction="none")
    p, q = zs.double().softmax(-1), zt.double().softmax(-1)
    torch.testing.assert_close(ce.double(), want_ce, rtol=1e-6, atol=0)
    torch.testing.assert_close(
        tvd.double(), torch.where(keep, 0.5 * (p - q).abs().sum(-1), 0.0), rtol=1e-6, atol=0
    )
    for which in (0, 1):
        x = leaf(zs)
        (dx,) = torch.autograd.grad(cross_entropy_tvd(x, zt, target)[which].sum(), x)
        x64 = leaf(zs, torch.float64)
        (want,) = torch.autograd.grad(reference.cross_entropy_tvd(x64, zt.double(), target)[which].sum(), x64)
        torch.testing.assert_close(dx.double(), want, rtol=1e-6, atol=1e-9)


def test_module_reference_path_and_bad_input(monkeypatch):
    zs, zt, target = make((5,), 9, torch.float32)
    module = LigerFusedCETVDLoss()
    kernel = module(zs, zt, target)
    use_reference_path(monkeypatch)
    for a, b in zip(kernel, module(zs, zt, target)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="target"):
        cross_entropy_tvd(zs, zt, torch.full((5,), 9))
    with pytest.raises(ValueError, match="teacher_logits"):
        cross_entropy_tvd(zs, zt[:4], target)
    with pytest.raises(TypeError, match="teacher_logits"):
        cross_entropy_tvd(zs, zt.double(), target)
    with pytest.raises(ValueError, match="target"):
        cross_entropy_tvd(zs, zt, target[:3])


def test_empty_rows():
    x = leaf(torch.randn(0, 5))
    ce, tvd = cross_entropy_tvd(x, torch.randn(0, 5), torch.zeros(0, dtype=torch.long))
    (ce.sum() + tvd.sum()).backward()
    assert ce.shape == tvd.shape == (0,) and x.grad.shape == (0, 5)

"""torch.compile(fullgraph=True) through the custom ops of fused_add_rms_norm, rms_norm_no_weight, poly_norm,
dyt, group_norm and modulated_rms_norm: no graph break, and the compiled forward and backward give the eager
kernels' values."""

import pytest
import torch

from liger_core.ops import (
    dyt,
    fused_add_rms_norm,
    group_norm,
    modulated_rms_norm,
    poly_norm,
    rms_norm_no_weight,
)


def _cases():
    x = torch.randn(6, 5, 32)
    return {
        "fused_add_rms_norm": (
            lambda x, r, w: fused_add_rms_norm(x, r, w, 1e-6),
            (x, torch.randn_like(x), torch.rand(32)),
        ),
        "rms_norm_no_weight": (lambda x: rms_norm_no_weight(x, 1e-6), (x,)),
        "poly_norm": (lambda x, w, b: poly_norm(x, w, b), (x, torch.rand(3), torch.tensor(0.5))),
        "dyt": (dyt, (x, torch.tensor([0.7]), torch.rand(32), torch.randn(32))),
        "modulated_rms_norm": (
            lambda x, w, sc, sh: modulated_rms_norm(x, w, sc, sh),
            (x, torch.rand(32), torch.randn(6, 32), torch.randn(6, 32)),
        ),
        "group_norm": (
            lambda x, w, b: group_norm(x, 5, w, b),
            (x.transpose(1, 2).contiguous().transpose(1, 2)[:, :5], torch.rand(5), torch.randn(5)),
        ),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_compiled_matches_eager(name):
    torch._dynamo.reset()
    fn, args = _cases()[name]
    outs = {}
    for mode in ("eager", "compiled"):
        ins = [a.detach().clone().requires_grad_() for a in args]
        f = fn if mode == "eager" else torch.compile(fn, fullgraph=True, backend="aot_eager")
        out = f(*ins)
        out = out if isinstance(out, tuple) else (out,)
        torch.manual_seed(0)
        gs = [torch.randn_like(o) for o in out]
        outs[mode] = [o.detach() for o in out] + list(torch.autograd.grad(out, ins, gs))
    for a, b in zip(outs["eager"], outs["compiled"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

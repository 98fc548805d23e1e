"""Every op's forward + backward can be captured in a CUDA graph and replayed on new inputs.

Users capture training steps (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``), and the
benchmark suite times each op's GPU work by graph replay. A capture forbids host syncs (the CE target check
skips itself there) and freezes every launch argument, so a replay after copying new data into the captured
inputs must give what a fresh eager call on that data gives: bit for bit (same kernels, same launch plan).
"""

from __future__ import annotations

import pytest
import torch
from helpers import HAS_CUDA

from liger_core import ops

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")]

BF16 = torch.bfloat16


def _randn(*shape, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(BF16)


def _rope_inputs():
    q = _randn(2, 37, 8, 64).transpose(1, 2)  # HF layout: (B, H, T, D) view of (B, T, H, D)
    k = _randn(2, 37, 2, 64).transpose(1, 2)
    angles = torch.randn(1, 37, 32, device="cuda")
    cos = torch.cat([angles.cos()] * 2, -1).to(BF16)
    sin = torch.cat([angles.sin()] * 2, -1).to(BF16)
    return [q, k, cos, sin], [0, 1]


def _ce_inputs():
    target = torch.randint(0, 1000, (333,), device="cuda")
    target[::7] = -100
    return [_randn(333, 1000, scale=3.0), target], [0]


def _flce_inputs():
    target = torch.randint(0, 1000, (333,), device="cuda")
    target[::7] = -100
    return [_randn(333, 256), _randn(1000, 256, scale=0.05), target], [0, 1]


# name -> (inputs, indices of the differentiable inputs), function of the inputs
CASES = {
    "rms_norm": (lambda: ([_randn(333, 1000), _randn(1000)], [0, 1]), lambda x, w: ops.rms_norm(x, w, 1e-6)),
    "rms_norm_in_place": (
        lambda: ([_randn(333, 1000), _randn(1000)], [0, 1]),
        lambda x, w: ops.rms_norm(x, w, 1e-6, in_place=True),
    ),
    "layer_norm": (
        lambda: ([_randn(333, 1000), _randn(1000), _randn(1000)], [0, 1, 2]),
        lambda x, w, b: ops.layer_norm(x, w, b, 1e-5),
    ),
    "rope": (_rope_inputs, lambda q, k, c, s: ops.rope(q, k, c, s)),
    "swiglu": (lambda: ([_randn(333, 1000), _randn(333, 1000)], [0, 1]), ops.swiglu),
    "geglu": (lambda: ([_randn(333, 1000), _randn(333, 1000)], [0, 1]), ops.geglu),
    "cross_entropy": (_ce_inputs, lambda x, t: ops.cross_entropy(x, t)),
    "fused_linear_cross_entropy": (_flce_inputs, lambda h, w, t: ops.fused_linear_cross_entropy(h, w, t)),
}


def _fwd_bwd(fn, inputs, diff, grad_outputs):
    leaves = [t.requires_grad_() if i in diff else t for i, t in enumerate(inputs)]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    grads = torch.autograd.grad(outs, [leaves[i] for i in diff], grad_outputs)
    return [o.detach() for o in outs] + list(grads)


@pytest.mark.parametrize("name", list(CASES))
def test_fwd_bwd_replays_in_a_cuda_graph(name):
    make, fn = CASES[name]
    static, diff = make()
    static = [t.detach().clone() for t in static]
    with torch.no_grad():
        probe = fn(*static)
    pristine_grads = [torch.randn_like(o) for o in (probe if isinstance(probe, tuple) else (probe,))]
    # backward may write into the incoming gradient (rms_norm in_place): every call gets its own copy, and the
    # captured one is refilled before each replay
    static_grads = [g.clone() for g in pristine_grads]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (compilation, allocator)
        for _ in range(2):
            _fwd_bwd(fn, [t.clone() for t in static], diff, [g.clone() for g in pristine_grads])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _fwd_bwd(fn, [t.detach() for t in static], diff, static_grads)

    for _ in range(2):  # new data each replay, copied into the captured input buffers
        fresh, _ = make()
        with torch.no_grad():
            for buffer, value in zip(static + static_grads, fresh + pristine_grads):
                buffer.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        eager = _fwd_bwd(fn, [t.clone() for t in fresh], diff, [g.clone() for g in pristine_grads])
        for i, (got, want) in enumerate(zip(captured, eager)):
            assert got.shape == want.shape and torch.isfinite(got).all(), f"{name}: output {i}"
            if name == "fused_linear_cross_entropy":
                # its loop order depends on the memory headroom, which a graph's private pool changes: the
                # same math in another order, so equal to bf16 rounding rather than bit for bit
                torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-5)
            else:
                assert torch.equal(got, want), f"{name}: output {i} of the replay differs from the eager call"

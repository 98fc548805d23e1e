"""Shared test helpers: devices, error metrics, the "no worse than eager" assertion, strided and non-finite
inputs.

The accuracy rule (DEVELOPERS.md): each kernel output is compared with a float64 reference, and its relative
error must not exceed that of the PyTorch eager code it replaces, computed in the same dtype:

    err(kernel) <= SLACK * err(eager) + FLOOR[dtype]

SLACK = 1.25 absorbs a different (equally valid) summation order; FLOOR is a tenth of the dtype's machine
epsilon, so an eager error of exactly 0 (e.g. a pure copy) does not demand bit-equality from the kernel.
A single-number output (a mean loss) gets one spacing of the dtype at its value instead: when the exact
result lies between two representable numbers, eager may round to one neighbour and an equally exact kernel
to the other, and no summation order is "more right" than the other at that point.
"""

from __future__ import annotations

import math

import pytest
import torch

SLACK = 1.25
FLOOR = {
    torch.float32: 0.1 * 2**-23,
    torch.float16: 0.1 * 2**-10,
    torch.bfloat16: 0.1 * 2**-7,
    torch.float64: 0.0,
}

HAS_CUDA = torch.cuda.is_available()


def devices():
    """'cpu' always (Triton interpreter in CI); 'cuda' marked `gpu` and skipped where there is none."""
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param(
            "cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")]
        ),
    ]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64 (absolute norm when ref is all zeros). NaN/inf give inf."""
    # on the reference's device: float64 norms of a GPU test's 4096 x 128256 gradients take seconds on the CPU
    ref = ref.detach().to(torch.float64)
    x = x.detach().to(device=ref.device, dtype=torch.float64)
    assert x.shape == ref.shape, f"shape {tuple(x.shape)} != reference {tuple(ref.shape)}"
    if not torch.isfinite(x).all():
        return float("inf")
    num = (x - ref).norm().item()
    den = ref.norm().item()
    return num / den if den > 0 else num


def half_ulp(value: float, dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype``'s numbers at ``value``: the largest error of rounding it to ``dtype``."""
    if value == 0:
        return 0.0
    eps = torch.finfo(dtype).eps  # spacing at 1.0
    return 0.5 * eps * 2.0 ** math.floor(math.log2(abs(value)))


def assert_no_worse_than_eager(
    name: str, ours: torch.Tensor, eager: torch.Tensor, ref64: torch.Tensor, *, slack: float = SLACK
) -> tuple[float, float]:
    """Assert err(ours) <= slack * err(eager) + FLOOR, both against the float64 reference."""
    e_ours = rel_err(ours, ref64)
    e_eager = rel_err(eager, ref64)
    # inf <= 1.25 * inf would pass: a non-finite kernel output (or reference) is a failure in itself
    assert math.isfinite(e_ours), f"{name}: kernel output has NaN/inf (or the reference does): error {e_ours}"
    floor = FLOOR[ours.dtype]
    if ours.numel() == 1 and ours.dtype.is_floating_point:
        value = float(ref64.detach().reshape(()))
        if value != 0 and math.isfinite(value):
            floor = max(floor, 2 * half_ulp(value, ours.dtype) / abs(value))
    bound = slack * e_eager + floor
    assert e_ours <= bound, (
        f"{name}: kernel rel. error {e_ours:.3e} > {slack} x eager's {e_eager:.3e} + floor ({ours.dtype})"
    )
    return e_ours, e_eager


def grads(outputs: torch.Tensor, inputs: list[torch.Tensor], grad_out: torch.Tensor) -> list[torch.Tensor]:
    """Gradients of <outputs, grad_out> w.r.t. inputs (None for inputs that get none)."""
    return list(torch.autograd.grad(outputs, inputs, grad_out, allow_unused=True))


def leaf(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A detached copy (optionally cast) that requires grad."""
    return t.detach().to(dtype or t.dtype).clone().requires_grad_(True)


def noncontiguous(t: torch.Tensor) -> torch.Tensor:
    """Same values, non-contiguous layout (every other column of a twice-as-wide buffer)."""
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    wide[..., 1::2] = float("nan")  # poison: a kernel that ignores strides reads NaN
    out = wide[..., ::2]
    assert not out.is_contiguous()
    return out


def dyadic_linear_inputs(rows_shape, hidden_size, vocab, dtype, device="cpu", *, bias=False, logit_std=1.0):
    """(hidden (*rows_shape, H), weight (V, H), bias (V,) or None) of random small dyadic numbers: hidden k/8,
    weight k/16 times a power of two (logits of standard deviation ~logit_std), bias k/8. Every logit is then
    exact in fp32 from any GEMM, chunked or not (and rounded once to a 16-bit dtype), so comparing an op with
    eager measures the op's arithmetic; with Gaussian inputs both errors are dominated by the roundings of two
    different GEMMs (chunk rows vs all rows), two draws whose ratio is noise (1-3 % of fp32 runs above
    1.25)."""
    scale = 2.0 ** round(math.log2(2.7 * logit_std / hidden_size**0.5))
    hidden = (torch.randint(-8, 9, (*rows_shape, hidden_size), device=device) / 8).to(dtype)
    weight = (torch.randint(-16, 17, (vocab, hidden_size), device=device) * (scale / 16)).to(dtype)
    b = (torch.randint(-8, 9, (vocab,), device=device) / 8).to(dtype) if bias else None
    return hidden, weight, b


INF, NAN = float("inf"), float("nan")


def use_reference_path(monkeypatch) -> None:
    """Route CPU tensors to the pure-PyTorch reference path for one test (chosen on purpose: no warning)."""
    from liger_core import dispatch

    monkeypatch.setattr(dispatch, "_STATUS", "missing")
    monkeypatch.setattr(dispatch, "_warned_reference", True)


def strided(t: torch.Tensor, how: str) -> torch.Tensor:
    """t's values in a non-contiguous layout: "step2" takes every other element of the last dimension (NaN in
    between), "transposed" reverses the storage order of the dimensions (1-D: a column of a row-major matrix,
    NaN beside it), so a kernel that assumes unit or row-major strides reads the wrong elements."""
    if how == "step2":
        return noncontiguous(t)
    if t.dim() == 1:
        buf = torch.full((t.shape[0], 3), float("nan"), dtype=t.dtype, device=t.device)
        buf[:, 1] = t
        out = buf[:, 1]
    else:
        dims = list(reversed(range(t.dim())))
        out = t.permute(dims).contiguous().permute(dims)
    assert not out.is_contiguous()
    return out


def with_values_at_random(t: torch.Tensor, values: list[float]) -> torch.Tensor:
    """A copy of t with ``values`` written at distinct random positions."""
    out = t.detach().clone()
    flat = out.view(-1)
    flat[torch.randperm(flat.numel(), device=t.device)[: len(values)]] = torch.tensor(
        values, dtype=t.dtype, device=t.device
    )
    return out


def assert_same_nonfinite(name: str, ours: torch.Tensor, eager: torch.Tensor, ref64: torch.Tensor) -> None:
    """NaN, +inf and -inf exactly where torch's eager result has them; the other values no worse than eager's
    against the float64 reference."""
    for kind, where in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        assert torch.equal(where(ours), where(eager)), f"{name}: {kind} at other positions than eager's"
    finite = torch.isfinite(eager)
    assert_no_worse_than_eager(name, ours[finite], eager[finite], ref64[finite])


def assert_same_values(name: str, ours: torch.Tensor, want: torch.Tensor, rtol: float = 1e-5) -> None:
    """NaN and +-inf where ``want`` has them, and close values elsewhere."""
    ours = ours.detach().double()
    assert ours.shape == want.shape, name
    for what in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(what(ours), what(want)), f"{name}: {what.__name__} positions differ"
    finite = torch.isfinite(want)
    scale = want[finite].abs().max().item() if finite.any() else 1.0
    torch.testing.assert_close(ours[finite], want[finite], rtol=rtol, atol=1e-6 * scale)


# a and b values of a gated activation crossed (every pair once): non-finite ones, zeros of both signs, the
# activation saturated (+-200) and ordinary values
SPECIAL_A = [INF, -INF, NAN, 0.0, -0.0, 200.0, -200.0, 1.5, -1.5]
SPECIAL_B = [INF, -INF, NAN, 0.0, 1.0, -2.0]


def special_pairs(dtype: torch.dtype, device, n_random: int = 2157) -> list[torch.Tensor]:
    """(a, b) of shape (201, 11): every pair of SPECIAL_A x SPECIAL_B, then random values (enough of them for
    a stable error ratio, in many rows: a row holding a non-finite product has a non-finite output row)."""
    grid_a = torch.tensor(SPECIAL_A).repeat_interleave(len(SPECIAL_B))
    grid_b = torch.tensor(SPECIAL_B).repeat(len(SPECIAL_A))
    a = torch.cat([grid_a, torch.randn(n_random, dtype=torch.float64) * 3])
    b = torch.cat([grid_b, torch.randn(n_random, dtype=torch.float64)])
    return [t.view(-1, 11).to(device=device, dtype=dtype) for t in (a, b)]


def check_gated_strided(op, eager, shape, dtype: torch.dtype, device, how: str) -> None:
    """A gated activation ``op(a, b)`` with a, b and the incoming gradient non-contiguous (``strided(.,
    how)``): y, da and db no worse than ``eager(a, b)`` on the same views (against ``eager`` in float64), the
    gradients in the views' shapes, and the caller's a and b untouched (an in-place backward writes over the
    op's own contiguous copies)."""
    a = strided((torch.randn(shape, dtype=torch.float64, device=device) * 3).to(dtype), how)
    b = strided(torch.randn(shape, dtype=torch.float64, device=device).to(dtype), how)
    a_before, b_before = a.clone(), b.clone()
    a.requires_grad_(), b.requires_grad_()
    a_e, b_e = strided(a.detach(), how).requires_grad_(), strided(b.detach(), how).requires_grad_()
    a_r, b_r = leaf(a, torch.float64), leaf(b, torch.float64)

    y = op(a, b)
    y_e, y_r = eager(a_e, b_e), eager(a_r, b_r)
    assert y.dtype == dtype and y.shape == shape
    assert_no_worse_than_eager("y", y, y_e, y_r)

    dy = strided(torch.randn(shape, dtype=torch.float64, device=device).to(dtype), how)
    da, db = torch.autograd.grad(y, (a, b), dy)
    da_e, db_e = torch.autograd.grad(y_e, (a_e, b_e), dy)
    da_r, db_r = torch.autograd.grad(y_r, (a_r, b_r), dy.double())
    assert da.shape == db.shape == shape
    assert_no_worse_than_eager("da", da, da_e, da_r)
    assert_no_worse_than_eager("db", db, db_e, db_r)
    assert torch.equal(a.detach(), a_before) and torch.equal(b.detach(), b_before)


def check_gated_nonfinite(op, eager, dtype: torch.dtype, device) -> tuple[torch.Tensor, ...]:
    """A gated activation ``op(a, b)`` on ``special_pairs``: y, da and db NaN / +-inf exactly where
    ``eager(a, b)`` and its autograd give them, and no worse than eager elsewhere. Returns (a, b, eager's
    y), detached."""
    a, b = special_pairs(dtype, device)
    a_e, b_e, a_r, b_r = leaf(a), leaf(b), leaf(a, torch.float64), leaf(b, torch.float64)
    a, b = leaf(a), leaf(b)
    y, y_e, y_r = op(a, b), eager(a_e, b_e), eager(a_r, b_r)
    assert_same_nonfinite("y", y, y_e, y_r)
    dy = torch.randn(a.shape, dtype=torch.float64, device=a.device).to(dtype)
    for name, g, g_e, g_r in zip(
        ("da", "db"),
        torch.autograd.grad(y, (a, b), dy),
        torch.autograd.grad(y_e, (a_e, b_e), dy),
        torch.autograd.grad(y_r, (a_r, b_r), dy.double()),
    ):
        assert_same_nonfinite(name, g, g_e, g_r)
    return a.detach(), b.detach(), y_e.detach()


def check_gated_empty(op, eager, shape, device) -> None:
    """A gated activation ``op(a, b)`` on 0 rows: the same empty y, da and db as ``eager(a, b)``."""
    a, b = leaf(torch.randn(shape, device=device)), leaf(torch.randn(shape, device=device))
    a_e, b_e = leaf(a), leaf(b)
    y, y_e = op(a * 1, b * 1), eager(a_e, b_e)
    assert y.dtype == y_e.dtype and y.shape == y_e.shape == shape
    dy = torch.randn(shape, device=device)
    for g, g_e in zip(torch.autograd.grad(y, (a, b), dy), torch.autograd.grad(y_e, (a_e, b_e), dy)):
        assert g.dtype == g_e.dtype and torch.equal(g, g_e)

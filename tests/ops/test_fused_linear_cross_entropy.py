import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    SLACK,
    assert_no_worse_than_eager,
    assert_same_values,
    devices,
    dyadic_linear_inputs,
    leaf,
    noncontiguous,
    rel_err,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from liger_core import reference, tuning
from liger_core.modules import LigerFusedLinearCrossEntropyLoss
from liger_core.ops import fused_linear_cross_entropy
from liger_core.ops._ce_kernel import resident_kernel_runs
from liger_core.ops._chunked_linear import LinearLossArgs, _chunk_loop, choose_chunk_tokens
from liger_core.ops._flce_two_pass import _two_pass_loop, two_pass_sizes, vocab_slice_columns

IGNORE = -100
HALF_ULP = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-9}


# per reduction, a different mix of options (keeps the CPU interpreter time down while covering each option)
OPTIONS = {
    # (no bias with "mean": a bias turns the two-pass loop's kept chunk off, and smoothing with class weights
    # is checked there too)
    "mean": dict(label_smoothing=0.1, weighted=True, bias=False),
    "sum": dict(lse_square_scale=1e-3, softcap=30.0, bias=False),
    "none": dict(label_smoothing=0.05, weighted=True, lse_square_scale=1e-3, softcap=20.0, bias=True),
}


def _inputs(device, dtype, n, hidden_size, vocab, *, bias=False, weighted=False, ignore_every=6, exact=False):
    """Gaussian inputs, or (``exact``) dyadic ones whose logits are exact from any GEMM (helpers)."""
    if exact:
        hidden, weight, b = dyadic_linear_inputs(
            (n,), hidden_size, vocab, dtype, device, bias=bias, logit_std=hidden_size**0.25
        )
    else:
        hidden = torch.randn(n, hidden_size, dtype=torch.float64, device=device).to(dtype)
        weight = (torch.randn(vocab, hidden_size, dtype=torch.float64, device=device) / hidden_size**0.25).to(
            dtype
        )
        b = torch.randn(vocab, dtype=torch.float64, device=device).to(dtype) if bias else None
    target = torch.randint(0, vocab, (n,), device=device)
    if ignore_every:
        target[torch.randperm(n, device=device)[: n // ignore_every]] = IGNORE
    ce_weight = (torch.rand(vocab, dtype=torch.float64, device=device) + 0.5).to(dtype) if weighted else None
    return hidden, weight, b, target, ce_weight


def _three_ways(hidden, weight, bias, target, grad_out, ours_kwargs, **opts):
    """[loss, z_loss, dhidden, dweight, dbias] from the op, the eager composition (same dtype), float64."""
    out = []
    for kind in ("ours", "eager", "ref64"):
        dtype = torch.float64 if kind == "ref64" else hidden.dtype
        h, w = leaf(hidden, dtype), leaf(weight, dtype)
        b = leaf(bias, dtype) if bias is not None else None
        kw = dict(opts)
        if kw.get("ce_weight") is not None:
            kw["ce_weight"] = kw["ce_weight"].to(dtype)
        if kind == "ours":
            loss, z = fused_linear_cross_entropy(h, w, target, b, return_z_loss=True, **kw, **ours_kwargs)
        else:
            loss, z = reference.fused_linear_cross_entropy(h, w, target, b, return_z_loss=True, **kw)
        grads = torch.autograd.grad(loss, [h, w] + ([b] if b is not None else []), grad_out.to(loss.dtype))
        out.append([loss, z, *grads])
    return out


def assert_loss_no_worse(name, ours, eager, ref64, half_ulps=1):
    """A scalar's error is mostly its final rounding (a lottery eager can win by luck): a scalar loss may
    exceed SLACK x eager's error by that unavoidable relative half ulp (``half_ulps`` of them), no more."""
    if ours.dim() > 0:
        assert_no_worse_than_eager(name, ours, eager, ref64)
        return
    e_ours, e_eager = rel_err(ours, ref64), rel_err(eager, ref64)
    bound = SLACK * e_eager + half_ulps * HALF_ULP[ours.dtype]
    assert e_ours <= bound, f"{name}: {e_ours:.3e} vs eager's {e_eager:.3e}"


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("order", ["vocab", "token"])
def test_flce_matches_float64(device, dtype, reduction, order, poison_empty):
    """Loss and d(hidden, weight, bias) against float64, several vocabulary slices (the default two-pass
    order) or token chunks (``chunk_size``), grad_output != 1; bf16 with accum_dtype=fp32 (the stored bf16
    gradients would otherwise round a second time when scaled by grad_output; grad_output 1 has its own test).
    Exact logits: with Gaussian inputs the scalar losses' errors in fp32 are two draws of GEMM roundings (the
    op's chunk rows vs eager's all rows; a CI run: z_loss 8.7e-8 vs eager's lucky 2.1e-8)."""
    opts = dict(OPTIONS[reduction])
    # CPU: H < n, so the two-pass loop keeps H (fp32) or 2H (bf16 into an fp32 dW) tokens and chunks the rest
    n, hidden_size, vocab = (37, 15, 131) if device == "cpu" else (2048, 4096, 128256)
    hidden, weight, bias, target, ce_weight = _inputs(
        device,
        dtype,
        n,
        hidden_size,
        vocab,
        bias=opts.pop("bias"),
        weighted=opts.pop("weighted", False),
        exact=True,
    )
    grad_out = torch.randn(n, device=device) if reduction == "none" else torch.tensor(3.7, device=device)
    if order == "token":
        ours_kwargs = dict(chunk_size=10 if device == "cpu" else 512)
    else:
        elt = hidden.element_size()
        budget = n * (40 if device == "cpu" else 16384) * elt
        assert vocab_slice_columns(n, vocab, elt, budget, hidden.device) < vocab  # several slices
        ours_kwargs = dict(max_chunk_bytes=budget)
    if dtype == torch.bfloat16:
        ours_kwargs["accum_dtype"] = torch.float32
    ours, eager, ref = _three_ways(
        hidden, weight, bias, target, grad_out, ours_kwargs, reduction=reduction, ce_weight=ce_weight, **opts
    )
    assert ours[0].dtype == torch.float32 and ours[0].shape == ref[0].shape
    assert_loss_no_worse("loss", ours[0], eager[0], ref[0])
    assert_loss_no_worse("z_loss", ours[1], eager[1], ref[1])
    # The logits are exact before their one rounding (dyadic inputs), so the loss arithmetic alone is
    # compared too, against float64 on those rounded logits. Against float64 logits the logits' own rounding
    # dominates both errors, and a GEMM that rounds twice only sometimes shows there (H100:
    # cuBLAS's beta path for a per-class bias, 7 % of the logits one ulp off: 50-175x eager's error here).
    # Here the two sums' own final roundings may land one fp32 ulp apart (H100: a sum of 40000 one ulp off
    # where eager's was correctly rounded): two half ulps.
    logits_rounded = F.linear(hidden, weight, bias).double()
    weight_64 = ce_weight.double() if ce_weight is not None else None
    ref_rounded = reference.cross_entropy(
        logits_rounded, target, weight_64, reduction=reduction, return_z_loss=True, **opts
    )
    assert_loss_no_worse("loss vs the rounded logits", ours[0], eager[0], ref_rounded[0], half_ulps=2)
    assert_loss_no_worse("z_loss vs the rounded logits", ours[1], eager[1], ref_rounded[1], half_ulps=2)
    for name, i in (("dhidden", 2), ("dweight", 3), ("dbias", 4)):
        if i < len(ours):
            assert ours[i].dtype == dtype
            assert_no_worse_than_eager(name, ours[i], eager[i], ref[i])


@pytest.mark.parametrize("order", ["vocab", "token"])
def test_flce_bf16_default_accumulation(order, poison_empty):
    """accum_dtype=None, grad_output 1 (loss.backward()): in the default two-pass order every gradient is at
    eager's accuracy (dW one GEMM over all tokens per slice, dh one GEMM over all classes per chunk, each
    rounded once), over several slices (the default budget); the token-major order (``chunk_size``) keeps dW
    in bf16, one rounding per chunk (documented: up to sqrt(chunks) x eager's error)."""
    n, hidden_size, vocab = 37, 67, 131
    hidden, weight, bias, target, _ = _inputs("cpu", torch.bfloat16, n, hidden_size, vocab, bias=True)
    if order == "vocab":
        _, cols = two_pass_sizes(n, hidden_size, vocab, torch.bfloat16, hidden.device, None, 0)
        assert cols < vocab
        ours_kwargs, dweight_slack = {}, SLACK
    else:
        ours_kwargs, dweight_slack = dict(chunk_size=13), SLACK * math.sqrt(3)
    ours, eager, ref = _three_ways(hidden, weight, bias, target, torch.tensor(1.0), ours_kwargs)
    assert_loss_no_worse("loss", ours[0], eager[0], ref[0])
    assert_no_worse_than_eager("dhidden", ours[2], eager[2], ref[2])
    assert_no_worse_than_eager("dbias", ours[4], eager[4], ref[4])
    assert_no_worse_than_eager("dweight", ours[3], eager[3], ref[3], slack=dweight_slack)


def _divided_three_ways(hidden, weight, bias, target, denominator, **ours_kwargs):
    """[loss, dhidden, dweight, dbias] of sum / denominator: the op (``denominator=``), Hugging Face's eager
    composition (sum, then divided), and float64."""
    out = []
    for kind in ("ours", "eager", "ref64"):
        dtype = torch.float64 if kind == "ref64" else hidden.dtype
        h, w = leaf(hidden, dtype), leaf(weight, dtype)
        b = leaf(bias, dtype) if bias is not None else None
        if kind != "ours":
            loss = reference.fused_linear_cross_entropy(
                h, w, target, b, reduction="sum", denominator=denominator
            )
        else:
            loss = fused_linear_cross_entropy(
                h, w, target, b, reduction="sum", denominator=denominator, **ours_kwargs
            )
        loss.backward()
        out.append([loss, h.grad, w.grad, b.grad if b is not None else None])
    return out


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("order", ["default", "token"])
@pytest.mark.parametrize("as_tensor", [True, False], ids=["tensor", "number"])
def test_flce_denominator_rounds_gradients_once(device, order, as_tensor, poison_empty):
    """bf16, default accumulation, loss.backward(): the sum divided by a denominator (HF's
    num_items_in_batch: the kept tokens of all micro-batches, not a power of two) inside the op is at eager's
    accuracy in the loss and every gradient. In the token-major order (``chunk_size``) dW keeps its documented
    per-chunk rounding (sqrt(chunks) x); dh and db are each rounded once there too."""
    # CPU: H < n, so the two-pass loop keeps H tokens (bf16 logits in the bf16 dW) and chunks the rest
    n, hidden_size, vocab = (37, 15, 131) if device == "cpu" else (2048, 4096, 128256)
    hidden, weight, bias, target, _ = _inputs(
        device, torch.bfloat16, n, hidden_size, vocab, bias=True, exact=True
    )
    kept = int((target != IGNORE).sum())
    denominator = 3 * kept + int(torch.randint(1, 2 * kept, ()))  # other micro-batches' tokens too
    denominator = torch.tensor(denominator, device=device) if as_tensor else denominator
    ours_kwargs = dict(chunk_size=13 if device == "cpu" else 512) if order == "token" else {}
    ours, eager, ref = _divided_three_ways(hidden, weight, bias, target, denominator, **ours_kwargs)
    assert ours[0].dtype == torch.float32 and ours[0].shape == ()
    assert_loss_no_worse("loss", ours[0], eager[0], ref[0])
    chunks = math.ceil(n / ours_kwargs["chunk_size"]) if order == "token" else 1
    for name, i, slack in (
        ("dhidden", 1, SLACK),
        ("dweight", 2, SLACK * math.sqrt(chunks)),
        ("dbias", 3, SLACK),
    ):
        assert ours[i].dtype == torch.bfloat16
        assert_no_worse_than_eager(name, ours[i], eager[i], ref[i], slack=slack)


def test_flce_denominator_beats_dividing_afterwards():
    """The division inside the op, not of the returned sum: dividing afterwards scales the stored bf16
    gradients in backward and rounds them again (1.1-1.4 x eager's error at this shape, logits of standard
    deviation 1; the fold is at eager's error). Summed over four draws, so the comparison is not one draw's
    luck."""
    totals = {"inside": [0.0, 0.0], "after": [0.0, 0.0]}
    for _ in range(4):
        hidden, _, _, target, _ = _inputs("cpu", torch.bfloat16, 37, 67, 1031)
        weight = (torch.randn(1031, 67, dtype=torch.float64) / 67**0.5).bfloat16()  # logits of std 1
        denominator = torch.tensor(4 * int((target != IGNORE).sum()) + 3)
        ref = _divided_three_ways(hidden, weight, None, target, denominator)[2]
        for how in totals:
            h, w = leaf(hidden), leaf(weight)
            if how == "inside":
                loss = fused_linear_cross_entropy(h, w, target, reduction="sum", denominator=denominator)
            else:
                loss = fused_linear_cross_entropy(h, w, target, reduction="sum") / denominator
            loss.backward()
            totals[how][0] += rel_err(h.grad, ref[1])
            totals[how][1] += rel_err(w.grad, ref[2])
    for i, name in enumerate(("dhidden", "dweight")):
        assert totals["inside"][i] < 0.97 * totals["after"][i], (name, totals)  # 0.81-0.90 seen


def test_flce_denominator_zero_and_bad_values():
    """A denominator of 0 (nothing kept anywhere) gives loss 0 and zero gradients (a documented departure:
    Hugging Face's division gives NaN); negative or non-finite numbers, other reductions and non-scalar
    tensors are refused, naming the argument."""
    hidden, weight, bias, target, _ = _inputs("cpu", torch.float32, 13, 67, 131, bias=True)
    h, w = leaf(hidden), leaf(weight)
    loss = fused_linear_cross_entropy(
        h, w, target, reduction="sum", denominator=torch.tensor(0), chunk_size=5
    )
    loss.backward()
    assert torch.equal(loss, torch.zeros_like(loss))
    assert torch.equal(h.grad, torch.zeros_like(h)) and torch.equal(w.grad, torch.zeros_like(w))
    loss = fused_linear_cross_entropy(hidden, weight, target, reduction="sum", denominator=0)
    assert torch.equal(loss, torch.zeros_like(loss))
    for bad in (-2.0, math.inf, math.nan, True, "12"):
        with pytest.raises(ValueError, match="denominator"):
            fused_linear_cross_entropy(hidden, weight, target, reduction="sum", denominator=bad)
    with pytest.raises(ValueError, match="denominator"):
        fused_linear_cross_entropy(hidden, weight, target, reduction="sum", denominator=torch.ones(2))
    with pytest.raises(ValueError, match="denominator.*reduction"):
        fused_linear_cross_entropy(hidden, weight, target, denominator=10)
    module = LigerFusedLinearCrossEntropyLoss(reduction="sum")
    torch.testing.assert_close(
        module(weight, hidden, target, denominator=7.0),
        fused_linear_cross_entropy(hidden, weight, target, reduction="sum") / 7.0,
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunking", [dict(chunk_size=5), dict(max_chunk_bytes=13 * 40 * 4), dict()])
def test_flce_empty_and_all_ignored_as_torch(path, reduction, chunking):
    """No tokens, or every target ignored: torch's values of the eager composition (mean: NaN, 0 / 0; sum: 0;
    none: zeros), the z-loss reduced the same way, zero gradients; in each loop, on both paths."""
    for n in (0, 13):
        hidden, weight, bias, _, ce_weight = _inputs(
            "cpu", torch.float32, n, 67, 131, bias=True, weighted=True
        )
        target = torch.full((n,), IGNORE)
        h, w, b = leaf(hidden), leaf(weight), leaf(bias)
        opts = dict(reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-2, ce_weight=ce_weight)
        loss, z = fused_linear_cross_entropy(h, w, target, b, return_z_loss=True, **opts, **chunking)
        (loss * 2.0).sum().backward()
        logits = F.linear(hidden.double(), weight.double(), bias.double())
        want = F.cross_entropy(logits, target, ce_weight.double(), reduction=reduction, label_smoothing=0.1)
        want_z = {"mean": torch.tensor(float("nan")), "sum": torch.tensor(0.0), "none": torch.zeros(n)}
        assert loss.dtype == z.dtype == torch.float32
        assert_same_values("loss", loss, want)
        assert_same_values("z_loss", z, want_z[reduction].double())
        for g in (h.grad, w.grad, b.grad):
            assert torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize("case", ["neg_inf_weight", "non_finite_hidden"])
@pytest.mark.parametrize("chunking", [dict(chunk_size=5), dict(max_chunk_bytes=13 * 40 * 4)])
@pytest.mark.parametrize(
    "opts", [dict(), dict(label_smoothing=0.1, lse_square_scale=1e-3)], ids=["plain", "smooth"]
)
def test_flce_non_finite_as_torch(path, case, chunking, opts):
    """fp32 inputs holding -inf, +inf and NaN: the loss (per token) and every gradient have NaN and +-inf
    exactly where the eager composition's (float64) have them, and its values elsewhere. ``neg_inf_weight``:
    a -inf weight entry makes class 0's logit -inf in every row (the target of some rows, and the row's first
    logit: the smoothing sum's shift); ``non_finite_hidden``: NaN and +inf hidden entries make rows of NaN
    and +-inf logits (each such row's gradient NaN, and so all of dW). bf16 takes the same branches."""
    n, hidden_size, vocab = 13, 23, 131
    hidden, weight, bias, target, _ = _inputs("cpu", torch.float32, n, hidden_size, vocab, bias=True)
    hidden[:, 0] = torch.rand(n) + 0.5  # positive: weight[:, 0] * hidden[:, 0] keeps its sign
    target[[1, 4]] = 0
    if case == "neg_inf_weight":
        weight[0, 0] = -float("inf")
    else:
        hidden[2, 3] = float("nan")
        hidden[5, 7] = float("inf")
        target[[2, 5]] = 9  # kept rows (an ignored row's NaN hidden state would still make dW NaN: 0 * NaN)
    grad_out = torch.randn(n)
    h, w, b = leaf(hidden), leaf(weight), leaf(bias)
    loss = fused_linear_cross_entropy(h, w, target, b, reduction="none", **opts, **chunking)
    loss.backward(grad_out)
    h64, w64, b64 = leaf(hidden, torch.float64), leaf(weight, torch.float64), leaf(bias, torch.float64)
    logits = F.linear(h64, w64, b64)
    want = F.cross_entropy(logits, target, reduction="none", label_smoothing=opts.get("label_smoothing", 0.0))
    if opts.get("lse_square_scale"):
        want = want + (opts["lse_square_scale"] * torch.logsumexp(logits, -1).square()).masked_fill(
            target == IGNORE, 0.0
        )
    want.backward(grad_out.double())
    assert_same_values("loss", loss, want.detach())
    for name, g, g64 in (
        ("dhidden", h.grad, h64.grad),
        ("dweight", w.grad, w64.grad),
        ("dbias", b.grad, b64.grad),
    ):
        assert_same_values(name, g, g64)
    # the scalar reductions of the same rows: torch's inf or NaN
    total = fused_linear_cross_entropy(hidden, weight, target, bias, reduction="sum", **opts, **chunking)
    assert_same_values("sum", total, want.detach().sum())


def _strided(t, junk=float("nan")):
    """Same values, every other element of a twice-as-long buffer whose other elements are ``junk``."""
    wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), junk, dtype=t.dtype)
    wide[..., ::2] = t.detach()
    return wide[..., ::2]


@pytest.mark.parametrize("chunking", [dict(chunk_size=5), dict(max_chunk_bytes=13 * 40 * 4), dict()])
def test_flce_strided_arguments(path, chunking):
    """hidden, weight, bias, target, class weights and the per-token grad_output as non-contiguous views
    (gaps poisoned: NaN, out-of-range targets; weight also in the transposed (H, V) storage), forward and
    backward: the values of contiguous inputs."""
    hidden, weight, bias, target, ce_weight = _inputs(
        "cpu", torch.float32, 3 * 7, 23, 131, bias=True, weighted=True
    )
    hidden, target = hidden.view(3, 7, 23), target.view(3, 7)
    grad_out = torch.randn(3, 7)
    opts = dict(reduction="none", label_smoothing=0.1, lse_square_scale=1e-3)
    h, w, b = leaf(hidden), leaf(weight), leaf(bias)
    want = fused_linear_cross_entropy(h, w, target, b, ce_weight=ce_weight, **opts, **chunking)
    want_grads = torch.autograd.grad(want, (h, w, b), grad_out)
    for weight_layout in ("strided", "transposed"):
        h_s, b_s = _strided(hidden).requires_grad_(), _strided(bias).requires_grad_()
        if weight_layout == "strided":
            w_s = _strided(weight).requires_grad_()
        else:
            w_s = weight.t().contiguous().t().requires_grad_()
        assert not (h_s.is_contiguous() or w_s.is_contiguous() or b_s.is_contiguous())
        loss = fused_linear_cross_entropy(
            h_s, w_s, _strided(target, 10**6), b_s, ce_weight=_strided(ce_weight), **opts, **chunking
        )
        grads = torch.autograd.grad(loss, (h_s, w_s, b_s), _strided(grad_out))
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
        for g, g_want in zip(grads, want_grads):
            torch.testing.assert_close(g, g_want, rtol=1e-5, atol=1e-6)
    # a scalar reduction, no gradient wanted for hidden (frozen) but for weight
    w_s = _strided(weight).requires_grad_()
    got = fused_linear_cross_entropy(_strided(hidden), w_s, _strided(target, 10**6), **chunking)
    torch.testing.assert_close(got, fused_linear_cross_entropy(hidden, weight, target, **chunking))


def test_flce_tied_weights_noncontiguous_hidden():
    """lm_head weight shared with the input embedding (gradients add up), hidden (B, T, H) non-contiguous."""
    batch, seq, hidden_size, vocab = 3, 9, 67, 131
    ids = torch.randint(0, vocab, (batch, seq))
    weight64 = torch.randn(vocab, hidden_size, dtype=torch.float64) / 4
    mix64 = torch.randn(hidden_size, hidden_size, dtype=torch.float64) / 8
    target = torch.randint(0, vocab, (batch, seq))
    target[0, :3] = IGNORE
    results = []
    for kind, dtype in (("ours", torch.float32), ("eager", torch.float32), ("ref64", torch.float64)):
        weight = leaf(weight64.to(torch.float32), dtype)
        hidden = F.embedding(ids, weight) @ mix64.to(torch.float32).to(dtype)
        hidden = noncontiguous(hidden) if kind == "ours" else hidden
        fn = fused_linear_cross_entropy if kind == "ours" else reference.fused_linear_cross_entropy
        kwargs = dict(chunk_size=8) if kind == "ours" else {}
        loss = fn(hidden, weight, target, reduction="sum", **kwargs)
        (loss * 0.5).backward()
        results.append((loss, weight.grad))
    (loss, dw), (loss_e, dw_e), (loss_r, dw_r) = results
    assert_loss_no_worse("loss", loss, loss_e, loss_r)
    assert_no_worse_than_eager("dweight (embedding + lm_head)", dw, dw_e, dw_r)


def test_flce_frozen_weight_and_frozen_hidden():
    """Only the gradients asked for are computed (a frozen lm_head, as with LoRA, skips the dW GEMMs)."""
    hidden, weight, _, target, _ = _inputs("cpu", torch.float32, 13, 67, 131)
    h_ref, w_ref = leaf(hidden, torch.float64), leaf(weight, torch.float64)
    reference.fused_linear_cross_entropy(h_ref, w_ref, target).backward()

    h, w = leaf(hidden), weight.clone()
    fused_linear_cross_entropy(h, w, target, chunk_size=5).backward()
    assert w.grad is None
    torch.testing.assert_close(h.grad.double(), h_ref.grad, rtol=1e-5, atol=1e-7)

    h, w = hidden.clone(), leaf(weight)
    fused_linear_cross_entropy(h, w, target, chunk_size=5).backward()
    assert h.grad is None
    torch.testing.assert_close(w.grad.double(), w_ref.grad, rtol=1e-5, atol=1e-7)


class _RecordShapes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.shapes, self.nbytes = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.shapes += [tuple(t.shape) for t in tensors]
        self.nbytes += [t.numel() * t.element_size() for t in tensors]
        return out


def test_flce_never_materialises_the_logits():
    """Every tensor the chunk loop creates (forward and the reduction="none" backward recompute) has at most
    one chunk of logits; and the public op with that chunk size gives the reference loss."""
    n, hidden_size, vocab, chunk = 37, 23, 1031, 8  # H < n: dW (V, H) is smaller than (n, V)
    hidden, weight, bias, target, _ = _inputs("cpu", torch.float32, n, hidden_size, vocab, bias=True)
    options = (IGNORE, "sum", 0.1, 1e-3, 30.0)
    for row_scale in (None, torch.randn(n)):
        with _RecordShapes() as rec:
            args = LinearLossArgs(hidden, weight, target, bias, None, *options, True, True, True, None)
            _chunk_loop(args, chunk, row_scale)
        # (the interpreter also copies buffers as raw bytes: counting bytes covers those)
        assert rec.nbytes and max(rec.nbytes) <= 4 * max(chunk * vocab, vocab * hidden_size) < 4 * n * vocab
        assert (n, vocab) not in rec.shapes
        assert sum(s == (chunk, vocab) for s in rec.shapes) >= 1  # the chunk buffer was made
    loss = fused_linear_cross_entropy(hidden, weight, target, bias, chunk_size=chunk)
    torch.testing.assert_close(
        loss.double(),
        reference.fused_linear_cross_entropy(hidden.double(), weight.double(), target, bias.double()),
    )


def test_flce_two_pass_order_never_materialises_the_logits():
    """The two-pass loop's tensors: grad_weight's storage, which holds pass 1's token chunks (rest, V) and,
    without a bias, the kept chunk (V, kept) of H tokens (fp32 logits in an fp32 dW), one slice of logits (n,
    V_s), the (n, H) gradient and the fp64 products for fp32 inputs; never (n, V) in either layout. With a
    bias there is no kept chunk: every token goes through chunks of at most H tokens."""
    n, hidden_size, vocab = 37, 23, 1031
    hidden, weight, bias, target, _ = _inputs("cpu", torch.float32, n, hidden_size, vocab, bias=True)
    options = (IGNORE, "sum", 0.1, 1e-3, 30.0)
    budget = 8 * vocab * 4  # the logits of 8 tokens
    _, cols = two_pass_sizes(n, hidden_size, vocab, torch.float32, hidden.device, budget, 0)
    assert cols == vocab_slice_columns(n, vocab, 4, budget, hidden.device)
    assert -(-vocab // cols) > 1 and n * cols * 4 <= budget  # several slices within the budget
    kept, rest = hidden_size, n - hidden_size  # storage for V x H fp32 holds H tokens of fp32 logits
    for b in (None, bias):
        for row_scale in (None, torch.randn(n)):
            with _RecordShapes() as rec:
                args = LinearLossArgs(hidden, weight, target, b, None, *options, True, True, True, None)
                _two_pass_loop(args, budget, row_scale)
            assert rec.nbytes and max(rec.nbytes) <= 8 * max(n * cols, vocab * hidden_size, n * hidden_size)
            assert (n, vocab) not in rec.shapes and (vocab, n) not in rec.shapes
            assert (n, cols) in rec.shapes
            if b is None:
                assert (rest, vocab) in rec.shapes and (vocab, kept) in rec.shapes
            else:  # 37 tokens in two chunks of at most H = 23 ((V, H) is grad_weight itself here)
                assert (19, vocab) in rec.shapes and (18, vocab) in rec.shapes
                assert (rest, vocab) not in rec.shapes
        loss = fused_linear_cross_entropy(hidden, weight, target, b, max_chunk_bytes=budget)
        torch.testing.assert_close(
            loss.double(),
            reference.fused_linear_cross_entropy(
                hidden.double(), weight.double(), target, b.double() if b is not None else None
            ),
        )


def test_flce_no_grad_matches_and_returns_z_loss():
    hidden, weight, _, target, _ = _inputs("cpu", torch.float32, 13, 67, 131)
    h, w = leaf(hidden), leaf(weight)
    loss, z = fused_linear_cross_entropy(
        h, w, target, lse_square_scale=1e-2, return_z_loss=True, chunk_size=5
    )
    with torch.no_grad():
        loss_ng, z_ng = fused_linear_cross_entropy(h, w, target, lse_square_scale=1e-2, return_z_loss=True)
    assert not loss_ng.requires_grad and not z.requires_grad
    torch.testing.assert_close(loss_ng, loss)
    torch.testing.assert_close(z_ng, z)
    assert 0 < z.item() < loss.item()


def test_flce_autocast_casts_like_linear():
    """Under CPU autocast (bf16) with fp32 parameters the GEMMs run in bf16, as F.linear's would, and the
    gradients come back in the parameters' dtype."""
    hidden, weight, _, target, _ = _inputs("cpu", torch.float32, 13, 67, 131)
    h, w = leaf(hidden), leaf(weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = fused_linear_cross_entropy(h, w, target, chunk_size=5)
    loss.backward()
    assert loss.dtype == torch.float32 and h.grad.dtype == w.grad.dtype == torch.float32
    h_ref, w_ref = leaf(hidden.bfloat16(), torch.float64), leaf(weight.bfloat16(), torch.float64)
    reference.fused_linear_cross_entropy(h_ref, w_ref, target).backward()
    torch.testing.assert_close(
        loss.double(), reference.fused_linear_cross_entropy(h_ref, w_ref, target), rtol=1e-2, atol=1e-2
    )
    torch.testing.assert_close(w.grad.double(), w_ref.grad, rtol=3e-2, atol=3e-3)


def test_flce_bad_input():
    hidden, weight, bias, target, _ = _inputs("cpu", torch.float32, 6, 67, 131, bias=True)
    bad = target.clone()
    bad[1] = 131
    with pytest.raises(ValueError, match="target"):
        fused_linear_cross_entropy(hidden, weight, bad)
    bad[1] = -3
    with pytest.raises(ValueError, match="target"):
        fused_linear_cross_entropy(hidden, weight, bad)
    with pytest.raises(ValueError, match="target"):
        fused_linear_cross_entropy(hidden, weight, target[:5])
    with pytest.raises(ValueError, match="weight"):
        fused_linear_cross_entropy(hidden, weight[:, :66], target)
    with pytest.raises(TypeError, match="weight"):
        fused_linear_cross_entropy(hidden, weight.double(), target)
    with pytest.raises(ValueError, match="bias"):
        fused_linear_cross_entropy(hidden, weight, target, bias[:130])
    with pytest.raises(ValueError, match="ce_weight"):
        fused_linear_cross_entropy(hidden, weight, target, ce_weight=torch.rand(3))
    with pytest.raises(ValueError, match="chunk_size"):
        fused_linear_cross_entropy(hidden, weight, target, chunk_size=0)
    with pytest.raises(ValueError, match="reduction"):
        fused_linear_cross_entropy(hidden, weight, target, reduction="batchmean")


def test_flce_max_chunk_bytes_and_check_targets_false():
    """max_chunk_bytes bounds one chunk's logits (balanced chunks); check_targets=False skips the check."""
    n, hidden_size, vocab = 37, 67, 131
    assert (
        choose_chunk_tokens(n, hidden_size, vocab, torch.float32, torch.device("cpu"), None, 10 * vocab * 4)
        == 10
    )
    hidden, weight, _, target, _ = _inputs("cpu", torch.float32, n, hidden_size, vocab)
    ref = reference.fused_linear_cross_entropy(hidden.double(), weight.double(), target)
    loss = fused_linear_cross_entropy(
        hidden, weight, target, max_chunk_bytes=10 * vocab * 4, check_targets=False
    )
    torch.testing.assert_close(loss.double(), ref)
    with pytest.raises(ValueError, match="max_chunk_bytes"):
        fused_linear_cross_entropy(hidden, weight, target, max_chunk_bytes=0)
    module = LigerFusedLinearCrossEntropyLoss(max_chunk_bytes=10 * vocab * 4)
    torch.testing.assert_close(module(weight, hidden, target), loss)


def test_flce_module():
    hidden, weight, bias, target, ce_weight = _inputs(
        "cpu", torch.float32, 13, 67, 131, bias=True, weighted=True
    )
    module = LigerFusedLinearCrossEntropyLoss(ce_weight=ce_weight, label_smoothing=0.1, reduction="sum")
    loss = module(weight, hidden, target, bias)
    torch.testing.assert_close(
        loss,
        fused_linear_cross_entropy(
            hidden, weight, target, bias, reduction="sum", label_smoothing=0.1, ce_weight=ce_weight
        ),
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_flce_peak_memory_cuda():
    """8192 tokens, H 4096, V 128256, bf16: peak extra memory over fwd+bwd <= the two gradients + one
    vocabulary slice of logits (+ 16 MiB for small buffers), below 1.10 GiB (issue 7's goal; Liger-Kernel
    1.102 GiB); the (BT, V) logits would be 2 GiB, pass 1's chunks take grad_weight's memory before it
    exists."""
    n, hidden_size, vocab = 8192, 4096, 128256
    h = (torch.randn(n, hidden_size, device="cuda") * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden_size, device="cuda") * 0.02).bfloat16().requires_grad_()
    target = torch.randint(0, vocab, (n,), device="cuda")
    fused_linear_cross_entropy(h, w, target).backward()  # warm-up (kernel compile, cuBLAS handles)
    h.grad = w.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    grads = (n * hidden_size + vocab * hidden_size) * 2
    _, cols = two_pass_sizes(n, hidden_size, vocab, torch.bfloat16, h.device, None, grads)
    fused_linear_cross_entropy(h, w, target).backward()
    torch.cuda.synchronize()
    peak_extra = torch.cuda.max_memory_allocated() - base
    budget = grads + n * cols * 2 + 16 * 2**20
    assert peak_extra <= budget, f"peak extra {peak_extra / 2**30:.3f} GiB > {budget / 2**30:.3f} GiB"
    assert peak_extra <= 1.10 * 2**30


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.gpu
def test_flce_memory_queries_leave_no_reference_cycles_cuda():
    """The loss asks the allocator for its headroom on every call; ``torch.cuda.memory_allocated`` and friends
    leave a reference cycle of thousands of objects per call (a closure over the flattened statistics), which
    made Python run full collections (285 ms pauses) inside training steps. The loss's queries leave none."""
    import gc

    hidden, weight, _, target, _ = _inputs("cuda", torch.bfloat16, 256, 128, 1000)
    h, w = leaf(hidden), leaf(weight)
    fused_linear_cross_entropy(h, w, target).backward()  # warm-up: compilation and caches
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        h, w = leaf(hidden), leaf(weight)
        fused_linear_cross_entropy(h, w, target).backward()
        gc.collect()
        from_memory_stats = [o for o in gc.garbage if "memory_stats" in getattr(o, "__qualname__", "")]
        assert not from_memory_stats, f"{len(gc.garbage)} objects in cycles, e.g. {from_memory_stats[:2]}"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.gpu
@pytest.mark.parametrize("headroom", ["all_logits", "fp32_accumulators", "all_logits_ignored"])
def test_flce_headroom_order_cuda(headroom):
    """With headroom under the process's peak (as inside a training step), the default takes the fastest
    exact loop that fits below it: one token-major chunk where every logit fits, else token-major chunks
    into fp32 accumulators; with USE_HEADROOM off (the benchmarks of the op alone) the two-pass loop.
    Gradients at eager's accuracy, and no new peak."""
    use_headroom = headroom != "all_logits_ignored"
    n, hidden_size, vocab = 8192, 1024, 128256
    hidden, weight, _, target, _ = _inputs("cuda", torch.bfloat16, n, hidden_size, vocab)
    elements = (vocab + n) * hidden_size
    one_chunk_need = n * vocab * 2 + 2 * elements
    fp32_need = 6 * elements + tuning.HEADROOM_CHUNK_BYTES
    assert fp32_need < one_chunk_need
    spike_bytes = (fp32_need + one_chunk_need) // 2 if headroom == "fp32_accumulators" else 16 * 2**30
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    spike = torch.empty(spike_bytes, dtype=torch.uint8, device="cuda")  # an earlier peak of the process
    del spike
    peak_before = torch.cuda.max_memory_allocated()
    before = dict(tuning.LOOP_COUNTS)
    h, w = leaf(hidden), leaf(weight)
    with tuning.override(use_headroom=use_headroom):
        fused_linear_cross_entropy(h, w, target).backward()
    assert torch.cuda.max_memory_allocated() == peak_before
    loop = {
        "all_logits": "token-major one chunk",
        "fp32_accumulators": "token-major fp32",
        "all_logits_ignored": "two-pass",
    }[headroom]
    assert {k for k in tuning.LOOP_COUNTS if tuning.LOOP_COUNTS[k] != before.get(k, 0)} == {loop}
    del h, w
    with tuning.override(use_headroom=use_headroom):
        ours, eager, ref = _three_ways(hidden, weight, None, target, torch.tensor(1.0, device="cuda"), {})
    assert tuning.LOOP_COUNTS[loop] == before.get(loop, 0) + 2  # the same loop again for the comparison
    assert_loss_no_worse("loss", ours[0], eager[0], ref[0])
    assert_no_worse_than_eager("dhidden", ours[2], eager[2], ref[2])
    assert_no_worse_than_eager("dweight", ours[3], eager[3], ref[3])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("resident_on", [True, False])
def test_flce_two_pass_pass1_kernels_cuda(reduction, resident_on):
    """Pass 1 of the two-pass loop (a token-major chunk, then the kept vocabulary-major chunk of H tokens)
    runs cross_entropy's resident kernel where it runs (Hopper, 16-bit, no class weights or softcap), which
    also stores the coefficients that pass 2 applies to the recomputed logits; else the Triton row kernels.
    Either way: gradients at eager's accuracy with label smoothing, z-loss, ignored rows and (reduction none)
    per-token grad_output, Gaussian inputs (recomputed logits)."""
    with tuning.override(ce_resident=resident_on):
        _two_pass_pass1_kernels(reduction, resident_on)


def _two_pass_pass1_kernels(reduction, resident_on):
    n, hidden_size, vocab = 2048, 1024, 128256
    hidden, weight, _, target, _ = _inputs("cuda", torch.bfloat16, n, hidden_size, vocab)
    probe = torch.empty(8, vocab, dtype=torch.bfloat16, device="cuda")
    if resident_on and torch.cuda.get_device_capability()[0] == 9:
        assert resident_kernel_runs(probe, None, None)
    elif not resident_on:
        assert not resident_kernel_runs(probe, None, None)
    grad_out = torch.randn(n, device="cuda") if reduction == "none" else torch.tensor(1.0, device="cuda")
    budget = 32 * 2**20  # several vocabulary slices
    _, cols = two_pass_sizes(n, hidden_size, vocab, torch.bfloat16, hidden.device, budget, 0)
    assert cols < vocab and n > hidden_size  # a token-major chunk, then H kept tokens
    before = tuning.LOOP_COUNTS["two-pass"]
    opts = dict(reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-3)
    ours, eager, ref = _three_ways(
        hidden, weight, None, target, grad_out, dict(max_chunk_bytes=budget), **opts
    )
    assert tuning.LOOP_COUNTS["two-pass"] > before
    assert_loss_no_worse("loss", ours[0], eager[0], ref[0])
    assert_loss_no_worse("z_loss", ours[1], eager[1], ref[1])
    assert_no_worse_than_eager("dhidden", ours[2], eager[2], ref[2])
    assert_no_worse_than_eager("dweight", ours[3], eager[3], ref[3])


@pytest.mark.parametrize("budget", ["all_logits", "fp32_accumulators", "short"])
def test_flce_budget_selects_the_loop(budget, poison_empty):
    """``max_chunk_bytes`` picks the fastest exact loop it holds: every logit -> one token-major chunk (each
    gradient one GEMM); fp32 copies of the gradients plus a HEADROOM_CHUNK_BYTES chunk -> token-major chunks
    into fp32 accumulators; less -> the two-pass loop. Gradients at eager's accuracy in each, dW with
    no per-chunk slack."""
    n, hidden_size, vocab = 64, 8, 1031  # the logits (132 KB) outweigh the fp32 gradient copies (35 KB)
    headroom_chunk_bytes = 10 * vocab * 2
    hidden, weight, bias, target, _ = _inputs("cpu", torch.bfloat16, n, hidden_size, vocab, bias=True)
    fp32_copies = 4 * (vocab + n) * hidden_size
    fp32_threshold = fp32_copies + headroom_chunk_bytes
    max_chunk_bytes, loop = {
        "all_logits": (n * vocab * 2, "token-major one chunk"),
        "fp32_accumulators": (fp32_threshold + 2 * vocab * 2, "token-major fp32"),  # 12-token chunks
        "short": (fp32_threshold - 1, "two-pass"),
    }[budget]
    assert fp32_threshold + 2 * vocab * 2 < n * vocab * 2
    before = dict(tuning.LOOP_COUNTS)
    with tuning.override(headroom_chunk_bytes=headroom_chunk_bytes):
        ours, eager, ref = _three_ways(
            hidden, weight, bias, target, torch.tensor(1.0), dict(max_chunk_bytes=max_chunk_bytes)
        )
    changed = {k for k in tuning.LOOP_COUNTS if tuning.LOOP_COUNTS[k] != before.get(k, 0)}
    assert changed == {loop}
    assert_loss_no_worse("loss", ours[0], eager[0], ref[0])
    for name, i in (("dhidden", 2), ("dweight", 3), ("dbias", 4)):
        assert ours[i].dtype == torch.bfloat16
        assert_no_worse_than_eager(name, ours[i], eager[i], ref[i])


def test_flce_custom_ops_pass_opcheck():
    mod = importlib.import_module("liger_core.ops.fused_linear_cross_entropy")

    hidden, weight, bias, target, ce_weight = _inputs(
        "cpu", torch.float32, 7, 9, 33, bias=True, weighted=True
    )
    options = (IGNORE, "sum", 0.1, 1e-3, 20.0)
    denominator = torch.tensor(9.0, dtype=torch.float64)  # HF's num_items_in_batch
    # (accum_dtype, chunk_size, check_targets, max_chunk_bytes[, denominator]): the token order, the
    # two-pass order (a logits budget of 10 tokens), both with a denominator
    for loop in (
        (torch.float32, 3),
        (None, None, True, 10 * 33 * 4),
        (None, 3, True, None, denominator),
        (None, None, True, 400, denominator),
    ):
        torch.library.opcheck(
            mod._flce_fwd, (hidden, weight, target, bias, ce_weight, *options, True, True, True, *loop)
        )
    rows_options = (IGNORE, 0.1, 1e-3, None, True, True, True, None, 3)
    torch.library.opcheck(
        mod._flce_bwd_rows, (torch.randn(7), hidden, weight, target, bias, None, *rows_options)
    )


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("chunking", [dict(chunk_size=4), dict(max_chunk_bytes=9 * 10 * 4)])
def test_flce_under_torch_compile(reduction, chunking):
    hidden, weight, bias, target, _ = _inputs("cpu", torch.float32, 9, 11, 33, bias=True)
    results = []
    for fn in (fused_linear_cross_entropy, torch.compile(fused_linear_cross_entropy, backend="aot_eager")):
        h, w, b = leaf(hidden), leaf(weight), leaf(bias)
        fn(h, w, target, b, reduction=reduction, **chunking).sum().backward()
        results.append((h.grad, w.grad, b.grad))
    for ours, compiled in zip(*results):
        torch.testing.assert_close(compiled, ours)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transpose_into_writes_every_element(device, dtype):
    """``transpose_into`` (pass 2's copy of the kept gradient) equals ``src.T`` bitwise on odd shapes,
    row-strided source and destination views (as the kept slice and the pass-2 buffer are), leaving the
    destination's padding untouched; the destination starts as NaN so an unwritten element shows."""
    from liger_core.ops._flce_two_pass import transpose_into

    for rows, cols in ((1, 1), (37, 131), (130, 67)):
        src_store = torch.randn(rows, cols + 5, device=device).to(dtype)
        src_store[:, cols:] = float("nan")  # a kernel that ignores the row stride reads NaN
        src = src_store[:, :cols]
        dst_store = torch.full((cols, rows + 3), float("nan"), device=device, dtype=dtype)
        dst = dst_store[:, :rows]
        transpose_into(dst, src)
        assert torch.equal(dst, src.t())
        assert torch.isnan(dst_store[:, rows:]).all()

"""fused_linear_cosine_similarity: student and teacher lm_heads, hard cross-entropy + soft cosine term,
chunked over tokens, vs the float64 reference of the same inputs and no worse than the eager composition."""

import importlib

import pytest
import torch
from helpers import (
    assert_no_worse_than_eager,
    dyadic_linear_inputs,
    leaf,
    noncontiguous,
    use_reference_path,
)

from liger_core import reference
from liger_core.losses import LigerFusedLinearCosineSimilarityLoss
from liger_core.ops import fused_linear_cosine_similarity

op_module = importlib.import_module("liger_core.ops.fused_linear_cosine_similarity")

OPTIONS = dict(weight_hard_loss=0.3, weight_soft_loss=0.6, beta=0.7, temperature=0.7)


def make_inputs(lead, hidden_s, hidden_t, vocab_s, vocab_t, dtype, bias=False, logit_std=1.0):
    """Dyadic hidden states, weights and biases (exact logits from any GEMM); a quarter of labels ignored."""
    sh, sw, sb = dyadic_linear_inputs(lead, hidden_s, vocab_s, dtype, bias=bias, logit_std=logit_std)
    th, tw, tb = dyadic_linear_inputs(lead, hidden_t, vocab_t, dtype, bias=bias, logit_std=logit_std)
    labels = torch.randint(0, vocab_s, lead)
    labels[torch.rand(lead) < 0.25] = -100
    return sh, sw, sb, th, tw, tb, labels


def run(fn, inputs, go, dtype=None, **kwargs):
    """(loss, soft, hard, d student_hidden, d student_weight[, d student_bias]) on copies cast to dtype."""
    sh, sw, sb, th, tw, tb, labels = inputs
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    leaves = [leaf(t, dtype) for t in (sh, sw, sb) if t is not None]
    bias = leaves[2] if sb is not None else None
    options = {**OPTIONS, **kwargs}
    loss, soft, hard = fn(
        leaves[0], leaves[1], cast(th), cast(tw), labels, bias, None if tb is None else cast(tb),
        return_soft_hard_loss=True, **options,
    )  # fmt: skip
    grads = torch.autograd.grad(loss, leaves, go.to(loss.dtype))
    return (loss, soft, hard, *grads)


NAMES = ("loss", "soft_loss", "hard_loss", "grad_student_hidden", "grad_student_weight", "grad_student_bias")


@pytest.mark.parametrize(
    "dtype, bias, vocab_t",
    [(torch.float32, True, 140), (torch.float32, False, 131), (torch.bfloat16, False, 137)],
)
def test_matches_float64(dtype, bias, vocab_t):
    """37 tokens in chunks of 8, hidden sizes 67 / 45, student vocabulary 131 (the teacher's padded to 140 or
    137, or equal), temperature 0.7, a quarter of the rows ignored, grad_output != 1."""
    inputs = make_inputs((37,), 67, 45, 131, vocab_t, dtype, bias=bias)
    go = torch.rand((), dtype=torch.float64) + 0.5
    ours = run(fused_linear_cosine_similarity, inputs, go, chunk_size=8)
    eager = run(reference.fused_linear_cosine_similarity, inputs, go)
    ref = run(reference.fused_linear_cosine_similarity, inputs, go, dtype=torch.float64)
    assert all(t.dtype == torch.float32 and t.shape == () for t in ours[:3])
    assert ours[3].dtype == dtype and ours[4].dtype == dtype
    for name, a, e, r in zip(NAMES, ours, eager, ref):
        assert_no_worse_than_eager(name, a, e, r)
    assert (ours[3][inputs[-1] == -100] == 0).all()
    assert not ours[1].requires_grad and not ours[2].requires_grad


def test_noncontiguous_3d_default_chunk():
    """(2, 19, H) strided bf16 hidden states and 3-d labels, vocabulary 1031, default chunk size."""
    sh, sw, sb, th, tw, tb, labels = make_inputs((2, 19), 67, 45, 1031, 1031, torch.bfloat16)
    inputs = (noncontiguous(sh), sw, sb, noncontiguous(th), tw, tb, labels)
    go = torch.tensor(1.0, dtype=torch.float64)
    ours = run(fused_linear_cosine_similarity, inputs, go, temperature=1.0)
    eager = run(reference.fused_linear_cosine_similarity, inputs, go, temperature=1.0)
    ref = run(reference.fused_linear_cosine_similarity, inputs, go, dtype=torch.float64, temperature=1.0)
    assert ours[3].shape == sh.shape
    for name, a, e, r in zip(NAMES, ours, eager, ref):
        assert_no_worse_than_eager(name, a, e, r)


def test_liger_kernel_definition():
    """The loss is Liger-Kernel's: fp32 cross-entropy without temperature, and beta (1 - cos) of the
    temperature-divided logits through F.normalize / F.cosine_similarity (student padded with zeros), both
    over the kept tokens; written here from that definition in float64."""
    sh, sw, sb, th, tw, tb, labels = make_inputs((23,), 16, 12, 40, 48, torch.float32, bias=True)
    got = fused_linear_cosine_similarity(sh, sw, th, tw, labels, sb, tb, chunk_size=5, **OPTIONS)
    zs = sh.double() @ sw.double().t() + sb.double()
    zt = th.double() @ tw.double().t() + tb.double()
    n = (labels != -100).sum()
    hard = torch.nn.functional.cross_entropy(zs, labels, ignore_index=-100, reduction="sum") / n
    s = torch.nn.functional.pad(zs / 0.7, (0, 8))
    cos = torch.nn.functional.cosine_similarity(
        torch.nn.functional.normalize(s, dim=-1), torch.nn.functional.normalize(zt / 0.7, dim=-1), dim=-1
    )
    soft = (0.7 * (1 - cos)).masked_fill(labels == -100, 0.0).sum() / n
    torch.testing.assert_close(got.double(), 0.3 * hard + 0.6 * soft, rtol=2e-7, atol=0)


def test_chunks_never_hold_more_rows(monkeypatch):
    """With chunk_size 8 no GEMM produces more than 8 rows of logits; the result equals one chunk's."""
    inputs = make_inputs((37,), 67, 45, 131, 131, torch.float32)
    go = torch.tensor(0.8, dtype=torch.float64)
    one_chunk = run(fused_linear_cosine_similarity, inputs, go, chunk_size=37)
    widest = []
    real_mm = torch.mm

    def spy_mm(a, b, *args, **kwargs):
        out = real_mm(a, b, *args, **kwargs)
        if out.shape[-1] == 131:
            widest.append(out.shape[0])
        return out

    monkeypatch.setattr(torch, "mm", spy_mm)
    chunked = run(fused_linear_cosine_similarity, inputs, go, chunk_size=8)
    monkeypatch.undo()
    assert widest and max(widest) == 8
    for a, b in zip(one_chunk, chunked):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * b.abs().max().item())


def test_all_ignored_zero_rows_and_partial_grads():
    sh, sw, _, th, tw, _, labels = make_inputs((19,), 16, 12, 33, 33, torch.float32)
    h, w = leaf(sh), leaf(sw)
    loss = fused_linear_cosine_similarity(h, w, th, tw, torch.full((19,), -100), chunk_size=8)
    loss.backward()
    assert loss.item() == 0.0 and (h.grad == 0).all() and (w.grad == 0).all()

    # a student row of zero logits: cosine 0 (soft term beta), and no soft gradient for that row
    sh = sh.clone()
    sh[3] = 0.0
    labels[3] = 5
    h = leaf(sh)
    loss, soft, _ = fused_linear_cosine_similarity(
        h,
        sw,
        th,
        tw,
        labels,
        weight_hard_loss=0.0,
        weight_soft_loss=1.0,
        beta=0.5,
        return_soft_hard_loss=True,
    )
    loss.backward()
    want = reference.fused_linear_cosine_similarity(
        sh.double(), sw.double(), th.double(), tw.double(), labels, weight_hard_loss=0.0, weight_soft_loss=1.0
    )
    torch.testing.assert_close(loss.double(), want, rtol=1e-6, atol=0)
    assert (h.grad[3] == 0).all() and (h.grad[labels != -100].abs().sum(-1) > 0).sum() > 1

    # only the weight, only the hidden states, no gradient at all
    w_only = leaf(sw)
    (dw,) = torch.autograd.grad(fused_linear_cosine_similarity(sh, w_only, th, tw, labels), w_only)
    h_only = leaf(sh)
    (dh,) = torch.autograd.grad(fused_linear_cosine_similarity(h_only, sw, th, tw, labels), h_only)
    with torch.no_grad():
        no_grad = fused_linear_cosine_similarity(sh, sw, th, tw, labels)
    h_r, w_r = leaf(sh, torch.float64), leaf(sw, torch.float64)
    want = reference.fused_linear_cosine_similarity(h_r, w_r, th.double(), tw.double(), labels)
    dh_r, dw_r = torch.autograd.grad(want, (h_r, w_r))
    torch.testing.assert_close(no_grad.double(), want, rtol=1e-6, atol=0)
    torch.testing.assert_close(dw.double(), dw_r, rtol=1e-5, atol=1e-6 * dw_r.abs().max().item())
    torch.testing.assert_close(dh.double(), dh_r, rtol=1e-5, atol=1e-6 * dh_r.abs().max().item())


def test_extreme_and_nonfinite_logits():
    """Logits up to +-1e4 against float64; a NaN logit makes the loss NaN."""
    inputs = list(make_inputs((19,), 16, 12, 33, 33, torch.float32, logit_std=3.0))
    inputs[0] = inputs[0].clone()
    inputs[0][:3] *= 3000.0
    inputs[-1][:3] = 1
    assert (inputs[0][:3] @ inputs[1].t()).abs().max() > 5e3
    go = torch.tensor(1.7, dtype=torch.float64)
    ours = run(fused_linear_cosine_similarity, inputs, go, chunk_size=8)
    ref = run(reference.fused_linear_cosine_similarity, inputs, go, dtype=torch.float64)
    for a, r in zip(ours, ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), r, rtol=1e-5, atol=1e-6 * r.abs().max().item())
    sh, sw, _, th, tw, _, labels = inputs
    tw = tw.clone()
    tw[7, 0] = float("nan")
    labels[:] = 1
    assert torch.isnan(fused_linear_cosine_similarity(sh, sw, th, tw, labels, chunk_size=8))


def test_reference_path_and_module(monkeypatch):
    inputs = make_inputs((11,), 16, 12, 33, 35, torch.float32, bias=True)
    sh, sw, sb, th, tw, tb, labels = inputs
    module = LigerFusedLinearCosineSimilarityLoss(beta=0.7, weight_hard_loss=0.3, weight_soft_loss=0.6)
    assert list(module.state_dict()) == [] and "beta=0.7" in repr(module)
    kernel = module(sh, sw, th, tw, labels, sb, tb)
    use_reference_path(monkeypatch)
    fallback = module(sh, sw, th, tw, labels, sb, tb)
    torch.testing.assert_close(kernel, fallback, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="target"):
        fused_linear_cosine_similarity(sh, sw, th, tw, torch.full((11,), 33))
    with pytest.raises(ValueError, match="temperature"):
        LigerFusedLinearCosineSimilarityLoss(temperature=0.0)


def test_custom_op_opcheck():
    sh, sw, sb, th, tw, tb, labels = make_inputs((5,), 7, 6, 33, 35, torch.float32, bias=True)
    torch.library.opcheck(
        op_module._fused_linear_cosine_fwd,
        (sh, sw, th, tw, labels, sb, tb, 0.5, 0.5, 0.5, -100, 2, False, True, True, True),
    )
    torch.library.opcheck(
        op_module._fused_linear_cosine_fwd,
        (sh, sw, th, tw, labels, None, None, 0.0, 1.0, 1.0, -100, 8, False, False, True, False),
    )


def test_bad_input():
    sh, sw, sb, th, tw, tb, labels = make_inputs((4,), 8, 6, 11, 11, torch.float32, bias=True)
    with pytest.raises(ValueError, match="target"):
        fused_linear_cosine_similarity(sh, sw, th, tw, torch.full((4,), 11))
    with pytest.raises(ValueError, match="teacher_weight"):
        fused_linear_cosine_similarity(sh, sw, th, torch.randn(10, 6), labels)
    with pytest.raises(ValueError, match="student_weight"):
        fused_linear_cosine_similarity(sh, torch.randn(11, 9), th, tw, labels)
    with pytest.raises(ValueError, match="teacher_hidden"):
        fused_linear_cosine_similarity(sh, sw, torch.randn(5, 6), tw, labels)
    with pytest.raises(ValueError, match="target"):
        fused_linear_cosine_similarity(sh, sw, th, tw, labels[:3])
    with pytest.raises(ValueError, match="student_bias"):
        fused_linear_cosine_similarity(sh, sw, th, tw, labels, sb[:5])
    with pytest.raises(TypeError, match="teacher_bias"):
        fused_linear_cosine_similarity(sh, sw, th, tw, labels, sb, tb.double())
    with pytest.raises(ValueError, match="temperature"):
        fused_linear_cosine_similarity(sh, sw, th, tw, labels, temperature=-1.0)
    with pytest.raises(ValueError, match="chunk_size"):
        fused_linear_cosine_similarity(sh, sw, th, tw, labels, chunk_size=0)
    with pytest.raises(ValueError, match="beta"):
        fused_linear_cosine_similarity(sh, sw, th, tw, labels, beta=float("nan"))


def test_compile_and_empty():
    """torch.compile traces the custom op (fullgraph) to the eager result; no tokens: loss 0, zero grads."""
    sh, sw, _, th, tw, _, labels = make_inputs((7,), 8, 6, 11, 11, torch.float32)
    h, w = leaf(sh), leaf(sw)

    def loss_fn(a, b):
        return fused_linear_cosine_similarity(a, b, th, tw, labels, weight_hard_loss=0.3, chunk_size=4) * 0.5

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)(h, w)
    eager = loss_fn(h, w)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    for a, b in zip(torch.autograd.grad(compiled, (h, w)), torch.autograd.grad(eager, (h, w))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    h, w = leaf(sh[:0]), leaf(sw)
    loss = fused_linear_cosine_similarity(h, w, th[:0], tw, labels[:0])
    loss.backward()
    assert loss.item() == 0.0 and h.grad.shape == (0, 8) and (w.grad == 0).all()


def test_hard_loss_without_weight():
    """weight_hard_loss 0: the loss is the soft term alone; the cross-entropy is still reported (and its
    targets checked) when returned, and not computed (targets unchecked) otherwise, as Liger-Kernel does."""
    sh, sw, _, th, tw, _, labels = make_inputs((9,), 8, 6, 11, 11, torch.float32)
    loss, soft, hard = fused_linear_cosine_similarity(
        sh, sw, th, tw, labels, weight_hard_loss=0.0, return_soft_hard_loss=True, chunk_size=4
    )
    with_hard = fused_linear_cosine_similarity(
        sh, sw, th, tw, labels, weight_hard_loss=1.0, weight_soft_loss=0.0
    )
    torch.testing.assert_close(hard, with_hard, rtol=1e-6, atol=0)
    torch.testing.assert_close(loss, 0.5 * soft, rtol=1e-6, atol=0)
    out_of_range = torch.full((9,), 11)
    soft_only = fused_linear_cosine_similarity(sh, sw, th, tw, out_of_range, weight_hard_loss=0.0)
    every_row = fused_linear_cosine_similarity(
        sh, sw, th, tw, torch.zeros(9, dtype=torch.long), weight_hard_loss=0.0
    )
    torch.testing.assert_close(soft_only, every_row, rtol=0, atol=0)
    with pytest.raises(ValueError, match="target"):
        fused_linear_cosine_similarity(
            sh, sw, th, tw, out_of_range, weight_hard_loss=0.0, return_soft_hard_loss=True
        )

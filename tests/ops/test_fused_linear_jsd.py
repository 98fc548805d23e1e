"""fused_linear_jsd: lm_head projections of student and teacher + generalised JSD, chunked over tokens, vs the
float64 reference of the same inputs and no worse than the eager composition (full logits, fp32 softmax)."""

import importlib
import math

import pytest
import torch
from helpers import (
    HAS_CUDA,
    SLACK,
    assert_no_worse_than_eager,
    assert_same_values,
    dyadic_linear_inputs,
    half_ulp,
    leaf,
    noncontiguous,
)

from liger_core import reference
from liger_core.modules import LigerFusedLinearJSD
from liger_core.ops import fused_linear_jsd
from liger_core.reference.jsd import jsd_rows

flj_module = importlib.import_module("liger_core.ops.fused_linear_jsd")


def make_inputs(n_rows, hidden_s, hidden_t, vocab, dtype, device, leading=None, logit_scale=1.0):
    """Hidden states and lm_head weights whose logits have standard deviation ~logit_scale, dyadic (exact
    logits from any GEMM: chunked-vs-eager error ratios then measure the op's own math)."""
    lead = leading or (n_rows,)
    sh, sw, _ = dyadic_linear_inputs(lead, hidden_s, vocab, dtype, device, logit_std=logit_scale)
    th, tw, _ = dyadic_linear_inputs(lead, hidden_t, vocab, dtype, device, logit_std=logit_scale)
    labels = torch.randint(0, vocab, lead, device=device)
    labels[torch.rand(lead, device=device) < 0.25] = -100
    return sh, sw, th, tw, labels


def run(fn, sh, sw, th, tw, labels, beta, temperature, go, dtype=None, **kwargs):
    """(loss, d student_hidden, d student_weight) of fn on copies of the inputs (cast to dtype)."""
    h, w = leaf(sh, dtype), leaf(sw, dtype)
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    loss = fn(h, w, cast(th), cast(tw), labels, beta, -100, temperature, **kwargs)
    dh, dw = torch.autograd.grad(loss, (h, w), go.to(loss.dtype))
    return loss, dh, dw


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fused_linear_jsd_matches_float64(dtype, beta, poison_empty):
    """37 tokens in chunks of 8, hidden sizes 67 (student) / 45 (teacher), vocabulary 131, temperature 0.7,
    a quarter of the rows ignored, grad_output != 1."""
    sh, sw, th, tw, labels = make_inputs(37, 67, 45, 131, dtype, "cpu")
    go = torch.rand((), dtype=torch.float64) + 0.5
    ours = run(fused_linear_jsd, sh, sw, th, tw, labels, beta, 0.7, go, chunk_size=8)
    eager = run(reference.fused_linear_jsd, sh, sw, th, tw, labels, beta, 0.7, go)
    ref = run(reference.fused_linear_jsd, sh, sw, th, tw, labels, beta, 0.7, go, dtype=torch.float64)
    assert ours[0].dtype == torch.float32 and ours[0].shape == ()
    assert ours[1].dtype == dtype and ours[2].dtype == dtype
    _, spread = float64_reference_in_chunks(sh, sw, th, tw, labels, beta, 0.7, go)
    # the loss is one mean over rows: the mean rule (fresh-clone CI: 6.4e-8 vs a lucky eager 3.2e-9, i.e. one
    # fp32 ulp of a loss of 1.97 against eager's 1/20 ulp)
    assert_mean_no_worse_than_eager("loss", ours[0], eager[0], ref[0], spread)
    for name, a, e, r in zip(("grad_student_hidden", "grad_student_weight"), ours[1:], eager[1:], ref[1:]):
        assert_no_worse_than_eager(name, a, e, r)
    assert (ours[1][labels == -100] == 0).all()


def test_fused_linear_jsd_noncontiguous_3d_default_chunk(poison_empty):
    """(2, 19, H) strided hidden states, vocabulary 1031, no labels, temperature 1, default chunk size."""
    sh, sw, th, tw, _ = make_inputs(38, 67, 45, 1031, torch.bfloat16, "cpu", leading=(2, 19))
    sh, th = noncontiguous(sh), noncontiguous(th)
    go = torch.tensor(1.0, dtype=torch.float64)
    ours = run(fused_linear_jsd, sh, sw, th, tw, None, 0.5, 1.0, go)
    eager = run(reference.fused_linear_jsd, sh, sw, th, tw, None, 0.5, 1.0, go)
    ref = run(reference.fused_linear_jsd, sh, sw, th, tw, None, 0.5, 1.0, go, dtype=torch.float64)
    assert ours[1].shape == sh.shape
    for name, a, e, r in zip(("loss", "grad_student_hidden", "grad_student_weight"), ours, eager, ref):
        assert_no_worse_than_eager(name, a, e, r)


def test_fused_linear_jsd_never_materialises_logits(monkeypatch):
    """With chunk_size 8, no matmul produces more than 8 rows of logits, and the result equals (to rounding)
    the single-chunk one."""
    sh, sw, th, tw, labels = make_inputs(37, 67, 45, 131, torch.float32, "cpu")
    go = torch.tensor(0.8, dtype=torch.float64)
    one_chunk = run(fused_linear_jsd, sh, sw, th, tw, labels, 0.5, 1.3, go, chunk_size=37)
    widest = []
    real_mm = torch.mm

    def spy_mm(a, b, *args, **kwargs):
        out = real_mm(a, b, *args, **kwargs)
        if out.shape[-1] == 131:
            widest.append(out.shape[0])
        return out

    monkeypatch.setattr(torch, "mm", spy_mm)
    chunked = run(fused_linear_jsd, sh, sw, th, tw, labels, 0.5, 1.3, go, chunk_size=8)
    monkeypatch.undo()
    assert widest and max(widest) == 8 and len(widest) == 2 * math.ceil(37 / 8)  # student + teacher per chunk
    for a, b in zip(one_chunk, chunked):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * b.abs().max().item())


def test_fused_linear_jsd_all_ignored_and_partial_grads():
    sh, sw, th, tw, _ = make_inputs(19, 67, 45, 131, torch.float32, "cpu")
    h, w = leaf(sh), leaf(sw)
    loss = fused_linear_jsd(h, w, th, tw, torch.full((19,), -100), beta=0.5, chunk_size=8)
    loss.backward()  # grad_output == 1
    assert loss.item() == 0.0 and (h.grad == 0).all() and (w.grad == 0).all()

    labels = torch.randint(0, 131, (19,))
    want = reference.fused_linear_jsd(sh, sw, th, tw, labels, beta=0.5)
    w_only = leaf(sw)
    loss = fused_linear_jsd(sh, w_only, th, tw, labels, beta=0.5, chunk_size=8)
    (dw,) = torch.autograd.grad(loss, w_only)
    h_only = leaf(sh)
    (dh,) = torch.autograd.grad(fused_linear_jsd(h_only, sw, th, tw, labels, beta=0.5), h_only)
    with torch.no_grad():
        no_grad = fused_linear_jsd(sh, sw, th, tw, labels, beta=0.5)
    w_r, h_r = leaf(sw, torch.float64), leaf(sh, torch.float64)
    want_r = reference.fused_linear_jsd(h_r, w_r, th.double(), tw.double(), labels, beta=0.5)
    dh_r, dw_r = torch.autograd.grad(want_r, (h_r, w_r))
    for got in (loss, no_grad):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    torch.testing.assert_close(dw.double(), dw_r, rtol=1e-4, atol=1e-5 * dw_r.abs().max().item())
    torch.testing.assert_close(dh.double(), dh_r, rtol=1e-4, atol=1e-5 * dh_r.abs().max().item())


def test_fused_linear_jsd_extreme_logits():
    """Logits up to +-1e4 (peaky rows, probabilities of exactly 0), checked against float64."""
    sh, sw, th, tw, labels = make_inputs(19, 67, 45, 131, torch.float32, "cpu", logit_scale=3.0)
    sh[:3] *= 3000.0  # rows with logits of order 1e4 (one-hot softmax: zero gradient for those rows)
    labels[:3] = 1
    assert (sh[:3] @ sw.t()).abs().max() > 5e3
    go = torch.tensor(1.7, dtype=torch.float64)
    ours = run(fused_linear_jsd, sh, sw, th, tw, labels, 0.5, 1.0, go, chunk_size=8)
    ref = run(reference.fused_linear_jsd, sh, sw, th, tw, labels, 0.5, 1.0, go, dtype=torch.float64)
    for a, r in zip(ours, ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), r, rtol=1e-4, atol=1e-5 * r.abs().max().item())


def test_fused_linear_jsd_module():
    sh, sw, th, tw, labels = make_inputs(19, 67, 45, 131, torch.bfloat16, "cpu")
    module = LigerFusedLinearJSD(beta=0.3, ignore_index=-100, temperature=2.0)
    assert list(module.state_dict()) == [] and "temperature=2.0" in repr(module)
    got = module(sh, sw, th, tw, labels)
    torch.testing.assert_close(got, fused_linear_jsd(sh, sw, th, tw, labels, 0.3, -100, 2.0), rtol=0, atol=0)
    with pytest.raises(ValueError, match="temperature"):
        LigerFusedLinearJSD(temperature=0.0)


def test_fused_linear_jsd_compile_and_second_backward():
    """torch.compile traces through the custom ops (fullgraph); a second backward through the same graph is
    exact for bf16 parameters and fails loudly for fp32 ones (their gradient was scaled in place)."""
    sh, sw, th, tw, labels = make_inputs(6, 7, 5, 33, torch.float32, "cpu")
    h, w = leaf(sh), leaf(sw)

    def loss_fn(a, b):
        return fused_linear_jsd(a, b, th, tw, labels, 0.3, temperature=2.0) * 0.5

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)(h, w)
    eager = loss_fn(h, w)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    for a, b in zip(
        torch.autograd.grad(compiled, (h, w)), torch.autograd.grad(eager, (h, w), retain_graph=True)
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="inplace"):
        torch.autograd.grad(eager, (h, w))

    h16, w16 = leaf(sh, torch.bfloat16), leaf(sw, torch.bfloat16)
    loss = fused_linear_jsd(h16, w16, th.bfloat16(), tw.bfloat16(), labels, 0.3)
    first = torch.autograd.grad(loss * 0.5, (h16, w16), retain_graph=True)
    for a, b in zip(first, torch.autograd.grad(loss * 0.5, (h16, w16))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fused_linear_jsd_custom_ops_opcheck():
    sh, sw, th, tw, labels = make_inputs(5, 7, 6, 33, torch.float32, "cpu")
    torch.library.opcheck(
        flj_module._fused_linear_jsd_fwd, (sh, sw, th, tw, labels, 0.5, -100, 1.5, 2, True, True)
    )
    torch.library.opcheck(
        flj_module._fused_linear_jsd_fwd, (sh, sw, th, tw, None, 1.0, -100, 1.0, 8, False, True)
    )
    torch.library.opcheck(flj_module._scale_to, (torch.randn(5, 7), torch.tensor(0.5), torch.bfloat16))


def test_fused_linear_jsd_bad_input():
    sh, sw, th, tw, labels = make_inputs(4, 8, 6, 11, torch.float32, "cpu")
    with pytest.raises(ValueError, match="teacher_weight"):
        fused_linear_jsd(sh, sw, th, torch.randn(12, 6))
    with pytest.raises(ValueError, match="student_weight"):
        fused_linear_jsd(sh, torch.randn(11, 9), th, tw)
    with pytest.raises(ValueError, match="teacher_weight"):
        fused_linear_jsd(sh, sw, th, torch.randn(11, 7))
    with pytest.raises(ValueError, match="teacher_hidden"):
        fused_linear_jsd(sh, sw, torch.randn(5, 6), tw)
    with pytest.raises(TypeError, match="student_weight"):
        fused_linear_jsd(sh, sw.double(), th, tw)
    with pytest.raises(TypeError, match="teacher_hidden"):
        fused_linear_jsd(sh, sw, th.long(), tw)
    with pytest.raises(ValueError, match="student_weight"):
        fused_linear_jsd(sh, sw[0], th, tw)
    with pytest.raises(ValueError, match="shift_labels"):
        fused_linear_jsd(sh, sw, th, tw, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="beta"):
        fused_linear_jsd(sh, sw, th, tw, beta=2.0)
    with pytest.raises(ValueError, match="temperature"):
        fused_linear_jsd(sh, sw, th, tw, temperature=-1.0)
    with pytest.raises(ValueError, match="chunk_size"):
        fused_linear_jsd(sh, sw, th, tw, chunk_size=0)
    with pytest.raises(ValueError, match="teacher_weight"):
        fused_linear_jsd(sh, sw, th, torch.empty(11, 6, device="meta"))


def float64_reference_in_chunks(sh, sw, th, tw, labels, beta, temperature, go, rows=256):
    """Loss and gradients of the float64 reference, row chunk by row chunk (float64 logits of 4096 x 128256
    would take 4 GiB per model, with several temporaries each), and ``spread = ||e|| / n_kept``, e the
    per-row losses of the eager composition (logits in the inputs' dtype, fp32 softmax and JSD) minus the
    float64 ones: the standard deviation of eager's mean-loss error were its rows' errors independent."""
    w = sw.detach().double().requires_grad_(True)
    tw64 = tw.double()
    kept = labels != -100
    n_kept = max(int(kept.sum()), 1)
    loss, dh, dw = 0.0, torch.zeros_like(sh, dtype=torch.float64), torch.zeros_like(w)
    eager_err_sq = 0.0
    for idx in torch.arange(sh.shape[0], device=sh.device).split(rows):
        h = leaf(sh[idx], torch.float64)
        x = torch.log_softmax(h @ w.t() / temperature, -1)
        y = torch.log_softmax(th[idx].double() @ tw64.t() / temperature, -1)
        ref_rows = jsd_rows(x[kept[idx]], y[kept[idx]], beta)
        part = ref_rows.sum() / n_kept
        g_h, g_w = torch.autograd.grad(part, (h, w), go)
        loss += part.item()
        dh[idx] = g_h
        dw += g_w
        with torch.no_grad():
            x_eager = torch.log_softmax((sh[idx] @ sw.t()).float() / temperature, -1)[kept[idx]]
            y_eager = torch.log_softmax((th[idx] @ tw.t()).float() / temperature, -1)[kept[idx]]
            row_err = jsd_rows(x_eager, y_eager, beta).double() - ref_rows.detach()
            eager_err_sq += float((row_err**2).sum())
    spread = math.sqrt(eager_err_sq) / n_kept
    return (torch.tensor(loss, dtype=torch.float64), dh, dw), spread


def assert_mean_no_worse_than_eager(name, ours, eager, ref64, spread, *, slack=SLACK):
    """The rule for a 0-dim loss that is a mean over rows: |ours - ref| <= slack |eager - ref| + 4 spread.

    A mean over n rows is one draw of the sum of the rows' rounding errors. For bf16 models those are
    dominated by the bf16 logits, which the chunked kernel and eager both round, but from different GEMMs
    (chunk rows vs all rows: cuBLAS may pick other tilings), so their errors are two draws of the same size
    whose ratio is noise (H100, llama shapes, beta 0.5: 3.9e-6 vs eager's 3.1e-6, both a few 1e-7 absolute).
    "No worse than eager" is then per row: if the kernel's per-row errors are no larger than eager's, its
    mean's error is within eager's spread (4 standard deviations: a chance failure ~1e-4), and a systematic
    error (a wrong term, a scale) of more than 4 spread / sqrt(n) per row, far below any real bug, fails.
    Plus the output's own final rounding (half an ulp of the value in the output dtype), which no
    computation avoids and eager's draw may happen to dodge."""
    e_ours = abs(ours.item() - ref64.item())
    e_eager = abs(eager.item() - ref64.item())
    assert math.isfinite(e_ours), f"{name}: NaN/inf"
    bound = slack * e_eager + 4.0 * spread + half_ulp(ref64.item(), ours.dtype)
    assert e_ours <= bound, (
        f"{name}: error {e_ours:.3e} > {slack} x eager's {e_eager:.3e} + 4 x eager's spread {spread:.3e}"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_fused_linear_jsd_llama_shapes_cuda(beta):
    """4096 tokens, student hidden 2048, teacher hidden 4096, vocabulary 128256, bf16: no worse than the eager
    composition, and peak extra memory bounded by one chunk's logits plus the gradients (the full logits of
    either model would be 1 GiB in bf16, 2 GiB in fp32)."""
    n, hidden_s, hidden_t, vocab = 4096, 2048, 4096, 128256
    sh, sw, th, tw, labels = make_inputs(n, hidden_s, hidden_t, vocab, torch.bfloat16, "cuda")
    go = torch.tensor(0.75, dtype=torch.float64, device="cuda")
    ref, spread = float64_reference_in_chunks(sh, sw, th, tw, labels, beta, 1.0, go)
    eager = run(reference.fused_linear_jsd, sh, sw, th, tw, labels, beta, 1.0, go)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    h, w = leaf(sh), leaf(sw)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = fused_linear_jsd(h, w, th, tw, labels, beta)
    dh, dw = torch.autograd.grad(loss, (h, w), go.float())
    peak_extra = torch.cuda.max_memory_allocated() - base
    chunk = flj_module.default_chunk_rows(n, vocab, 4)
    bound = chunk * vocab * 4 + vocab * hidden_s * (4 + 2) + n * hidden_s * (4 + 2) + 256 * 2**20
    assert peak_extra <= bound, f"peak extra memory {peak_extra / 2**30:.2f} GiB > {bound / 2**30:.2f} GiB"
    assert_mean_no_worse_than_eager("loss", loss, eager[0], ref[0], spread)
    for name, a, e, r in zip(("grad_student_hidden", "grad_student_weight"), (dh, dw), eager[1:], ref[1:]):
        assert_no_worse_than_eager(name, a, e, r)


# ----------------------------------------------------------------------------------------------------------
# Edge cases on both paths: empty batches, non-finite inputs, any strides
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fused_linear_jsd_empty_and_all_ignored(path, beta):
    """No tokens (with or without labels, 2-D or 3-D hidden states) or every token ignored: a loss of 0 (the
    documented mean over no rows), fp32, with zero gradients; the same on both paths."""
    for lead, labels in (((0,), None), ((2, 0), None), ((0,), torch.zeros(0, dtype=torch.long)),
                         ((5,), torch.full((5,), -100))):  # fmt: skip
        sh, sw, th, tw, _ = make_inputs(1, 7, 5, 33, torch.bfloat16, "cpu", leading=lead)
        h, w = leaf(sh), leaf(sw)
        loss = fused_linear_jsd(h, w, th, tw, labels, beta, chunk_size=2)
        dh, dw = torch.autograd.grad(loss * 2.0, (h, w))
        assert loss.dtype == torch.float32 and loss.shape == () and loss.item() == 0.0, (lead, loss)
        assert dh.shape == sh.shape and dh.dtype == torch.bfloat16 and (dh == 0).all()
        assert dw.dtype == torch.bfloat16 and (dw == 0).all()


@pytest.mark.parametrize("case", ["neg_inf_weights", "non_finite_hidden"])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fused_linear_jsd_non_finite_inputs(path, case, beta):
    """fp32 inputs holding -inf, +inf and NaN: the loss and both gradients have NaN and +-inf exactly where
    the float64 reference composition has them, its values elsewhere. ``neg_inf_weights``: a -inf weight
    entry in each model makes a class's logit -inf in every row (the student's the first of the vocabulary:
    a leading column all -inf), whose probability 0 contributes 0 (documented: ``jsd``);
    ``non_finite_hidden``: NaN and +inf hidden entries in kept rows make their logits NaN / +-inf (a NaN
    loss, NaN rows of dh, all of dw NaN). bf16 takes the same branches."""
    sh, sw, th, tw, labels = make_inputs(13, 9, 7, 33, torch.float32, "cpu")
    sh[:, 0] = torch.rand(13) + 0.5  # positive: weight[:, 0] * hidden[:, 0] keeps its sign
    th[:, 0] = torch.rand(13) + 0.5
    labels[[2, 4, 6]] = 1
    if case == "neg_inf_weights":
        sw[0, 0] = -float("inf")
        tw[5, 0] = -float("inf")
    else:
        sh[2, 3] = float("nan")
        sh[4, 1] = float("inf")
        th[6, 2] = float("nan")
    go = torch.tensor(1.3, dtype=torch.float64)
    ours = run(fused_linear_jsd, sh, sw, th, tw, labels, beta, 0.9, go, chunk_size=4)
    want = run(reference.fused_linear_jsd, sh, sw, th, tw, labels, beta, 0.9, go, dtype=torch.float64)
    for name, a, r in zip(("loss", "grad_student_hidden", "grad_student_weight"), ours, want):
        assert_same_values(name, a, r)


def test_fused_linear_jsd_strided_inputs(path):
    """Every tensor argument as a non-contiguous view (hidden states and weights every other column of a
    NaN-poisoned buffer, or a weight in transposed storage; labels strided): the contiguous inputs' values,
    forward and backward."""
    sh, sw, th, tw, labels = make_inputs(15, 9, 7, 33, torch.float32, "cpu", leading=(3, 5))
    go = torch.tensor(0.8, dtype=torch.float64)
    want = run(fused_linear_jsd, sh, sw, th, tw, labels, 0.3, 1.2, go, chunk_size=4)

    def strided(t):
        wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype)
        wide[..., ::2] = t
        return wide[..., ::2]

    lab_wide = torch.zeros(3, 10, dtype=torch.long)
    lab_wide[:, ::2] = labels
    for w_layout in ("strided", "transposed"):
        h = strided(sh).requires_grad_()
        w = (strided(sw) if w_layout == "strided" else sw.t().contiguous().t()).requires_grad_()
        t_w = strided(tw) if w_layout == "strided" else tw.t().contiguous().t()
        loss = fused_linear_jsd(h, w, strided(th), t_w, lab_wide[:, ::2], 0.3, temperature=1.2, chunk_size=4)
        dh, dw = torch.autograd.grad(loss, (h, w), go.float())
        for a, b in zip((loss, dh, dw), want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_fused_linear_jsd_leading_column_block_neg_inf(path):
    """Logits -inf over the whole first column block of the kernel (16384 columns on the interpreter; a
    masked leading range of the vocabulary): probability 0 there, the rest's JSD finite and as the float64
    reference's, in both models."""
    vocab = 16384 + 37
    sh, sw, th, tw, labels = make_inputs(3, 5, 4, vocab, torch.float32, "cpu")
    sh[:, 0] = th[:, 0] = 1.0
    sw[: vocab - 37, 0] = -float("inf")
    tw[: vocab - 30, 0] = -float("inf")
    go = torch.tensor(1.0, dtype=torch.float64)
    for beta in (0.0, 0.5):
        ours = run(fused_linear_jsd, sh, sw, th, tw, None, beta, 1.0, go)
        want = run(reference.fused_linear_jsd, sh, sw, th, tw, None, beta, 1.0, go, dtype=torch.float64)
        assert torch.isfinite(ours[0])
        for name, a, r in zip(("loss", "grad_student_hidden", "grad_student_weight"), ours, want):
            assert_same_values(name, a, r)


def run_biased(fn, sh, sw, sb, th, tw, tb, labels, beta, temperature, go, dtype=None, **kwargs):
    """(loss, d student_hidden, d student_weight, d student_bias) of fn with lm_head biases."""
    h, w, b = leaf(sh, dtype), leaf(sw, dtype), leaf(sb, dtype)
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    biases = dict(student_bias=b, teacher_bias=cast(tb))
    loss = fn(h, w, cast(th), cast(tw), labels, beta, -100, temperature, **biases, **kwargs)
    return (loss, *torch.autograd.grad(loss, (h, w, b), go.to(loss.dtype)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_fused_linear_jsd_bias_matches_float64(dtype, beta):
    """Student and teacher lm_head biases: loss and the gradients to hidden, weight and bias against the
    float64 reference, no worse than eager; 29 tokens in chunks of 8, a quarter ignored, grad_output != 1."""
    sh, sw, sb = dyadic_linear_inputs((29,), 37, 97, dtype, bias=True)
    th, tw, tb = dyadic_linear_inputs((29,), 21, 97, dtype, bias=True)
    labels = torch.randint(0, 97, (29,))
    labels[torch.rand(29) < 0.25] = -100
    go = torch.rand((), dtype=torch.float64) + 0.5
    args = (sh, sw, sb, th, tw, tb, labels, beta, 0.8, go)
    ours = run_biased(fused_linear_jsd, *args, chunk_size=8)
    eager = run_biased(reference.fused_linear_jsd, *args)
    ref = run_biased(reference.fused_linear_jsd, *args, dtype=torch.float64)
    assert ours[3].dtype == dtype and ours[3].shape == (97,)
    assert ours[3].abs().max() > 0
    for name, a, e, r in zip(("loss", "dhidden", "dweight", "dbias"), ours, eager, ref):
        assert_no_worse_than_eager(name, a, e, r)
    # the bias moves the loss: without it the result differs (the bias is not dropped)
    plain = run(fused_linear_jsd, sh, sw, th, tw, labels, beta, 0.8, go, chunk_size=8)
    assert not torch.allclose(plain[0], ours[0])
    # the teacher bias alone, and no gradient wanted for the student bias
    h = leaf(sh)
    loss = fused_linear_jsd(h, sw, th, tw, labels, beta, temperature=0.8, teacher_bias=tb, chunk_size=8)
    want = reference.fused_linear_jsd(sh.double(), sw.double(), th.double(), tw.double(), labels, beta,
                                      temperature=0.8, teacher_bias=tb.double())  # fmt: skip
    assert_no_worse_than_eager(
        "teacher bias only",
        loss,
        reference.fused_linear_jsd(sh, sw, th, tw, labels, beta, temperature=0.8, teacher_bias=tb),
        want,
    )


def test_fused_linear_jsd_bias_opcheck_and_errors():
    sh, sw, th, tw, labels = make_inputs(5, 7, 6, 33, torch.float32, "cpu")
    sb, tb = torch.randn(33), torch.randn(33)
    torch.library.opcheck(
        flj_module._fused_linear_jsd_fwd,
        (sh, sw, th, tw, labels, 0.5, -100, 1.5, 2, True, True, sb, tb, True),
    )
    with pytest.raises(ValueError, match="student_bias"):
        fused_linear_jsd(sh, sw, th, tw, student_bias=torch.randn(32))
    with pytest.raises(TypeError, match="teacher_bias"):
        fused_linear_jsd(sh, sw, th, tw, teacher_bias=tb.double())

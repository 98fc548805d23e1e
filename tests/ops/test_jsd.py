"""jsd: generalised Jensen-Shannon divergence vs the float64 reference of the same inputs, no worse than eager

Inputs are log_softmax of logits with a moderate spread, so that thousands of elements carry the gradient's
norm (with peaky distributions a handful of elements do, and an error ratio measures luck); peaky and extreme
inputs are checked separately against float64 with tolerances.
"""

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    HAS_CUDA,
    assert_no_worse_than_eager,
    assert_same_values,
    devices,
    leaf,
    noncontiguous,
    rel_err,
)

from liger_core import reference
from liger_core.modules import LigerJSD
from liger_core.ops import jsd
from liger_core.reference.jsd import jsd_rows

jsd_module = importlib.import_module("liger_core.ops.jsd")

SHAPES = {"cpu": [(37, 1031), (2, 19, 131)], "cuda": [(1024, 128256), (3, 333, 32000)]}


def log_probs(shape, dtype, device, scale=1.0):
    return torch.log_softmax(torch.randn(shape, dtype=torch.float64, device=device) * scale, -1).to(dtype)


def shift_labels(shape, device, ignore_index=-100, frac_ignored=0.25):
    labels = torch.randint(0, 1000, shape, device=device)
    labels[torch.rand(shape, device=device) < frac_ignored] = ignore_index
    return labels


def grad_output(dtype, device):
    return (torch.rand((), dtype=torch.float64, device=device) + 0.5).to(dtype)  # never exactly 1


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
def test_jsd_matches_float64(device, dtype, beta, layout, poison_empty):
    make = noncontiguous if layout == "noncontiguous" else (lambda t: t)
    for shape in SHAPES[device]:
        s = leaf(make(log_probs(shape, dtype, device)))
        t = make(log_probs(shape, dtype, device))
        labels = shift_labels(shape[:-1], device)
        s_e, s_r = leaf(s), leaf(s, torch.float64)

        loss = jsd(s, t, beta, shift_labels=labels)
        loss_e = reference.jsd(s_e, t, beta, shift_labels=labels)
        loss_r = reference.jsd(s_r, t.double(), beta, shift_labels=labels)
        assert loss.dtype == torch.float32 and loss.shape == ()
        assert_no_worse_than_eager("loss", loss, loss_e, loss_r)

        go = grad_output(dtype, device)
        (g,) = torch.autograd.grad(loss, s, go)
        (g_e,) = torch.autograd.grad(loss_e, s_e, go)
        (g_r,) = torch.autograd.grad(loss_r, s_r, go.double())
        assert g.shape == s.shape and g.dtype == dtype
        assert_no_worse_than_eager("grad", g, g_e, g_r)
        assert (g[labels == -100] == 0).all()


@pytest.mark.parametrize("beta", [0.0, 0.2, 0.5, 1.0])
def test_jsd_beta_convention_and_limits(beta):
    """beta weights the teacher: M = beta P + (1 - beta) Q; beta = 0 is KL(teacher || student) and beta = 1
    is KL(student || teacher) (TRL GKD / Liger convention), checked against formulas written here."""
    s = leaf(log_probs((37, 131), torch.float32, "cpu"))
    t = log_probs((37, 131), torch.float32, "cpu")
    loss = jsd(s, t, beta)
    (g,) = torch.autograd.grad(loss, s)
    s64 = leaf(s, torch.float64)
    q, p = s64.exp(), t.double().exp()
    if beta == 0.0:
        want = F.kl_div(s64, t.double(), reduction="batchmean", log_target=True)  # sum P log(P / Q) / N
    elif beta == 1.0:
        want = (q * (s64 - t.double())).sum() / s.shape[0]
    else:
        m = beta * p + (1 - beta) * q
        want = (beta * (p * (p / m).log()).sum() + (1 - beta) * (q * (q / m).log()).sum()) / s.shape[0]
    (g_want,) = torch.autograd.grad(want, s64)
    torch.testing.assert_close(loss.double(), want, rtol=1e-6, atol=0)
    torch.testing.assert_close(g.double(), g_want, rtol=1e-5, atol=1e-6 * g_want.abs().max().item())
    # swapping student and teacher is swapping beta and 1 - beta
    torch.testing.assert_close(jsd(t, s.detach(), 1.0 - beta), loss, rtol=1e-6, atol=0)


def test_jsd_by_hand():
    """One row computed by hand: P = teacher, Q = student, beta = 0.3."""
    p, q, beta = [0.7, 0.2, 0.1], [0.2, 0.5, 0.3], 0.3
    m = [beta * a + (1 - beta) * b for a, b in zip(p, q)]
    want = beta * sum(a * math.log(a / c) for a, c in zip(p, m)) + (1 - beta) * sum(
        b * math.log(b / c) for b, c in zip(q, m)
    )
    got = jsd(torch.tensor([q]).log(), torch.tensor([p]).log(), beta)
    assert abs(got.item() - want) <= 1e-6 * want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_jsd_ignored_rows(dtype):
    """Ignored rows are left out entirely (their contents cannot leak in), with any ignore_index and label
    dtype, labels shaped like the leading dims or flat; all rows ignored gives 0 and zero gradients."""
    s = log_probs((3, 13, 257), dtype, "cpu")
    t = log_probs((3, 13, 257), dtype, "cpu")
    labels = shift_labels((3, 13), "cpu", ignore_index=7).to(torch.int32)
    poisoned_s, poisoned_t = s.clone(), t.clone()
    poisoned_s[labels == 7] = float("nan")
    poisoned_t[labels == 7] = float("inf")
    poisoned_s = leaf(poisoned_s)
    loss = jsd(poisoned_s, poisoned_t, 0.5, ignore_index=7, shift_labels=labels.flatten())
    (g,) = torch.autograd.grad(loss, poisoned_s)
    kept = labels != 7
    s_r = leaf(s[kept], torch.float64)
    loss_r = reference.jsd(s_r, t[kept].double(), 0.5)
    (g_r,) = torch.autograd.grad(loss_r, s_r)
    assert rel_err(loss, loss_r) < 2**-7 and rel_err(g[kept], g_r) < 2**-7
    assert (g[~kept] == 0).all()

    s = leaf(s)
    for beta in (0.0, 0.5, 1.0):
        loss = jsd(s, t, beta, shift_labels=torch.full((3, 13), -100))
        loss.backward()  # grad_output == 1
        assert loss.item() == 0.0 and loss.dtype == torch.float32
        assert s.grad is not None and (s.grad == 0).all()
        s.grad = None


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_jsd_extreme_and_masked_values(beta):
    """Logits of +-1e4 (log-probs down to -2e4, probabilities of exactly 0), peaky rows, and vocabulary
    entries masked to -inf in both models (they must contribute exactly 0, where eager gives NaN)."""
    logits = torch.randn(37, 131, dtype=torch.float64) * 3
    logits[:, :5] = torch.tensor([-1e4, 1e4, 0.0, -80.0, 80.0], dtype=torch.float64)
    s = leaf(torch.log_softmax(logits, -1).float())
    t = torch.log_softmax(torch.randn(37, 131, dtype=torch.float64) * 8, -1).float()
    loss = jsd(s, t, beta)
    (g,) = torch.autograd.grad(loss, s)
    s_r = leaf(s, torch.float64)
    loss_r = reference.jsd(s_r, t.double(), beta)
    (g_r,) = torch.autograd.grad(loss_r, s_r)
    assert torch.isfinite(loss) and torch.isfinite(g).all()
    torch.testing.assert_close(loss.double(), loss_r, rtol=1e-5, atol=0)
    torch.testing.assert_close(g.double(), g_r, rtol=1e-5, atol=1e-9)

    masked = torch.zeros(131, dtype=torch.bool)
    masked[[3, 50, 130]] = True
    s_m = leaf(s.detach().masked_fill(masked, float("-inf")).log_softmax(-1))
    t_m = t.masked_fill(masked, float("-inf")).log_softmax(-1)
    loss = jsd(s_m, t_m, beta)
    (g,) = torch.autograd.grad(loss, s_m)
    s_r = leaf(s_m[:, ~masked], torch.float64)
    loss_r = reference.jsd(s_r, t_m[:, ~masked].double(), beta)
    (g_r,) = torch.autograd.grad(loss_r, s_r)
    torch.testing.assert_close(loss.double(), loss_r, rtol=1e-5, atol=0)
    torch.testing.assert_close(g[:, ~masked].double(), g_r, rtol=1e-5, atol=1e-9)
    assert (g[:, masked] == 0).all()


def test_jsd_near_identical_distributions_fp32():
    """Student close to its teacher (where distillation converges): the JSD is tiny next to its terms, so
    eager's log M = logaddexp(...) loses digits; ours (log-ratios from x - y) must stay accurate."""
    t = log_probs((37, 1031), torch.float32, "cpu", scale=2.0)
    s = leaf(torch.log_softmax(t.double() + 1e-3 * torch.randn(37, 1031, dtype=torch.float64), -1).float())
    s_e, s_r = leaf(s), leaf(s, torch.float64)
    for beta in (0.1, 0.5, 0.9):
        loss = jsd(s, t, beta)
        loss_e = reference.jsd(s_e, t, beta)
        loss_r = reference.jsd(s_r, t.double(), beta)
        assert_no_worse_than_eager("loss", loss, loss_e, loss_r)
        (g,) = torch.autograd.grad(loss, s)
        (g_e,) = torch.autograd.grad(loss_e, s_e)
        (g_r,) = torch.autograd.grad(loss_r, s_r)
        assert_no_worse_than_eager("grad", g, g_e, g_r)


def test_jsd_module_and_no_grad():
    s = leaf(log_probs((2, 5, 131), torch.bfloat16, "cpu"))
    t = log_probs((2, 5, 131), torch.bfloat16, "cpu")
    labels = shift_labels((2, 5), "cpu")
    module = LigerJSD(beta=0.3, ignore_index=-100)
    assert list(module.state_dict()) == [] and "beta=0.3" in repr(module)
    torch.testing.assert_close(module(s, t, labels), jsd(s, t, 0.3, shift_labels=labels), rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(jsd(s, t, 0.3, shift_labels=labels), module(s, t, labels), rtol=0, atol=0)
    with pytest.raises(ValueError, match="beta"):
        LigerJSD(beta=1.5)


def test_jsd_and_kl_div_under_torch_compile():
    """torch.compile traces jsd and kl_div (custom ops with fake implementations) without graph breaks."""
    from liger_core.ops import kl_div

    s = leaf(log_probs((6, 33), torch.float32, "cpu"))
    t = log_probs((6, 33), torch.float32, "cpu")
    labels = torch.tensor([1, -100, 2, 3, 4, -100])

    def loss_fn(a):
        return jsd(a, t, 0.5, shift_labels=labels) * 2.0 + kl_div(a, t.exp())

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)(s)
    eager = loss_fn(s)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    torch.testing.assert_close(
        torch.autograd.grad(compiled, s)[0], torch.autograd.grad(eager, s)[0], rtol=0, atol=0
    )


def test_jsd_custom_ops_opcheck():
    x = log_probs((5, 33), torch.float32, "cpu")
    y = log_probs((5, 33), torch.float32, "cpu")
    labels = torch.tensor([1, -100, 2, 3, -100])
    torch.library.opcheck(jsd_module._jsd_fwd, (x, y, labels, 0.5, -100))
    torch.library.opcheck(jsd_module._jsd_bwd, (x, y, None, torch.tensor(0.3), 1.0, -100))


def test_jsd_bad_input():
    s = log_probs((4, 8), torch.float32, "cpu")
    with pytest.raises(ValueError, match="teacher_logp"):
        jsd(s, log_probs((4, 9), torch.float32, "cpu"))
    with pytest.raises(TypeError, match="teacher_logp"):
        jsd(s, s.double())
    with pytest.raises(TypeError, match="student_logp"):
        jsd(s.long(), s.long())
    with pytest.raises(TypeError, match="student_logp"):
        jsd([1.0], s)
    with pytest.raises(ValueError, match="beta"):
        jsd(s, s, beta=-0.1)
    with pytest.raises(ValueError, match="shift_labels"):
        jsd(s, s, shift_labels=torch.zeros(5, dtype=torch.long))
    with pytest.raises(TypeError, match="shift_labels"):
        jsd(s, s, shift_labels=torch.zeros(4))
    with pytest.raises(TypeError, match="ignore_index"):
        jsd(s, s, ignore_index=1.5)
    with pytest.raises(ValueError, match="teacher_logp"):
        jsd(s, torch.empty(4, 8, device="meta"))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")
def test_jsd_llama3_vocab_bf16_cuda():
    """8192 x 128256 bf16 (Llama-3 vocabulary): loss and gradient within one bf16 rounding of the float64
    values of the same inputs (the reference runs in row chunks: a float64 copy of one input is 8 GiB)."""
    n, vocab, beta = 8192, 128256, 0.5
    s = leaf(log_probs((n, vocab), torch.bfloat16, "cuda"))
    t = log_probs((n, vocab), torch.bfloat16, "cuda")
    labels = shift_labels((n,), "cuda")
    go = grad_output(torch.bfloat16, "cuda")
    loss = jsd(s, t, beta, shift_labels=labels)
    (g,) = torch.autograd.grad(loss, s, go)
    kept = labels != -100
    n_kept = int(kept.sum())
    loss_r, err2, norm2 = 0.0, 0.0, 0.0
    for rows in torch.arange(n, device="cuda").split(512):
        rows = rows[kept[rows]]
        s_r = leaf(s[rows], torch.float64)
        part = jsd_rows(s_r, t[rows].double(), beta).sum() / n_kept
        (g_r,) = torch.autograd.grad(part, s_r, go.double())
        loss_r += part.item()
        err2 += (g[rows].double() - g_r).pow(2).sum().item()
        norm2 += g_r.pow(2).sum().item()
    assert abs(loss.item() - loss_r) <= 2**-8 * abs(loss_r)
    assert math.sqrt(err2 / norm2) <= 2**-8
    assert (g[~kept] == 0).all()


# ----------------------------------------------------------------------------------------------------------
# Edge cases on both paths: empty batches, non-finite log-probs, any strides, the fp32 loss
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_jsd_empty_and_all_ignored(path, beta):
    """No rows (with or without labels, 2-D or 3-D) or every row ignored: a loss of 0 (the documented mean
    over no rows), fp32, with zero gradients in the inputs' dtype; the same on both paths."""
    for shape, labels in (
        ((0, 131), None),
        ((2, 0, 131), None),
        ((0, 131), torch.zeros(0, dtype=torch.long)),
        ((5, 131), torch.full((5,), -100)),
    ):
        s = leaf(log_probs(shape, torch.bfloat16, "cpu"))
        t = log_probs(shape, torch.bfloat16, "cpu")
        loss = jsd(s, t, beta, shift_labels=labels)
        (g,) = torch.autograd.grad(loss * 2.0, s)
        assert loss.dtype == torch.float32 and loss.shape == () and loss.item() == 0.0, (shape, loss)
        assert g.dtype == torch.bfloat16 and g.shape == s.shape and (g == 0).all()


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_jsd_non_finite_log_probs(path, beta):
    """fp32 log-probs holding -inf (probability 0), NaN and +inf: every gradient element and the loss have
    NaN and +-inf exactly where the float64 reference has them, its values elsewhere. A term of probability
    0 contributes 0 (``0 log 0 = 0``, documented: the plain eager formula gives NaN there); NaN gives NaN.
    bf16 log-probs take the same branches (fp32 math inside)."""
    s = log_probs((7, 131), torch.float32, "cpu")
    t = log_probs((7, 131), torch.float32, "cpu")
    s[0, 3] = t[0, 5] = -float("inf")  # a masked entry in one model
    s[1, 7] = t[1, 7] = -float("inf")  # in both
    s[2, :] = t[2, :] = -float("inf")  # a whole row in both
    s[3, 9] = float("nan")
    t[4, 2] = float("nan")
    t[5, 1] = float("inf")
    s[6, 4] = float("inf")
    labels = torch.tensor([1, 2, 3, 4, 5, 6, -100])
    x = leaf(s)
    loss = jsd(x, t, beta, shift_labels=labels)
    (g,) = torch.autograd.grad(loss, x, torch.tensor(1.3))
    x64 = leaf(s, torch.float64)
    want = reference.jsd(x64, t.double(), beta, shift_labels=labels)
    (g64,) = torch.autograd.grad(want, x64, torch.tensor(1.3, dtype=torch.float64))
    assert_same_values("loss", loss, want.detach())
    assert_same_values("grad", g, g64)
    assert (g[6] == 0).all()  # the ignored row, whatever it holds
    # entries of probability 0 in both models: the JSD of the other entries alone (finite); in one model
    # only, a KL with that model second is +inf (mathematically), a mixture's finite
    keep = s[1] > -float("inf")
    want = float(jsd_rows(s[1:2, keep].double(), t[1:2, keep].double(), beta)) / 2
    loss = jsd(s[1:3], t[1:3], beta)
    assert torch.isfinite(loss) and abs(loss.item() - want) <= 1e-6 * abs(want)
    assert torch.isposinf(jsd(s[:1], t[:1], beta)) == (beta in (0.0, 1.0))


def test_jsd_strided_inputs(path):
    """student_logp strided (gaps poisoned with NaN), teacher_logp with rows expanded from one (row stride 0)
    or in a transposed storage, shift_labels strided (gaps of class 0): forward and backward give the values
    of contiguous inputs."""
    s = log_probs((3, 5, 131), torch.float32, "cpu")
    t = log_probs((3, 5, 131), torch.float32, "cpu")
    t_row = log_probs((131,), torch.float32, "cpu")
    labels = shift_labels((3, 5), "cpu")
    wide = torch.full((3, 5, 262), float("nan"))
    wide[..., ::2] = s
    x = wide.requires_grad_()[..., ::2]  # a strided view: its gradient is taken w.r.t. the view
    lab_wide = torch.zeros(3, 10, dtype=torch.long)
    lab_wide[:, ::2] = labels
    for teacher in (t.transpose(0, 1).contiguous().transpose(0, 1), t_row.expand(3, 5, 131)):
        x_ref = leaf(s)
        want = jsd(x_ref, teacher.contiguous(), 0.4, shift_labels=labels)
        (g_want,) = torch.autograd.grad(want, x_ref)
        loss = jsd(x, teacher, 0.4, shift_labels=lab_wide[:, ::2])
        (g,) = torch.autograd.grad(loss, x)
        assert not (x.is_contiguous() or teacher.is_contiguous())
        torch.testing.assert_close(loss, want, rtol=1e-6, atol=0)
        torch.testing.assert_close(g, g_want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_jsd_loss_is_fp32(path, dtype):
    """16-bit log-probs: an fp32 loss, exact to fp32 sums (the reference path's fp32 sum over 38k terms is up
    to ~1e-6 off, a loss in the inputs' dtype ~2e-3), the gradient in the inputs' dtype."""
    s = leaf(log_probs((37, 1031), dtype, "cpu"))
    t = log_probs((37, 1031), dtype, "cpu")
    labels = shift_labels((37,), "cpu")
    for beta in (0.0, 0.5, 1.0):
        loss = jsd(s, t, beta, shift_labels=labels)
        (g,) = torch.autograd.grad(loss, s)
        want = reference.jsd(s.double(), t.double(), beta, shift_labels=labels)
        assert loss.dtype == torch.float32 and g.dtype == dtype
        assert rel_err(loss, want) <= 2**-16

import importlib

import pytest
import torch
from helpers import (
    assert_no_worse_than_eager,
    assert_same_values,
    devices,
    dyadic_linear_inputs,
    leaf,
    noncontiguous,
)

from liger_core import reference
from liger_core.ops import FusedLogProbs, fused_linear_logprobs
from liger_core.ops.fused_linear_logprobs import OUTPUTS
from liger_core.reference.fused_linear_logprobs import transform_logits

# the module (``liger_core.ops.fused_linear_logprobs`` is the function of the same name)
fused_linear_logprobs_module = importlib.import_module("liger_core.ops.fused_linear_logprobs")
IGNORE = -100
STATS = OUTPUTS[1:]
FLOAT_FIELDS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits")

# option mixes (kept few: the interpreter is slow); V=1031 spans several 512-column blocks of the kernels;
# >= 37 tokens each: a norm-wise error over fewer tokens is too noisy a sample for the 1.25 x eager rule (11
# tokens: the softcap case's log_probs failed 1 run in 6 on the CPU at 1.3 x)
CASES = {
    "plain": dict(opts={}, bias=False, shape=(37, 67, 131)),
    "scaled": dict(opts=dict(temperature=0.7, logit_scale=1.3), bias=True, shape=(37, 67, 131)),
    "softcap": dict(
        opts=dict(temperature=1.6, softcap=4.0, logit_scale=0.8), bias=True, shape=(41, 24, 1031)
    ),
}


def _inputs(device, dtype, n, hidden_size, vocab, *, bias=False, ignore_every=5, logit_std=1.0, exact=False):
    """Gaussian inputs, or (``exact``) random small dyadic numbers (hidden k/8, weight k/16 times a power of
    two, bias k/8) whose logits are exact in fp32 from any GEMM, chunked or not: then comparing with eager
    measures the kernels' arithmetic, not two draws of GEMM roundings (whose ratio is noise)."""
    if exact:
        hidden, weight, b = dyadic_linear_inputs(
            (n,), hidden_size, vocab, dtype, device, bias=bias, logit_std=logit_std
        )
    else:
        hidden = torch.randn(n, hidden_size, dtype=torch.float64, device=device).to(dtype)
        weight = (
            logit_std * torch.randn(vocab, hidden_size, dtype=torch.float64, device=device) / hidden_size**0.5
        ).to(dtype)
        b = torch.randn(vocab, dtype=torch.float64, device=device).to(dtype) if bias else None
    target = torch.randint(0, vocab, (n,), device=device)
    if ignore_every:
        target[torch.randperm(n, device=device)[: max(1, n // ignore_every)]] = IGNORE
    return hidden, weight, b, target


def _three_ways(hidden, weight, bias, target, grad_out, ours_kwargs, **opts):
    """(outputs, [dhidden, dweight, dbias]) from the op, the eager reference (same dtype) and float64."""
    out = []
    for kind in ("ours", "eager", "ref64"):
        dtype = torch.float64 if kind == "ref64" else hidden.dtype
        h, w = leaf(hidden, dtype), leaf(weight, dtype)
        b = leaf(bias, dtype) if bias is not None else None
        fn = fused_linear_logprobs if kind == "ours" else reference.fused_linear_logprobs
        res = fn(h, w, target, b, outputs=OUTPUTS, **opts, **(ours_kwargs if kind == "ours" else {}))
        inputs = [h, w] + ([b] if b is not None else [])
        out.append((res, torch.autograd.grad(res.log_probs, inputs, grad_out.to(res.log_probs.dtype))))
    return out


def _assert_top1(ours, ref64, z_gap, tol):
    """is_top1 equals the float64 answer except where the target's logit is within ``tol`` of the best
    other logit (a tie in the rounded logits can go either way)."""
    differ = ours != ref64
    assert not differ.any() or bool((z_gap[differ] <= tol).all()), f"is_top1 differs: {differ.nonzero()}"


def _top1_gap(hidden, weight, bias, target, opts):
    """|z_target - max_{v != target} z_v| in float64 (ignored rows: inf)."""
    logits = torch.nn.functional.linear(
        hidden.double(), weight.double(), bias.double() if bias is not None else None
    )
    z = transform_logits(
        logits, opts.get("temperature", 1.0), opts.get("softcap"), opts.get("logit_scale", 1.0)
    )
    valid = target != IGNORE
    safe = target.masked_fill(~valid, 0)
    z_t = z.gather(-1, safe[:, None]).squeeze(-1)
    others = z.scatter(-1, safe[:, None], -torch.inf).amax(-1)
    return torch.where(valid, (z_t - others).abs(), torch.inf)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_logprobs_match_float64(device, dtype, case, poison_empty):
    """Every output and d(hidden, weight, bias) of log_probs against float64, several chunks, a random
    per-token grad_output, ignored tokens; error no larger than the eager composition's in the same dtype."""
    spec = CASES[case]
    n, hidden_size, vocab = spec["shape"] if device == "cpu" else (2048, 4096, 128256)
    hidden, weight, bias, target = _inputs(device, dtype, n, hidden_size, vocab, bias=spec["bias"])
    grad_out = torch.randn(n, device=device)
    ours_kwargs = dict(chunk_size=4 if device == "cpu" else 512)
    (ours, g_ours), (eager, g_eager), (ref, g_ref) = _three_ways(
        hidden, weight, bias, target, grad_out, ours_kwargs, **spec["opts"]
    )
    assert isinstance(ours, FusedLogProbs)
    for name in FLOAT_FIELDS:
        value = getattr(ours, name)
        assert value.dtype == torch.float32 and value.shape == target.shape, name
        assert_no_worse_than_eager(name, value, getattr(eager, name), getattr(ref, name))
        assert bool((value[target == IGNORE] == 0).all()), f"{name}: ignored tokens must be 0"
    assert ours.is_top1.dtype == torch.bool
    tol = 1e-5 if dtype == torch.float32 else 0.1
    _assert_top1(ours.is_top1, ref.is_top1, _top1_gap(hidden, weight, bias, target, spec["opts"]), tol)
    for name, mine, theirs, ref64 in zip(("dhidden", "dweight", "dbias"), g_ours, g_eager, g_ref):
        assert mine.dtype == dtype, name
        assert_no_worse_than_eager(name, mine, theirs, ref64)
    ignored = target == IGNORE
    assert bool((g_ours[0][ignored] == 0).all()), "ignored tokens must get no hidden gradient"


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["scaled", "softcap"])
@pytest.mark.parametrize("with_log_probs", [True, False], ids=["logp+entropy", "entropy"])
def test_entropy_gradient_matches_float64(device, dtype, case, with_log_probs, poison_empty):
    """The entropy carries a gradient (as TRL's kernel; GRPO's entropy bonus): d(<log_probs, g1> + <entropy,
    g2>)/d(hidden, weight, bias), and the entropy's alone, against float64; no worse than eager."""
    spec = CASES[case]
    n, hidden_size, vocab = spec["shape"] if device == "cpu" else (2048, 4096, 128256)
    # exact logits: the entropy's gradient is sensitive to the logits' roundings (Gaussian inputs: dweight
    # and dbias above 1.25 x eager's in ~3 % of fp32 runs, two draws of GEMM roundings)
    hidden, weight, bias, target = _inputs(
        device, dtype, n, hidden_size, vocab, bias=spec["bias"], exact=True
    )
    g1, g2 = torch.randn(n, device=device), torch.randn(n, device=device)
    results = []
    for kind in ("ours", "eager", "ref64"):
        dt = torch.float64 if kind == "ref64" else dtype
        h, w, b = leaf(hidden, dt), leaf(weight, dt), leaf(bias, dt) if bias is not None else None
        fn = fused_linear_logprobs if kind == "ours" else reference.fused_linear_logprobs
        extra = dict(chunk_size=4 if device == "cpu" else 512) if kind == "ours" else {}
        out = fn(h, w, target, b, outputs=("entropy",), **spec["opts"], **extra)
        objective = (out.entropy * g2.to(out.entropy.dtype)).sum()
        if with_log_probs:
            objective = objective + (out.log_probs * g1.to(out.log_probs.dtype)).sum()
        inputs = [h, w] + ([b] if b is not None else [])
        results.append(torch.autograd.grad(objective, inputs))
    for name, mine, theirs, ref64 in zip(("dhidden", "dweight", "dbias"), *results):
        assert mine.dtype == dtype, name
        assert_no_worse_than_eager(name, mine, theirs, ref64)
    assert bool((results[0][0][target == IGNORE] == 0).all()), "ignored tokens must get no hidden gradient"


def test_logprobs_noncontiguous_3d_and_no_grad(poison_empty):
    """(B, T, H) hidden with non-unit strides; the no-grad (evaluation) path gives the same values."""
    hidden, weight, bias, target = _inputs("cpu", torch.float32, 21, 24, 37, bias=True)
    hidden3 = noncontiguous(hidden.view(3, 7, 24))
    opts = dict(temperature=0.9, outputs=OUTPUTS, chunk_size=6)
    with torch.no_grad():
        evaluated = fused_linear_logprobs(hidden3, weight, target.view(3, 7), bias, **opts)
    trained = fused_linear_logprobs(leaf(hidden3), leaf(weight), target.view(3, 7), leaf(bias), **opts)
    ref = reference.fused_linear_logprobs(hidden.double(), weight.double(), target, bias.double(), **opts)
    for name in OUTPUTS:
        a, b = getattr(evaluated, name), getattr(trained, name)
        assert a.shape == (3, 7) and torch.equal(a, b), name
        if name != "is_top1":
            torch.testing.assert_close(a.reshape(-1).double(), getattr(ref, name), rtol=1e-5, atol=1e-5)
    assert trained.log_probs.requires_grad and trained.entropy.requires_grad
    assert not trained.mean_logits.requires_grad and not trained.log_sum_sq_probs.requires_grad


def test_logprobs_outputs_selection():
    """Fields not asked for are None; log_probs is always there; order of ``outputs`` does not matter."""
    hidden, weight, _, target = _inputs("cpu", torch.float32, 9, 24, 37)
    only = fused_linear_logprobs(hidden, weight, target)
    assert only.log_probs is not None and all(getattr(only, name) is None for name in STATS)
    some = fused_linear_logprobs(hidden, weight, target, outputs=["is_top1", "entropy"])
    assert some.entropy is not None and some.is_top1 is not None
    assert some.log_sum_sq_probs is None and some.mean_logits is None
    torch.testing.assert_close(only.log_probs, some.log_probs, rtol=0, atol=0)


def test_logprobs_all_ignored_and_empty():
    """Every token ignored: zeros everywhere, zero gradients, no NaN; zero tokens: empty outputs."""
    hidden, weight, bias, _ = _inputs("cpu", torch.float32, 7, 24, 37, bias=True)
    target = torch.full((7,), IGNORE)
    h, w, b = leaf(hidden), leaf(weight), leaf(bias)
    out = fused_linear_logprobs(h, w, target, b, outputs=OUTPUTS, chunk_size=3)
    for name in FLOAT_FIELDS:
        assert torch.equal(getattr(out, name), torch.zeros(7)), name
    assert not out.is_top1.any()
    grads = torch.autograd.grad(out.log_probs.sum(), [h, w, b])
    for g in grads:
        assert torch.equal(g, torch.zeros_like(g))
    empty = fused_linear_logprobs(leaf(hidden[:0]), w, target[:0], outputs=OUTPUTS)
    assert empty.log_probs.shape == (0,) and empty.entropy.shape == (0,)


def test_logprobs_extreme_logits():
    """Logits near +-1e4 in fp32: finite, and as exact as the eager fp32 code (entropy kept relative to the
    running max, so it does not cancel).

    Integer hidden states and weights (logits: integers of standard deviation ~3e3, exact in fp32 from any
    GEMM) and dyadic grad_outputs: with random fp32 inputs both errors are the rounding of logits this large
    by two different GEMMs (chunk rows vs all rows), two draws whose ratio is noise (100 seeds: 2-4% of
    cases above 1.25 for log_probs, entropy, dweight). Exact logits leave the softmax math itself."""
    _, _, _, target = _inputs("cpu", torch.float32, 13, 24, 131)
    hidden = torch.randint(-4, 5, (13, 24)).float()
    weight = torch.randint(-400, 401, (131, 24)).float()
    grad_out = torch.randint(-8, 9, (13,)) / 8
    (ours, g_ours), (eager, g_eager), (ref, g_ref) = _three_ways(
        hidden, weight, None, target, grad_out, dict(chunk_size=5)
    )
    assert ref.mean_logits.abs().max() > 100
    for name in FLOAT_FIELDS:
        value = getattr(ours, name)
        assert torch.isfinite(value).all(), name
        if name == "entropy":
            # Known limit: rows this extreme are one-hot but for terms exp(-D), D >> 1, and the kernel's
            # entropy log(d) - s/d loses log(d) when d = 1 + tiny rounds to 1 (fp64 math), where eager's sum
            # of p log p keeps it: relative error up to ~1/D of an entropy of ~1e-15 or less. The absolute
            # error is what a logged metric sees: held to eager's plus 1e-15.
            err, err_eager = (
                (value.double() - ref.entropy).abs().max().item(),
                (eager.entropy.double() - ref.entropy).abs().max().item(),
            )
            assert err <= err_eager + 1e-15, f"entropy: abs error {err:.3e} vs eager's {err_eager:.3e}"
            continue
        assert_no_worse_than_eager(name, value, getattr(eager, name), getattr(ref, name))
    for name, mine, theirs, ref64 in zip(("dhidden", "dweight"), g_ours, g_eager, g_ref):
        assert_no_worse_than_eager(name, mine, theirs, ref64)


def test_logprobs_only_stats_used():
    """A loss that uses log_probs while the statistics are requested (non-differentiable outputs) trains;
    a backward that reaches only the detached statistics is refused by autograd (they carry no gradient)."""
    hidden, weight, _, target = _inputs("cpu", torch.float32, 9, 24, 37)
    h = leaf(hidden)
    out = fused_linear_logprobs(h, weight, target, outputs=OUTPUTS)
    (out.log_probs.sum() + out.mean_logits.sum() + out.entropy.sum().detach()).backward()
    assert h.grad is not None and torch.isfinite(h.grad).all()
    with pytest.raises(RuntimeError):
        out2 = fused_linear_logprobs(leaf(hidden), weight, target, outputs=OUTPUTS)
        (out2.log_sum_sq_probs.sum() + out2.mean_logits.sum()).backward()


def test_logprobs_bf16_default_weight_accumulation():
    """accum_dtype=None: dW rounds to bf16 once per chunk (documented), within sqrt(chunks) x eager."""
    hidden, weight, bias, target = _inputs("cpu", torch.bfloat16, 29, 24, 37, bias=True)
    (ours, g_ours), (eager, g_eager), (ref, g_ref) = _three_ways(
        hidden, weight, bias, target, torch.randn(29), dict(chunk_size=8, accum_dtype=None)
    )
    assert_no_worse_than_eager("log_probs", ours.log_probs, eager.log_probs, ref.log_probs)
    assert_no_worse_than_eager("dhidden", g_ours[0], g_eager[0], g_ref[0])
    assert_no_worse_than_eager("dweight", g_ours[1], g_eager[1], g_ref[1], slack=1.25 * 2)


def test_logprobs_matches_trl_kernel():
    """Same outputs and gradients as TRL's own ``ChunkedLogProbFunction`` (its torch tile path on CPU), on
    the valid tokens TRL's fused head passes it, with softcap, logit_scale and temperature."""
    trl_kernels = pytest.importorskip("trl.kernels")
    hidden, weight, bias, target = _inputs("cpu", torch.float32, 23, 24, 37, bias=True)
    opts = dict(temperature=0.8, softcap=5.0, logit_scale=1.2)
    valid = target != IGNORE
    h1, w1, b1 = leaf(hidden), leaf(weight), leaf(bias)
    ours = fused_linear_logprobs(h1, w1, target, b1, outputs=OUTPUTS, chunk_size=7, **opts)
    h2, w2, b2 = leaf(hidden), leaf(weight), leaf(bias)
    theirs = trl_kernels.ChunkedLogProbFunction.apply(
        h2[valid], w2, b2, target[valid], opts["temperature"], 16, opts["softcap"], opts["logit_scale"], STATS
    )
    for name, value in zip(OUTPUTS, theirs):
        mine = getattr(ours, name)[valid]
        if name == "is_top1":
            assert torch.equal(mine, value)
        else:
            torch.testing.assert_close(mine, value, rtol=2e-5, atol=2e-5)
    g_logp, g_entropy = torch.randn(int(valid.sum())), torch.randn(int(valid.sum()))
    full_logp = torch.zeros(23).masked_scatter(valid, g_logp)
    full_entropy = torch.zeros(23).masked_scatter(valid, g_entropy)
    # gradients of the log-probs, and of log-probs + entropy (TRL's entropy carries one: GRPO's bonus)
    for with_entropy in (False, True):
        objective_ours = (ours.log_probs * full_logp).sum()
        objective_trl = (theirs[0] * g_logp).sum()
        if with_entropy:
            objective_ours = objective_ours + (ours.entropy * full_entropy).sum()
            objective_trl = objective_trl + (theirs[1] * g_entropy).sum()
        g_ours = torch.autograd.grad(objective_ours, [h1, w1, b1], retain_graph=True)
        g_trl = torch.autograd.grad(objective_trl, [h2, w2, b2], retain_graph=True)
        for a, b in zip(g_ours, g_trl):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("with_entropy", [False, True], ids=["logp", "logp+entropy"])
def test_logprobs_float64_output(device, with_entropy, monkeypatch):
    """log_probs_dtype=float64: the fp32 output is those values rounded once (bit for bit); the gradient takes
    an fp64 grad_output unrounded: no worse than the fp32 output fed the same grad_output rounded to fp32
    would be, against float64; float64 log-probs of the CPU reference path too."""
    hidden, weight, bias, target = _inputs(device, torch.float32, 37, 67, 131, bias=True, exact=True)
    outputs = ("log_probs", "entropy") if with_entropy else ("log_probs",)
    runs = {}
    for name, dtype in (("fp32", torch.float32), ("fp64", torch.float64)):
        h, w = leaf(hidden), leaf(weight)
        out = fused_linear_logprobs(
            h, w, target, bias, temperature=0.7, outputs=outputs, chunk_size=8, log_probs_dtype=dtype
        )
        assert out.log_probs.dtype == dtype
        runs[name] = (out, h, w)
    assert torch.equal(runs["fp64"][0].log_probs.float(), runs["fp32"][0].log_probs)
    g = torch.randn(37, dtype=torch.float64, device=device) * 3
    g_entropy = torch.randn(37, dtype=torch.float32, device=device)

    def objective(out, grad):
        value = (out.log_probs * grad.to(out.log_probs.dtype)).sum()
        return value + (out.entropy * g_entropy).sum() if with_entropy else value

    h64, w64 = leaf(hidden, torch.float64), leaf(weight, torch.float64)
    ref = reference.fused_linear_logprobs(h64, w64, target, bias.double(), temperature=0.7, outputs=outputs)
    want = torch.autograd.grad(objective(ref, g), (h64, w64))
    got64 = torch.autograd.grad(objective(runs["fp64"][0], g), runs["fp64"][1:])
    got32 = torch.autograd.grad(objective(runs["fp32"][0], g.float()), runs["fp32"][1:])
    for name, a, b, r in zip(("dhidden", "dweight"), got64, got32, want):
        assert a.dtype == torch.float32
        assert_no_worse_than_eager(name, a, b, r)
    with monkeypatch.context() as patch:  # the pure-PyTorch path (CPU tensors without the interpreter)
        patch.setattr(fused_linear_logprobs_module, "use_triton", lambda *_: False)
        fallback = fused_linear_logprobs(hidden, weight, target, bias, log_probs_dtype=torch.float64)
    assert fallback.log_probs.dtype == torch.float64
    with pytest.raises(ValueError, match="log_probs_dtype"):
        fused_linear_logprobs(hidden, weight, target, log_probs_dtype=torch.bfloat16)


def test_logprobs_bad_inputs():
    hidden, weight, bias, target = _inputs("cpu", torch.float32, 5, 24, 37, bias=True)
    with pytest.raises(TypeError, match="target"):
        fused_linear_logprobs(hidden, weight, target.float())
    with pytest.raises(ValueError, match="target"):
        fused_linear_logprobs(hidden, weight, target[:4])
    with pytest.raises(ValueError, match="weight"):
        fused_linear_logprobs(hidden, weight[:, :20], target)
    with pytest.raises(ValueError, match="bias"):
        fused_linear_logprobs(hidden, weight, target, bias[:5])
    with pytest.raises(TypeError, match="weight"):
        fused_linear_logprobs(hidden, weight.bfloat16(), target)
    with pytest.raises(TypeError, match="hidden"):
        fused_linear_logprobs(hidden.double(), weight.double(), target)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            fused_linear_logprobs(hidden, weight, target, temperature=bad)
    with pytest.raises(ValueError, match="logit_scale"):
        fused_linear_logprobs(hidden, weight, target, logit_scale=float("inf"))
    with pytest.raises(ValueError, match="softcap"):
        fused_linear_logprobs(hidden, weight, target, softcap=0.0)
    with pytest.raises(ValueError, match="outputs"):
        fused_linear_logprobs(hidden, weight, target, outputs=("log_probs", "perplexity"))
    with pytest.raises(TypeError, match="outputs"):
        fused_linear_logprobs(hidden, weight, target, outputs="entropy")
    with pytest.raises(ValueError, match="chunk_size"):
        fused_linear_logprobs(hidden, weight, target, chunk_size=0)
    with pytest.raises(ValueError, match="class index 37"):
        fused_linear_logprobs(hidden, weight, torch.tensor([0, 1, 37, 2, IGNORE]))
    with pytest.raises(ValueError, match="class index -1"):
        fused_linear_logprobs(hidden, weight, torch.tensor([0, 1, -1, 2, IGNORE]))


@pytest.mark.slow
def test_logprobs_torch_compile_fullgraph():
    """Under torch.compile (fullgraph, aot_eager: the custom ops' fake implementations trace the graph) the
    outputs and the log-prob + entropy gradients equal eager's."""
    hidden, weight, _, target = _inputs("cpu", torch.float32, 11, 24, 37)

    def fn(h, w):
        out = fused_linear_logprobs(
            h, w, target, temperature=0.7, outputs=("entropy", "mean_logits", "is_top1"), chunk_size=4
        )
        return out.log_probs.sum() + 0.1 * out.entropy.sum(), out.mean_logits, out.is_top1

    results = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        h, w = leaf(hidden), leaf(weight)
        objective, mean_logits, top1 = f(h, w)
        results.append((objective, mean_logits, top1, *torch.autograd.grad(objective, [h, w])))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager)


# ----------------------------------------------------------------------------------------------------------
# Edge cases on both paths: empty and all-ignored batches, non-finite inputs, any strides
# ----------------------------------------------------------------------------------------------------------


def test_logprobs_empty_and_all_ignored_both_paths(path):
    """No tokens (2-D or (B, 0) leading dims) and every token ignored: empty outputs, or zeros (False), zero
    gradients through the log-probs and the entropy; the same on both paths."""
    hidden, weight, bias, _ = _inputs("cpu", torch.bfloat16, 6, 24, 37, bias=True)
    for h0, target in (
        (hidden[:0], torch.zeros(0, dtype=torch.long)),
        (hidden[:0].view(2, 0, 24), torch.zeros(2, 0, dtype=torch.long)),
        (hidden, torch.full((6,), IGNORE)),
    ):
        h, w, b = leaf(h0), leaf(weight), leaf(bias)
        out = fused_linear_logprobs(h, w, target, b, outputs=OUTPUTS, chunk_size=4)
        for name in OUTPUTS:
            value = getattr(out, name)
            assert value.shape == target.shape and not value.any(), name
            assert value.dtype == (torch.bool if name == "is_top1" else torch.float32), name
        grads = torch.autograd.grad((out.log_probs + out.entropy).sum(), (h, w, b))
        for g, x in zip(grads, (h, w, b)):
            assert g.dtype == x.dtype and torch.equal(g, torch.zeros_like(x))


@pytest.mark.parametrize("case", ["neg_inf_weight", "non_finite_hidden", "nan_weight"])
def test_logprobs_non_finite_as_eager(path, case):
    """fp32 inputs holding -inf, +inf and NaN: every field and the gradients of the log-probs (and of the
    entropy) have NaN and +-inf exactly where the eager composition's (float64) have them, its values
    elsewhere; ``is_top1`` equal (torch.argmax: the first NaN, else the first maximum). ``neg_inf_weight``:
    the first 600 classes' logits -inf in every row (the kernel's leading column blocks; a target among
    them: log-prob -inf; the entropy NaN there, 0 * -inf, as eager's); ``non_finite_hidden``: NaN and +inf
    hidden entries make a row's logits NaN / +-inf; ``nan_weight``: one class's logit NaN in every row (all
    NaN, ``is_top1`` True where it is the target). bf16 takes the same branches."""
    n, hidden_size, vocab = 9, 16, 1031
    hidden, weight, bias, target = _inputs("cpu", torch.float32, n, hidden_size, vocab, bias=True)
    hidden[:, 0] = torch.rand(n) + 0.5  # positive: weight[:, 0] * hidden[:, 0] keeps its sign
    target[1], target[2], target[3] = 3, 700, 5
    if case == "neg_inf_weight":
        weight[:600, 0] = -float("inf")
    elif case == "non_finite_hidden":
        hidden[2, 3] = float("nan")
        hidden[3, 5] = float("inf")
    else:
        weight[700, 2] = float("nan")
    g_logp, g_entropy = torch.randn(n), torch.randn(n)
    results = []
    for kind in ("ours", "ref64"):
        dtype = torch.float32 if kind == "ours" else torch.float64
        h, w, b = leaf(hidden, dtype), leaf(weight, dtype), leaf(bias, dtype)
        fn = fused_linear_logprobs if kind == "ours" else reference.fused_linear_logprobs
        out = fn(
            h,
            w,
            target,
            b,
            outputs=OUTPUTS,
            temperature=0.8,
            **(dict(chunk_size=4) if kind == "ours" else {}),
        )
        g1 = torch.autograd.grad((out.log_probs * g_logp.to(dtype)).sum(), (h, w, b), retain_graph=True)
        objective = (out.log_probs * g_logp.to(dtype)).sum() + (out.entropy * g_entropy.to(dtype)).sum()
        g2 = torch.autograd.grad(objective, (h, w, b))
        results.append((out, g1, g2))
    (ours, g1, g2), (want, g1_64, g2_64) = results
    for name in FLOAT_FIELDS:
        assert_same_values(name, getattr(ours, name), getattr(want, name).detach())
    assert torch.equal(ours.is_top1, want.is_top1)
    for name, a, r in zip(("dhidden", "dweight", "dbias"), g1, g1_64):
        assert_same_values(f"{name} (log_probs)", a, r)
    for name, a, r in zip(("dhidden", "dweight", "dbias"), g2, g2_64):
        assert_same_values(f"{name} (log_probs + entropy)", a, r)


def test_logprobs_strided_arguments(path):
    """hidden, weight, bias and target as non-contiguous views (gaps poisoned: NaN, out-of-range targets;
    weight also in the transposed (H, V) storage), the per-token grad_output strided: the values of
    contiguous inputs, every field and gradient."""
    hidden, weight, bias, target = _inputs("cpu", torch.float32, 21, 24, 37, bias=True)
    hidden, target = hidden.view(3, 7, 24), target.view(3, 7)
    g_logp = torch.randn(3, 7)

    def strided(t, junk=float("nan")):
        wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), junk, dtype=t.dtype)
        wide[..., ::2] = t
        return wide[..., ::2]

    opts = dict(temperature=0.7, outputs=OUTPUTS, chunk_size=5)
    h, w, b = leaf(hidden), leaf(weight), leaf(bias)
    want = fused_linear_logprobs(h, w, target, b, **opts)
    want_grads = torch.autograd.grad((want.log_probs * g_logp).sum() + want.entropy.sum(), (h, w, b))
    for w_layout in ("strided", "transposed"):
        h_s, b_s = strided(hidden).requires_grad_(), strided(bias).requires_grad_()
        w_s = (strided(weight) if w_layout == "strided" else weight.t().contiguous().t()).requires_grad_()
        out = fused_linear_logprobs(h_s, w_s, strided(target, 10**6), b_s, **opts)
        g_s = strided(g_logp)
        grads = torch.autograd.grad((out.log_probs * g_s).sum() + out.entropy.sum(), (h_s, w_s, b_s))
        for name in OUTPUTS:
            torch.testing.assert_close(getattr(out, name), getattr(want, name), rtol=1e-5, atol=1e-6)
        for g, g_want in zip(grads, want_grads):
            torch.testing.assert_close(g, g_want, rtol=1e-5, atol=1e-6)

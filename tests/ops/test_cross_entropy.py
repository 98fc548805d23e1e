import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import SLACK, assert_no_worse_than_eager, assert_same_values, devices, leaf, rel_err

from liger_core import reference, tuning
from liger_core.modules import LigerCrossEntropyLoss
from liger_core.ops import _cross_entropy_resident as resident
from liger_core.ops import cross_entropy

IGNORE = -100


# option sets (CPU shapes are small: the Triton interpreter runs one row at a time)
CASES = {
    "plain": dict(),
    "smooth_weight": dict(label_smoothing=0.1, weighted=True),
    "zloss_softcap": dict(lse_square_scale=1e-2, softcap=4.0),
    "all": dict(label_smoothing=0.2, weighted=True, lse_square_scale=1e-3, softcap=30.0),
}


# A loss's error is mostly its final rounding to the output dtype (fp32), a lottery that eager can win by
# luck: a scalar loss, and the per-row losses of 16-bit logits (fp32 math inside, like eager's fp32 upcast:
# two errors of one size, 40 draws of 11 rows up to 1.11 x eager's + the floor), may exceed SLACK x eager's
# error by that unavoidable relative half ulp, no more. Per-row losses of fp32 logits (fp64 math) take the
# plain rule.
HALF_ULP = {torch.float32: 2.0**-24}


def assert_loss_no_worse(name, ours, eager, ref64, logits_dtype=torch.float32):
    if ours.dim() > 0 and logits_dtype == torch.float32:
        assert_no_worse_than_eager(name, ours, eager, ref64)
        return
    e_ours, e_eager = rel_err(ours, ref64), rel_err(eager, ref64)
    assert e_ours <= SLACK * e_eager + HALF_ULP[ours.dtype], (
        f"{name}: rel. error {e_ours:.3e} > {SLACK} x eager's {e_eager:.3e} + half ulp ({ours.dtype})"
    )


def _inputs(device, dtype, n, vocab, *, scale=3.0, weighted=False, ignore_every=5, batch_shape=None):
    logits = (torch.randn(n, vocab, dtype=torch.float64, device=device) * scale).to(dtype)
    target = torch.randint(0, vocab, (n,), device=device)
    if ignore_every:
        target[torch.randperm(n, device=device)[: n // ignore_every]] = IGNORE
    weight = (torch.rand(vocab, dtype=torch.float64, device=device) + 0.5).to(dtype) if weighted else None
    if batch_shape is not None:
        logits, target = logits.reshape(*batch_shape, vocab), target.reshape(batch_shape)
    return logits, target, weight


def _eager_in_dtype(logits, target, weight, reduction="mean", label_smoothing=0.0, lse_square_scale=0.0,
                    softcap=None):  # fmt: skip
    """torch's cross-entropy (+ softcap, z-loss) on the logits in their own dtype: the gradient's comparator.
    (Hugging Face's upcast to fp32, the reference path, computes the gradient with grad_output inside its one
    rounding; the op stores its gradient rounded once and scales it by grad_output in backward, a second
    rounding for 16-bit logits other than fp16: see the op's module doc.)"""
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(
        logits, target, weight, ignore_index=IGNORE, reduction=reduction, label_smoothing=label_smoothing
    )
    if lse_square_scale:
        valid = target != IGNORE
        z = (lse_square_scale * torch.logsumexp(logits, -1).square()).masked_fill(~valid, 0.0)
        loss = loss + {"none": z, "sum": z.sum(), "mean": z.sum() / valid.sum()}[reduction]
    return loss


def _three_ways(logits, target, weight, grad_out, **opts):
    """(loss, z_loss, dlogits) from the kernel, the eager composition, and float64. Eager's loss and z-loss
    are the reference path's (fp32 from upcast logits, as Hugging Face's loss), its gradient that of the
    composition in the logits' dtype (``_eager_in_dtype``)."""
    out = []
    for kind in ("ours", "eager", "ref64"):
        dtype = torch.float64 if kind == "ref64" else logits.dtype
        x = leaf(logits, dtype)
        w = weight.to(dtype) if weight is not None else None
        fn = cross_entropy if kind == "ours" else reference.cross_entropy
        loss, z = fn(x, target, w, return_z_loss=True, **opts)
        if kind == "eager":
            loss_in_dtype = _eager_in_dtype(x, target, w, **opts)
            (dx,) = torch.autograd.grad(loss_in_dtype, x, grad_out.to(dtype))
        else:
            (dx,) = torch.autograd.grad(loss, x, grad_out.to(loss.dtype))
        out.append((loss, z, dx))
    return out


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", list(CASES))
def test_cross_entropy_matches_float64(device, dtype, reduction, case, poison_empty):
    opts = dict(CASES[case])
    weighted = opts.pop("weighted", False)
    n, vocab = (37, 131) if device == "cpu" else (4096, 128256)
    if device == "cpu" and dtype == torch.bfloat16 and reduction == "none":
        # per-token grad_output: the stored bf16 gradient is rounded a second time when scaled (see the op's
        # docstring), so the ratio of the two maximum errors is noisier; 4x the rows keep one draw from
        # deciding it
        n = 148
    logits, target, weight = _inputs(device, dtype, n, vocab, weighted=weighted)
    if reduction == "none":  # per-token grad_output (the reference system got these wrong)
        grad_out = torch.randn(n, device=device).to(dtype)
    else:  # loss is not the last op: grad_output != 1
        grad_out = torch.tensor(3.7 if case != "plain" else 1.0, device=device).to(dtype)
    (loss, z, dx), (loss_e, z_e, dx_e), (loss_r, z_r, dx_r) = _three_ways(
        logits, target, weight, grad_out, reduction=reduction, **opts
    )
    assert loss.dtype == torch.float32 and loss.shape == loss_r.shape and z.shape == loss.shape
    assert dx.dtype == dtype
    assert_loss_no_worse("loss", loss, loss_e, loss_r, dtype)
    if opts.get("lse_square_scale"):
        assert_loss_no_worse("z_loss", z, z_e, z_r, dtype)
    assert_no_worse_than_eager("dlogits", dx, dx_e, dx_r)
    ignored = target == IGNORE
    assert (dx[ignored] == 0).all()


def _divided_three_ways(logits, target, denominator, **opts):
    """(loss, dlogits) of sum / denominator: the op with ``denominator=``, HF's eager composition (the sum
    divided afterwards) and float64; loss.backward() with grad_output 1, as the Trainer calls it."""
    out = []
    for kind in ("ours", "eager", "ref64"):
        x = leaf(logits, torch.float64 if kind == "ref64" else logits.dtype)
        fn = cross_entropy if kind == "ours" else reference.cross_entropy
        loss = fn(x, target, reduction="sum", denominator=denominator, **opts)
        loss.backward()
        out.append((loss, x.grad))
    return out


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inplace_backward", [False, True], ids=["buffer", "inplace"])
@pytest.mark.parametrize("as_tensor", [True, False], ids=["tensor", "number"])
def test_cross_entropy_denominator_matches_float64(device, dtype, inplace_backward, as_tensor, poison_empty):
    """The sum divided by a denominator (HF's num_items_in_batch: the kept tokens of all micro-batches) inside
    the op: loss and gradient at eager's accuracy, ignored rows zero, z-loss included."""
    n, vocab = (37, 1031) if device == "cpu" else (4096, 128256)
    logits, target, _ = _inputs(device, dtype, n, vocab)
    denominator = 4 * int((target != IGNORE).sum()) + 3
    denominator = torch.tensor(denominator, device=device) if as_tensor else denominator
    opts = dict(lse_square_scale=1e-3, inplace_backward=inplace_backward)
    (loss, dx), (loss_e, dx_e), (loss_r, dx_r) = _divided_three_ways(logits, target, denominator, **opts)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert_loss_no_worse("loss", loss, loss_e, loss_r)
    assert_no_worse_than_eager("dlogits", dx, dx_e, dx_r)
    assert (dx[target == IGNORE] == 0).all()


def test_cross_entropy_denominator_beats_dividing_afterwards():
    """bf16 logits: dividing the returned sum scales the stored bf16 gradient in backward and rounds every
    element a second time; inside the op each rounds once. One draw's ratio varies (the target columns'
    large gradients dominate the norm), so errors are summed over four draws (0.90-0.96 in 12 such sums)."""
    inside = after = 0.0
    for _ in range(4):
        logits, target, _ = _inputs("cpu", torch.bfloat16, 37, 1031)
        denominator = torch.tensor(4 * int((target != IGNORE).sum()) + 3)
        (_, dx), _, (_, dx_r) = _divided_three_ways(logits, target, denominator)
        x = leaf(logits)
        (cross_entropy(x, target, reduction="sum") / denominator).backward()
        inside += rel_err(dx, dx_r)
        after += rel_err(x.grad, dx_r)
    assert inside < 0.98 * after, (inside, after)


def test_cross_entropy_denominator_zero_and_bad_values():
    """0 (nothing kept in the whole accumulated batch) gives loss 0 and zero gradients, as tensor or number;
    bad values and other reductions are refused, naming the argument; the module passes it through."""
    logits, target, _ = _inputs("cpu", torch.float32, 13, 131)
    for zero in (0, torch.tensor(0)):
        x = leaf(logits)
        loss = cross_entropy(x, target, reduction="sum", denominator=zero)
        loss.backward()
        assert torch.equal(loss, torch.zeros_like(loss)) and torch.equal(x.grad, torch.zeros_like(x))
    for bad in (-1, math.nan, "3", torch.ones(2)):
        with pytest.raises(ValueError, match="denominator"):
            cross_entropy(logits, target, reduction="sum", denominator=bad)
    with pytest.raises(ValueError, match="denominator.*reduction"):
        cross_entropy(logits, target, denominator=5)
    module = LigerCrossEntropyLoss(reduction="sum")
    torch.testing.assert_close(
        module(logits, target, denominator=7.0), cross_entropy(logits, target, reduction="sum") / 7.0
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_multi_block_rows(dtype, poison_empty):
    """V = 1031 spans several column blocks: the online max / rescaled sum across blocks, all options on."""
    logits, target, weight = _inputs("cpu", dtype, 11, 1031, weighted=True, ignore_every=4)
    grad_out = torch.randn(11).to(dtype)
    opts = dict(reduction="none", label_smoothing=0.05, lse_square_scale=1e-3, softcap=20.0)
    (loss, z, dx), (loss_e, z_e, dx_e), (loss_r, z_r, dx_r) = _three_ways(
        logits, target, weight, grad_out, **opts
    )
    assert_loss_no_worse("loss", loss, loss_e, loss_r, dtype)
    assert_loss_no_worse("z_loss", z, z_e, z_r, dtype)
    assert_no_worse_than_eager("dlogits", dx, dx_e, dx_r)


def test_cross_entropy_zero_weight_targets_mean_is_nan_as_torch(path):
    """Every non-ignored target of class weight 0: torch's mean is 0 / 0, NaN, and so is its gradient in the
    non-ignored rows (ignored rows: 0); on both paths."""
    logits, target, _ = _inputs("cpu", torch.float32, 9, 131, ignore_every=3)
    weight = torch.rand(131) + 0.5
    weight[target[target != IGNORE]] = 0.0
    x, x_t = leaf(logits), leaf(logits)
    loss = cross_entropy(x, target, weight)
    loss.backward()
    want = F.cross_entropy(x_t, target, weight)
    want.backward()
    assert loss.isnan() and want.isnan()
    assert torch.equal(x.grad.isnan(), x_t.grad.isnan()) and x.grad.isnan().any()
    assert (x.grad[target == IGNORE] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_extreme_logits(dtype):
    """Logits of +-1e4 (targets on both sides), with label smoothing and z-loss: finite and exact."""
    n, vocab = 12, 131
    logits = torch.randn(n, vocab, dtype=torch.float64)
    logits[:, ::3] += 1e4
    logits[:, 1::3] -= 1e4
    logits = logits.to(dtype)
    target = torch.randint(0, vocab, (n,))
    target[:4] = torch.arange(4) * 3  # at +1e4
    target[4:8] = torch.arange(4) * 3 + 1  # at -1e4: loss 2e4
    target[8] = IGNORE
    grad_out = torch.tensor(1.5).to(dtype)
    for opts in (dict(), dict(label_smoothing=0.1, lse_square_scale=1e-6)):
        (loss, _, dx), (loss_e, _, dx_e), (loss_r, _, dx_r) = _three_ways(
            logits, target, None, grad_out, **opts
        )
        assert torch.isfinite(loss) and torch.isfinite(dx).all()
        assert_loss_no_worse("loss", loss, loss_e, loss_r, dtype)
        assert_no_worse_than_eager("dlogits", dx, dx_e, dx_r)


def test_cross_entropy_tied_extreme_logits():
    """Every logit +1e4 (a row of exact ties): loss log(V), gradient softmax - onehot = 1/V - [c == y]."""
    vocab = 131
    x = leaf(torch.full((4, vocab), 1e4))
    target = torch.tensor([0, 5, 130, IGNORE])
    loss = cross_entropy(x, target, reduction="sum")
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(3 * torch.log(torch.tensor(float(vocab))).item()))
    expected = torch.full((4, vocab), 1.0 / vocab)
    expected[3] = 0.0
    expected[torch.arange(3), target[:3]] -= 1.0
    torch.testing.assert_close(x.grad, expected, rtol=1e-6, atol=1e-9)


def test_cross_entropy_batched_shape_int32_target_and_backward_call():
    """(B, T, V) logits with (B, T) int32 targets; grad_output 1 via loss.backward(); loss * 3.7 backward."""
    logits, target, _ = _inputs("cpu", torch.float32, 15, 131, batch_shape=(3, 5))
    target = target.int()
    x, x_r = leaf(logits), leaf(logits, torch.float64)
    none = cross_entropy(x, target, reduction="none")
    assert none.shape == (3, 5)
    torch.testing.assert_close(none.double(), reference.cross_entropy(x_r, target, reduction="none"))
    for factor in (1.0, 3.7):
        x.grad = x_r.grad = None
        (cross_entropy(x, target) * factor).backward()
        (reference.cross_entropy(x_r, target) * factor).backward()
        torch.testing.assert_close(x.grad.double(), x_r.grad, rtol=1e-5, atol=1e-7)


def test_cross_entropy_default_never_modifies_logits():
    logits, target, _ = _inputs("cpu", torch.float32, 13, 131)
    x = leaf(logits)
    y = x * 1.0  # a non-leaf, as a model's output would be
    before = y.detach().clone()
    cross_entropy(y, target, label_smoothing=0.1).backward()
    assert torch.equal(y.detach(), before)
    with torch.no_grad():  # forward only: nothing is written, even when in place is allowed
        cross_entropy(y, target, inplace_backward=True)
    assert torch.equal(y.detach(), before)


def test_cross_entropy_inplace_backward():
    """inplace_backward=True: the gradient lives in the logits buffer (no extra memory), same values; the
    mutation is declared, so another autograd node that saved the logits raises instead of going wrong."""
    logits, target, _ = _inputs("cpu", torch.float32, 13, 131)
    x_ref = leaf(logits)
    (cross_entropy(x_ref, target, reduction="sum") * 2.5).backward()

    x = leaf(logits)
    y = x * 1.0
    version = y._version
    loss = cross_entropy(y, target, reduction="sum", inplace_backward=True)
    assert y._version > version
    torch.testing.assert_close(y.detach(), x_ref.grad / 2.5)  # the buffer now holds d(loss)/d(logits)
    (loss * 2.5).backward()
    torch.testing.assert_close(x.grad, x_ref.grad)

    x2 = leaf(logits)
    y2 = x2 * 1.0
    other = (y2**2).sum()  # pow saves y2 for its backward
    loss2 = cross_entropy(y2, target, inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (other + loss2).backward()


def test_cross_entropy_retain_graph_second_backward_raises():
    logits, target, _ = _inputs("cpu", torch.float32, 5, 131)
    x = leaf(logits)
    loss = cross_entropy(x, target)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        loss.backward()


def test_cross_entropy_bad_input():
    logits = torch.randn(6, 131)
    target = torch.randint(0, 131, (6,))
    bad = target.clone()
    bad[2] = 131
    with pytest.raises(ValueError, match="target"):
        cross_entropy(logits, bad)
    bad[2] = -1
    with pytest.raises(ValueError, match="target"):
        cross_entropy(logits, bad)
    bad[2] = -1
    cross_entropy(logits, bad, ignore_index=-1)  # -1 is fine when it is the ignore_index
    with pytest.raises(ValueError, match="target"):
        cross_entropy(logits, target[:5])
    with pytest.raises(TypeError, match="target"):
        cross_entropy(logits, target.float())
    with pytest.raises(TypeError, match="logits"):
        cross_entropy(logits.long(), target)
    with pytest.raises(ValueError, match="weight"):
        cross_entropy(logits, target, torch.rand(130))
    with pytest.raises(ValueError, match="reduction"):
        cross_entropy(logits, target, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        cross_entropy(logits, target, label_smoothing=1.5)
    with pytest.raises(ValueError, match="softcap"):
        cross_entropy(logits, target, softcap=0.0)


def test_cross_entropy_check_targets_false_and_strided_target():
    """check_targets=False skips the range check (no error, no out-of-bounds access: the kernel clamps the
    index), the valid rows are unaffected; a strided 1-D target is read with its strides."""
    logits, target, _ = _inputs("cpu", torch.float32, 6, 131, ignore_every=0)
    ref = reference.cross_entropy(logits.double(), target, reduction="none")
    bad = target.clone()
    bad[2] = 131
    loss = cross_entropy(logits, bad, reduction="none", check_targets=False)
    keep = torch.arange(6) != 2
    assert torch.isfinite(loss).all()
    torch.testing.assert_close(loss[keep].double(), ref[keep])
    wide = torch.stack([target, torch.full_like(target, 7)], 1).reshape(-1)  # target = wide[::2]
    torch.testing.assert_close(cross_entropy(logits, wide[::2], reduction="none").double(), ref)


def test_cross_entropy_module():
    logits, target, weight = _inputs("cpu", torch.float32, 13, 131, weighted=True)
    module = LigerCrossEntropyLoss(
        weight=weight, label_smoothing=0.1, lse_square_scale=1e-3, return_z_loss=True
    )
    loss, z = module(leaf(logits), target)
    loss_f, z_f = cross_entropy(
        logits, target, weight, label_smoothing=0.1, lse_square_scale=1e-3, return_z_loss=True
    )
    assert torch.equal(loss, loss_f) and torch.equal(z, z_f)
    assert "weight" in dict(module.named_buffers())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_cross_entropy_int64_offsets_cuda():
    """32768 x 131072 bf16 logits (8 GiB): row * V passes 2^31; per-row losses and the last rows' gradients
    against an fp64 reference computed row-block by row-block before the in-place overwrite."""
    n, vocab = 32768, 131072
    logits = torch.randn(n, vocab, device="cuda", dtype=torch.bfloat16) * 2
    target = torch.randint(0, vocab, (n,), device="cuda")
    target[-3] = IGNORE
    ref_loss = torch.empty(n, dtype=torch.float64, device="cuda")
    for s in range(0, n, 2048):
        ref_loss[s : s + 2048] = reference.cross_entropy(
            logits[s : s + 2048].double(), target[s : s + 2048], reduction="none"
        )
    tail = leaf(logits[-8:], torch.float64)
    reference.cross_entropy(tail, target[-8:], reduction="sum").backward()
    x = logits.requires_grad_(True)
    y = x * 1  # a temporary the loss may overwrite
    del logits
    loss = cross_entropy(y, target, reduction="none", inplace_backward=True)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=2e-2, atol=2e-2)
    grad = torch.autograd.grad(loss.sum(), y)[0]
    torch.testing.assert_close(grad[-8:].double(), tail.grad, rtol=2e-2, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_cross_entropy_inplace_extra_memory_cuda():
    """8192 x 128256 bf16 with inplace_backward=True: fwd + bwd allocate ~nothing beyond the logits (the
    gradient lives in their buffer); the default allocates exactly one logits-sized gradient buffer."""
    n, vocab = 8192, 128256
    target = torch.randint(0, vocab, (n,), device="cuda")
    logits_bytes = n * vocab * 2
    for inplace, budget in ((True, 16 * 2**20), (False, logits_bytes + 16 * 2**20)):
        x = torch.randn(n, vocab, device="cuda", dtype=torch.bfloat16).requires_grad_()
        cross_entropy(x, target, inplace_backward=inplace).backward()  # warm-up (compile)
        x.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        cross_entropy(x, target, inplace_backward=inplace).backward()
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
        assert extra <= budget, f"inplace={inplace}: {extra / 2**20:.1f} MiB extra"
        del x


def test_cross_entropy_custom_ops_pass_opcheck():
    """Schemas (mutations declared), fake implementations and torch.compile traceability of the launchers."""
    mod = importlib.import_module("liger_core.ops.cross_entropy")  # the module (ops binds the function)

    logits, target, weight = _inputs("cpu", torch.float32, 5, 33, weighted=True, ignore_every=2)
    for reduction in ("mean", "none"):
        options = (IGNORE, reduction, 0.1, 1e-3, 20.0)
        torch.library.opcheck(mod._cross_entropy_fwd, (logits, target, weight, *options, True))
        torch.library.opcheck(mod._cross_entropy_fwd_inplace, (logits.clone(), target, None, *options))
    denominator = torch.tensor(7.0, dtype=torch.float64)  # HF's num_items_in_batch
    sum_options = (IGNORE, "sum", 0.1, 1e-3, 20.0)
    torch.library.opcheck(
        mod._cross_entropy_fwd, (logits, target, weight, *sum_options, True, True, denominator)
    )
    torch.library.opcheck(
        mod._cross_entropy_fwd_inplace, (logits.clone(), target, None, *sum_options, True, denominator)
    )
    torch.library.opcheck(mod._scale_rows, (logits.clone(), torch.randn(5)))
    torch.library.opcheck(mod._scale_rows, (logits.clone(), torch.tensor(2.5)))
    # fp16's gradient computed in backward (grad_output folded in)
    half = logits.half()
    for grad_loss, options in (
        (torch.tensor(2.5), sum_options),
        (torch.randn(5), (IGNORE, "none", 0.1, 1e-3, 20.0)),
    ):
        torch.library.opcheck(
            mod._grad_in_backward,
            (half, target, weight.half(), grad_loss, *options, None, torch.empty_like(half)),
        )
    torch.library.opcheck(
        mod._grad_in_backward,
        (half, target, None, torch.tensor(1.5), *sum_options, denominator, half.clone()),
    )


def test_cross_entropy_fp16_under_torch_compile():
    logits, target, _ = _inputs("cpu", torch.float16, 7, 33)
    x, x_c = leaf(logits), leaf(logits)
    (cross_entropy(x, target, label_smoothing=0.1) * 3.0).backward()
    compiled = torch.compile(cross_entropy, backend="aot_eager")
    (compiled(x_c * 1.0, target, label_smoothing=0.1) * 3.0).backward()
    torch.testing.assert_close(x_c.grad, x.grad)


def test_cross_entropy_under_torch_compile():
    logits, target, _ = _inputs("cpu", torch.float32, 7, 33)
    x, x_c = leaf(logits), leaf(logits)
    cross_entropy(x, target, label_smoothing=0.1, inplace_backward=True).backward()
    compiled = torch.compile(cross_entropy, backend="aot_eager")
    compiled(x_c * 1.0, target, label_smoothing=0.1, inplace_backward=True).backward()
    torch.testing.assert_close(x_c.grad, x.grad)


RESIDENT_SHAPES = [(4093, 128256), (1031, 32000), (257, 131072), (33, 2064)]
RESIDENT_CASES = {
    "plain": dict(),
    "smoothing": dict(label_smoothing=0.1),
    "zloss": dict(lse_square_scale=1e-3),
    "smoothing_zloss": dict(label_smoothing=0.2, lse_square_scale=1e-2),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", RESIDENT_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("case", list(RESIDENT_CASES))
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_resident_kernel_matches_float64_cuda(dtype, shape, case, reduction, poison_empty):
    """The Gluon kernel that keeps each row on chip (16-bit logits, Hopper, no weights/softcap): loss, z-loss
    and gradient at eager's accuracy and at least as exact as the streaming kernel, on rows that fill shared
    memory and registers (131072), leave both partly masked (128256, 32000, 2064), with ignored rows, extreme
    logits (+-1e4 in a few rows) and per-token grad_output."""
    n, vocab = shape
    logits, target, _ = _inputs("cuda", dtype, n, vocab)
    # extreme logits; in fp16 with z-loss, lse^2 of 1e4 overflows the returned per-row loss in any
    # implementation (the float64 answer is ~1e6 > 65504), so 1e3 there
    big = 1e3 if dtype == torch.float16 and "zloss" in case else 1e4
    logits[1, ::5] = big  # a row of tied huge logits
    logits[2, ::3] = -big
    if not resident.resident_supported(logits, None, None):
        pytest.skip("resident kernel not available on this GPU / Triton")
    opts = dict(RESIDENT_CASES[case], reduction=reduction)
    grad_out = (
        torch.randn(n, device="cuda") if reduction == "none" else torch.tensor(2.5, device="cuda")
    ).to(dtype)
    (loss, z, dx), (loss_e, z_e, dx_e), (loss_r, z_r, dx_r) = _three_ways(
        logits, target, None, grad_out, **opts
    )
    assert_loss_no_worse("loss", loss, loss_e, loss_r, dtype)
    if opts.get("lse_square_scale"):
        assert_loss_no_worse("z_loss", z, z_e, z_r, dtype)
    assert_no_worse_than_eager("dlogits", dx, dx_e, dx_r)
    assert (dx[target == IGNORE] == 0).all()
    # the streaming kernel on the same inputs: the resident one is no less exact
    with tuning.override(ce_resident=False):
        (loss_s, _, dx_s), _, _ = _three_ways(logits, target, None, grad_out, **opts)
    assert_no_worse_than_eager("dlogits vs streaming kernel", dx, dx_s, dx_r)
    if loss.dim():
        assert_no_worse_than_eager("loss vs streaming kernel", loss, loss_s, loss_r)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_cross_entropy_resident_kernel_used_only_where_supported_cuda():
    """Which calls take the resident kernel: 16-bit logits with 16-aligned rows of <= 131072 columns, no class
    weights or softcap; fp32 logits, weights, softcap, wider or odd rows take the streaming kernel."""
    if not resident.RESIDENT_AVAILABLE or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("resident kernel needs Gluon and a Hopper GPU")
    supported = resident.resident_supported
    x = torch.zeros(4, 128256, device="cuda", dtype=torch.bfloat16)
    assert supported(x, None, None)
    assert not supported(x.float(), None, None)
    assert not supported(x, torch.ones(128256, device="cuda"), None)
    assert not supported(x, None, 30.0)
    assert not supported(torch.zeros(4, 151936, device="cuda", dtype=torch.bfloat16), None, None)
    assert not supported(torch.zeros(4, 50257, device="cuda", dtype=torch.bfloat16), None, None)
    assert not supported(torch.zeros(4, 128264, device="cuda", dtype=torch.bfloat16)[:, 8:], None, None)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("grad_scale", [2.5, 4096.0], ids=["2.5", "loss_scaler"])
@pytest.mark.parametrize("inplace", [False, True], ids=["buffer", "inplace"])
def test_cross_entropy_fp16_grad_output_folded_before_rounding(reduction, grad_scale, inplace, poison_empty):
    """fp16: the gradient is computed in backward with grad_output inside its one rounding. Stored in the
    forward pass and scaled afterwards, its subnormal entries (p / N of a mean) would round twice: on the
    H100 at 1031 x 32000 that was 1.9x eager's error with grad_output 2.5
    (`python benchmarks/ce_fp16_rounding.py`, script at commit 0aa2349)."""
    n, vocab = 129, 1031
    logits, target, _ = _inputs("cpu", torch.float16, n, vocab)
    grad_out = (torch.rand(n) * grad_scale if reduction == "none" else torch.tensor(grad_scale)).to(
        torch.float16
    )
    grads = []
    for kind in ("ours", "eager", "ref64"):
        x = leaf(logits, torch.float64 if kind == "ref64" else torch.float16)
        fn = cross_entropy if kind == "ours" else reference.cross_entropy
        y = x * 1 if kind == "ours" and inplace else x  # a temporary the in-place gradient may overwrite
        loss = fn(y, target, reduction=reduction, **({"inplace_backward": True} if y is not x else {}))
        loss.backward(grad_out.to(x.dtype))
        grads.append(x.grad)
    assert_no_worse_than_eager("dlogits", *grads)
    assert (grads[0][target == IGNORE] == 0).all()


def test_cross_entropy_fp16_inplace_backward_once():
    """fp16 in place: the logits become the gradient in backward; a second backward through them raises, and
    another node that saved the same logits sees the version bump."""
    logits, target, _ = _inputs("cpu", torch.float16, 9, 131)
    x = leaf(logits)
    y = x * 1
    loss = cross_entropy(y, target, inplace_backward=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        loss.backward()
    x2 = leaf(logits)
    y2 = x2 * 1
    other = (y2 * y2).sum()  # saves y2 for its backward
    loss2 = cross_entropy(y2, target, inplace_backward=True)
    loss2.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        other.backward()


# ----------------------------------------------------------------------------------------------------------
# Edge cases on both paths: torch's semantics for empty batches, non-finite logits, any strides, fp32 losses
# ----------------------------------------------------------------------------------------------------------

CE_OPTION_SETS = {
    "plain": dict(),
    "smooth_weight": dict(label_smoothing=0.1, weighted=True),
    "zloss_softcap": dict(lse_square_scale=1e-2, softcap=4.0),
}


def _eager64(logits, target, weight, reduction, label_smoothing=0.0, lse_square_scale=0.0, softcap=None):
    """The eager composition in float64, written with torch's own functions (the expected semantics)."""
    x = logits.double()
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    w = weight.double() if weight is not None else None
    loss = F.cross_entropy(
        x, target, w, ignore_index=IGNORE, reduction=reduction, label_smoothing=label_smoothing
    )
    if lse_square_scale:
        valid = target != IGNORE
        z = (lse_square_scale * torch.logsumexp(x, -1).square()).masked_fill(~valid, 0.0)
        loss = loss + {"none": z, "sum": z.sum(), "mean": z.sum() / valid.sum()}[reduction]
    return loss


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", list(CE_OPTION_SETS))
def test_cross_entropy_empty_and_all_ignored_as_torch(path, reduction, case):
    """No rows, or every target ignored: torch's F.cross_entropy values (mean: NaN, 0 / 0; sum: 0; none:
    zeros), zero gradients, the z-loss reduced the same way, an fp32 loss; the same on both paths."""
    opts = dict(CE_OPTION_SETS[case])
    weighted = opts.pop("weighted", False)
    for n in (0, 13):
        logits, _, weight = _inputs("cpu", torch.float32, n, 131, weighted=weighted)
        target = torch.full((n,), IGNORE)
        x = leaf(logits.bfloat16())
        loss, z = cross_entropy(x, target, weight, reduction=reduction, return_z_loss=True, **opts)
        (loss * 2.0).sum().backward()
        want = _eager64(logits, target, weight, reduction, **opts)
        assert loss.dtype == z.dtype == torch.float32
        assert_same_values("loss", loss, want)
        assert_same_values(
            "z_loss",
            z,
            want
            if opts.get("lse_square_scale")
            else torch.zeros_like(want) / (0.0 if reduction == "mean" else 1.0),
        )
        assert x.grad.dtype == torch.bfloat16 and torch.equal(x.grad, torch.zeros_like(x.grad))


def test_cross_entropy_label_smoothing_neg_inf_target(path):
    """label_smoothing with the target logit -inf: the loss is +inf (torch's), not NaN, and the gradient is
    torch's finite one; also where a whole leading column block of the row is -inf."""
    logits = torch.randn(4, 1031)
    target = torch.tensor([5, 700, 3, IGNORE])
    logits[0, 5] = -float("inf")  # the target
    logits[1, :600] = -float("inf")  # the first column blocks (512 columns each on the interpreter)
    logits[2, 0] = -float("inf")  # the first logit (the two-pass loop's smoothing shift)
    for reduction in ("none", "sum"):
        x = leaf(logits)
        loss = cross_entropy(x, target, label_smoothing=0.1, reduction=reduction)
        loss.sum().backward()
        x64 = leaf(logits, torch.float64)
        want = F.cross_entropy(x64, target, label_smoothing=0.1, reduction=reduction)
        want.sum().backward()
        assert_same_values("loss", loss, want.detach())
        assert torch.isposinf(loss).any() and torch.isfinite(x.grad).all()
        assert_same_values("dlogits", x.grad, x64.grad)


@pytest.mark.parametrize("case", list(CE_OPTION_SETS))
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_non_finite_logits_as_torch(path, case, reduction):
    """fp32 logits holding -inf, +inf and NaN: the loss and gradient have NaN and +-inf exactly where torch's
    eager composition (float64) has them, and its values elsewhere. Ignored rows are never read: their
    gradient is 0 even where they hold NaN (torch's log_softmax backward gives NaN there; documented). bf16
    logits take the same branches (fp32 math inside), only the finite values round differently."""
    opts = dict(CE_OPTION_SETS[case])
    weight = torch.rand(1031) + 0.5 if opts.pop("weighted", False) else None
    logits = torch.randn(9, 1031) * 3
    target = torch.tensor([4, 9, 1, 6, 2, 0, 8, 700, IGNORE])
    logits[0, 4] = -float("inf")  # at the target
    logits[1, 3] = -float("inf")  # elsewhere
    logits[2, 7] = float("nan")
    logits[3, 1] = float("inf")  # elsewhere
    logits[4] = -float("inf")  # the whole row
    logits[6, 8] = float("inf")  # at the target
    logits[7, :600] = -float("inf")  # the leading column blocks
    logits[5, 0] = -float("inf")  # the first logit
    grad_out = torch.randn(9) if reduction == "none" else torch.tensor(1.7)
    x = leaf(logits)
    loss = cross_entropy(x, target, weight, reduction=reduction, **opts)
    loss.backward(grad_out)
    x64 = leaf(logits, torch.float64)
    want = _eager64(x64, target, weight, reduction, **opts)
    want.backward(grad_out.double())
    assert_same_values("loss", loss, want.detach())
    assert_same_values("dlogits", x.grad, x64.grad)

    poisoned = logits.clone()
    poisoned[8] = float("nan")  # an ignored row
    x = leaf(poisoned)
    loss_p = cross_entropy(x, target, weight, reduction=reduction, **opts)
    loss_p.backward(grad_out)
    assert_same_values("loss, ignored NaN row", loss_p, want.detach())
    assert torch.equal(x.grad[8], torch.zeros(1031))


def strided(t, junk=float("nan"), *, grad=False):
    """Same values, every other element of a twice-as-long buffer whose other elements are ``junk`` (a
    kernel that ignores the strides reads it); with ``grad`` a view of a leaf (differentiate w.r.t. the view:
    ``leaf`` would copy it into a contiguous tensor)."""
    wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), junk, dtype=t.dtype)
    wide[..., ::2] = t.detach()
    view = wide.requires_grad_(grad)[..., ::2]
    assert not view.is_contiguous()
    return view


@pytest.mark.parametrize("layout", ["strided", "row_padded", "transposed"])
def test_cross_entropy_strided_arguments(path, layout):
    """Every tensor argument as a non-contiguous view (gaps poisoned: NaN logits and weights, out-of-range
    targets), forward and backward (per-token grad_output strided too): the values of contiguous inputs."""
    logits, target, weight = _inputs("cpu", torch.float32, 3 * 7, 131, weighted=True, batch_shape=(3, 7))
    grad_out = torch.randn(3, 7)
    opts = dict(label_smoothing=0.1, lse_square_scale=1e-3, reduction="none")
    x_ref = leaf(logits)
    want = cross_entropy(x_ref, target, weight, **opts)
    want.backward(grad_out)
    if layout == "strided":
        x = strided(logits, grad=True)
    elif layout == "row_padded":  # unit column stride, rows further apart than V
        wide = torch.full((3, 7, 140), float("nan"))
        wide[..., :131] = logits
        x = wide.requires_grad_()[..., :131]
    else:  # (T, B, V) storage viewed as (B, T, V): its rows are not one stride apart (reshape copies)
        x = logits.transpose(0, 1).contiguous().requires_grad_().transpose(0, 1)
    t_view, w_view = strided(target, 10**6), strided(weight)
    assert not x.is_contiguous()
    loss = cross_entropy(x, t_view, w_view, **opts)
    (g,) = torch.autograd.grad(loss, x, strided(grad_out))
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g, x_ref.grad, rtol=1e-6, atol=1e-7)
    # reductions to a scalar, and the gradient written in place into a strided temporary
    for reduction in ("mean", "sum"):
        x_ref.grad = None
        expected = cross_entropy(x_ref, target, weight, reduction=reduction, label_smoothing=0.1)
        expected.backward()
        y = x * 1.0 if layout != "strided" else strided(x.detach(), grad=True) * 1.0  # keeps x's layout
        got = cross_entropy(
            y, t_view, w_view, reduction=reduction, label_smoothing=0.1, inplace_backward=True
        )
        (g,) = torch.autograd.grad(got, y)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(g, x_ref.grad, rtol=1e-6, atol=1e-7)


def test_cross_entropy_expanded_logits_in_place(path):
    """Logits whose rows share memory (one row expanded to many) with inplace_backward=True: the gradient
    must not be written over rows other rows still read; every row's gradient is the single row's."""
    row = torch.randn(1, 131)
    target = torch.randint(0, 131, (6,))
    base = leaf(row)
    loss = cross_entropy(base.expand(6, 131), target, reduction="sum", inplace_backward=True)
    loss.backward()
    x = leaf(row.expand(6, 131).contiguous())
    want = cross_entropy(x, target, reduction="sum")
    want.backward()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(base.grad, x.grad.sum(0, keepdim=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_loss_is_fp32(path, dtype, reduction):
    """16-bit logits: the loss is fp32 and exact to fp32 sums (Hugging Face upcasts the logits: a bf16 loss
    has a relative error of ~2e-3), the gradient in the logits' dtype, on both paths and under autocast."""
    logits, target, _ = _inputs("cpu", dtype, 37, 1031)
    x = leaf(logits)
    loss = cross_entropy(x, target, reduction=reduction, label_smoothing=0.1)
    loss.sum().backward()
    want = F.cross_entropy(logits.double(), target, reduction=reduction, label_smoothing=0.1)
    assert loss.dtype == torch.float32 and x.grad.dtype == dtype
    assert rel_err(loss, want) <= 2**-16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cross_entropy(logits, target, reduction=reduction).dtype == torch.float32

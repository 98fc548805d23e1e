"""fused_linear_cross_entropy's Liger-Kernel options: token accuracy and predicted tokens from the row
kernel's first pass (against torch.argmax of the float64 logits, ties and NaN included), per-token scaling
by the detached target probability (loss and gradients against float64, no worse than eager), the return
convention."""

import pytest
import torch
from helpers import SLACK, assert_no_worse_than_eager, dyadic_linear_inputs, leaf, rel_err

from liger_core import reference
from liger_core.loss_options import CrossEntropyOptions, CrossEntropyOutput
from liger_core.ops import fused_linear_cross_entropy

IGNORE = -100
SCALAR_FLOOR = 4 * 2.0**-23  # see test_ce_extra_outputs.py: a scaled scalar loss, the sequence losses' rule


def assert_loss_no_worse(name, ours, eager, ref64):
    """The scaled losses (a scalar or one per token) are products of fp32 numbers each rounded once: the
    kernel and eager each land within a few ulps, on either side (module comment on SCALAR_FLOOR)."""
    e_ours, e_eager = rel_err(ours, ref64), rel_err(eager, ref64)
    assert e_ours <= SLACK * e_eager + SCALAR_FLOOR, (
        f"{name}: rel. error {e_ours:.3e} vs eager's {e_eager:.3e}"
    )


N, H, V = 37, 24, 1031  # V > 512: several column blocks per row in the interpreter (the argmax across blocks)


def _inputs(dtype, *, bias=False, n=N, vocab=V):
    hidden, weight, b = dyadic_linear_inputs((n,), H, vocab, dtype, bias=bias, logit_std=2.0)
    target = torch.randint(0, vocab, (n,))
    target[torch.randperm(n)[: n // 5]] = IGNORE
    return hidden, weight, b, target


@pytest.mark.parametrize("chunk_size", [8, None])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_token_accuracy_and_predicted_tokens(reduction, chunk_size):
    """The argmax of every row (first maximum on ties, ties across column blocks) against torch.argmax of the
    float64 logits; the accuracy against its definition; the loss unchanged by the extra outputs."""
    hidden, weight, bias, target = _inputs(torch.float32, bias=True)
    # ties: classes 700 and 3 share a row of weight and a bias (equal logits in different column blocks),
    # 900 and 901 too (same block)
    weight[700], bias[700] = weight[3], bias[3]
    weight[901], bias[901] = weight[900], bias[900]
    hidden[5] = weight[3] * 64  # row 5's maximum: the tie 3 / 700 -> 3
    hidden[6] = weight[900] * 64  # row 6's: 900 / 901 -> 900
    logits64 = torch.nn.functional.linear(hidden.double(), weight.double(), bias.double())
    # half the kept rows predict their target
    kept = (target != IGNORE).nonzero()[:, 0]
    target[kept[::2]] = logits64.argmax(-1)[kept[::2]]
    target[5], target[6] = 700, 900
    valid = target != IGNORE
    predicted = torch.where(valid, logits64.argmax(-1), -1)
    assert predicted[5] == 3 and predicted[6] == 900
    correct = (predicted == target) & valid
    h, w, b = leaf(hidden), leaf(weight), leaf(bias)
    out = fused_linear_cross_entropy(
        h, w, target, b, reduction=reduction, chunk_size=chunk_size,
        return_token_accuracy=True, return_predicted_tokens=True,
    )  # fmt: skip
    assert isinstance(out, CrossEntropyOutput) and out.z_loss is None
    assert out.predicted_tokens.dtype == torch.int64 and torch.equal(out.predicted_tokens, predicted)
    if reduction == "none":
        assert torch.equal(out.token_accuracy, correct.float())
    else:
        assert out.token_accuracy.item() == pytest.approx(correct.sum().item() / valid.sum().item(), abs=1e-7)
    plain = fused_linear_cross_entropy(
        hidden, weight, target, bias, reduction=reduction, chunk_size=chunk_size
    )
    torch.testing.assert_close(out.loss.detach(), plain, rtol=1e-6, atol=1e-6)
    (out.loss.sum()).backward()  # the extra outputs do not disturb the gradients
    assert torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()
    # without gradients (evaluation path), the reference path, and a NaN logit (torch: NaN is the maximum)
    with torch.no_grad():
        hidden_nan = hidden.clone()
        hidden_nan[7, 0] = float("nan")  # every logit of row 7 NaN: argmax 0
        evaluated = fused_linear_cross_entropy(
            hidden_nan, weight, target, bias, reduction=reduction, return_predicted_tokens=True
        )
    want = predicted.clone()
    want[7] = 0 if valid[7] else -1
    assert torch.equal(evaluated.predicted_tokens, want)
    ref = reference.fused_linear_cross_entropy(
        hidden.double(), weight.double(), target, bias.double(), reduction=reduction,
        return_token_accuracy=True, return_predicted_tokens=True,
    )  # fmt: skip
    assert torch.equal(ref.predicted_tokens, predicted)
    torch.testing.assert_close(ref.token_accuracy.float(), out.token_accuracy.float())


def test_accuracy_with_every_token_ignored_is_zero():
    hidden, weight, _, target = _inputs(torch.float32, n=5, vocab=33)
    out = fused_linear_cross_entropy(
        hidden, weight, torch.full_like(target, IGNORE), return_token_accuracy=True
    )
    assert out.token_accuracy.item() == 0.0


CASES = [
    dict(reduction="mean"),
    dict(reduction="mean", label_smoothing=0.1, weighted=True),
    dict(reduction="sum", lse_square_scale=1e-3, softcap=20.0, bias=True),
    dict(reduction="none", label_smoothing=0.05, lse_square_scale=1e-3, bias=True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_token_scaling_matches_float64(case, dtype):
    """use_token_scaling: each token's loss (z-loss included) times p_y = softmax(logits)_y held constant
    (Liger-Kernel's definition, the float64 reference): loss and gradients to hidden, weight and bias no worse
    than eager (the reference composition in the input dtype); z-loss returned scaled too."""
    case = dict(case)
    weighted, with_bias = case.pop("weighted", False), case.pop("bias", False)
    hidden, weight, bias, target = _inputs(dtype, bias=with_bias, n=29, vocab=131)
    ce_weight = (torch.rand(131, dtype=torch.float64) + 0.5).float() if weighted else None
    # grad_output != 1, powers of two: the op stores its 16-bit gradients and scales them in backward, which
    # rounds a second time for any other factor (the ops' documented design, tested in their own files)
    shape = (29,) if case["reduction"] == "none" else ()
    grad_out = 2.0 ** torch.randint(-1, 2, shape).double()

    def run(fn, cast=None, **kwargs):
        leaves = [leaf(hidden, cast), leaf(weight, cast)] + ([leaf(bias, cast)] if with_bias else [])
        loss = fn(leaves[0], leaves[1], target, leaves[2] if with_bias else None, ce_weight=ce_weight,
                  use_token_scaling=True, **case, **kwargs)  # fmt: skip
        return (loss, *torch.autograd.grad(loss, leaves, grad_out.to(loss.dtype)))

    ours = run(fused_linear_cross_entropy, chunk_size=8)
    eager = run(reference.fused_linear_cross_entropy)
    ref = run(reference.fused_linear_cross_entropy, torch.float64)
    assert ours[1].dtype == dtype
    assert_loss_no_worse("loss", ours[0], eager[0], ref[0])
    for name, a, e, r in zip(("dhidden", "dweight", "dbias"), ours[1:], eager[1:], ref[1:]):
        assert_no_worse_than_eager(name, a, e, r)
    # the default loop (fp32 accumulators) too, and the definition: unscaled per-token losses times p_y
    default = run(fused_linear_cross_entropy)
    assert_loss_no_worse("default loop loss", default[0], eager[0], ref[0])
    for name, a, e, r in zip(("dhidden", "dweight", "dbias"), default[1:], eager[1:], ref[1:]):
        assert_no_worse_than_eager(f"default loop {name}", a, e, r)
    if case["reduction"] == "none" and not weighted:
        logits = torch.nn.functional.linear(
            hidden.double(), weight.double(), bias.double() if with_bias else None
        )
        unscaled = reference.fused_linear_cross_entropy(
            hidden.double(), weight.double(), target, bias.double() if with_bias else None, **case
        )
        safe = torch.where(target != IGNORE, target, 0)
        p_y = torch.softmax(logits, -1).gather(-1, safe[:, None])[:, 0]
        torch.testing.assert_close(ref[0].detach(), unscaled * p_y * (target != IGNORE))


def test_token_scaling_z_loss_output_scaled():
    hidden, weight, _, target = _inputs(torch.float32, n=19, vocab=131)
    kwargs = dict(lse_square_scale=1e-2, return_z_loss=True, use_token_scaling=True, chunk_size=8)
    loss, z = fused_linear_cross_entropy(hidden, weight, target, **kwargs)
    ref_loss, ref_z = reference.fused_linear_cross_entropy(hidden.double(), weight.double(), target, **kwargs)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(z.double(), ref_z, rtol=1e-6, atol=1e-7)
    unscaled_z = fused_linear_cross_entropy(
        hidden, weight, target, lse_square_scale=1e-2, return_z_loss=True
    )[1]
    assert z < unscaled_z


def test_return_convention_and_options():
    """No option: the loss (or (loss, z_loss)) as before; an extra output: CrossEntropyOutput; the options
    object carries them; a non-bool option is an error naming it."""
    hidden, weight, _, target = _inputs(torch.float32, n=7, vocab=33)
    assert isinstance(fused_linear_cross_entropy(hidden, weight, target), torch.Tensor)
    pair = fused_linear_cross_entropy(hidden, weight, target, return_z_loss=True)
    assert isinstance(pair, tuple) and not isinstance(pair, CrossEntropyOutput) and len(pair) == 2
    options = CrossEntropyOptions(return_token_accuracy=True, return_z_loss=True)
    out = fused_linear_cross_entropy(hidden, weight, target, options=options)
    assert isinstance(out, CrossEntropyOutput) and out.z_loss is not None and out.predicted_tokens is None
    with pytest.raises(TypeError, match="use_token_scaling"):
        CrossEntropyOptions(use_token_scaling=1)
    with pytest.raises(TypeError, match="inside options"):
        fused_linear_cross_entropy(hidden, weight, target, options=options, return_predicted_tokens=True)


def test_custom_ops_opcheck_and_compile():
    """The custom ops with the argmax output and token scaling pass opcheck; torch.compile (fullgraph) gives
    the eager values."""
    import importlib

    mod = importlib.import_module("liger_core.ops.fused_linear_cross_entropy")
    hidden, weight, bias, target = _inputs(torch.float32, bias=True, n=7, vocab=33)
    options = (IGNORE, "mean", 0.1, 1e-3, 20.0)
    for loop in (
        (torch.float32, 3, True, None, None, True, True),
        (None, None, True, None, None, True, False),
    ):
        torch.library.opcheck(
            mod._flce_fwd, (hidden, weight, target, bias, None, *options, True, True, True, *loop)
        )
    rows_options = (IGNORE, 0.1, 1e-3, None, True, True, True, None, 3, None, True)
    torch.library.opcheck(
        mod._flce_bwd_rows, (torch.randn(7), hidden, weight, target, bias, None, *rows_options)
    )

    def loss_fn(h, w):
        out = fused_linear_cross_entropy(h, w, target, return_token_accuracy=True, use_token_scaling=True)
        return out.loss, out.token_accuracy

    h, w = leaf(hidden), leaf(weight)
    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)(h, w)
    eager = loss_fn(h, w)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(torch.autograd.grad(compiled[0], (h, w)), torch.autograd.grad(eager[0], (h, w))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

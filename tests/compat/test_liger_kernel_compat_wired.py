"""``liger_core.compat.liger_kernel`` names backed by liger_core's norm variants, activations, TVD, tiled MLP,
cross-entropy extra outputs, preference ``average_log_prob``, distillation biases and GRPO clip ratio: each
gives the outputs and gradients of the liger_core function it calls, in Liger-Kernel's return structure."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import liger_core.modules as core_modules
import liger_core.ops as ops
from liger_core.compat.liger_kernel import chunked_loss as C
from liger_core.compat.liger_kernel import transformers as T
from liger_core.compat.liger_kernel.transformers import functional as F


def _run(fn, *inputs):
    """``fn(*inputs)`` on fresh leaves (floating inputs need grad) and the gradients of ``sum(out * g)`` for
    a fixed random ``g`` per output."""
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(1)
    total = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outs)
    total.backward()
    return outs, [x.grad for x in leaves]


def _same(fn_a, fn_b, *inputs, exact=True):
    (out_a, grads_a), (out_b, grads_b) = _run(fn_a, *inputs), _run(fn_b, *inputs)
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-5, atol=1e-6)
    assert len(out_a) == len(out_b)
    for a, b in zip(out_a, out_b):
        torch.testing.assert_close(a, b, **tol)
    for a, b in zip(grads_a, grads_b):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, **tol)


def _same_module(ours, theirs, *inputs, exact=True):
    theirs.load_state_dict(ours.state_dict())
    _same(ours, theirs, *inputs, exact=exact)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        rtol, atol = (0, 0) if exact else (1e-5, 1e-6)
        torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=name)


# ---------------------------------------------------------------------------------------------- functional


def test_norm_functions_are_liger_cores_ops():
    x, r, w = torch.randn(3, 5, 24), torch.randn(3, 5, 24), torch.randn(24)
    _same(
        lambda x, r, w: F.liger_fused_add_rms_norm(x, r, w, 1e-5, 1.0, "gemma", True),
        lambda x, r, w: ops.fused_add_rms_norm(x, r, w, 1e-5, offset=1.0, casting_mode="gemma"),
        x,
        r,
        w,
    )
    scale, shift = torch.randn(3, 1, 24), torch.randn(3, 1, 24)
    _same(
        lambda x, w, s, b: F.liger_modulated_rms_norm(x, w, s, b, 1e-6, 0.0, "llama", True),
        lambda x, w, s, b: ops.modulated_rms_norm(x, w, s, b, eps=1e-6),
        x,
        w,
        scale,
        shift,
    )
    _same(
        lambda x, s: F.liger_modulated_rms_norm(x, None, s),
        lambda x, s: ops.modulated_rms_norm(x, None, s),
        x,
        scale,
    )
    pw, pb = torch.randn(3), torch.randn(())
    _same(
        lambda x, w, b: F.liger_poly_norm(x, w, b, 1e-5, True),
        lambda x, w, b: ops.poly_norm(x, w, b, 1e-5),
        x,
        pw,
        pb,
    )
    alpha, gamma, beta = torch.randn(1), torch.randn(24), torch.randn(24)
    _same(F.liger_dyt, ops.dyt, x, alpha, gamma, beta)
    g = torch.randn(2, 6, 5)
    gw, gb = torch.randn(6), torch.randn(6)
    _same(
        lambda x, w, b: F.liger_group_norm(x, w, b, 6, 3, 1e-5),
        lambda x, w, b: ops.group_norm(x, 3, w, b, 1e-5),
        g,
        gw,
        gb,
    )
    with pytest.raises(ValueError, match="num_channels"):
        F.liger_group_norm(g, gw, gb, 4, 2, 1e-5)


def test_activation_and_tvd_functions_are_liger_cores_ops():
    x = torch.randn(4, 13)
    _same(F.liger_relu_squared, ops.relu_squared, x)
    _same(F.liger_softmax, lambda x: ops.softmax(x, -1), x)
    _same(lambda x: F.liger_sparsemax(x, 0), lambda x: ops.sparsemax(x, 0), x)
    p, q = torch.randn(6, 11).softmax(-1), torch.randn(6, 11).softmax(-1)
    labels = torch.tensor([1, -100, 3, 0, -100, 2])
    _same(
        lambda p, q: F.liger_tvd(p, q, labels, "sum"),
        lambda p, q: ops.tvd(p, q, labels, reduction="sum"),
        p,
        q,
    )
    # Liger-Kernel's default reduction for the function is "mean"
    torch.testing.assert_close(F.liger_tvd(p, q), ops.tvd(p, q, reduction="mean"), rtol=0, atol=0)


def test_fused_linear_kl_div_against_probabilities_raises_naming_it():
    with pytest.raises(NotImplementedError, match="liger_fused_linear_kl_div"):
        F.liger_fused_linear_kl_div(torch.randn(2, 4), torch.randn(5, 4), torch.rand(2, 5))


def test_cross_entropy_extra_outputs_in_liger_kernels_structure():
    logits, target = torch.randn(6, 11), torch.randint(0, 11, (6,))
    target[2] = -100
    out = F.liger_cross_entropy(logits, target, return_token_accuracy=True, return_predicted_tokens=True)
    assert isinstance(out, F.CrossEntropyOutput) and out.z_loss is None
    want = ops.cross_entropy(logits, target, return_token_accuracy=True, return_predicted_tokens=True)
    torch.testing.assert_close(out.loss, want.loss, rtol=0, atol=0)
    torch.testing.assert_close(out.token_accuracy, want.token_accuracy, rtol=0, atol=0)
    assert torch.equal(out.predicted_tokens, want.predicted_tokens)
    out = F.liger_cross_entropy(
        logits, target, lse_square_scale=1e-3, return_z_loss=True, return_token_accuracy=True
    )
    want = ops.cross_entropy(
        logits, target, lse_square_scale=1e-3, return_z_loss=True, return_token_accuracy=True
    )
    assert out.predicted_tokens is None
    torch.testing.assert_close(out.z_loss, want.z_loss, rtol=0, atol=0)
    torch.testing.assert_close(out.token_accuracy, want.token_accuracy, rtol=0, atol=0)

    hidden, weight = torch.randn(6, 8), torch.randn(11, 8)
    _same(
        lambda h, w: F.liger_fused_linear_cross_entropy(h, w, target, use_token_scaling=True),
        lambda h, w: ops.fused_linear_cross_entropy(h, w, target, use_token_scaling=True),
        hidden,
        weight,
    )
    out = T.LigerFusedLinearCrossEntropyLoss(return_token_accuracy=True)(weight, hidden, target)
    want = ops.fused_linear_cross_entropy(hidden, weight, target, return_token_accuracy=True)
    assert isinstance(out, F.CrossEntropyOutput)
    torch.testing.assert_close(out.loss, want.loss, rtol=0, atol=0)
    torch.testing.assert_close(out.token_accuracy, want.token_accuracy, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- modules


def test_rms_norm_without_weight():
    ours = T.LigerRMSNorm(24, 1e-5, elementwise_affine=False)
    assert ours.weight is None and not list(ours.parameters())
    x = torch.randn(3, 5, 24)
    _same(ours, lambda x: ops.rms_norm_no_weight(x, 1e-5), x)
    _same(ours, core_modules.LigerRMSNormNoWeight(24, 1e-5), x)


def test_norm_modules():
    x, r = torch.randn(3, 5, 24), torch.randn(3, 5, 24)
    add = T.LigerFusedAddRMSNorm(24, 1e-5, 1.0, "gemma", "zeros", True)
    assert add.in_place is True and torch.equal(add.weight, torch.zeros(24))
    with torch.no_grad():
        add.weight.normal_()
    out = add(x, r)
    assert isinstance(out, tuple) and len(out) == 2  # (normed, residual sum)
    torch.testing.assert_close(out[1], x + r, rtol=0, atol=0)
    _same_module(add, core_modules.LigerFusedAddRMSNorm(24, 1e-5, 1.0, "gemma"), x, r)

    mod = T.LigerModulatedRMSNorm(24, init_fn="zeros")
    with torch.no_grad():
        mod.weight.normal_()
    scale, shift = torch.randn(3, 1, 24), torch.randn(3, 1, 24)
    _same_module(mod, core_modules.LigerModulatedRMSNorm(24), x, scale, shift)
    bare = T.LigerModulatedRMSNorm(24, elementwise_affine=False)
    assert bare.weight is None
    _same(lambda x, s: bare(x, s), lambda x, s: ops.modulated_rms_norm(x, None, s), x, scale)

    poly = T.LigerPolyNorm(1e-5, in_place=False)
    assert torch.equal(poly.weight, torch.full((3,), 1 / 3)) and torch.equal(poly.bias, torch.tensor(1.0))
    _same_module(poly, core_modules.LigerPolyNorm(1e-5), x)

    dyt = T.LigerDyT(24, beta=False, init_alpha=0.7)
    assert dyt.beta is None and torch.equal(dyt.alpha, torch.tensor([0.7]))
    _same_module(dyt, core_modules.LigerDyT(24, beta=False), x)

    gn = T.LigerGroupNorm(6, 3, 1e-5, bias=True)
    assert torch.equal(gn.weight, torch.ones(6)) and not torch.equal(gn.bias, torch.zeros(6))
    assert torch.equal(T.LigerGroupNorm(6, 3, init_fn="zeros").weight, torch.zeros(6))
    assert torch.equal(T.LigerGroupNorm(6, 3).bias, torch.zeros(6))  # bias=False: a zero, trainable bias
    _same_module(gn, core_modules.LigerGroupNorm(3, 6, 1e-5), torch.randn(2, 6, 7))
    with pytest.raises(ValueError, match="3 dimensions"):
        gn(torch.randn(2, 6))
    with pytest.raises(ValueError, match="init_fn"):
        T.LigerGroupNorm(6, 3, init_fn="uniform")


def test_activation_and_tvd_modules():
    x = torch.randn(4, 13)
    _same(T.LigerSoftmax(), lambda x: ops.softmax(x, -1), x)
    _same(T.LigerSparsemax(0), lambda x: ops.sparsemax(x, 0), x)
    _same(T.LigerReLUSquared(), ops.relu_squared, x)
    p, q = torch.randn(6, 11).softmax(-1), torch.randn(6, 11).softmax(-1)
    loss = T.LigerTVDLoss()  # Liger-Kernel's module default: batchmean
    assert loss.reduction == "batchmean"
    _same(loss, lambda p, q: ops.tvd(p, q, reduction="batchmean"), p, q)


@pytest.mark.parametrize(("kind", "act"), [("swiglu", "silu"), ("geglu", "gelu_pytorch_tanh")])
@pytest.mark.parametrize("num_shards", [None, 3])
def test_tiled_mlps_match_the_untiled_mlp(kind, act, num_shards):
    config = SimpleNamespace(hidden_size=8, intermediate_size=12, hidden_act=act)
    if kind == "swiglu":
        ours, theirs = T.LigerTiledSwiGLUMLP(config, num_shards), core_modules.LigerSwiGLUMLP(config)
    else:
        ours, theirs = T.LigerTiledGEGLUMLP(config, num_shards), core_modules.LigerGEGLUMLP(config)
    assert ours.num_shards == num_shards
    # 19 positions of hidden 8: 3 shards by default; weight gradients are summed over tiles in fp32
    _same_module(ours, theirs, torch.randn(2, 19, 8), exact=False)


def test_tiled_mlps_check_the_activation():
    with pytest.raises(ValueError, match="GELU"):
        T.LigerTiledGEGLUMLP(SimpleNamespace(hidden_size=8, intermediate_size=12, hidden_act="relu"))
    with pytest.raises(ValueError, match="hidden_act"):
        T.LigerTiledSwiGLUMLP(SimpleNamespace(hidden_size=8, intermediate_size=12, hidden_act="gelu"))


# ------------------------------------------------------------------------------------------ chunked losses


def _pref_batch(pairs=2, seq=6, hidden=8, vocab=24):
    x = torch.randn(2 * pairs, seq, hidden)
    target = torch.randint(0, vocab, (2 * pairs, seq))
    target[:, :2] = -100
    target[1, 2:4] = -100  # rows of different lengths: averages differ from sums
    return x, torch.randn(vocab, hidden) * 0.5, target


def test_dpo_average_log_prob():
    from liger_core.losses import fused_linear_dpo_loss

    x, w, target = _pref_batch()
    ref_x, ref_w = torch.randn_like(x), torch.randn_like(w)
    dpo = C.LigerFusedLinearDPOLoss(beta=0.2, average_log_prob=True)
    _same(
        lambda h, W: dpo(W, h, target, None, ref_x, ref_w)[0],
        lambda h, W: fused_linear_dpo_loss(
            h, W, target, ref_hidden=ref_x, ref_weight=ref_w, per_pair=True, beta=0.2, average_log_prob=True
        )[0],
        x,
        w,
    )
    _, aux = dpo(w, x, target, None, ref_x, ref_w)
    logp = torch.log_softmax(x @ w.T, -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]
    mask = target != -100
    mean = (logp * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(aux[0], mean[:2], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(aux[1], mean[2:], rtol=1e-5, atol=1e-6)
    summed = C.LigerFusedLinearDPOLoss(beta=0.2)(w, x, target, None, ref_x, ref_w)[0]
    assert not torch.allclose(summed, dpo(w, x, target, None, ref_x, ref_w)[0])


def test_kto_average_log_prob():
    from liger_core.losses import fused_linear_kto_loss

    x, w, target = _pref_batch()
    labels = torch.tensor([True, False, True, False])
    kto = C.LigerFusedLinearKTOLoss(beta=0.1, average_log_prob=True)
    _same(
        lambda h, W: kto(h, W, target, None, labels)[0],
        lambda h, W: fused_linear_kto_loss(
            h, W, target, labels, ref_logps=torch.zeros(4), beta=0.1, average_log_prob=True
        )[0],
        x,
        w,
    )
    _, aux = kto(x, w, target, None, labels)
    logp = torch.log_softmax(x @ w.T, -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]
    mask = target != -100
    mean = (logp * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(aux[0], mean[labels].sum(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(aux[4], 0.1 * aux[0], rtol=1e-5, atol=1e-6)


def test_jsd_distillation_with_biases():
    student, teacher = torch.randn(2, 3, 8), torch.randn(2, 3, 12)
    sw, tw, sb, tb = torch.randn(16, 8), torch.randn(16, 12), torch.randn(16), torch.randn(16)
    labels = torch.randint(0, 16, (2, 3))
    labels[0, 0] = -100
    flat = labels.reshape(-1)
    loss_fn = C.LigerFusedLinearJSDLoss(0.3, 0.7, 0.4, temperature=2.0, return_soft_hard_loss=True)

    def ours(s, sw, sb, t, tw, tb):
        return loss_fn(s, sw, t, tw, labels, sb, tb)

    def theirs(s, sw, sb, t, tw, tb):
        s2, t2 = s.reshape(-1, 8), t.reshape(-1, 12)
        hard = ops.fused_linear_cross_entropy(s2, sw, flat, sb)
        soft = ops.fused_linear_jsd(
            s2, sw, t2, tw, flat, beta=0.4, temperature=2.0, student_bias=sb, teacher_bias=tb
        )
        return 0.3 * hard + 0.7 * soft, soft, hard

    _same(ours, theirs, student, sw, sb, teacher, tw, tb, exact=False)
    _, soft, hard = ours(student, sw, sb, teacher, tw, tb)
    ce = torch.nn.functional.cross_entropy(student.reshape(-1, 8) @ sw.T + sb, flat)
    torch.testing.assert_close(hard, ce, rtol=1e-5, atol=1e-6)
    unbiased = loss_fn(student, sw, teacher, tw, labels)[1]
    assert not torch.allclose(soft, unbiased)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_grpo_clip_ratio_is_liger_kernels_token_weighted_one(level):
    from liger_core.losses import fused_linear_grpo_loss, grpo_options

    x, w = torch.randn(4, 5, 8), torch.randn(20, 8)
    ids = torch.randint(0, 20, (4, 5))
    mask = torch.ones(4, 5)
    mask[0, 2:] = 0
    mask[2, 4:] = 0
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    old = torch.randn(4, 5) * 0.5 - 3  # ratios far from 1: some completions clipped, some not
    loss, metrics = C.LigerFusedLinearGRPOLoss(beta=0.0, importance_sampling_level=level)(
        x, w, ids, mask, adv, None, None, old
    )
    options = grpo_options(epsilon_high=0.2, use_bias_correction_kl=False, importance_sampling_level=level)
    want_loss, want = fused_linear_grpo_loss(
        x, w, ids, advantages=adv, completion_mask=mask, old_per_token_logps=old, options=options
    )
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=0)
    assert len(metrics) == 1
    torch.testing.assert_close(metrics[0], want["clip_ratio"], rtol=0, atol=0)
    # token-weighted: the share of completion tokens in the clipped region (Liger-Kernel's definition)
    logp = torch.log_softmax(x @ w.T, -1).gather(-1, ids[..., None])[..., 0]
    log_ratio = logp - old
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)).expand_as(logp)
    ratio = log_ratio.exp()
    region = ((ratio < 0.8) & (adv[:, None] < 0)) | ((ratio > 1.2) & (adv[:, None] > 0))
    torch.testing.assert_close(metrics[0], (region * mask).sum() / mask.sum(), rtol=1e-5, atol=1e-6)

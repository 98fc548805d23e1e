"""``liger_core.compat.liger_kernel`` against an installed Liger-Kernel (run_all.sh's hf_trainer-liger-kernel
suite installs 0.8.5): every public name of ``liger_kernel.transformers``, its ``functional`` and
``liger_kernel.chunked_loss`` exists in the compat layer with the same parameters (names, kinds, defaults),
so moving code over is one changed import; the chunked losses give Liger-Kernel's loss, gradients and aux
outputs. Without Liger-Kernel, the compat layer imports and patches without it (it never imports
``liger_kernel``). Each check runs in a child process (this file run as a script), so that the pytest
process never imports ``liger_kernel`` (other tests here check that the plugin does not)."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys

import torch

HAS_LIGER_KERNEL = importlib.util.find_spec("liger_kernel") is not None


def _params(obj) -> list[tuple[str, object, object]]:
    """(name, kind, default) of a function's parameters, or of a class's ``__init__`` less ``self``."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = list(inspect.signature(target).parameters.values())
    if inspect.isclass(obj):
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


def _compare(theirs_module, ours_module, names, skip=()):
    mismatched = {}
    for name in names:
        assert hasattr(ours_module, name), f"{ours_module.__name__} has no {name}"
        theirs, ours = getattr(theirs_module, name), getattr(ours_module, name)
        if name in skip or not callable(theirs):
            continue
        if _params(theirs) != _params(ours):
            mismatched[name] = f"{_params(theirs)} != {_params(ours)}"
    assert not mismatched, "\n".join(f"{k}: {v}" for k, v in mismatched.items())


def _check_names():
    if not HAS_LIGER_KERNEL:  # this suite's venv without Liger-Kernel: the compat layer needs none
        from transformers import LlamaConfig, LlamaForCausalLM

        from liger_core.compat.liger_kernel import transformers as compat

        config = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, num_key_value_heads=2, **config))
        report = compat.apply_liger_kernel_to_llama(model=model)
        assert report and "liger_kernel" not in sys.modules
        return

    import liger_kernel.chunked_loss as lk_chunked
    import liger_kernel.transformers as lk
    import liger_kernel.transformers.functional as lk_functional

    from liger_core.compat.liger_kernel import chunked_loss as ours_chunked
    from liger_core.compat.liger_kernel import transformers as ours
    from liger_core.compat.liger_kernel.transformers import functional as ours_functional
    from liger_core.compat.liger_kernel.transformers.modules import DEFERRED

    # Classes built lazily from liger_core.modules take whatever liger_core's class takes; AutoLiger... has
    # classmethods only.
    _compare(lk, ours, lk.__all__, skip={*DEFERRED, "AutoLigerKernelForCausalLM"})
    assert callable(ours.AutoLigerKernelForCausalLM.from_pretrained)
    functional = [n for n in dir(lk_functional) if n.startswith("liger_")]
    # Functions liger_core has no op for take anything and raise NotImplementedError naming themselves.
    _compare(lk_functional, ours_functional, functional, skip=set(ours_functional.NOT_IN_LIGER_CORE))
    chunked = [n for n in dir(lk_chunked) if n.startswith("LigerFusedLinear")]
    _compare(lk_chunked, ours_chunked, chunked, skip=set())
    for name in chunked:
        theirs, mine = getattr(lk_chunked, name), getattr(ours_chunked, name)
        assert _params(theirs.forward)[1:] == _params(mine.forward)[1:], name


def _run(loss_module, args, grad_args):
    """(loss, outputs after it, gradients of ``grad_args``' positions) of one forward and backward."""
    args = [
        a.detach().clone().requires_grad_(i in grad_args) if torch.is_tensor(a) else a
        for i, a in enumerate(args)
    ]
    out = loss_module(*args)
    loss, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
    loss.backward()
    return loss.detach(), rest, [args[i].grad for i in grad_args]


def _flatten(values):
    for v in values:
        if isinstance(v, (tuple, list)):
            yield from _flatten(v)
        else:
            yield v


def _check_chunked_losses():
    """Loss, gradients and every aux output of the compat chunked losses equal Liger-Kernel's (its pure
    PyTorch path, ``compiled=False``) on a small batch. Without Liger-Kernel: the compat losses run and
    return Liger-Kernel's structure."""
    from liger_core.compat.liger_kernel import chunked_loss as ours

    torch.manual_seed(0)
    pairs, seq, hidden, vocab = 2, 6, 8, 24
    x, w = torch.randn(2 * pairs, seq, hidden), torch.randn(vocab, hidden) * 0.5
    target = torch.randint(0, vocab, (2 * pairs, seq))
    target[:, :2] = -100
    ref_x, ref_w = torch.randn_like(x), torch.randn_like(w)
    labels = torch.tensor([True, False, True, False])
    ids, xs = torch.randint(0, vocab, (3, 5)), torch.randn(3, 5, hidden)
    mask = torch.ones(3, 5)
    mask[0, 3:] = 0
    adv, ref_lp, old_lp = torch.randn(3), torch.randn(3, 5) - 3, torch.randn(3, 5) - 3
    student, teacher = torch.randn(8, hidden), torch.randn(8, 12)
    teacher_w, true_labels = torch.randn(vocab, 12), torch.randint(0, vocab, (8,))
    true_labels[0] = -100
    pref, dpo_args = (w, x, target), (w, x, target, None, ref_x, ref_w)
    grpo_args = (xs, w, ids, mask, adv, None, ref_lp, old_lp)
    jsd_args = (student, w, teacher, teacher_w, true_labels)
    jsd_bias_args = (*jsd_args, torch.randn(vocab), torch.randn(vocab))
    uneven = target.clone()
    uneven[1, 2:4] = -100  # rows of different lengths: per-token means differ from sums
    cases = [  # (class, constructor kwargs, forward args, positions of the args to differentiate)
        ("LigerFusedLinearDPOLoss", dict(beta=0.2), dpo_args, (0, 1)),
        ("LigerFusedLinearDPOLoss", dict(beta=0.2, compute_nll_loss=True, alpha=0.5), dpo_args, (1,)),
        ("LigerFusedLinearDPOLoss", dict(loss_type="robust", label_smoothing=0.1), dpo_args, (1,)),
        (
            "LigerFusedLinearDPOLoss",
            dict(beta=0.2, average_log_prob=True),
            dpo_args[:2] + (uneven,) + dpo_args[3:],
            (0, 1),
        ),
        ("LigerFusedLinearORPOLoss", dict(beta=0.3), pref, (0, 1)),
        ("LigerFusedLinearCPOLoss", dict(beta=0.2, alpha=0.7, label_smoothing=0.1), pref, (0, 1)),
        ("LigerFusedLinearSimPOLoss", dict(beta=2.0, gamma=0.4), pref, (0, 1)),
        (
            "LigerFusedLinearKTOLoss",
            dict(use_ref_model=True),
            (x, w, target, None, labels, ref_x, ref_w),
            (0, 1),
        ),
        (
            "LigerFusedLinearKTOLoss",
            dict(use_ref_model=True, average_log_prob=True),
            (x, w, uneven, None, labels, ref_x, ref_w),
            (0, 1),
        ),
        ("LigerFusedLinearGRPOLoss", dict(beta=0.05), grpo_args, (0, 1)),
        (
            "LigerFusedLinearGRPOLoss",
            dict(beta=0.05, importance_sampling_level="sequence"),
            grpo_args,
            (0, 1),
        ),
        ("LigerFusedLinearGRPOLoss", dict(use_ref_model=False, loss_type="cispo"), grpo_args, (0,)),
        (
            "LigerFusedLinearJSDLoss",
            dict(beta=0.4, temperature=2.0, return_soft_hard_loss=True),
            jsd_args,
            (0, 1),
        ),
        (
            "LigerFusedLinearJSDLoss",
            dict(beta=0.4, temperature=2.0, return_soft_hard_loss=True),
            jsd_bias_args,
            (0, 1, 5),
        ),
        (
            "LigerFusedLinearCosineSimilarityLoss",
            dict(beta=0.7, temperature=2.0, weight_hard_loss=0.3, return_soft_hard_loss=True),
            jsd_args,
            (0, 1),
        ),
        (
            "LigerFusedLinearCosineSimilarityLoss",
            dict(beta=0.4),
            (student, w, teacher, torch.randn(vocab + 8, 12), true_labels, torch.randn(vocab)),
            (0, 1, 5),
        ),
    ]
    for name, kwargs, args, grad_args in cases:
        loss, rest, grads = _run(getattr(ours, name)(**kwargs), args, grad_args)
        assert loss.dim() == 0 and all(g is not None for g in grads), name
        if not HAS_LIGER_KERNEL:
            soft_hard = name in ("LigerFusedLinearJSDLoss", "LigerFusedLinearCosineSimilarityLoss")
            want_rest = (2 if kwargs.get("return_soft_hard_loss") else 0) if soft_hard else 1
            assert len(rest) == want_rest, name
            continue
        import liger_kernel.chunked_loss as lk

        want, want_rest, want_grads = _run(getattr(lk, name)(compiled=False, **kwargs), args, grad_args)
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n} loss: {m}")
        for i, (a, b) in enumerate(zip(grads, want_grads)):
            torch.testing.assert_close(
                a, b, rtol=1e-4, atol=1e-6, msg=lambda m, n=name, i=i: f"{n} grad {i}: {m}"
            )
        got_aux, want_aux = list(_flatten(rest)), list(_flatten(want_rest))
        assert len(got_aux) == len(want_aux), name
        for i, (a, b) in enumerate(zip(got_aux, want_aux)):
            torch.testing.assert_close(
                a.float(), b.float(), rtol=1e-4, atol=1e-5, msg=lambda m, n=name, i=i: f"{n} aux {i}: {m}"
            )


def _check_functional():
    """The compat ``functional`` entry points give Liger-Kernel's values (those of its kernels that run in
    Triton's interpreter on CPU: fused linear cross-entropy, cross-entropy's z-loss path, JSD, fused linear
    JSD, rope). Without Liger-Kernel: each returns a finite loss or tensor pair."""
    from liger_core.compat.liger_kernel.transformers import functional as ours

    torch.manual_seed(0)
    target = torch.randint(0, 20, (6,))
    target[1] = -100
    hidden, weight = torch.randn(6, 8), torch.randn(20, 8)
    teacher, teacher_w = torch.randn(6, 12), torch.randn(20, 12)
    logits = torch.randn(6, 20)
    student_lp, teacher_lp = torch.randn(6, 20).log_softmax(-1), torch.randn(6, 20).log_softmax(-1)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    angles = torch.randn(2, 5, 4).repeat(1, 1, 2)  # Hugging Face's layout: the two halves share angles
    cases = {
        "liger_fused_linear_cross_entropy": (
            (hidden, weight, target),
            dict(label_smoothing=0.1),
        ),
        "liger_cross_entropy": ((logits, target), dict(lse_square_scale=1e-3, return_z_loss=True)),
        "liger_cross_entropy/token_accuracy": (
            (logits, target),
            dict(return_token_accuracy=True, return_predicted_tokens=True),
        ),
        "liger_fused_linear_cross_entropy/token_scaling": (
            (hidden, weight, target),
            dict(use_token_scaling=True, return_token_accuracy=True),
        ),
        "liger_jsd": ((student_lp, teacher_lp, target), dict(beta=0.3)),
        "liger_fused_linear_jsd": (
            (hidden, weight, teacher, teacher_w, target),
            dict(jsd_beta=0.3, temperature=2.0),
        ),
        "liger_rope": ((q, k, angles.cos(), angles.sin()), {}),
    }

    def fields(out):  # a CrossEntropyOutput's tensors, in field order
        names = ("loss", "z_loss", "token_accuracy", "predicted_tokens")
        return [getattr(out, n) for n in names if getattr(out, n) is not None]

    for case, (args, kwargs) in cases.items():
        name = case.split("/")[0]
        got = getattr(ours, name)(*[a.clone() for a in args], **kwargs)
        got = fields(got) if isinstance(got, ours.CrossEntropyOutput) else got
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        assert all(bool(torch.isfinite(g.float()).all()) for g in got), case
        if not HAS_LIGER_KERNEL:
            continue
        import liger_kernel.transformers.functional as lk

        want = getattr(lk, name)(*[a.clone() for a in args], **kwargs)
        want = fields(want) if hasattr(want, "z_loss") else want
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            torch.testing.assert_close(
                a, b, rtol=1e-5, atol=1e-6, msg=lambda m, n=case, i=i: f"{n} [{i}]: {m}"
            )


CHECKS = {"names": _check_names, "chunked_losses": _check_chunked_losses, "functional": _check_functional}


def _run_child(check: str) -> None:
    proc = subprocess.run(
        [sys.executable, __file__, check], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith(f"{check}: ok"), proc.stdout + proc.stderr


def test_compat_layer_has_liger_kernels_names_and_signatures():
    _run_child("names")


def test_compat_chunked_losses_equal_liger_kernels():
    _run_child("chunked_losses")


def test_compat_functional_equals_liger_kernels():
    _run_child("functional")


if __name__ == "__main__":
    CHECKS[sys.argv[1]]()
    print(f"{sys.argv[1]}: ok")

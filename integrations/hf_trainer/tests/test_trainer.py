"""The Trainer hook on a tiny Llama: patched only with the flag, same losses, GA, model_init, eval."""

from __future__ import annotations

import sys

import liger_core_hf
import pytest
import torch
from tiny import kinds, make_trainer, step_losses
from transformers import TrainerCallback

from liger_core.patching import is_patched

NO_ROPE = {
    "rope": False
}  # RoPE is the slowest kernel in the interpreter; tests that are about wiring skip it


def test_flag_off_leaves_model_alone_flag_on_patches_with_equal_losses(
    make_model, tokenizer, train_rows, tmp_path
):
    liger_core_hf.install()
    off = make_trainer(make_model(), tokenizer, train_rows, tmp_path / "off")
    off.train()
    assert not is_patched(off.model) and kinds(off.model) == set()

    on = make_trainer(make_model(), tokenizer, train_rows, tmp_path / "on", use_liger_kernel=True)
    on.train()
    assert is_patched(on.model)
    assert kinds(on.model) == {"rms_norm", "swiglu", "rope", "fused_linear_cross_entropy"}
    assert on.args.use_liger_kernel is True  # hidden from transformers during train(), then given back
    assert "liger_kernel" not in sys.modules  # the third-party package was never imported

    losses_off, losses_on = step_losses(off), step_losses(on)
    assert len(losses_off) == len(losses_on) == 3
    assert losses_on == pytest.approx(losses_off, rel=1e-4)
    for (name, p_off), p_on in zip(off.model.named_parameters(), on.model.parameters()):
        torch.testing.assert_close(p_on, p_off, rtol=1e-4, atol=1e-5, msg=name)


def test_gradient_accumulation_4x1_equals_one_batch_of_4(make_model, tokenizer, train_rows, tmp_path):
    liger_core_hf.install()
    common = dict(
        use_liger_kernel=True, liger_kernel_config=NO_ROPE, max_steps=2, optim="sgd", learning_rate=0.5
    )
    accumulated = make_trainer(
        make_model(),
        tokenizer,
        train_rows,
        tmp_path / "ga",
        per_device_train_batch_size=1,
        gradient_accumulation_steps=4,
        **common,
    )
    accumulated.train()
    batched = make_trainer(
        make_model(),
        tokenizer,
        train_rows,
        tmp_path / "bs4",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        **common,
    )
    batched.train()
    assert "fused_linear_cross_entropy" in kinds(accumulated.model) and "rope" not in kinds(accumulated.model)
    assert step_losses(accumulated) == pytest.approx(step_losses(batched), rel=1e-4)
    assert len(step_losses(batched)) == 2
    for (name, p_ga), p_bs in zip(accumulated.model.named_parameters(), batched.model.parameters()):
        torch.testing.assert_close(p_ga, p_bs, rtol=1e-4, atol=1e-5, msg=name)


class _RecordOrder(TrainerCallback):
    def __init__(self):
        self.at_train_begin = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.at_train_begin = args.use_liger_kernel


def test_model_init_recreated_model_is_patched_before_the_optimizer(
    make_model, tokenizer, train_rows, tmp_path
):
    liger_core_hf.install()
    built = []

    def model_init():
        built.append(make_model())
        return built[-1]

    order = _RecordOrder()
    trainer = make_trainer(
        None,
        tokenizer,
        train_rows,
        tmp_path,
        model_init=model_init,
        callbacks=[order],
        use_liger_kernel=True,
        liger_kernel_config=NO_ROPE,
        max_steps=1,
    )
    seen_by_create_optimizer = []
    create_optimizer = trainer.create_optimizer

    def spy(*args, **kwargs):
        seen_by_create_optimizer.append((trainer.model, is_patched(trainer.model)))
        return create_optimizer(*args, **kwargs)

    trainer.create_optimizer = spy
    trainer.train()
    assert len(built) == 2 and trainer.model is built[1]  # train() re-created the model
    assert all(is_patched(m) for m in built)
    assert seen_by_create_optimizer == [(built[1], True)]
    assert order.at_train_begin is True  # flag given back before the first step (eval and reporting see it)
    assert kinds(built[1]) == {"rms_norm", "swiglu", "fused_linear_cross_entropy"}


def test_callback_patches_at_init_end_without_the_flag(make_model, tokenizer, train_rows, tmp_path):
    model = make_model()
    trainer = make_trainer(
        model,
        tokenizer,
        train_rows,
        tmp_path,
        callbacks=[liger_core_hf.LigerCoreCallback({"rope": False})],
        max_steps=1,
    )
    assert trainer.args.use_liger_kernel is False
    assert kinds(model) == {"rms_norm", "swiglu", "fused_linear_cross_entropy"}  # already, before train()
    trainer.train()
    assert trainer.state.global_step == 1


def test_callback_with_the_flag_needs_no_install(make_model, tokenizer, train_rows, tmp_path):
    """The callback switches on the hook, so transformers does not go looking for liger-kernel in train()."""
    model = make_model()
    trainer = make_trainer(
        model,
        tokenizer,
        train_rows,
        tmp_path,
        callbacks=[liger_core_hf.LigerCoreCallback()],
        use_liger_kernel=True,
        liger_kernel_config={"rope": False, "swiglu": False},
        max_steps=1,
    )
    trainer.train()
    assert kinds(model) == {"rms_norm", "fused_linear_cross_entropy"}
    assert trainer.args.use_liger_kernel is True


def _record_forward_kwargs(model):
    calls = []
    model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(dict(kwargs)), with_kwargs=True)
    return calls


def test_eval_loss_only_skips_logits_and_compute_metrics_still_gets_them(
    make_model, tokenizer, train_rows, tmp_path
):
    liger_core_hf.install()
    reference = make_trainer(make_model(), tokenizer, train_rows, tmp_path / "ref").evaluate()

    model = make_model()
    calls = _record_forward_kwargs(model)
    trainer = make_trainer(
        model,
        tokenizer,
        train_rows,
        tmp_path / "on",
        use_liger_kernel=True,
        liger_kernel_config=NO_ROPE,
        prediction_loss_only=True,
    )
    metrics = trainer.evaluate()  # no train() first: the hook patches before evaluating
    assert is_patched(model)
    assert calls and all(c.get("skip_logits") is True for c in calls)
    assert metrics["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-4)

    seen = []

    def compute_metrics(prediction):
        seen.append(prediction.predictions)
        return {"n": float(len(prediction.predictions))}

    calls.clear()
    trainer.args.prediction_loss_only = False
    trainer.compute_metrics = compute_metrics
    metrics = trainer.evaluate()
    assert not any(c.get("skip_logits") for c in calls)
    (logits,) = seen
    assert logits.shape[0] == 4 and logits.shape[-1] == len(tokenizer)
    assert metrics["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-4)

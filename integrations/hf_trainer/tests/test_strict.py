"""`strict` in `liger_kernel_config`: a kernel asked for and not applied stops training before the first step;
without it the model trains and the plugin's own log line names what was left out (at WARNING)."""

from __future__ import annotations

import logging
import sys

import liger_core_hf
import pytest
from liger_core_hf.config import parse_kernel_config
from tiny import kinds, make_trainer, step_losses
from torch import nn
from transformers import HfArgumentParser, TrainingArguments

from liger_core.patching import PatchIncompleteError, is_patched

LAYERS_ONLY = {"rope": False}  # RoPE is the slowest kernel in Triton's interpreter; not what is tested here


class CustomHead(nn.Linear):
    """An lm_head of its own class (as a quantised or adapter layer is): the fused loss must not bypass it."""


def with_custom_head(model):
    head = CustomHead(model.config.hidden_size, model.config.vocab_size, bias=False)
    head.weight = model.lm_head.weight
    model.lm_head = head
    return model


def test_parse_kernel_config_takes_strict():
    assert parse_kernel_config({"strict": True}) == {"strict": True}
    assert parse_kernel_config('{"strict": "yes", "rope": false}') == {"strict": True, "rope": False}
    with pytest.raises(TypeError, match="strict"):
        parse_kernel_config({"strict": "sometimes"})
    with pytest.raises(ValueError, match="'strict'"):  # the accepted keys are listed, strict among them
        parse_kernel_config({"stric": True})


def test_strict_from_the_command_line(monkeypatch, tmp_path):
    liger_core_hf.install()
    argv = ["train.py", "--output_dir", str(tmp_path), "--use_liger_kernel", "--liger_kernel_config"]
    monkeypatch.setattr(sys, "argv", [*argv, '{"strict": true, "rope": false}'])
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    assert args.liger_kernel_config == {"strict": True, "rope": False}


@pytest.mark.parametrize("form", [{"strict": True, **LAYERS_ONLY}, '{"strict": true, "rope": false}'])
def test_strict_stops_training_when_the_fused_loss_cannot_apply(
    make_model, tokenizer, train_rows, tmp_path, form
):
    liger_core_hf.install()
    trainer = make_trainer(
        with_custom_head(make_model()),
        tokenizer,
        train_rows,
        tmp_path,
        use_liger_kernel=True,
        liger_kernel_config=form,
    )
    with pytest.raises(PatchIncompleteError, match=r"fused_linear_cross_entropy: lm_head \(CustomHead\)"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert not is_patched(trainer.model)  # liger_core undid the call


def test_without_strict_it_trains_and_warns_what_was_left_out(
    make_model, tokenizer, train_rows, tmp_path, caplog
):
    liger_core_hf.install()
    trainer = make_trainer(
        with_custom_head(make_model()),
        tokenizer,
        train_rows,
        tmp_path,
        use_liger_kernel=True,
        liger_kernel_config=LAYERS_ONLY,
        max_steps=2,
    )
    with caplog.at_level(logging.INFO, logger="liger_core_hf"):
        trainer.train()
    assert len(step_losses(trainer)) == 2
    assert kinds(trainer.model) == {"rms_norm", "swiglu"}
    ours = [r for r in caplog.records if r.name == "liger_core_hf" and "use_liger_kernel: " in r.getMessage()]
    assert len(ours) == 1 and ours[0].levelno == logging.WARNING
    assert "NOT applied: fused_linear_cross_entropy (lm_head (CustomHead)" in ours[0].getMessage()


def test_strict_through_the_callback_stops_the_trainer_constructor(
    make_model, tokenizer, train_rows, tmp_path
):
    with pytest.raises(PatchIncompleteError, match="fused_linear_cross_entropy"):
        make_trainer(
            with_custom_head(make_model()),
            tokenizer,
            train_rows,
            tmp_path,
            callbacks=[liger_core_hf.LigerCoreCallback({"strict": True, **LAYERS_ONLY})],
        )


def test_strict_on_a_model_that_takes_every_kernel_trains(make_model, tokenizer, train_rows, tmp_path):
    liger_core_hf.install()
    trainer = make_trainer(
        make_model(),
        tokenizer,
        train_rows,
        tmp_path,
        use_liger_kernel=True,
        liger_kernel_config={"strict": True, **LAYERS_ONLY},
        max_steps=1,
    )
    trainer.train()
    assert len(step_losses(trainer)) == 1
    assert kinds(trainer.model) == {"rms_norm", "swiglu", "fused_linear_cross_entropy"}

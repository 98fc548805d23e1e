"""``trl_grpo``: TRL's own GRPOTrainer (the version Axolotl pins) with its fused-loss path served by
liger_core gives the loss, the gradients and every logged metric of TRL's unfused path, for several loss
types, KL, clipping and importance-sampling settings (one batch of sampled completions, no generation)."""

from __future__ import annotations

import os

os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")

import pytest
import torch
from conftest import assert_same_step, trainer_step
from liger_core_axolotl import trl_grpo

trl = pytest.importorskip("trl")
B, PROMPT, COMPLETION = 6, 5, 7

SETTINGS = {
    "grpo+kl": dict(loss_type="grpo", beta=0.04),
    "dapo": dict(loss_type="dapo"),
    "bnpo+sequence": dict(loss_type="bnpo", importance_sampling_level="sequence", beta=0.1),
    "dr_grpo+delta": dict(loss_type="dr_grpo", delta=1.5),
    "cispo": dict(loss_type="cispo", epsilon_high=1.05),
    "sapo": dict(loss_type="sapo"),
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence"),
}


def _reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _trainer(tiny_llama, tmp_path, **options):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=B, num_generations=2,
        max_completion_length=COMPLETION, report_to=[], use_cpu=True, bf16=False, **options,
    )  # fmt: skip
    data = Dataset.from_list([{"prompt": "red fox"}] * B)
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=_reward, args=args, train_dataset=data, processing_class=tokenizer
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _inputs(trainer):
    """A batch as TRL's generation step leaves it: completions of varied lengths (one empty), advantages of
    both signs, the old policy's log-probs away from the current ones (so that clipping happens), the
    reference's log-probs."""
    vocab = trainer.model.config.vocab_size
    completion_mask = (torch.arange(COMPLETION) < torch.tensor([7, 3, 5, 0, 6, 2])[:, None]).long()
    with torch.no_grad():
        ids = torch.randint(4, vocab, (B, PROMPT + COMPLETION))
        logits = trainer.model(input_ids=ids).logits[:, PROMPT - 1 : -1]
        logps = torch.log_softmax(logits, -1).gather(-1, ids[:, PROMPT:, None])[..., 0]
    return {
        "prompt_ids": ids[:, :PROMPT],
        "prompt_mask": torch.ones(B, PROMPT, dtype=torch.long),
        "completion_ids": ids[:, PROMPT:],
        "completion_mask": completion_mask,
        "advantages": torch.randn(B),
        "old_per_token_logps": logps + 0.3 * torch.randn(B, COMPLETION),
        "ref_per_token_logps": logps + 0.5 * torch.randn(B, COMPLETION),
        "num_items_in_batch": completion_mask.sum(),
    }


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_liger_core_loss_equals_trl_unfused(tiny_llama, tmp_path, setting):
    trainer = _trainer(tiny_llama, tmp_path, **SETTINGS[setting])
    trainer.model.train()
    inputs = _inputs(trainer)
    off = trainer_step(trainer, inputs)
    assert trl_grpo.install(trainer) is None
    assert trainer.use_liger_kernel and not trainer.args.use_liger_kernel
    on = trainer_step(trainer, inputs)
    assert_same_step(on, off)


def test_unsupported_settings_keep_trls_path(tiny_llama, tmp_path):
    trainer = _trainer(tiny_llama, tmp_path, top_entropy_quantile=0.5)
    assert "top_entropy_quantile" in trl_grpo.install(trainer)
    assert not trainer.use_liger_kernel
    trainer = _trainer(tiny_llama, tmp_path, loss_type="luspo")
    assert "luspo" in trl_grpo.unsupported(trainer)

"""A tiny random-init Llama and a byte-level BPE tokenizer built locally (no downloads); Trainer helpers."""

from __future__ import annotations

import os
from pathlib import Path

import torch

ACTIVATION_ENV = "LIGER_CORE_DISABLE_HOOK"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a subprocess test: this one without the switch that turns the plugin's `.pth`
    activation off in the pytest process (conftest.py), so the child runs as a user's process does."""
    env = {k: v for k, v in os.environ.items() if k != ACTIVATION_ENV}
    env.update(TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **extra)
    return env


SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Fused kernels keep the logits out of memory.",
    "A tiny model is enough to check the wiring.",
    "Gradient accumulation must match one large batch.",
    "RMSNorm, RoPE and SwiGLU run in Triton.",
    "The trainer patches the model before the optimizer.",
    "Short one.",
    "Evaluation with only the loss skips the logits entirely, which saves memory.",
]


def build_tokenizer(directory: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.save_pretrained(directory)
    return fast


def llama_config(tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


MAX_TOKENS = 9  # RoPE and the fused loss are slow in Triton's interpreter: keep sequences short


def make_trainer(model, tokenizer, rows, output_dir, *, callbacks=None, model_init=None, **overrides):
    """A CPU Trainer over `rows` in order (two runs see the same batches), no checkpoints, no reports."""
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    settings = dict(
        output_dir=str(output_dir),
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        train_sampling_strategy="sequential",
        disable_tqdm=True,
        seed=0,
    )
    settings.update(overrides)
    return Trainer(
        model=model,
        model_init=model_init,
        args=TrainingArguments(**settings),
        train_dataset=rows,
        eval_dataset=rows[:4],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=callbacks,
    )


def step_losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def kinds(model) -> set[str]:
    """The liger_core kinds swapped into `model` (patched modules carry `_liger_core_kind`)."""
    return {m.__dict__["_liger_core_kind"] for m in model.modules() if "_liger_core_kind" in m.__dict__}


def toy_model():
    """A causal LM that liger_core cannot patch: unknown model_type, no norm, no gated MLP, no attention."""
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutput

    class ToyConfig(PretrainedConfig):
        model_type = "toy_unpatchable"

        def __init__(self, vocab=50, width=8, **kwargs):
            self.vocab, self.width = vocab, width
            super().__init__(**kwargs)

    class ToyLM(PreTrainedModel):
        config_class = ToyConfig

        def __init__(self, config):
            super().__init__(config)
            self.table = nn.Embedding(config.vocab, config.width)
            self.proj = nn.Linear(config.width, config.vocab)
            self.post_init()

        def forward(self, input_ids=None, labels=None, **kwargs):
            logits = self.proj(torch.tanh(self.table(input_ids)))
            loss = None
            if labels is not None:
                loss = nn.functional.cross_entropy(
                    logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100
                )
            return CausalLMOutput(loss=loss, logits=logits)

    return ToyLM(ToyConfig())

"""Fixtures: a tiny local Llama (byte-level BPE tokenizer, 2 layers), a tiny completion dataset, an Axolotl
config for 3 CPU steps; nothing is downloaded."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

# Short rows on purpose: the Triton interpreter's cost grows with the tokens per batch.
TEXTS = [
    "red fox runs",
    "blue sky glows",
    "tiny model learns",
    "fast kernels fuse",
    "exact loss",
    "rope turns",
]
PLUGIN = "liger_core_axolotl.LigerCorePlugin"


def build_tiny_llama(path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(TEXTS * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tok.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "data.jsonl"
    path.write_text("".join(json.dumps({"text": TEXTS[i % len(TEXTS)]}) + "\n" for i in range(16)))
    return path


def axolotl_config(model: Path, data: Path, workdir: Path, **extra) -> dict:
    """3 steps on CPU (``fp16: false`` is the one key CPU needs: Axolotl turns fp16 on without bf16)."""
    config = {
        "base_model": str(model),
        "plugins": [PLUGIN],
        "use_liger_kernel": True,
        "datasets": [{"path": str(data), "type": "completion"}],
        "dataset_prepared_path": str(workdir / "prepared"),
        "output_dir": str(workdir / "out"),
        "sequence_len": 64,
        "micro_batch_size": 1,
        "max_steps": 3,
        "learning_rate": 0.001,
        "optimizer": "adamw_torch",
        "fp16": False,
        "bf16": False,
        "save_strategy": "no",
        "logging_steps": 1,
    }
    config.update(extra)
    return config


# The messages the plugin and liger_core log (liger_core_axolotl/plugin.py, liger_core.patching's reports and
# warnings): each starts with "liger_core: " or "liger_core_axolotl: ", or names the kernels or the loss. A
# run without the plugin logs none of them. Matching the messages, never the bare name "liger_core", keeps
# the check blind to paths in the log (a clone in a folder named liger_core prints it in every traceback).
LIGER_CORE_MESSAGE = re.compile(
    r"(?<![\w/.-])liger_core(_axolotl)?: |kernels active on |computes its loss with liger_core|"
    r"keeps TRL's loss from the full logits|: liger_core runs its layer kernels"
)


def liger_core_messages(output: str) -> list[str]:
    """The lines of ``output`` that carry a message of the plugin or of liger_core."""
    return [line for line in output.splitlines() if LIGER_CORE_MESSAGE.search(line)]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AXOLOTL_DO_NOT_TRACK="1",  # without it PostHog retries keep the process alive after training
        DO_NOT_TRACK="1",
        TRITON_INTERPRET="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        WANDB_MODE="disabled",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        # as in an activated venv: Axolotl's launcher execs `accelerate` from PATH
        PATH=os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")]),
    )
    env.update(extra)
    return env


def trainer_step(trainer, batch) -> tuple:
    """(loss, gradients of the policy's parameters, the metrics logged) of one ``compute_loss`` of a TRL
    trainer in training mode, from fresh metrics and gradients."""
    trainer._metrics["train"].clear()
    trainer._total_train_tokens = 0
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, {k: list(v) for k, v in trainer._metrics["train"].items()}


def assert_same_step(on, off, metric_abs=lambda key: 1e-6) -> None:
    """Two ``trainer_step`` results agree: the loss (rel 1e-5), every parameter's gradient (norm-wise 1e-4:
    fp32 roundings of two computations; a wiring error is O(1)), the same metric names, each value (rel
    1e-5, absolute ``metric_abs(name)``)."""
    assert on[0].item() == pytest.approx(off[0].item(), rel=1e-5, abs=1e-7)
    assert on[1].keys() == off[1].keys()
    for name, g in off[1].items():
        assert (on[1][name] - g).norm() <= 1e-4 * g.norm(), name
    assert set(on[2]) == set(off[2]), (sorted(on[2]), sorted(off[2]))
    for key, values in off[2].items():
        assert on[2][key] == pytest.approx(values, rel=1e-5, abs=metric_abs(key), nan_ok=True), key


def policy_and_reference(model_dir):
    """(policy, reference, tokenizer) in fp32 from ``model_dir``, the policy moved away from the reference
    (seeded): nonzero rewards, margins and KL."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model, ref, AutoTokenizer.from_pretrained(model_dir)

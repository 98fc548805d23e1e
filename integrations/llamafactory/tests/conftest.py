"""Fixtures: a tiny local Llama (byte-level BPE tokenizer, 2 layers), a tiny alpaca dataset; no downloads."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

# Short rows on purpose: the Triton interpreter's cost grows with tokens per batch.
SENTENCES = ["red fox", "blue sky", "tiny model", "fast kernels", "exact loss", "rope turns"]


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
    tokenizer.train_from_iterator([*SENTENCES, "Human: Assistant: say"] * 4, trainer=trainer)
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
def tiny_dataset_dir(tmp_path_factory) -> Path:
    """``dataset_dir`` with ``dataset_info.json`` registering ``tiny_alpaca`` (alpaca columns)."""
    root = tmp_path_factory.mktemp("data")
    rows = [
        {"instruction": f"say {text}", "input": "", "output": text}
        for text in (SENTENCES[i % len(SENTENCES)] for i in range(16))
    ]
    (root / "tiny_alpaca.json").write_text(json.dumps(rows))
    (root / "dataset_info.json").write_text(json.dumps({"tiny_alpaca": {"file_name": "tiny_alpaca.json"}}))
    return root


def train_config(model: Path, data: Path, out: Path, **extra) -> dict:
    config = dict(
        model_name_or_path=str(model),
        stage="sft",
        do_train=True,
        finetuning_type="full",
        dataset="tiny_alpaca",
        dataset_dir=str(data),
        template="default",
        cutoff_len=64,
        overwrite_cache=True,
        preprocessing_num_workers=1,
        output_dir=str(out),
        overwrite_output_dir=True,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        per_device_train_batch_size=1,
        disable_gradient_checkpointing=True,
        max_steps=3,
        learning_rate=1.0e-3,
        bf16=False,
        fp16=False,
    )
    config.update(extra)
    return config


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TRITON_INTERPRET="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        GRADIO_ANALYTICS_ENABLED="False",
        WANDB_MODE="disabled",
        # as in an activated venv: LLaMA-Factory's launcher runs `torchrun` from PATH
        PATH=os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")]),
    )
    env.pop("FORCE_TORCHRUN", None)
    env.pop("LIGER_CORE_LMF", None)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

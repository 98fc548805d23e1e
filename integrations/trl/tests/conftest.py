"""Fixtures: the tiny random-init Llama and tokenizer of the HF Trainer plugin's tests (built locally, no
downloads), and a small text dataset. Triton kernels run in Triton's interpreter (CPU)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if not (Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()):
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The plugins' `.pth` activation is off in the pytest process (each test installs what it needs); subprocess
# tests run with it on (`tiny.child_env`), as a user's process does.
os.environ["LIGER_CORE_DISABLE_HOOK"] = "1"
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
# one tiny-model recipe for both plugins: integrations/hf_trainer/tests/tiny.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hf_trainer" / "tests"))

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import SENTENCES, build_tokenizer, llama_config  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from transformers import LlamaForCausalLM

    directory = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_tokenizer(directory)
    torch.manual_seed(0)
    LlamaForCausalLM(llama_config(tokenizer)).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture
def make_model(tiny_dir):
    from transformers import LlamaForCausalLM

    return lambda: LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)


@pytest.fixture(scope="session")
def text_dataset():
    from datasets import Dataset

    return Dataset.from_list([{"text": s} for s in SENTENCES])


@pytest.fixture(scope="session")
def dataset_dir(tmp_path_factory) -> Path:
    """The same sentences as a local dataset directory (`--dataset_name DIR` loads its train.jsonl)."""
    import json

    directory = tmp_path_factory.mktemp("text-data")
    with open(directory / "train.jsonl", "w") as f:
        for s in SENTENCES:
            f.write(json.dumps({"text": s}) + "\n")
    return directory


@pytest.fixture(autouse=True)
def _no_hook_left_behind():
    yield
    import liger_core_trl

    liger_core_trl.uninstall()

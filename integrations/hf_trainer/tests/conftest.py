"""Fixtures: a tiny random-init Llama and a byte-level BPE tokenizer, built here (no downloads).

TRITON_INTERPRET=1 must be set before triton is imported: without a GPU, liger_core's Triton kernels then run
in Triton's interpreter on CPU tensors (slow, so everything here is tiny).
"""

from __future__ import annotations

import os
from pathlib import Path

if not (Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()):
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The plugin is installed, so its `.pth` activation is on in this process too: turn it off here (it is read
# when transformers.trainer is imported), so that each test installs what it needs and tests of transformers
# alone are not served by liger_core. Subprocess tests run with it on (`tiny.child_env`): the real path.
os.environ["LIGER_CORE_DISABLE_HOOK"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import MAX_TOKENS, SENTENCES, build_tokenizer, llama_config  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A directory with the tokenizer and a random-init LlamaForCausalLM (float32), for subprocess tests."""
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
    """Fresh copies of the same random-init model (so runs with and without the flag start equal)."""
    from transformers import LlamaForCausalLM

    def make():
        return LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)

    return make


@pytest.fixture(scope="session")
def train_rows(tokenizer) -> list[dict]:
    """Eight tokenized sentences of different lengths (padding and ignored labels in every batch)."""
    return [{"input_ids": tokenizer(s)["input_ids"][:MAX_TOKENS]} for s in SENTENCES]


@pytest.fixture(autouse=True)
def _no_hook_left_behind():
    """Each test installs what it needs; none leaks the class-level hook into the next."""
    yield
    import liger_core_hf

    liger_core_hf.uninstall()

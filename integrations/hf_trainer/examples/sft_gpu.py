"""A causal-LM fine-tuning run on one GPU, with and without `--use_liger_kernel`: peak memory, speed, loss.

An ordinary HF Trainer script (nothing liger-specific in it), for the launcher. No downloads: the model is a
random-init Llama built from a config (Llama-3 vocabulary size by default, where the fused linear
cross-entropy matters most) or a local checkpoint (`--model_dir`), the data random token ids.

    # from the repository root, with liger_core and the plugin importable
    # (pip install -e . -e integrations/hf_trainer, or PYTHONPATH=.:integrations/hf_trainer):
    ARGS="--output_dir /tmp/sft --bf16 --max_steps 20 --per_device_train_batch_size 4 \
          --logging_steps 1 --save_strategy no --report_to none --optim adamw_torch_fused \
          --learning_rate 1e-5 --disable_tqdm true"
    python -m liger_core_hf.launch integrations/hf_trainer/examples/sft_gpu.py $ARGS
    python -m liger_core_hf.launch integrations/hf_trainer/examples/sft_gpu.py $ARGS --use_liger_kernel

Each run prints one line `RESULT {...}` (JSON): peak GPU memory of the training loop, median step time,
tokens/s, the per-step losses and the liger_core kinds in the model. Options: --model_size {0.5b,1b,3b},
--seq_len, --per_device_train_batch_size, --max_steps, --gradient_checkpointing, any TrainingArguments flag.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoModelForCausalLM,
    HfArgumentParser,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from liger_core.patching import patched_modules

SIZES = {  # hidden, layers, heads, kv heads, intermediate ("tiny": a CPU smoke test of the script itself)
    "tiny": (64, 2, 4, 2, 128),
    "0.5b": (1024, 16, 16, 8, 3584),
    "1b": (2048, 16, 32, 8, 8192),
    "3b": (3072, 28, 24, 8, 8192),
}


@dataclass
class RunArguments:
    model_size: str = field(default="1b", metadata={"help": f"random-init Llama size: {sorted(SIZES)}"})
    model_dir: str | None = field(
        default=None, metadata={"help": "local checkpoint instead of a random init"}
    )
    vocab_size: int = field(default=128256, metadata={"help": "vocabulary of the random-init model"})
    seq_len: int = 2048
    num_examples: int = 512


class RandomTokens(torch.utils.data.Dataset):
    """Fixed-length rows of random token ids (labels = input ids; the collator-free Trainer path)."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


CUDA = torch.cuda.is_available()


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step; peak memory counted from the start of training (after the model and
    before the optimizer states, so both runs include the same weights, gradients and optimizer states)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.start = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if CUDA:
            torch.cuda.reset_peak_memory_stats()

    def on_step_begin(self, args, state, control, **kwargs):
        if CUDA:
            torch.cuda.synchronize()
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if CUDA:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.start)


def build_model(run: RunArguments, dtype: torch.dtype) -> torch.nn.Module:
    if run.model_dir:
        return AutoModelForCausalLM.from_pretrained(run.model_dir, dtype=dtype)
    hidden, layers, heads, kv_heads, intermediate = SIZES[run.model_size]
    config = LlamaConfig(
        vocab_size=run.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=max(run.seq_len, 2048),
        rope_theta=500000.0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(dtype)


def main() -> None:
    run, args = HfArgumentParser((RunArguments, TrainingArguments)).parse_args_into_dataclasses()
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = build_model(run, dtype)
    vocab = model.config.vocab_size
    timer = StepTimer()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=RandomTokens(run.num_examples, run.seq_len, vocab, seed=args.seed),
        callbacks=[timer],
    )
    trainer.train()
    steady = timer.times[3:] or timer.times
    step_s = statistics.median(steady)
    tokens_per_step = run.seq_len * args.per_device_train_batch_size * args.gradient_accumulation_steps
    result = {
        "use_liger_kernel": args.use_liger_kernel,
        "liger_kernel_config": args.liger_kernel_config,
        "model": run.model_dir or f"llama-{run.model_size} (random init, vocab {vocab})",
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "seq_len": run.seq_len,
        "batch": args.per_device_train_batch_size,
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if CUDA else None,
        "median_step_s": round(step_s, 4),
        "tokens_per_s": round(tokens_per_step / step_s),
        "losses": [round(e["loss"], 4) for e in trainer.state.log_history if "loss" in e],
        "liger_core_kinds": sorted(set(patched_modules(model).values())),
        "device": torch.cuda.get_device_name() if CUDA else "cpu",
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

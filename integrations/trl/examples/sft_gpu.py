"""TRL SFT on one GPU, with and without `--use_liger_kernel`: peak memory, speed, loss, token accuracy.

An ordinary TRL script (nothing liger-specific in it), for `liger-core-trl`/`python -m liger_core_trl`. No
downloads: a random-init Llama (or `--model_dir`), random token ids as a pre-tokenized dataset, a word-level
tokenizer built here. The model, data and timing helpers are those of ../../hf_trainer/examples/sft_gpu.py.

    # from the repository root, with liger_core, both plugins and trl importable
    # (pip install -e . -e integrations/hf_trainer -e integrations/trl,
    #  or PYTHONPATH=.:integrations/hf_trainer:integrations/trl with trl installed):
    ARGS="--output_dir /tmp/sft --bf16 --max_steps 20 --per_device_train_batch_size 4 \\
          --logging_steps 1 --save_strategy no --report_to none --optim adamw_torch_fused \\
          --learning_rate 1e-5 --disable_tqdm true --max_length 2048"
    python -m liger_core_trl integrations/trl/examples/sft_gpu.py $ARGS
    python -m liger_core_trl integrations/trl/examples/sft_gpu.py $ARGS --use_liger_kernel

TRL >= 1.15 already computes the loss with its own fused LM head (no logits in either run), so the difference
here comes from liger_core's layer kernels only; the HF Trainer example shows the fused loss's share as well.
Prints one line `RESULT {...}` (JSON).
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer, TrlParser

from liger_core.patching import patched_modules

_spec = importlib.util.spec_from_file_location(
    "hf_sft_gpu", Path(__file__).resolve().parents[2] / "hf_trainer" / "examples" / "sft_gpu.py"
)
hf_example = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf_example)


def word_level_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A tokenizer covering the model's vocabulary (the data is token ids already; TRL needs pad/eos)."""
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def main() -> None:
    run, args = TrlParser((hf_example.RunArguments, SFTConfig)).parse_args_and_config()
    model = hf_example.build_model(run, torch.bfloat16 if args.bf16 else torch.float32)
    vocab = model.config.vocab_size
    rows = hf_example.RandomTokens(run.num_examples, run.seq_len, vocab, seed=args.seed).ids
    timer = hf_example.StepTimer()
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"input_ids": rows.tolist()}),
        processing_class=word_level_tokenizer(vocab),
        callbacks=[timer],
    )
    trainer.train()
    step_s = statistics.median(timer.times[3:] or timer.times)
    logs = [e for e in trainer.state.log_history if "loss" in e]
    result = {
        "trainer": "trl.SFTTrainer",
        "use_liger_kernel": args.use_liger_kernel,
        "liger_kernel_config": args.liger_kernel_config,
        "model": run.model_dir or f"llama-{run.model_size} (random init, vocab {vocab})",
        "seq_len": run.seq_len,
        "batch": args.per_device_train_batch_size,
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if hf_example.CUDA else None,
        "median_step_s": round(step_s, 4),
        "tokens_per_s": round(
            run.seq_len * args.per_device_train_batch_size * args.gradient_accumulation_steps / step_s
        ),
        "losses": [round(e["loss"], 4) for e in logs],
        "mean_token_accuracy": [
            round(e["mean_token_accuracy"], 4) for e in logs if "mean_token_accuracy" in e
        ],
        "liger_core_kinds": sorted(set(patched_modules(model).values())),
        "device": torch.cuda.get_device_name() if hf_example.CUDA else "cpu",
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

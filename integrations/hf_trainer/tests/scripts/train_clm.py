"""An ordinary HF training script (nothing liger-specific in it): the launcher tests run it unchanged.

    python train_clm.py --model_dir DIR --output_dir OUT [TrainingArguments flags ...]

Writes OUT/result.json: the parsed flag and config, the step losses and the liger_core kinds in the model.
"""

import json
import os
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)


@dataclass
class ScriptArguments:
    model_dir: str = field(metadata={"help": "directory with the model and its tokenizer"})
    max_tokens: int = 9


def main():
    script_args, training_args = HfArgumentParser(
        (ScriptArguments, TrainingArguments)
    ).parse_args_into_dataclasses()
    tokenizer = AutoTokenizer.from_pretrained(script_args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(script_args.model_dir, dtype=torch.float32)
    texts = [
        "The quick brown fox jumps over the lazy dog.",
        "A tiny model is enough.",
        "Short one.",
        "One more.",
    ]
    rows = [{"input_ids": tokenizer(t)["input_ids"][: script_args.max_tokens]} for t in texts]
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=rows,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    trainer.train()
    from liger_core.patching import patched_modules  # what the flag patched, to check it

    result = {
        "use_liger_kernel": training_args.use_liger_kernel,
        "liger_kernel_config": training_args.liger_kernel_config,
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "kinds": sorted(set(patched_modules(model).values())),
    }
    with open(os.path.join(training_args.output_dir, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

"""A short multi-GPU fine-tune through the HF Trainer (FSDP2 or DeepSpeed ZeRO-3), with or without liger_core.

An ordinary Trainer script: the engine comes from the Trainer's own flags (`--fsdp full_shard --fsdp_config
benchmarks/configs/fsdp2.json` or `--deepspeed benchmarks/configs/zero3.json`), liger_core from
`--use_liger_kernel` served by the liger_core_hf launcher. No downloads: a random-init Llama built from a
config (Llama-3.2-1B's shape by default: hidden 2048, 16 layers, 32/8 heads, vocabulary 128256, tied
embeddings) trained on synthetic, learnable token rows (arithmetic progressions modulo a few thousand ids,
so the loss falls and two loss curves can be compared meaningfully).

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m liger_core_hf.launch \\
        benchmarks/multigpu_sft.py --output_dir /tmp/mg --bf16 --max_steps 30 \\
        --per_device_train_batch_size 4 --deepspeed benchmarks/configs/zero3.json --use_liger_kernel \\
        --results_dir benchmarks/results/run/multigpu --run_name zero3_liger

Every rank writes `<results_dir>/<run_name>.rank<R>.json`: peak GPU memory of the training loop on that GPU,
per-step wall times, global tokens/s, the logged (all-rank mean) losses, and the liger_core kinds found in
the model. With `--use_liger_kernel` a fall-back of the fused linear cross-entropy to materialised logits is
an error (the run fails), and so is a patched model missing any of `--expect_kinds`.
`benchmarks/run_multigpu.sh` runs the four runs and `benchmarks/multigpu_report.py` compares them.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from transformers import (
    HfArgumentParser,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

SIZES = {  # hidden, layers, heads, kv heads, intermediate ("tiny": CPU smoke test of the whole pipeline)
    "tiny": (64, 2, 4, 2, 128),
    "1b": (2048, 16, 32, 8, 8192),
}
CUDA = torch.cuda.is_available()


@dataclass
class RunArguments:
    model_size: str = field(default="1b", metadata={"help": f"random-init Llama size: {sorted(SIZES)}"})
    vocab_size: int = 128256
    seq_len: int = 2048
    num_examples: int = 4096
    results_dir: str = "benchmarks/results/run/multigpu"
    expect_kinds: str = field(
        default="fused_linear_cross_entropy,rms_norm,rope,swiglu",
        metadata={"help": "liger_core kinds a --use_liger_kernel run must have patched (comma-separated)"},
    )


class Progressions(torch.utils.data.Dataset):
    """Rows ``(start + step * t) mod span``: learnable in a few dozen steps, fixed by the seed."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        span = min(vocab, 4096)
        start = torch.randint(0, span, (n, 1), generator=generator)
        step = torch.randint(1, 8, (n, 1), generator=generator)
        self.ids = (start + step * torch.arange(seq_len)) % span

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step; peak memory counted from the start of training (weights, gradients,
    optimizer states and activations of this GPU's shard; not the full model built before sharding)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.start = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if CUDA:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def on_step_begin(self, args, state, control, **kwargs):
        if CUDA:
            torch.cuda.synchronize()
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if CUDA:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.start)


def build_model(run: RunArguments) -> LlamaForCausalLM:
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
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    # fp32 master weights: FSDP2 (accelerate's mixed precision) computes in bf16 from them, DeepSpeed's bf16
    # mode casts the module itself; built on this rank's GPU (fast init), sharded by the engine afterwards
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if CUDA else torch.device("cpu")
    with device:
        return LlamaForCausalLM(config)


def engine_name(args: TrainingArguments) -> str:
    if args.deepspeed:
        return "zero3"
    return "fsdp2" if args.fsdp else "ddp"


def engine_used(trainer: Trainer) -> str:
    """What actually wrapped the model (accelerate falls back to DDP for --fsdp on CPU, for example)."""
    if type(trainer.model_wrapped).__name__ == "DeepSpeedEngine":
        stage = trainer.model_wrapped.zero_optimization_stage()
        return f"zero{stage}"
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is not None and any(isinstance(m, fsdp.FSDPModule) for m in trainer.model.modules()):
        return "fsdp2"
    return type(trainer.model_wrapped).__name__


def main() -> None:
    run, args = HfArgumentParser((RunArguments, TrainingArguments)).parse_args_into_dataclasses()
    if args.deepspeed and not CUDA:  # CPU rehearsal: skip compiling DeepSpeed's shared-memory collectives
        import deepspeed

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if args.use_liger_kernel:  # the fused loss must not silently fall back to materialised logits
        warnings.filterwarnings("error", message="liger_core: lm_head")
    model = build_model(run)
    n_params = sum(p.numel() for p in model.parameters())
    timer = StepTimer()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Progressions(run.num_examples, run.seq_len, run.vocab_size, seed=args.seed),
        callbacks=[timer],
    )
    trainer.train()

    rank, world = args.process_index, args.world_size
    used = engine_used(trainer)
    if used != engine_name(args) and CUDA:
        raise SystemExit(f"rank {rank}: asked for {engine_name(args)}, but the model was wrapped by {used}")
    kinds = sorted(
        {m.__dict__["_liger_core_kind"] for m in trainer.model.modules() if "_liger_core_kind" in m.__dict__}
    )
    if args.use_liger_kernel:
        missing = sorted(set(filter(None, run.expect_kinds.split(","))) - set(kinds))
        if missing:
            raise SystemExit(
                f"rank {rank}: --use_liger_kernel run, but not patched: {missing} (found {kinds})"
            )
    steady = timer.times[5:] if len(timer.times) > 8 else timer.times[1:] or timer.times
    step_s = statistics.median(steady)
    tokens_per_step = (
        run.seq_len * args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    )
    try:
        import deepspeed

        ds_version = deepspeed.__version__
    except ImportError:
        ds_version = None
    result = {
        "run_name": args.run_name,
        "engine": engine_name(args),
        "engine_used": used,
        "use_liger_kernel": bool(args.use_liger_kernel),
        "rank": rank,
        "world_size": world,
        "model": f"llama-{run.model_size} (random init, vocab {run.vocab_size}, tied)",
        "params_m": round(n_params / 1e6, 1),
        "seq_len": run.seq_len,
        "per_device_batch": args.per_device_train_batch_size,
        "steps": len(timer.times),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if CUDA else None,
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3) if CUDA else None,
        "median_step_s": round(step_s, 4),
        "tokens_per_s": round(tokens_per_step / step_s),
        "step_times_s": [round(t, 4) for t in timer.times],
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "liger_core_kinds": kinds,
        "device": torch.cuda.get_device_name() if CUDA else "cpu",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "deepspeed": ds_version,
        },
    }
    out = Path(run.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.run_name}.rank{rank}.json").write_text(json.dumps(result, indent=1))
    print(f"RESULT rank {rank} {json.dumps({k: result[k] for k in list(result)[:13]})}", flush=True)


if __name__ == "__main__":
    main()

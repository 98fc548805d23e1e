"""The HF Trainer with `use_liger_kernel` (the liger_core_hf plugin) and accelerate's Ulysses sequence
parallelism (`ParallelismConfig(sp_backend="deepspeed", sp_size=world)`, DeepSpeed ZeRO-2), against one
process.

Run: `python -m torch.distributed.run --nproc_per_node 2 tests/scripts/ulysses_sp_trainer.py` with
`DS_ACCELERATOR=cpu` (gloo). Every row of the data set is the same 16-token sequence (with a masked prompt),
so whichever rows the sampler deals, each optimizer step trains on that sequence, split over the ranks. The
Trainer patches the model (`liger_kernel_config`: `tiled_mlp` and `offload_checkpoints` on, gradient
checkpointing on), accelerate registers Ulysses attention and shards the batches, and the Trainer reduces the
shard losses. The reference is the unpatched model trained by plain SGD on the whole sequence in this process
(at the engine's gradient scale, see below): the logged loss of every step and the trained weights must match
it. The exit status is non-zero otherwise, or
if the plugin did not patch the model, or if no layer input was offloaded.
"""

from __future__ import annotations

import copy
import os
import sys

import deepspeed
import liger_core_hf
import torch
from accelerate.utils import DeepSpeedSequenceParallelConfig, ParallelismConfig
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from liger_core import tuning
from liger_core.modules.long_context import OFFLOAD_COUNTS
from liger_core.patching import patched_modules

VOCAB, SEQ, STEPS, LR = 128, 16, 2, 0.5


def build_model() -> LlamaForCausalLM:
    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


class LossLog(TrainerCallback):
    def __init__(self):
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def main() -> int:
    deepspeed.init_distributed(dist_backend="gloo")  # Ulysses builds its groups on deepspeed.comm
    liger_core_hf.install()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (SEQ,), generator=gen)
    labels = ids.clone()
    labels[:5] = -100  # a prompt
    row = dict(input_ids=ids.tolist(), labels=labels.tolist(), position_ids=list(range(SEQ)))
    data = [row] * 8  # a list is a map-style data set

    def collate(rows):
        return {k: torch.tensor([r[k] for r in rows]) for k in rows[0]}

    # reference: unpatched, one process, plain SGD on the whole sequence. The engine's gradients are `world`
    # times those of the global mean loss (each rank back-propagates the gathered loss of the whole group, and
    # ZeRO averages over a data-parallel group of one: DeepSpeed issue #5248, unpatched models alike), so
    # the reference steps with `world` times the learning rate.
    model = build_model()
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR * world)
    ref_losses = []
    for _ in range(STEPS):
        ref_opt.zero_grad()
        loss = reference(input_ids=ids[None], labels=labels[None]).loss
        loss.backward()
        ref_opt.step()
        ref_losses.append(loss.item())

    ds_config = {
        "zero_optimization": {"stage": 2},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**6,
    }
    args = TrainingArguments(
        output_dir=os.environ.get("OUT_DIR", "ulysses_trainer_out"),
        per_device_train_batch_size=1,
        max_steps=STEPS,
        use_cpu=True,
        report_to="none",
        use_liger_kernel=True,
        liger_kernel_config={"tiled_mlp": True, "offload_checkpoints": True, "strict": True},
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        deepspeed=ds_config,
        logging_steps=1,
        save_strategy="no",
        optim="sgd",
        learning_rate=LR,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        parallelism_config=ParallelismConfig(
            sp_backend="deepspeed",
            sp_size=world,
            dp_shard_size=1,
            sp_handler=DeepSpeedSequenceParallelConfig(sp_attn_implementation="sdpa"),
        ),
    )
    log = LossLog()
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collate, callbacks=[log])
    OFFLOAD_COUNTS.clear()
    with tuning.override(mlp_tile_tokens=3, checkpoint_offload_min_bytes=0):
        trainer.train()

    failures = []
    kinds = set(patched_modules(model).values())
    for kind in ("fused_linear_cross_entropy", "offload_checkpoints", "swiglu", "rms_norm"):
        if kind not in kinds:
            failures.append(f"{kind} not patched by the plugin: {sorted(kinds)}")
    if OFFLOAD_COUNTS["offloaded"] == 0:
        failures.append("no layer input offloaded")
    if len(log.losses) != STEPS:
        failures.append(f"logged losses {log.losses}, expected {STEPS}")
    for step, (got, want) in enumerate(zip(log.losses, ref_losses)):
        if abs(got - want) > 1e-4 * abs(want):
            failures.append(f"step {step}: loss {got:.6f} != reference {want:.6f}")
    ref_params = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        if not torch.allclose(p.detach(), ref_params[name].detach(), rtol=1e-4, atol=1e-5):
            err = (p.detach() - ref_params[name].detach()).abs().max().item()
            failures.append(f"weight {name} differs after training (max abs err {err:.3g})")
    if rank == 0:
        print(f"losses {log.losses} reference {ref_losses}", flush=True)
    for msg in failures:
        print(f"rank {rank}: MISMATCH {msg}", flush=True)
    failed = torch.tensor([len(failures)])
    torch.distributed.all_reduce(failed)
    if rank == 0 and not failed.item():
        print(f"OK: Trainer + Ulysses SP x{world} + liger_core == one process unpatched", flush=True)
    return 1 if failed.item() else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the interpreter's teardown: it has aborted after passing runs of gloo workers

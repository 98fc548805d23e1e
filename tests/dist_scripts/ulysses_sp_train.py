"""A liger_core-patched Llama under DeepSpeed's Ulysses sequence parallelism (ALST), against one process.

Run: `python -m torch.distributed.run --nproc_per_node 2 tests/dist_scripts/ulysses_sp_train.py` (gloo, CPU;
any world size that divides the heads). This is the path accelerate takes for
`ParallelismConfig(sp_backend="deepspeed", sp_size=N)` (the HF Trainer and TRL's SFTTrainer build on it):

- `UlyssesSPAttentionHF.register_with_transformers` replaces the model's attention function (`sdpa`) with
  all-to-all (sequence shard -> head shard), attention over the whole sequence, all-to-all back;
- `UlyssesSPDataLoaderAdapter` turns one batch per rank into one micro-step per batch in which every rank
  holds a contiguous sequence shard of `input_ids` / `position_ids` and of the pre-shifted `shift_labels`;
- transformers' `deepspeed_sp_compute_loss` runs the model on the shard (liger_core's fused linear
  cross-entropy over the shard's tokens, mean over its targets) and combines the ranks' means weighted by
  their target counts: the global mean (transformers 5.0 has no such function: the same reduction, as
  accelerate documents it, is done here).

Every rank builds the same model from one seed. Before Ulysses is registered (it replaces `sdpa`
process-wide), each batch's loss and gradients are computed on the whole sequence by the unpatched model and
by the patched one; then the patched model (with `tiled_mlp` and, under gradient checkpointing,
`offload_checkpoints`, tiles and offload threshold made small enough to act on this tiny model) trains on the
shards. Loss and the gradients averaged over the ranks (what data-parallel reduction over the
sequence-parallel ranks computes) must equal both references. One batch leaves a whole shard without targets
(a prompt masked in SFT). The same shards are also run the way a loop of one's own can reduce them:
`num_items_in_batch` = the global target count, losses and gradients summed over the ranks. The exit status
is non-zero on a mismatch, if the fused loss fell back to materialised logits, or if tiles / offload did not
run.
"""

from __future__ import annotations

import copy
import os
import sys
import types
import warnings

import deepspeed
import deepspeed.comm as ds_dist
import torch
import torch.distributed as dist
from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
from deepspeed.utils import groups
from transformers import LlamaConfig, LlamaForCausalLM

import liger_core
from liger_core import tuning
from liger_core.modules.long_context import OFFLOAD_COUNTS

try:
    from transformers.integrations.deepspeed import deepspeed_sp_compute_loss
except ImportError:  # transformers before its Trainer drove Ulysses (5.0): the reduction accelerate documents
    deepspeed_sp_compute_loss = None

VOCAB, LAYERS = 128, 2


def sp_loss(model, shard: dict, pc) -> tuple[torch.Tensor, object]:
    """The Trainer's loss under Ulysses: the ranks' mean losses weighted by their target counts."""
    if deepspeed_sp_compute_loss is not None:
        return deepspeed_sp_compute_loss(None, model, shard, True, pc)
    out = model(**shard)
    group = groups._get_sequence_parallel_group()
    losses = torch.stack(torch.distributed.nn.functional.all_gather(out.loss, group=group))
    counts = torch.stack(
        torch.distributed.nn.functional.all_gather((shard["shift_labels"] != -100).sum(), group=group)
    )
    losses = torch.where(counts > 0, losses, torch.zeros_like(losses))
    return (losses * counts).sum() / counts.sum().clamp(min=1), out


def build_model() -> LlamaForCausalLM:
    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
    )
    config._attn_implementation = "sdpa"  # Ulysses wraps sdpa / flash / flex attention, never eager
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # HF initialises norm weights to exactly 1: make their gradients path-dependent
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def make_batches(world: int) -> list[dict[str, torch.Tensor]]:
    """One batch per rank, [1, seq] each; seq a multiple of the world size (the adapter requires it)."""
    seq = 8 * world
    gen = torch.Generator().manual_seed(99)
    batches = []
    for r in range(world):
        ids = torch.randint(0, VOCAB, (1, seq), generator=gen)
        labels = ids.clone()
        if r == 0:
            labels[:, : seq // 2 + 1] = -100  # a prompt covering shard 0's every target: a shard without any
        else:
            labels[:, :3] = -100
        batches.append(dict(input_ids=ids, labels=labels, position_ids=torch.arange(seq)[None]))
    return batches


def step(model, **inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def compare(what: str, got, want, failures: list[str], rtol: float = 1e-4) -> None:
    loss, grads = got
    want_loss, want_grads = want
    if not torch.allclose(loss, want_loss, rtol=rtol, atol=1e-6):
        failures.append(f"{what}: loss {loss.item():.7f} != {want_loss.item():.7f}")
    for name, g in grads.items():
        ref = want_grads[name]
        if not torch.allclose(g, ref, rtol=rtol, atol=rtol * ref.abs().max().item()):
            failures.append(f"{what}: grad {name} differs (max abs err {(g - ref).abs().max().item():.3g})")


def main() -> int:
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = make_batches(world)
    failures: list[str] = []
    small = dict(mlp_tile_tokens=3, checkpoint_offload_min_bytes=0)  # tiles and offload act on 8-token shards

    # references on the whole sequence, before Ulysses replaces sdpa
    reference = build_model()
    patched = copy.deepcopy(reference)
    report = liger_core.apply_liger_kernel(patched, tiled_mlp=True, offload_checkpoints=True)
    for kind in ("fused_linear_cross_entropy", "tiled_mlp", "offload_checkpoints"):
        if not report.swapped.get(kind):
            failures.append(f"{kind} not patched: {report}")
    sp_model = copy.deepcopy(patched)
    want = [step(reference, **b) for b in batches]
    with tuning.override(**small):
        for i, b in enumerate(batches):
            compare(f"batch {i} patched, one process", step(patched, **b), want[i], failures)

    # Ulysses: the engine's own attention wrapper, process groups and data sharding
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=sp_model,
        core_attn_implementation="sdpa",
        sequence_parallel_size=world,
        micro_batch_size=1,
        seq_length_is_variable=True,
    )
    groups.mpu = mpu  # what deepspeed.initialize(mpu=...) records, where the Trainer's SP loss looks it up
    loader = UlyssesSPDataLoaderAdapter(
        [batches[rank]],  # a "DataLoader" yielding this rank's one batch
        sp_rank=mpu.get_sequence_parallel_rank(),
        sp_group=mpu.get_sequence_parallel_group(),
        sp_world_size=mpu.get_sequence_parallel_world_size(),
        device=torch.device("cpu"),
    )
    down_calls = [0]  # down_proj runs once per tile: more calls than layers means the MLPs were tiled
    for layer in sp_model.model.layers:
        layer.mlp.down_proj.register_forward_hook(lambda *_: down_calls.__setitem__(0, down_calls[0] + 1))
    pc = types.SimpleNamespace(sp_backend="deepspeed", sp_size=world, sp_enabled=True)
    for i in range(world):
        shard = next(loader)  # micro-step i: batch i, this rank's sequence shard
        sp_model.zero_grad(set_to_none=True)
        OFFLOAD_COUNTS.clear()
        down_calls[0] = 0
        with tuning.override(**small), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss, out = sp_loss(sp_model, shard, pc)
            loss.backward()
        if out.logits is not None or any("not a plain nn.Linear" in str(w.message) for w in caught):
            failures.append(f"micro-step {i}: fused loss not used")
        if OFFLOAD_COUNTS["offloaded"] != LAYERS:
            n = OFFLOAD_COUNTS["offloaded"]
            failures.append(f"micro-step {i}: {n} layer inputs offloaded, not {LAYERS}")
        if down_calls[0] < 3 * LAYERS:  # ceil(8 / 3) tiles per layer in the forward alone
            failures.append(f"micro-step {i}: down_proj ran {down_calls[0]} times: MLPs not tiled")
        grads = {}
        for name, p in sp_model.named_parameters():
            g = p.grad.detach().clone()
            dist.all_reduce(g)
            grads[name] = g / world
        compare(f"micro-step {i} Ulysses x{world}", (loss.detach(), grads), want[i], failures)

        # a loop of one's own: num_items_in_batch = the targets of all shards, so each rank's loss is its
        # shard's sum over that count; the sums over the ranks are the global mean and its gradients
        count = (shard["shift_labels"] != -100).sum()
        dist.all_reduce(count)
        sp_model.zero_grad(set_to_none=True)
        with tuning.override(**small):
            own = sp_model(**shard, num_items_in_batch=count).loss
            own.backward()
        own = own.detach().clone()
        dist.all_reduce(own)
        own_grads = {}
        for name, p in sp_model.named_parameters():
            own_grads[name] = p.grad.detach().clone()
            dist.all_reduce(own_grads[name])
        compare(f"micro-step {i} Ulysses x{world}, num_items_in_batch", (own, own_grads), want[i], failures)
        if rank == 0:
            print(f"micro-step {i}: loss {loss.item():.6f} reference {want[i][0].item():.6f}", flush=True)

    for msg in failures:
        print(f"rank {rank}: MISMATCH {msg}", flush=True)
    failed = torch.tensor([len(failures)])
    dist.all_reduce(failed)
    ds_dist.barrier()
    if rank == 0 and not failed.item():
        interpreter = os.environ.get("TRITON_INTERPRET", "0")
        print(f"OK: Ulysses SP x{world} patched == one process (interpreter={interpreter})", flush=True)
    return 1 if failed.item() else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the interpreter's teardown (see fsdp2_train.py)

"""2 training steps of a tiny liger_core-patched Llama sharded with FSDP2, against one unpatched process.

Run: `python -m torch.distributed.run --nproc_per_node 2 tests/dist_scripts/fsdp2_train.py [--shard-lm-head]`
(gloo, CPU). Every rank builds the same model from one seed; the sharded patched model trains on the rank's
slice of the global batch, and a local unpatched copy trains on every slice (the mean of the per-slice losses:
what FSDP's gradient averaging computes). Loss and full (gathered) gradients are compared at every step; the
exit status is non-zero on a mismatch, or if the fused linear cross-entropy fell back to materialised logits.

--tie ties lm_head to the input embedding (both in the root unit). --shard-lm-head makes lm_head its own FSDP
unit (its weight is then a sharded DTensor outside its own forward: the fused loss must run inside that
forward, after lm_head's hooks have gathered it).
"""

from __future__ import annotations

import copy
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

import liger_core

VOCAB, SEQ, ROWS_PER_RANK, STEPS, LR = 128, 16, 2, 2, 0.5


def build_model(tie: bool) -> LlamaForCausalLM:
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
        tie_word_embeddings=tie,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # HF initialises norm weights to exactly 1: make their gradients path-dependent
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def full_grad(p: torch.nn.Parameter) -> torch.Tensor:
    g = p.grad
    return g.full_tensor() if hasattr(g, "full_tensor") else g


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shard_lm_head = "--shard-lm-head" in sys.argv
    tie = "--tie" in sys.argv  # lm_head shares the embedding's weight (then it must stay in the root unit)

    reference = build_model(tie)
    model = copy.deepcopy(reference)
    report = liger_core.apply_liger_kernel(model)
    if report.swapped.get("fused_linear_cross_entropy") != 1:
        print(f"rank {rank}: fused linear cross-entropy not patched: {report}", flush=True)
        return 2
    for layer in model.model.layers:
        fully_shard(layer)
    if shard_lm_head:
        fully_shard(model.lm_head)
    fully_shard(model)
    reference.train()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)

    torch.manual_seed(99)
    batches = [torch.randint(0, VOCAB, (world * ROWS_PER_RANK, SEQ)) for _ in range(STEPS)]
    failures = []
    for step, ids in enumerate(batches):
        labels = ids.clone()
        labels[:, :2] = -100  # as many ignored targets in every row: the per-slice means average exactly
        # reference: one process, unpatched, the mean of the per-rank losses
        ref_opt.zero_grad(set_to_none=True)
        ref_loss = (
            sum(reference(input_ids=ids[r::world], labels=labels[r::world]).loss for r in range(world))
            / world
        )
        ref_loss.backward()

        opt.zero_grad(set_to_none=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model(input_ids=ids[rank::world], labels=labels[rank::world])
        fell_back = [str(w.message) for w in caught if "not a plain nn.Linear" in str(w.message)]
        if fell_back or out.logits is not None:
            failures.append(f"step {step}: fused loss not used ({fell_back or 'logits returned'})")
        loss = out.loss.detach().clone()
        out.loss.backward()
        dist.all_reduce(loss)
        loss /= world
        if not torch.allclose(loss, ref_loss.detach(), rtol=1e-5, atol=1e-6):
            failures.append(f"step {step}: loss {loss.item():.7f} != reference {ref_loss.item():.7f}")
        ref_params = dict(reference.named_parameters())
        for name, p in model.named_parameters():
            g, ref_g = full_grad(p), ref_params[name].grad
            if not torch.allclose(g, ref_g, rtol=1e-4, atol=1e-6):
                err = (g - ref_g).abs().max().item()
                failures.append(f"step {step}: grad {name} differs (max abs err {err:.3g})")
        if rank == 0:
            print(f"step {step}: loss {loss.item():.6f} reference {ref_loss.item():.6f}", flush=True)
        opt.step()
        ref_opt.step()

    for msg in failures:
        print(f"rank {rank}: MISMATCH {msg}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and not failures:
        interpreter = os.environ.get("TRITON_INTERPRET", "0")
        print(
            f"OK: FSDP2 x{world} patched == single-process unpatched "
            f"(interpreter={interpreter}, shard_lm_head={shard_lm_head}, tie={tie})",
            flush=True,
        )
    return 1 if failures else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip the interpreter's teardown: a worker once aborted there after passing ("terminate called without an
    # active exception", a C++ thread destroyed at exit), failing the run on an exit code, not on a result
    os._exit(code)

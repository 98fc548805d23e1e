"""2 training steps of a tiny liger_core-patched Llama under DeepSpeed ZeRO-3, against one unpatched process.

Run (CPU, gloo; DeepSpeed's CPU accelerator):
    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 \
        tests/dist_scripts/zero3_train.py [--tie] [--patch-after-init]

Every rank builds the same model from one seed; the ZeRO-3 engine (every parameter partitioned:
stage3_param_persistence_threshold 0) trains the patched copy on the rank's slice of the global batch, a local
unpatched copy trains on every slice (mean of the per-slice losses: what ZeRO's gradient averaging computes).
Loss and full gradients (deepspeed.utils.safe_get_full_grad) are compared at every step; the exit status is
non-zero on a mismatch, or when the fused linear cross-entropy was not used (logits returned, or the
materialised-logits fallback warned).

--tie: lm_head shares the input embedding's weight. --patch-after-init: liger_core patches the model after
deepspeed.initialize (lm_head's weight is then already partitioned and hooked when the patch looks at it).
"""

from __future__ import annotations

import copy
import os
import sys
import warnings

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.utils import safe_get_full_grad
from fsdp2_train import LR, ROWS_PER_RANK, SEQ, STEPS, VOCAB, build_model

import liger_core


def skip_shm_collectives() -> None:
    """DeepSpeed's CPU accelerator compiles its shared-memory collectives (C++, minutes on a loaded 2-core
    machine) in every new process group; the plain gloo collectives it falls back to are enough here."""
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def main() -> int:
    skip_shm_collectives()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tie = "--tie" in sys.argv
    patch_after_init = "--patch-after-init" in sys.argv

    reference = build_model(tie)
    model = copy.deepcopy(reference)
    if not patch_after_init:
        report = liger_core.apply_liger_kernel(model)
    config = {
        "train_micro_batch_size_per_gpu": ROWS_PER_RANK,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "gradient_clipping": 0.0,  # DeepSpeed clips at 1.0 by default; the reference does not clip
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), config=config
    )
    lm_weight = engine.module.lm_head.weight
    if lm_weight.numel() != 0 or not hasattr(lm_weight, "ds_id"):
        print(f"rank {rank}: lm_head.weight is not ZeRO-3 partitioned ({tuple(lm_weight.shape)})", flush=True)
        return 2
    if patch_after_init:
        report = liger_core.apply_liger_kernel(engine.module)
    if report.swapped.get("fused_linear_cross_entropy") != 1:
        print(f"rank {rank}: fused linear cross-entropy not patched: {report}", flush=True)
        return 2
    reference.train()
    engine.train()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)

    torch.manual_seed(99)
    batches = [torch.randint(0, VOCAB, (world * ROWS_PER_RANK, SEQ)) for _ in range(STEPS)]
    failures = []
    for step, ids in enumerate(batches):
        labels = ids.clone()
        labels[:, :2] = -100  # as many ignored targets in every row: the per-slice means average exactly
        ref_opt.zero_grad(set_to_none=True)
        ref_loss = (
            sum(reference(input_ids=ids[r::world], labels=labels[r::world]).loss for r in range(world))
            / world
        )
        ref_loss.backward()

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = engine(input_ids=ids[rank::world], labels=labels[rank::world])
        fell_back = [str(w.message) for w in caught if "not a plain nn.Linear" in str(w.message)]
        if fell_back or out.logits is not None:
            failures.append(f"step {step}: fused loss not used ({fell_back or 'logits returned'})")
        loss = out.loss.detach().clone()
        engine.backward(out.loss)
        dist.all_reduce(loss)
        loss /= world
        if not torch.allclose(loss, ref_loss.detach(), rtol=1e-5, atol=1e-6):
            failures.append(f"step {step}: loss {loss.item():.7f} != reference {ref_loss.item():.7f}")
        ref_params = dict(reference.named_parameters())
        for name, p in engine.module.named_parameters():
            g, ref_g = safe_get_full_grad(p), ref_params[name].grad
            if g is None or not torch.allclose(g.float(), ref_g, rtol=1e-4, atol=1e-6):
                err = "none" if g is None else f"max abs err {(g.float() - ref_g).abs().max().item():.3g}"
                failures.append(f"step {step}: grad {name} differs ({err})")
        if rank == 0:
            print(f"step {step}: loss {loss.item():.6f} reference {ref_loss.item():.6f}", flush=True)
        engine.step()
        ref_opt.step()

    for msg in failures:
        print(f"rank {rank}: MISMATCH {msg}", flush=True)
    dist.barrier()
    if rank == 0 and not failures:
        interpreter = os.environ.get("TRITON_INTERPRET", "0")
        print(
            f"OK: ZeRO-3 x{world} patched == single-process unpatched "
            f"(interpreter={interpreter}, tie={tie}, patch_after_init={patch_after_init})",
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

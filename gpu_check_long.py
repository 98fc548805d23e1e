import sys, time
import torch
sys.path.insert(0, "tests/patching")
from tiny_models import tiny_model, batch
import liger_core
from liger_core import tuning
from liger_core.modules.long_context import OFFLOAD_COUNTS

def step(model, ids, labels):
    model.train(); model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

def build(seed, **kw):
    m = tiny_model("llama", seed=seed, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=8192, **kw).cuda()
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return m

g = torch.Generator().manual_seed(0)
ids = torch.randint(3, 160, (2, 3000), generator=g).cuda()
for flags in (dict(offload_checkpoints=True, rope=False, rms_norm=False, swiglu=False, fused_linear_cross_entropy=False),
              dict(offload_checkpoints=True, tiled_mlp=True)):
    ref, model = build(1), build(1)
    if "tiled_mlp" in flags:
        liger_core.apply_liger_kernel(ref)
    want = step(ref, ids, ids)
    print(liger_core.apply_liger_kernel(model, **flags))
    OFFLOAD_COUNTS.clear()
    with tuning.override(checkpoint_offload_min_bytes=0, mlp_tile_tokens=1000):
        got = step(model, ids, ids)
    worst = max((got[1][n] - want[1][n]).abs().max().item() / max(want[1][n].abs().max().item(), 1e-30) for n in want[1])
    print(flags, "loss", got[0].item(), want[0].item(), "worst rel grad diff", worst, dict(OFFLOAD_COUNTS), "same keys", got[1].keys() == want[1].keys())

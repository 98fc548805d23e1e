"""Profile one fwd+bwd of liger_core's fused DPO (gradient-in-forward path) on the GPU: each kernel's share of
the time beyond the 3 GEMMs.  python benchmarks/profile_logprob_loss.py [--pairs 8 --seq 1024]"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from liger_core.losses import fused_linear_dpo_loss

parser = argparse.ArgumentParser()
parser.add_argument("--pairs", type=int, default=8)
parser.add_argument("--seq", type=int, default=1024)
parser.add_argument("--hidden", type=int, default=4096)
parser.add_argument("--vocab", type=int, default=128256)
args = parser.parse_args()
dev = "cuda"
B, T, H, V = args.pairs, args.seq, args.hidden, args.vocab
hidden = torch.randn(2 * B, T, H, device=dev, dtype=torch.bfloat16, requires_grad=True)
weight = (torch.randn(V, H, device=dev) / H**0.5).to(torch.bfloat16).requires_grad_()
target = torch.randint(0, V, (2 * B, T), device=dev)
target[:, :256] = -100
ref = torch.randn(2 * B, device=dev) - 10000


def step():
    loss, _ = fused_linear_dpo_loss(
        hidden, weight, target, ref_chosen_logps=ref[:B], ref_rejected_logps=ref[B:]
    )
    loss.backward()
    hidden.grad = weight.grad = None


for _ in range(3):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))

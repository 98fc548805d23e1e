"""Hugging Face's gradient-accumulation loss (sum / num_items_in_batch) through the fused linear CE: the
division inside the op (``denominator=``, what the patched forward does since session 6) beside the division
of the returned sum (the earlier patched forward: the stored bf16 gradients are scaled and rounded again in
backward), and eager (HF's ``ForCausalLMLoss``: fp32 logits, sum, divided). Errors against float64 of the
same inputs, time per fwd+bwd, in one GPU call.

    PYTHONPATH=. python benchmarks/flce_denominator.py [--bt 8192 --hidden 4096 --vocab 128256]

On CPU (Triton interpreter): a smoke test at a small shape.
"""

from __future__ import annotations

import sys

import torch

# the same setup as flce_order.py (repo on sys.path, the interpreter on CPU), and its error measure
from flce_order import DEVICE, GPU, fwd_bwd_ms, problem, rel

from liger_core.ops import fused_linear_cross_entropy


def run(fn, h, w, t):
    """(loss, dh, dW) of fn; loss.backward() with grad_output 1, as the Trainer calls it."""
    h = h.detach().requires_grad_()
    w = w.detach().requires_grad_()
    loss = fn(h, w, t)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def main() -> int:
    bt, hs, v, h, w = problem()
    t = torch.randint(0, v, (bt,), device=DEVICE)
    t[torch.rand(bt, device=DEVICE) < 0.1] = -100
    # the kept tokens of 4 micro-batches (HF counts the whole accumulated batch), not a power of two
    num_items = torch.tensor(4 * int((t != -100).sum()) + 3, device=DEVICE)

    def eager(h_, w_, t_):
        logits = torch.nn.functional.linear(h_, w_).float()
        return torch.nn.functional.cross_entropy(logits, t_, reduction="sum") / num_items

    ref = run(eager, h.double(), w.double(), t)
    variants = {
        "eager (HF ForCausalLMLoss)": eager,
        "liger_core, divided afterwards": lambda h_, w_, t_: (
            fused_linear_cross_entropy(h_, w_, t_, reduction="sum") / num_items
        ),
        "liger_core, denominator= (inside)": lambda h_, w_, t_: fused_linear_cross_entropy(
            h_, w_, t_, reduction="sum", denominator=num_items
        ),
    }
    print(f"FLCE sum / num_items_in_batch, BT {bt} H {hs} V {v} bf16 on {DEVICE}, num_items {int(num_items)}")
    print(f"  {'variant':36s} {'ms':>8s}  {'loss err':>9s}  {'dh err':>9s}  {'dW err':>9s}")
    for name, fn in variants.items():
        out = run(fn, h, w, t)
        errs = "  ".join(f"{rel(a, r):9.3e}" for a, r in zip(out, ref))
        del out
        ms = fwd_bwd_ms(fn, h, w, t, warmup=10, rep=100) if GPU else float("nan")
        print(f"  {name:36s} {ms:8.2f}  {errs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fused linear cross-entropy: the two-pass loop (default) at several vocabulary-slice budgets beside the
token-major chunk loop, in one GPU call: time, peak extra memory, and each gradient's error against float64.

    PYTHONPATH=. python benchmarks/flce_order.py [--bt 8192 --hidden 4096 --vocab 128256] [--frozen-weight]

(``--frozen-weight``: the lm_head takes no gradient, as under LoRA; only dh is computed and compared.)

Each variant runs forward + backward (loss.backward(), grad_output 1) of bf16 inputs; errors are
``||g - g64|| / ||g64||`` of dh and dW against the float64 reference of the same inputs, beside eager's
(``F.linear`` + ``F.cross_entropy`` on fp32 logits, HF's loss). Time: ``triton.testing.do_bench`` median;
memory: ``max_memory_allocated`` during one fwd+bwd minus what was allocated before. On CPU: a smoke test.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from liger_core.ops import fused_linear_cross_entropy  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")


# --frozen-weight: the lm_head takes no gradient (LoRA / adapters: only dh is computed)
TRAIN_WEIGHT = True


def grads(fn, h, w, t):
    h = h.detach().requires_grad_()
    w = w.detach().requires_grad_(TRAIN_WEIGHT)
    fn(h, w, t).backward()
    return h.grad, w.grad


def eager(h, w, t):
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w).float(), t)


def rel(a, b) -> float:
    return float((a.double() - b).norm() / b.norm())


def fwd_bwd_ms(fn, h, w, t, warmup: int = 25, rep: int = 200) -> float:
    """Median ms of ``fn(h, w, t).backward()`` (do_bench; the leaves' gradients reset between runs)."""
    import triton.testing

    hr = h.detach().requires_grad_()
    wr = w.detach().requires_grad_(TRAIN_WEIGHT)

    def step():
        fn(hr, wr, t).backward()

    return triton.testing.do_bench(step, warmup=warmup, rep=rep, grad_to_none=[hr, wr], return_mode="median")


def problem() -> tuple[int, int, int, torch.Tensor, torch.Tensor]:
    """(BT, H, V, hidden, weight) from the command line: bf16, logits of standard deviation ~1."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bt", type=int, default=8192 if GPU else 37)
    ap.add_argument("--hidden", type=int, default=4096 if GPU else 67)
    ap.add_argument("--vocab", type=int, default=128256 if GPU else 1031)
    ap.add_argument(
        "--interleave",
        type=int,
        default=0,
        help="then N rounds timing the one-chunk budget and torch.compile alternately (GEMM clocks drift)",
    )
    ap.add_argument(
        "--frozen-weight", action="store_true", help="the lm_head takes no gradient (LoRA): dh only"
    )
    args = ap.parse_args()
    global TRAIN_WEIGHT
    TRAIN_WEIGHT = not args.frozen_weight
    bt, hs, v = args.bt, args.hidden, args.vocab
    h = torch.randn(bt, hs, device=DEVICE).bfloat16()
    w = (torch.randn(v, hs, device=DEVICE) / hs**0.5).bfloat16()
    return bt, hs, v, h, w, args.interleave


def main() -> int:
    bt, hs, v, h, w, rounds = problem()
    t = torch.randint(0, v, (bt,), device=DEVICE)
    gh64, gw64 = grads(eager, h.double(), w.double(), t)
    geh, gew = grads(eager, h, w, t)
    floor_ms = 6 * bt * hs * v / 800e12 * 1e3
    print(f"FLCE BT {bt} H {hs} V {v} bf16 on {DEVICE}; floor (6 BT H V at 800 TFLOP/s) {floor_ms:.2f} ms")
    if not TRAIN_WEIGHT:
        floor_ms *= 2 / 3  # the logits and dh: 4 BT H V FLOPs
        print(f"  frozen weight (LoRA): dh only; floor (4 BT H V) {floor_ms:.2f} ms")
    print(f"  eager errors: dh {rel(geh, gh64):.3e}  dW {rel(gew, gw64) if TRAIN_WEIGHT else 0:.3e}")
    del geh, gew
    mib = 2**20
    budgets = (16, 32, 64, 128, 256)
    variants = {f"two-pass, slice budget {b} MiB": dict(max_chunk_bytes=b * mib) for b in budgets}
    variants["two-pass, default budget"] = {}
    variants.update({f"token-major, chunk {c} tokens": dict(chunk_size=c) for c in (256, 1024)})
    variants["token-major, chunk 256, accum fp32"] = dict(chunk_size=256, accum_dtype=torch.float32)
    # session 11: a budget holding fp32 copies of dW and dh plus a 512 MiB chunk selects the fp32 token loop
    fp32_copies = 4 * (v + bt) * hs
    for extra in (512, 1024):
        variants[f"budget fp32 copies + {extra} MiB"] = dict(max_chunk_bytes=fp32_copies + extra * mib)
    variants["budget all logits (one chunk)"] = dict(max_chunk_bytes=bt * v * h.element_size())
    peers = {}
    if GPU:  # the same problem through the suite's peer providers, timed and measured the same way
        from liger_core.harness import providers as harness_providers
        from liger_core.harness import registry as harness_registry

        spec = harness_registry.OPS["fused_linear_cross_entropy"]
        for provider in ("torch.compile", "liger_kernel", "cce"):
            fn, why = harness_providers.provider_fn(spec, provider)
            if fn is None:
                print(f"  {provider}: skipped ({why})")
            else:
                peers[provider] = fn
    if not GPU:
        variants = {
            "two-pass, 8-token budget": dict(max_chunk_bytes=8 * v * 2),
            "token-major 8": dict(chunk_size=8),
            "budget all logits (one chunk)": dict(max_chunk_bytes=bt * v * 2),
        }
    loops = sys.modules["liger_core.ops.fused_linear_cross_entropy"].LOOP_COUNTS
    runs = {
        name: (lambda h_, w_, t_, kw=kw: fused_linear_cross_entropy(h_, w_, t_, **kw))
        for name, kw in variants.items()
    }
    runs.update(peers)
    for name, fn in runs.items():
        if GPU:  # each variant from the same state: the default's loop choice depends on the process's peak
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        counts = dict(loops)
        gh, gw = grads(fn, h, w, t)
        ran = ",".join(k for k in loops if loops[k] != counts.get(k, 0)) or "-"
        errs = f"dh {rel(gh, gh64):.3e}  dW {rel(gw, gw64) if TRAIN_WEIGHT else 0:.3e}  loop {ran}"
        del gh, gw
        if GPU:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            ms = fwd_bwd_ms(fn, h, w, t)
            hr = h.detach().requires_grad_()
            wr = w.detach().requires_grad_(TRAIN_WEIGHT)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn(hr, wr, t).backward()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
            hr.grad = wr.grad = None
            print(f"  {name:40s} {ms:8.2f} ms ({100 * floor_ms / ms:3.0f}%)  {peak:.3f} GiB  {errs}")
        else:
            print(f"  {name:40s} {errs}")
    pair = {k: runs[k] for k in ("budget all logits (one chunk)", "torch.compile") if k in runs}
    if GPU and rounds and len(pair) == 2:
        times: dict[str, list[float]] = {k: [] for k in pair}
        for _ in range(rounds):
            for name, fn in pair.items():
                times[name].append(fwd_bwd_ms(fn, h, w, t))
        for name, ms in times.items():
            ms = sorted(ms)
            median = ms[len(ms) // 2]
            print(f"  interleaved x{rounds} {name:30s} median {median:.2f} ms ({ms[0]:.2f}-{ms[-1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

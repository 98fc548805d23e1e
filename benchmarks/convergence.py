"""bf16 convergence: 100 training steps of small Llama- and Qwen2-shaped models on liger_core's corpus,
unpatched vs patched with ``liger_core.apply_liger_kernel``; do the loss curves agree within bf16 noise?

"bf16 noise" is measured, not assumed: each model is also trained unpatched in fp32 from the same weights on
the same batches. The unpatched bf16 run's distance from that fp32 run is what bf16 rounding alone does to the
curve; the patched bf16 run must stay as close to the unpatched bf16 run as that (criterion: mean |patched -
unpatched| over the steps <= 2 x mean |unpatched bf16 - fp32|, and the patched run no further from fp32 than
1.5 x the unpatched bf16 run).

Models (same weights and batches for the three runs of a model): hidden 512, 8 layers, 8 query / 2 key-value
heads, intermediate 1408, vocab 32000 (the corpus's byte tokens use ids 0-255; the rest is a real-sized LM
head), batch 8 x 512 tokens, pure bf16 weights and AdamW states (lr 1e-3, 10 warm-up steps, cosine),
gradient clipping at 1.0. Qwen2-shaped: q/k/v biases, RMSNorm eps 1e-6, rope theta 1e6; Llama-shaped: no
biases, eps 1e-5, rope theta 5e5.

Writes ``benchmarks/results/convergence_<gpu>.csv`` (step, model, loss per run), ``convergence_<gpu>.png``
and a ``.json`` summary. Usage on the GPU machine: ``python benchmarks/convergence.py``; on CPU:
``python benchmarks/convergence.py --tiny`` (tiny shapes, a few steps, Triton interpreter; a smoke test of the
script).
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as bc  # noqa: E402  (model building, results)

ROOT = bc.ROOT
RESULTS = bc.RESULTS
CORPUS = ROOT / "liger_core" / "data" / "tiny_stories.txt"

LLAMA = dict(
    model_type="llama",
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=32000,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
)
SHAPES = {
    "llama": LLAMA,
    "qwen2": dict(LLAMA, model_type="qwen2", rms_norm_eps=1e-6, rope_theta=1000000.0),
}
TINY_SHAPE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
)


def _config(shape: dict):
    shape = dict(shape)
    return bc.causal_lm_config(
        shape.pop("model_type"),
        shape,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def _batches(steps: int, batch: int, seq: int, device):
    import torch

    data = torch.frombuffer(bytearray(CORPUS.read_bytes()), dtype=torch.uint8).long()
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq, (batch,), generator=gen).tolist()
        out.append(torch.stack([data[s : s + seq] for s in starts]).to(device))
    return out


def _train(model, batches, lr: float, warmup: int) -> list[float]:
    import torch

    fused = next(model.parameters()).device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
    steps = len(batches)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    losses = []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def run_model(name: str, shape: dict, opts: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    import liger_core

    device = torch.device(opts["device"])
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(_config(shape)).to(device)  # fp32 master copy of the weights
    batches = _batches(opts["steps"], opts["batch"], opts["seq"], device)
    runs, reports = {}, {}
    for run in ("hf_fp32", "hf_bf16", "liger_core_bf16"):
        model = copy.deepcopy(base)
        if run.endswith("bf16"):
            model = model.to(torch.bfloat16)
        if run.startswith("liger_core"):
            reports[run] = str(liger_core.apply_liger_kernel(model))
        started = time.perf_counter()
        runs[run] = _train(model, batches, opts["lr"], opts["warmup"])
        seconds = time.perf_counter() - started
        print(f"  {name} {run}: {seconds:.1f} s, loss {runs[run][0]:.4f} -> {runs[run][-1]:.4f}", flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return dict(runs=runs, reports=reports)


def _summary(runs: dict) -> dict:
    fp32, hf, ours = runs["hf_fp32"], runs["hf_bf16"], runs["liger_core_bf16"]

    def mean_abs(a, b):
        return sum(abs(x - y) for x, y in zip(a, b)) / len(a)

    noise = mean_abs(hf, fp32)  # what bf16 rounding alone does to the curve
    diff = mean_abs(ours, hf)
    ours_vs_fp32 = mean_abs(ours, fp32)
    ok = diff <= 2 * noise + 1e-6 and ours_vs_fp32 <= 1.5 * noise + 1e-6
    return dict(
        mean_abs_patched_vs_unpatched=diff,
        mean_abs_unpatched_bf16_vs_fp32=noise,
        mean_abs_patched_bf16_vs_fp32=ours_vs_fp32,
        max_abs_patched_vs_unpatched=max(abs(x - y) for x, y in zip(ours, hf)),
        final_loss=dict(hf_fp32=fp32[-1], hf_bf16=hf[-1], liger_core_bf16=ours[-1]),
        within_bf16_noise=ok,
    )


def _plot(all_runs: dict, path: Path, title: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot"
    names = list(all_runs)
    fig, axes = plt.subplots(2, len(names), figsize=(6.5 * len(names), 7), sharex=True, squeeze=False)
    styles = {
        "hf_fp32": dict(color="#1f77b4", linewidth=1.0, label="HF fp32"),
        "hf_bf16": dict(color="#888888", linewidth=2.5, label="HF bf16"),
        "liger_core_bf16": dict(color="#d9480f", linewidth=1.2, linestyle="--", label="liger_core bf16"),
    }
    for col, name in enumerate(names):
        runs = all_runs[name]["runs"]
        steps = range(1, len(runs["hf_bf16"]) + 1)
        ax = axes[0][col]
        for run, losses in runs.items():
            ax.plot(steps, losses, **styles[run])
        ax.set_title(f"{name}-shaped: training loss")
        ax.legend()
        ax = axes[1][col]
        ax.plot(steps, [a - b for a, b in zip(runs["liger_core_bf16"], runs["hf_bf16"])], color="#d9480f",
                label="liger_core bf16 - HF bf16")  # fmt: skip
        ax.plot(steps, [a - b for a, b in zip(runs["hf_bf16"], runs["hf_fp32"])], color="#888888",
                label="HF bf16 - HF fp32 (bf16 noise)")  # fmt: skip
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xlabel("step")
        ax.set_title("loss differences")
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=None, help="default 100 (--tiny: 3)")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny shapes, Triton interpreter")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.tiny:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
    sys.path.insert(0, str(ROOT))
    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        print("convergence: no CUDA device; use --tiny for a CPU smoke test of the script", file=sys.stderr)
        return 2
    opts = dict(
        device="cuda" if cuda else "cpu",
        steps=args.steps or (100 if cuda else 3),
        batch=8 if cuda else 1,
        seq=512 if cuda else 8,
        lr=1e-3,
        warmup=10 if cuda else 1,
    )
    shapes = {m: SHAPES[m] if cuda else dict(SHAPES[m], **TINY_SHAPE) for m in args.models}
    tag = torch.cuda.get_device_name().replace(" ", "_") if cuda else "tiny-cpu"
    print(f"convergence: {opts}", flush=True)
    all_runs, summaries = {}, {}
    for name, shape in shapes.items():
        all_runs[name] = run_model(name, shape, opts)
        summaries[name] = _summary(all_runs[name]["runs"])
        s = summaries[name]
        print(
            f"  {name}: mean |liger_core - HF| (bf16) {s['mean_abs_patched_vs_unpatched']:.4f}, bf16 noise "
            f"(mean |HF bf16 - HF fp32|) {s['mean_abs_unpatched_bf16_vs_fp32']:.4f}, liger_core vs fp32 "
            f"{s['mean_abs_patched_bf16_vs_fp32']:.4f} -> within bf16 noise: {s['within_bf16_noise']}",
            flush=True,
        )

    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"convergence_{tag}"
    with open(f"{stem}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["model", "step", "hf_fp32", "hf_bf16", "liger_core_bf16"])
        for name, data in all_runs.items():
            runs = data["runs"]
            for i in range(len(runs["hf_bf16"])):
                writer.writerow(
                    [name, i + 1, runs["hf_fp32"][i], runs["hf_bf16"][i], runs["liger_core_bf16"][i]]
                )
    bc.write_json(
        f"{stem}.json",
        dict(
            options=opts,
            shapes=shapes,
            torch=torch.__version__,
            summary=summaries,
            reports={n: d["reports"] for n, d in all_runs.items()},
        ),
        indent=2,
    )
    print(f"  wrote {stem}.csv and {stem}.json")
    print("  " + _plot(all_runs, Path(f"{stem}.png"), f"bf16 convergence, {opts['steps']} steps ({tag})"))
    return 0 if all(s["within_bf16_noise"] for s in summaries.values()) or args.tiny else 1


if __name__ == "__main__":
    sys.exit(main())

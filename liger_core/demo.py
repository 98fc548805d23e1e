"""``liger-core demo``: train a small Llama-style model on the corpus shipped with liger_core, once with plain
Hugging Face transformers and once patched with ``liger_core.apply_liger_kernel``, and compare tokens/s, peak
memory and the two loss curves (printed side by side and saved as a PNG plot when matplotlib is installed).

On a GPU: a ~190M-parameter model in bf16 (hidden 1024, 12 layers, vocabulary of 32000 like Llama-2), batch
8 x 1024 tokens, AdamW; the Triton kernels run, and the gains are real.

On a CPU-only machine (finishes in about a minute): Triton kernels need a GPU, so the training comparison
runs liger_core's pure-PyTorch reference path on a small fp32 model (the loss curves must agree; CPU speed and
memory are then not the kernels'); then a short run under Triton's CPU interpreter trains a tiny model with
the real Triton kernels and reports how far its losses are from plain transformers'.

Each run is a fresh subprocess (``python -m liger_core.demo --worker ...``), so peak memory is measured per
run: ``torch.cuda.max_memory_allocated`` on CUDA; on CPU the process's peak resident set size above its size
after building the model (``resource.getrusage`` high-water mark).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

CORPUS = Path(__file__).parent / "data" / "tiny_stories.txt"
_RESULT_MARK = "LIGER_CORE_DEMO_RESULT "


@dataclass
class RunConfig:
    mode: str  # "hf" | "liger_core"
    device: str
    dtype: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    seq_len: int
    batch_size: int
    steps: int
    warmup_steps: int
    lr: float
    seed: int = 0
    rope: bool = True


GPU_MODEL = dict(
    dtype="bfloat16",
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=4,
    vocab_size=32000,
    seq_len=1024,
    batch_size=8,
    lr=6e-4,
)
CPU_MODEL = dict(
    dtype="float32",
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=256,
    seq_len=128,
    batch_size=8,
    lr=3e-3,
)
KERNEL_CHECK_MODEL = dict(
    dtype="float32",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    seq_len=8,
    batch_size=1,
    lr=3e-3,
)


# ----------------------------------------------------------------------------------------------------------
# Worker: one training run in its own process
# ----------------------------------------------------------------------------------------------------------


def _batches(cfg: RunConfig, device):
    """Random windows of the corpus as byte tokens (ids 0-255), the same sequence for every run."""
    import torch

    data = torch.frombuffer(bytearray(CORPUS.read_bytes()), dtype=torch.uint8).long()
    gen = torch.Generator().manual_seed(cfg.seed)
    for _ in range(cfg.steps):
        starts = torch.randint(0, len(data) - cfg.seq_len, (cfg.batch_size,), generator=gen).tolist()
        ids = torch.stack([data[s : s + cfg.seq_len] for s in starts]).to(device)
        yield ids


def _rss_bytes() -> int:
    """Current resident set size (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _peak_rss_bytes() -> int:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if sys.platform == "darwin" else 1024)


def run_worker(cfg: RunConfig) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    warnings.filterwarnings("ignore", message="liger_core: tensors on")  # the parent explains the CPU path
    device = torch.device(cfg.device)
    dtype = getattr(torch, cfg.dtype)
    if device.type == "cpu":
        # small matrices: a 2nd thread buys little, and on a busy 2-core machine oversubscription costs 4x
        torch.set_num_threads(max(1, min(4, (os.cpu_count() or 2) // 2)))
    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=max(cfg.seq_len, 128),
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype)
    report = ""
    if cfg.mode == "liger_core":
        import liger_core

        report = str(liger_core.apply_liger_kernel(model, rope=cfg.rope))
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95), fused=device.type == "cuda"
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    baseline_rss = _rss_bytes()
    losses, timed_tokens, timed_seconds = [], 0, 0.0
    for step, ids in enumerate(_batches(cfg, device)):
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()  # synchronises
        if step >= cfg.warmup_steps:
            timed_seconds += time.perf_counter() - start
            timed_tokens += ids.numel()
        losses.append(value)
    if device.type == "cuda":
        peak, memory_kind = torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"
    else:
        peak, memory_kind = max(0, _peak_rss_bytes() - baseline_rss), "peak RSS above post-build RSS"
    return dict(
        mode=cfg.mode,
        losses=losses,
        tokens_per_s=timed_tokens / timed_seconds if timed_seconds > 0 else float("nan"),
        peak_bytes=peak,
        memory_kind=memory_kind,
        params=sum(p.numel() for p in model.parameters()),
        report=report,
    )


def _spawn(cfg: RunConfig, interpret: bool, timeout: float) -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    cmd = [sys.executable, "-m", "liger_core.demo", "--worker", json.dumps(asdict(cfg))]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULT_MARK):
            return json.loads(line[len(_RESULT_MARK) :])
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
    raise RuntimeError(f"the {cfg.mode} run failed (exit code {proc.returncode}):\n{tail}")


# ----------------------------------------------------------------------------------------------------------
# Parent: plan, run, print, plot
# ----------------------------------------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _print_curves(hf: list[float], lc: list[float], max_rows: int = 24) -> None:
    n = len(hf)
    rows = sorted({0, n - 1, *range(0, n, max(1, n // max_rows))})
    print(f"\n  {'step':>4}  {'HF loss':>10}  {'liger_core loss':>15}  {'difference':>10}")
    for i in rows:
        print(f"  {i + 1:>4}  {hf[i]:>10.4f}  {lc[i]:>15.4f}  {lc[i] - hf[i]:>+10.2e}")


def _plot(results: dict[str, dict], path: Path, title: str, gpu: bool) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    hf, lc = results["hf"], results["liger_core"]
    fig, (ax_loss, ax_speed, ax_mem) = plt.subplots(
        1, 3, figsize=(14, 4.2), gridspec_kw=dict(width_ratios=[2, 1, 1])
    )
    steps = range(1, len(hf["losses"]) + 1)
    ax_loss.plot(steps, hf["losses"], label="Hugging Face", color="#888888", linewidth=2.5)
    ax_loss.plot(steps, lc["losses"], label="liger_core", color="#d9480f", linewidth=1.2, linestyle="--")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss")
    ax_loss.legend()
    ax_loss.set_title("loss curves")
    names, colors = ["HF", "liger_core" if gpu else "liger_core\n(reference path)"], ["#888888", "#d9480f"]
    ax_speed.bar(names, [hf["tokens_per_s"], lc["tokens_per_s"]], color=colors)
    ax_speed.set_title("tokens / s (higher is better)")
    unit, scale = ("GiB", 2**30) if gpu else ("MiB", 2**20)
    ax_mem.bar(names, [hf["peak_bytes"] / scale, lc["peak_bytes"] / scale], color=colors)
    ax_mem.set_title(f"peak memory, {unit} (lower is better)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot: {path}"


def _run_pair(
    base: dict, steps: int, warmup: int, device: str, interpret: bool, timeout: float, **extra
) -> dict:
    results = {}
    for mode in ("hf", "liger_core"):
        cfg = RunConfig(mode=mode, device=device, steps=steps, warmup_steps=warmup, **base, **extra)
        results[mode] = _spawn(cfg, interpret=interpret, timeout=timeout)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="liger-core demo",
        description="Train a small Llama-style model without and with liger_core: speed, memory, loss.",
    )
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (GPU 60, CPU 80)")
    parser.add_argument("--out", type=Path, default=Path("liger_core_demo"), help="where the PNG plot goes")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--kernel-check-steps", type=int, default=3, help="CPU: steps run by the interpreter")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        result = run_worker(RunConfig(**json.loads(args.worker)))
        print(_RESULT_MARK + json.dumps(result), flush=True)
        return 0

    import torch

    try:
        import transformers  # noqa: F401 - the demo trains a transformers model
    except ImportError:
        print(
            "liger-core demo needs Hugging Face transformers (and matplotlib for its plot): "
            "pip install 'liger-core[demo]'  (or: pip install transformers matplotlib)",
            file=sys.stderr,
        )
        return 2
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("liger-core demo: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    gpu = device == "cuda"
    base = GPU_MODEL if gpu else CPU_MODEL
    steps = args.steps or (60 if gpu else 80)
    warmup = min(3 if gpu else 1, steps - 1)
    started = time.perf_counter()

    print("liger-core demo: a Llama-style model trained on liger_core/data/tiny_stories.txt (300 KB, bytes)")
    print("  once with plain Hugging Face transformers (HF), once after liger_core.apply_liger_kernel(model)")
    if gpu:
        print(f"  device: {torch.cuda.get_device_name()} | Triton kernels | {base['dtype']}")
    else:
        print(
            "  device: CPU (no CUDA). Triton kernels need a GPU, so this comparison runs liger_core's PyTorch"
        )
        print("  reference path: the loss curves must match; CPU speed and memory here are NOT the kernels'.")
        print("  The real Triton kernels are then run by Triton's CPU interpreter on a tiny model (below).")
    print(
        f"  model: hidden {base['hidden_size']}, {base['num_hidden_layers']} layers, "
        f"{base['num_attention_heads']}/{base['num_key_value_heads']} heads, vocab {base['vocab_size']}"
        + (" (Llama-2 size; the byte tokens use ids 0-255)" if gpu else "")
        + f" | batch {base['batch_size']} x {base['seq_len']} tokens | {steps} AdamW steps",
        flush=True,
    )
    try:
        results = _run_pair(base, steps, warmup, device, interpret=False, timeout=1800)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"liger-core demo: {e}", file=sys.stderr)
        return 1
    hf, lc = results["hf"], results["liger_core"]
    print(f"\n  {lc['report']}")
    print(f"  parameters: {hf['params'] / 1e6:.1f}M")
    _print_curves(hf["losses"], lc["losses"])
    max_diff = max(abs(a - b) for a, b in zip(hf["losses"], lc["losses"]))
    speedup = lc["tokens_per_s"] / hf["tokens_per_s"]
    memory = lc["peak_bytes"] / hf["peak_bytes"] if hf["peak_bytes"] else float("nan")
    print(f"\n  {'':24}{'HF':>14}{'liger_core' if gpu else 'liger_core ref':>16}")
    print(f"  {'tokens/s':24}{hf['tokens_per_s']:>14,.0f}{lc['tokens_per_s']:>16,.0f}   x{speedup:.2f}")
    print(f"  {'peak memory':24}{_gib(hf['peak_bytes']):>14}{_gib(lc['peak_bytes']):>16}   x{memory:.2f}")
    print(f"  (memory: {hf['memory_kind']}; tokens/s excludes {warmup} warm-up step(s))")
    print(f"  largest loss difference over {steps} steps: {max_diff:.2e}")

    if not gpu and args.kernel_check_steps > 0:
        n = args.kernel_check_steps
        print(f"\n  The Triton kernels, run by Triton's CPU interpreter: {n} steps of a tiny model")
        print("  (hidden 32, 1 layer, 8 tokens: the interpreter is ~1000x slower than a GPU)")
        try:
            check = _run_pair(KERNEL_CHECK_MODEL, n, 0, "cpu", interpret=True, timeout=600)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"liger-core demo: {e}", file=sys.stderr)
            return 1
        diffs = [abs(a - b) for a, b in zip(check["hf"]["losses"], check["liger_core"]["losses"])]
        print(f"  {check['liger_core']['report']}")
        for i, (a, b) in enumerate(zip(check["hf"]["losses"], check["liger_core"]["losses"])):
            print(f"  step {i + 1}: HF {a:.6f}  liger_core (Triton kernels) {b:.6f}")
        print(f"  largest loss difference: {max(diffs):.2e}")

    if not args.no_plot:
        where = "GPU, Triton kernels" if gpu else "CPU, reference path"
        print(
            "\n  "
            + _plot(
                results, args.out / "liger_core_demo.png", f"liger-core demo ({where}, {steps} steps)", gpu
            )
        )
    print(f"\n  done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``liger-core demo``: train a small Llama-style model on the corpus shipped with liger_core, once with plain
Hugging Face transformers and once patched with ``liger_core.apply_liger_kernel``, and compare the two loss
curves (printed side by side and saved as a PNG plot when matplotlib is installed) and, on a GPU, tokens/s and
peak memory. Each run shows a progress line from its start (step, loss, time so far, ETA).

On a GPU: a ~190M-parameter model in bf16 (hidden 1024, 12 layers, vocabulary of 32000 like Llama-2), batch
8 x 1024 tokens, AdamW; the Triton kernels run, and the gains are real. Each run is a fresh subprocess
(``python -m liger_core.demo --worker ...``), so its peak memory (``torch.cuda.max_memory_allocated``) is
its own.

On a CPU-only machine (about 27 s of CPU time: about 30 s on two idle cores): Triton kernels need a GPU to
be fast, so the training comparison runs liger_core's pure-PyTorch reference code on a small fp32 model. The
loss curves must agree; the tokens/s of the two are printed as two PyTorch programs, with no ratio and no bar
chart, since they say nothing about the kernels. Then a short run under Triton's CPU interpreter trains a
tiny model with the real Triton kernels and reports how far its losses are from plain transformers'. On CPU
the two runs of each pair share one subprocess (one start-up of Python, torch and transformers, most of the
time on a small machine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

CORPUS = Path(__file__).parent / "data" / "tiny_stories.txt"
_RESULT_MARK = "LIGER_CORE_DEMO_RESULT "
_PROGRESS_MARK = "LIGER_CORE_DEMO_PROGRESS "


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


# The model and training fields of a RunConfig (all but mode, device and the step counts), one model a row.
_MODEL_FIELDS = (
    "dtype", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "vocab_size", "seq_len", "batch_size", "lr",
)  # fmt: skip
GPU_MODEL = dict(zip(_MODEL_FIELDS, ("bfloat16", 1024, 2816, 12, 16, 4, 32000, 1024, 8, 6e-4)))
CPU_MODEL = dict(zip(_MODEL_FIELDS, ("float32", 128, 352, 4, 8, 4, 256, 128, 8, 3e-3)))
KERNEL_CHECK_MODEL = dict(zip(_MODEL_FIELDS, ("float32", 32, 64, 1, 4, 2, 256, 8, 1, 3e-3)))


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


def run_worker(cfg: RunConfig, index: int = 0) -> dict:
    """One training run; ``index``: its place among the runs of this process (0: the first)."""
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
    _emit_progress(index, 0, cfg.steps, None)  # built: the parent's progress line switches from "starting"
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
        _emit_progress(index, step + 1, cfg.steps, value)
    if device.type == "cuda":
        peak, memory_kind = torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"
    elif index == 0:
        peak, memory_kind = max(0, _peak_rss_bytes() - baseline_rss), "peak RSS above post-build RSS"
    else:  # the RSS high-water mark is the process's: it would include the earlier runs
        peak, memory_kind = None, "not measured (an earlier run shares the process)"
    return dict(
        mode=cfg.mode,
        losses=losses,
        tokens_per_s=timed_tokens / timed_seconds if timed_seconds > 0 else float("nan"),
        peak_bytes=peak,
        memory_kind=memory_kind,
        params=sum(p.numel() for p in model.parameters()),
        report=report,
    )


def _emit_progress(run: int, step: int, steps: int, loss: float | None) -> None:
    print(_PROGRESS_MARK + json.dumps(dict(run=run, step=step, steps=steps, loss=loss)), flush=True)


class Progress:
    """One status line per run: "starting" until the worker has built its model, then step, loss, elapsed
    time and the ETA (from the mean time per step so far). On a terminal the line is rewritten in place;
    otherwise (a pipe, a log file) a line is printed on start, every ``every`` seconds and at the end."""

    def __init__(self, label: str, stream=None, every: float = 5.0, starting: str = "Python imports, "):
        self.label, self.stream, self.every = label, stream or sys.stdout, every
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = self.first_step_at = time.perf_counter()
        self.last_print, self.step, self.steps, self.loss = -math.inf, 0, 0, None
        self._show(f"{label}: starting ({starting}building the model)...", force=True)

    def update(self, step: int, steps: int, loss: float | None) -> None:
        now = time.perf_counter()
        if step == 0:
            self.first_step_at = now
        self.step, self.steps, self.loss = step, steps, loss
        self._show(self.line(now), force=step in (0, steps))

    def line(self, now: float) -> str:
        elapsed = now - self.started
        if self.step == 0:
            return f"{self.label}: model built in {elapsed:.0f} s, training {self.steps} step(s)..."
        text = f"{self.label}: step {self.step}/{self.steps}"
        if self.loss is not None:
            text += f", loss {self.loss:.4f}"
        text += f", {elapsed:.0f} s"
        if self.step < self.steps:
            per_step = (now - self.first_step_at) / self.step
            text += f", ETA {per_step * (self.steps - self.step):.0f} s"
        return text

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _show(self, text: str, force: bool = False) -> None:
        now = time.perf_counter()
        if self.tty:
            self.stream.write("\r\033[K  " + text)
        elif force or now - self.last_print >= self.every:
            self.stream.write("  " + text + "\n")
        else:
            return
        self.last_print = now
        self.stream.flush()


def _spawn(
    cfgs: list[RunConfig], interpret: bool, timeout: float, labels: list[str] | None = None
) -> list[dict]:
    """Run the trainings ``cfgs`` one after the other in one fresh process, showing each one's progress;
    the result dict of each (what it prints at the end)."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    labels = labels or [cfg.mode for cfg in cfgs]
    cmd = [sys.executable, "-m", "liger_core.demo", "--worker", json.dumps([asdict(c) for c in cfgs])]
    progress = Progress(labels[0])
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    results: dict[int, dict] = {}
    other = []  # the worker's own output (warnings, a traceback), shown on failure
    run = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(_PROGRESS_MARK):
                event = json.loads(line[len(_PROGRESS_MARK) :])
                if event.pop("run") != run:
                    progress.done()
                    run += 1
                    progress = Progress(labels[run], starting="")
                progress.update(**event)
            elif line.startswith(_RESULT_MARK):
                result = json.loads(line[len(_RESULT_MARK) :])
                results[result.pop("run")] = result
            else:
                other.append(line.rstrip("\n"))
        proc.wait()
    finally:
        timer.cancel()
        progress.done()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if len(results) == len(cfgs):
        return [results[i] for i in range(len(cfgs))]
    if timed_out.is_set():
        raise subprocess.TimeoutExpired(cmd, timeout)
    tail = "\n".join(other[-25:])
    failed = cfgs[len(results)].mode
    raise RuntimeError(f"the {failed} run failed (exit code {proc.returncode}):\n{tail}")


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
    """The loss curves; on a GPU also tokens/s and peak memory bars. On CPU liger_core ran its PyTorch
    reference code, so its speed and memory say nothing about the kernels: the plot shows the loss curves
    and their difference only, and says why."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    hf, lc = results["hf"], results["liger_core"]
    if gpu:
        fig, (ax_loss, ax_speed, ax_mem) = plt.subplots(
            1, 3, figsize=(14, 4.2), gridspec_kw=dict(width_ratios=[2, 1, 1])
        )
    else:
        fig, (ax_loss, ax_diff) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw=dict(width_ratios=[2, 1]))
    steps = range(1, len(hf["losses"]) + 1)
    ax_loss.plot(steps, hf["losses"], label="Hugging Face", color="#888888", linewidth=2.5)
    ax_loss.plot(steps, lc["losses"], label="liger_core", color="#d9480f", linewidth=1.2, linestyle="--")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss")
    ax_loss.legend()
    ax_loss.set_title("loss curves")
    if gpu:
        names, colors = ["HF", "liger_core"], ["#888888", "#d9480f"]
        ax_speed.bar(names, [hf["tokens_per_s"], lc["tokens_per_s"]], color=colors)
        ax_speed.set_title("tokens / s (higher is better)")
        ax_mem.bar(names, [hf["peak_bytes"] / 2**30, lc["peak_bytes"] / 2**30], color=colors)
        ax_mem.set_title("peak memory, GiB (lower is better)")
    else:
        diffs = [b - a for a, b in zip(hf["losses"], lc["losses"])]
        ax_diff.plot(steps, diffs, color="#d9480f", linewidth=1.2)
        ax_diff.axhline(0, color="k", linewidth=0.6)
        ax_diff.set_xlabel("step")
        ax_diff.set_title("liger_core loss - HF loss")
        ax_diff.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        title += (
            "\nno GPU: liger_core ran its PyTorch reference code, so speed and memory are not compared here "
            "(the kernels' speed is only measured on a GPU)"
        )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return f"plot: {path}"


def _run_pair(
    base: dict, steps: int, warmup: int, device: str, interpret: bool, timeout: float, labels: dict, **extra
) -> dict:
    """The HF run, then the liger_core run. On a GPU each in its own process, so that each one's peak memory
    is its own; on CPU, where memory is not compared, both in one process (one start-up of Python, torch and
    transformers instead of two: most of the demo's time on a small CPU)."""
    cfgs = [
        RunConfig(mode=mode, device=device, steps=steps, warmup_steps=warmup, **base, **extra)
        for mode in ("hf", "liger_core")
    ]
    names = [labels[c.mode] for c in cfgs]
    if device == "cpu":
        runs = _spawn(cfgs, interpret=interpret, timeout=timeout, labels=names)
    else:
        runs = [_spawn([c], interpret=interpret, timeout=timeout, labels=[n])[0] for c, n in zip(cfgs, names)]
    return dict(zip(("hf", "liger_core"), runs))


def print_speed_table(hf: dict, lc: dict, gpu: bool, warmup: int) -> None:
    """tokens/s and peak memory of both runs. The ratio (a speedup) is printed only on a GPU, where
    liger_core's column is the Triton kernels; on CPU it is PyTorch reference code and the numbers are
    printed as what they are, with no ratio."""
    if gpu:
        speedup = lc["tokens_per_s"] / hf["tokens_per_s"]
        memory = lc["peak_bytes"] / hf["peak_bytes"] if hf["peak_bytes"] else float("nan")
        print(f"\n  {'':24}{'HF':>14}{'liger_core':>16}")
        print(f"  {'tokens/s':24}{hf['tokens_per_s']:>14,.0f}{lc['tokens_per_s']:>16,.0f}   x{speedup:.2f}")
        print(f"  {'peak memory':24}{_gib(hf['peak_bytes']):>14}{_gib(lc['peak_bytes']):>16}   x{memory:.2f}")
        print(f"  (memory: {hf['memory_kind']}; tokens/s excludes {warmup} warm-up step(s))")
        return
    print(f"\n  {'':24}{'HF':>14}{'liger_core reference code':>28}")
    print(f"  {'tokens/s':24}{hf['tokens_per_s']:>14,.0f}{lc['tokens_per_s']:>28,.0f}")
    print("  No GPU: liger_core ran its PyTorch reference code, not the Triton kernels, so these two numbers")
    print("  compare two PyTorch programs on this CPU; they are not a kernel speedup. The kernels' speed and")
    print("  memory are measured on a CUDA GPU (`liger-core demo` there, or benchmarks/results/ for H100s).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="liger-core demo",
        description="Train a small Llama-style model without and with liger_core: loss curves; on a GPU also "
        "speed and memory. Progress (step, loss, ETA) is shown for each run.",
    )
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (GPU 60, CPU 80)")
    parser.add_argument("--out", type=Path, default=Path("liger_core_demo"), help="where the PNG plot goes")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--kernel-check-steps", type=int, default=3, help="CPU: steps run by the interpreter")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        for index, cfg in enumerate(json.loads(args.worker)):
            result = run_worker(RunConfig(**cfg), index)
            print(_RESULT_MARK + json.dumps(dict(result, run=index)), flush=True)
        return 0
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")

    started = time.perf_counter()
    print("liger-core demo: importing torch...", flush=True)
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
    check_steps = 0 if gpu else max(0, args.kernel_check_steps)
    n_runs = 2 + (2 if check_steps else 0)

    print("liger-core demo: a Llama-style model trained on liger_core/data/tiny_stories.txt (300 KB, bytes)")
    print("  once with plain Hugging Face transformers (HF), once after liger_core.apply_liger_kernel(model)")
    if gpu:
        print(f"  device: {torch.cuda.get_device_name()} | Triton kernels | {base['dtype']}")
    else:
        print("  device: CPU, no CUDA GPU. The Triton kernels need a GPU to run fast, so here liger_core")
        print("  runs its PyTorch reference code: the loss curves must match HF's, but its speed and")
        print("  memory here say nothing about the kernels (no ratio is given). The real Triton kernels are")
        print(
            "  then run by Triton's CPU interpreter on a tiny model, to show that they give the same losses."
        )
    print(
        f"  model: hidden {base['hidden_size']}, {base['num_hidden_layers']} layers, "
        f"{base['num_attention_heads']}/{base['num_key_value_heads']} heads, vocab {base['vocab_size']}"
        + (" (Llama-2 size; the byte tokens use ids 0-255)" if gpu else "")
        + f" | batch {base['batch_size']} x {base['seq_len']} tokens | {steps} AdamW steps",
    )
    print(f"  {n_runs} training runs:\n", flush=True)
    lc_name = "liger_core (Triton kernels)" if gpu else "liger_core (reference code)"
    try:
        results = _run_pair(
            base, steps, warmup, device, interpret=False, timeout=1800,
            labels={"hf": f"[1/{n_runs}] HF", "liger_core": f"[2/{n_runs}] {lc_name}"},
        )  # fmt: skip
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"liger-core demo: {e}", file=sys.stderr)
        return 1
    hf, lc = results["hf"], results["liger_core"]
    print(f"\n  {lc['report']}")
    print(f"  parameters: {hf['params'] / 1e6:.1f}M")
    _print_curves(hf["losses"], lc["losses"])
    max_diff = max(abs(a - b) for a, b in zip(hf["losses"], lc["losses"]))
    print(f"  largest loss difference over {steps} steps: {max_diff:.2e}")
    print_speed_table(hf, lc, gpu, warmup)

    if check_steps:
        n = check_steps
        print(f"\n  The Triton kernels, run by Triton's CPU interpreter: {n} step(s) of a tiny model")
        print("  (hidden 32, 1 layer, 8 tokens: the interpreter is ~1000x slower than a GPU)\n", flush=True)
        try:
            labels = {"hf": f"[3/{n_runs}] HF", "liger_core": f"[4/{n_runs}] liger_core (Triton interpreter)"}
            check = _run_pair(KERNEL_CHECK_MODEL, n, 0, "cpu", interpret=True, timeout=600, labels=labels)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"liger-core demo: {e}", file=sys.stderr)
            return 1
        diffs = [abs(a - b) for a, b in zip(check["hf"]["losses"], check["liger_core"]["losses"])]
        print(f"\n  {check['liger_core']['report']}")
        for i, (a, b) in enumerate(zip(check["hf"]["losses"], check["liger_core"]["losses"])):
            print(f"  step {i + 1}: HF {a:.6f}  liger_core (Triton kernels) {b:.6f}")
        print(f"  largest loss difference: {max(diffs):.2e}")

    if not args.no_plot:
        where = "GPU, Triton kernels" if gpu else "CPU, liger_core as PyTorch reference code"
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

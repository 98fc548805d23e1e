"""Pieces the end-to-end benchmark scripts share: a model from a shape dict, the providers' patches, the
worker process each (model, provider) runs in, the timed training loop with its peak memory, the environment
of a run and the writing of its results.

The scripts import it as ``_common`` (``benchmarks/`` is on ``sys.path`` when a script runs, and each script
puts it there when loaded by path, as the tests do).
"""

from __future__ import annotations

import csv
import gc
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LIGER_KERNEL_DIST = "liger-kernel"

# ----------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------

# Fields of published config.json files that more than one benchmark builds from: Llama 3's (every size) and
# Qwen2.5-3B's text model (Qwen2.5-VL-3B's language model has the same shape)
LLAMA3 = dict(vocab_size=128256, num_key_value_heads=8, rope_theta=500000.0)
QWEN2_5_3B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
# the text model of the CPU smoke runs (--tiny)
TINY_TEXT = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def set_rope(config, theta: float, scaling: dict | None = None) -> None:
    """RoPE theta (and scaling) on ``config`` whichever way this transformers version reads them: 5.x keeps
    both in the ``rope_parameters`` dict, earlier versions in ``rope_theta`` / ``rope_scaling``."""
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict):
        rope.update(rope_theta=theta, **(scaling or {}))
        if scaling is None:
            rope.setdefault("rope_type", "default")
    else:
        config.rope_theta = theta
        if scaling is not None:
            config.rope_scaling = scaling


def training_config(config):
    """SDPA attention and no KV cache: the configuration every training benchmark runs."""
    config._attn_implementation = "sdpa"
    config.use_cache = False
    return config


def causal_lm_config(model_type: str, shape: dict, **extra):
    """The transformers config of ``model_type`` from a shape dict (``rope_theta`` and an optional
    ``rope_scaling`` among its keys) and ``extra`` keyword arguments, set up for training."""
    from transformers import AutoConfig

    shape = dict(shape)
    theta, scaling = shape.pop("rope_theta"), shape.pop("rope_scaling", None)
    config = AutoConfig.for_model(model_type, **shape, **extra)
    set_rope(config, theta, scaling)
    return training_config(config)


def build_model(build: Callable[[], object], device, dtype):
    """``build()`` (seed 0) with its parameters created on ``device`` in ``dtype`` (no fp32 copy first)."""
    import torch

    torch.manual_seed(0)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = build()
    finally:
        torch.set_default_dtype(default_dtype)
    return model.to(device=device, dtype=dtype)


# ----------------------------------------------------------------------------------------------------------
# Providers
# ----------------------------------------------------------------------------------------------------------


def dist_version(name: str) -> str | None:
    """An installed distribution's version (liger-kernel has no ``__version__``), None if not installed."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def liger_kernel_patch(model_type: str) -> Callable[[], None] | str:
    """liger-kernel's ``apply_liger_kernel_to_<model_type>``, or the reason it cannot be imported."""
    try:
        import liger_kernel.transformers as lk
    except Exception as e:  # noqa: BLE001 - any import failure means the provider cannot run
        return f"liger_kernel not importable: {type(e).__name__}: {e}"
    return getattr(lk, f"apply_liger_kernel_to_{model_type}")


def enable_training(model, grad_ckpt: bool = True) -> None:
    """Gradient checkpointing (non-reentrant) when asked, and training mode."""
    if grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()


# ----------------------------------------------------------------------------------------------------------
# Worker processes: one per (model, provider), so that each peak memory is its own
# ----------------------------------------------------------------------------------------------------------


def worker_env(interpret: bool = False) -> dict[str, str]:
    """The worker's environment: this checkout first on PYTHONPATH, Triton's interpreter only when asked
    (CPU smoke runs of the liger providers), PyTorch's expandable segments unless set."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(ROOT)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    return env


def spawn_worker(
    script: str | Path, worker: str, opts: dict, mark: str, timeout: float, interpret: bool = False
) -> tuple[dict | None, subprocess.CompletedProcess | None, float]:
    """Runs ``script --worker <worker> --opts <json>`` and returns (the result it printed after ``mark`` or
    None, the finished process or None on timeout, wall seconds)."""
    cmd = [sys.executable, str(Path(script).resolve()), "--worker", worker, "--opts", json.dumps(opts)]
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=worker_env(interpret), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, None, time.perf_counter() - started
    wall = time.perf_counter() - started
    for line in proc.stdout.splitlines():
        if line.startswith(mark):
            return json.loads(line[len(mark) :]), proc, wall
    return None, proc, wall


def stderr_tail(proc: subprocess.CompletedProcess, lines: int = 12) -> str:
    return "\n".join(proc.stderr.strip().splitlines()[-lines:])


def output_tail(proc: subprocess.CompletedProcess, lines: int = 15) -> str:
    return "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-lines:])


def no_result(proc: subprocess.CompletedProcess) -> tuple[str, str]:
    """(status, error) of a worker that printed no result: "oom" when its output says so, else "failed"."""
    tail = output_tail(proc)
    status = "oom" if "OutOfMemoryError" in tail or "out of memory" in tail else "failed"
    if proc.returncode == -9:  # SIGKILL without a result: the kernel's OOM killer (host memory)
        status, tail = "oom", f"killed (host memory?)\n{tail}"
    return status, f"exit code {proc.returncode}: {tail}"


def is_oom(e: BaseException) -> bool:
    return "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"


def run_worker_main(
    mark: str, base: dict, work: Callable[[], dict], max_chars: int | None = None, trace_oom: bool = True
) -> int:
    """The worker side: prints ``mark`` + the JSON of ``work()``'s result, or of its failure (``base`` with
    status "oom" or "failed" and the error), so that the parent never hangs on a crash."""
    try:
        result = work()
    except Exception as e:  # noqa: BLE001 - report, do not hang the parent
        oom = is_oom(e)
        message = str(e) if max_chars is None else str(e)[:max_chars]
        result = dict(base, status="oom" if oom else "failed", error=f"{type(e).__name__}: {message}")
        if trace_oom or not oom:
            traceback.print_exc()
    print(mark + json.dumps(result), flush=True)
    return 0


# ----------------------------------------------------------------------------------------------------------
# The timed training loop
# ----------------------------------------------------------------------------------------------------------


def sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize()


def reset_peak_memory(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory(device) -> dict:
    """``peak_alloc_gib`` and ``peak_reserved_gib`` since the last reset (nothing off CUDA)."""
    if device.type != "cuda":
        return {}
    import torch

    return dict(
        peak_alloc_gib=torch.cuda.max_memory_allocated() / 2**30,
        peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
    )


def train_step(model, optimizer, batch: dict):
    """One optimizer step on ``batch`` (the model's keyword arguments, labels included); returns the loss."""
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def timed_steps(
    step: Callable[[object], object], batches: Sequence, warmup: int, steps: int, device, diagnostics=False
) -> dict:
    """``warmup`` untimed then ``steps`` timed calls of ``step`` over ``batches`` in turn (CUDA-synchronised
    around the timed ones). Returns ``elapsed`` (seconds of the timed steps), ``losses`` (first and last
    step's). With ``diagnostics``: the warm-up's garbage collected before the clock starts (as
    torch.utils.benchmark does: otherwise a full collection of it lands in a timed step), and
    ``gc_pauses`` (generation, ms) of Python's collector inside the timed steps, and on CUDA ``step_ms``, the
    GPU time of each timed step (a slow step stands out)."""
    import torch

    losses: list[float] = []
    total = warmup + steps
    start = None
    gc_pauses: list[tuple[int, float]] = []
    gc_started = [0.0]

    def gc_timer(phase: str, info: dict) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        elif start is not None:
            gc_pauses.append((info["generation"], (time.perf_counter() - gc_started[0]) * 1e3))

    if diagnostics:
        gc.callbacks.append(gc_timer)
    events = []
    record = diagnostics and device.type == "cuda"
    try:
        for i in range(total):
            if i == warmup:
                if diagnostics:
                    gc.collect()
                sync(device)
                start = time.perf_counter()
            if record and i >= warmup:
                events.append(torch.cuda.Event(enable_timing=True))
                events[-1].record()
            loss = step(batches[i % len(batches)])
            if i == 0 or i == total - 1:
                losses.append(loss.item())
        if events:
            events.append(torch.cuda.Event(enable_timing=True))
            events[-1].record()
        sync(device)
        elapsed = time.perf_counter() - start
    finally:
        if diagnostics:
            gc.callbacks.remove(gc_timer)
    out = dict(elapsed=elapsed, losses=losses)
    if diagnostics:
        out["gc_pauses"] = gc_pauses
    if events:
        out["step_ms"] = [round(a.elapsed_time(b), 1) for a, b in zip(events, events[1:])]
    return out


def throughput(timed: dict, tokens_per_step: int, steps: int, model) -> dict:
    """The result fields of a timed run: tokens/s, step time, first and last loss, parameter count."""
    return dict(
        tokens_per_s=tokens_per_step * steps / timed["elapsed"],
        step_time_s=timed["elapsed"] / steps,
        first_loss=timed["losses"][0],
        last_loss=timed["losses"][-1],
        params=sum(p.numel() for p in model.parameters()),
    )


def progress_line(result: dict, leave_out: Iterable[str]) -> dict:
    """A result without the keys ``leave_out`` (long ones, printed apart), floats to 4 decimals."""
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items() if k not in leave_out}


def summary_cells(r: dict) -> tuple[str, str, str, str]:
    """(tokens/s, peak allocated, reserved, first loss) of a result row as the summary tables print them."""
    tps = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else "-"
    alloc = f"{r['peak_alloc_gib']:.2f} GiB" if "peak_alloc_gib" in r else "-"
    reserved = f"{r['peak_reserved_gib']:.1f}" if "peak_reserved_gib" in r else "-"
    first = f"{r['first_loss']:.4f}" if "first_loss" in r else "-"
    return tps, alloc, reserved, first


# ----------------------------------------------------------------------------------------------------------
# The run's environment and its results
# ----------------------------------------------------------------------------------------------------------


def environment(packages: Iterable[str] = ("transformers", "triton", LIGER_KERNEL_DIST)) -> dict:
    """Versions (python, torch, ``packages`` by distribution name, this checkout's liger_core and its
    commit) and the GPU's name (None without one)."""
    import torch

    env = dict(python=platform.python_version(), torch=torch.__version__)
    for name in packages:
        env[name.replace("-", "_")] = dist_version(name)
    try:
        if str(ROOT) not in sys.path:  # this checkout's liger_core, as the workers import it
            sys.path.insert(0, str(ROOT))
        import liger_core

        env["liger_core"] = liger_core.__version__
    except Exception:  # noqa: BLE001
        env["liger_core"] = None
    try:  # the checkout's commit (None where the tree has no git metadata; uncommitted changes not shown)
        git = ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]
        env["liger_core_commit"] = subprocess.run(git, capture_output=True, text=True).stdout.strip() or None
    except OSError:
        env["liger_core_commit"] = None
    env["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return env


def hardware_folder(gpu: str | None) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100'; no GPU -> 'tiny-cpu'."""
    if not gpu:
        return "tiny-cpu"
    m = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", gpu)
    return m.group(1).lower() if m else re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")


def write_csv(path: str | Path, fields: Sequence[str], rows: Iterable[dict]) -> None:
    """``rows`` under the header ``fields`` (keys not in it left out, missing ones empty)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_json(path: str | Path, data: dict, indent: int = 1, newline: bool = False) -> None:
    """``data`` as JSON (a results ``.json`` or ``.meta.json`` file)."""
    Path(path).write_text(json.dumps(data, indent=indent) + ("\n" if newline else ""))

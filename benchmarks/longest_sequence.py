"""Longest trainable sequence on one GPU: bisection over the sequence length, per model setup and provider.

A length is trainable when one training step at batch 1 (forward, backward, optimizer step, with the
optimizer's states already allocated, as in every step after the first) succeeds; the longest is the last
success below a failure (out of memory) at the next length up to ``--resolution`` tokens. Each attempt runs in
its own process, so a failed attempt's fragmented allocator does not shrink the next one.

Setups (random weights from the config, no download; bf16; gradient checkpointing (non-reentrant); SDPA
attention, causal without a mask, batch 1, random token ids as labels):
  llama8b-lora  Llama-3.1-8B shape (vocab 128256, hidden 4096, 32 layers, 32 query / 8 key-value heads,
                intermediate 14336, llama3 RoPE scaling, untied embeddings); frozen bf16 base, LoRA r=16
                (alpha 32, no dropout) on every linear layer of the decoder (q, k, v, o, gate, up, down)
                through peft where it is importable, else through this script's own LoRA wrapper (the
                same math: y = base(x) + (alpha / r) * B(A(x)), A random, B zero; recorded as ``lora``);
                fused AdamW on the adapters, fp32 as peft keeps them by default (each adapted layer's input
                is then cast to fp32 for its adapter, a tokens x hidden fp32 copy per adapted linear layer
                saved for backward; ``--adapter-dtype bf16`` keeps adapters and inputs in bf16)
  llama3b-full  Llama-3.2-3B shape (vocab 128256, hidden 3072, 28 layers, 24 / 8 heads, intermediate 8192,
                tied embeddings), full fine-tuning: bf16 weights, gradients and fused AdamW states
  qwen3b-full   Qwen2.5-3B shape (vocab 151936, hidden 2048, 36 layers, 16 / 2 heads, intermediate 11008,
                tied embeddings), full fine-tuning as above

Providers:
  hf                  transformers as is
  liger_kernel        liger-kernel's ``apply_liger_kernel_to_llama/qwen2()`` (its defaults: RoPE, RMSNorm,
                      SwiGLU, fused linear cross-entropy), before the model is built
  liger_kernel_tiled  the same, and every MLP runs liger-kernel's ``LigerTiledSwiGLUMLP`` forward (its
                      sequence tiling, ``num_shards`` automatic: ceil(tokens / hidden)); its patch functions
                      have no tiling option, so the module's forward is bound to each MLP, which keeps its
                      weights
  liger_core          ``liger_core.apply_liger_kernel(model)`` (defaults)
  liger_core_long     ``liger_core.apply_liger_kernel(model, tiled_mlp=True, offload_checkpoints=True)``

Search per (setup, provider): the attempt at ``--start`` (per provider; defaults from earlier H100 runs), then
steps of x1.25 up after a success (x0.8 down after a failure) until the longest is bracketed, then bisection
to ``--resolution``; lengths are multiples of the resolution, at most ``--max-length``. ``--max-minutes``
bounds the whole run (each (setup, provider) gets an equal share of what is left); a search cut short reports
its bracket. Per success: tokens/s (one step after the measured one when the step takes under 60 s, else the
measured step itself: compilation is then a negligible part of it), peak GPU memory allocated and reserved
(``torch.cuda.max_memory_*``, weights, gradients and optimizer states included) and the process's peak
resident host memory (the offloaded checkpoints live there).

``--layers K`` runs K decoder layers instead of all of them and holds the memory the other layers would hold
(their parameters, gradients and optimizer states, and, for providers that keep checkpointed layer inputs on
the GPU, those inputs: tokens x hidden x 2 bytes each) in a ballast tensor, on the GPU, and in host memory
for the inputs ``liger_core_long`` offloads; memory limits are then those of the full model, and the
step time is projected to all layers (``step_s_projected`` = step_s x layers / K, a slight overestimate: the
embedding and the loss do not scale). This makes an 8B attempt at 400K tokens fit the minutes a run has (one
full step there is ~10 minutes of attention on an H100). ``--memory-gib G`` caps the GPU memory the process
may use (``torch.cuda.set_per_process_memory_fraction``; e.g. 79.1 on an H200 to measure an H100's limit).

Usage (GPU machine, repository root; liger-kernel (and peft) importable for their providers, e.g. from the
peer wheels in .whl/ as benchmarks/run_e2e_gpu.sh installs them):
    python benchmarks/longest_sequence.py --setups llama8b-lora --providers liger_core_long \\
        --start liger_core_long=393216 --layers 4 --max-minutes 8
writes ``DIR/longest_sequence.csv`` (one row per attempt; ``longest`` marks each search's answer),
``.meta.json`` (environment, command, per-search summary: longest, first failure, attempts) and ``.png``
(length vs tokens/s and peak GPU memory); DIR defaults to ``benchmarks/results/<gpu>/``. Results are rewritten
after every attempt. Earlier results in DIR for other (setup, provider) pairs are kept (merged by pair).
On CPU:  python benchmarks/longest_sequence.py --tiny   (tiny configs in fp32, liger providers through
Triton's interpreter, lengths capped at ``--max-length`` (256): checks the script end to end; numbers
meaningless; writes to ``benchmarks/results/tiny-cpu/``)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as bc  # noqa: E402  (model building, workers, environment, results)

RESULTS = bc.RESULTS
MARK = "LONGEST_RESULT "
SETUPS = ("llama8b-lora", "llama3b-full", "qwen3b-full")
PROVIDERS = ("hf", "liger_kernel", "liger_kernel_tiled", "liger_core", "liger_core_long")
# first length tried, per provider (H100 80GB, Llama-3.1-8B LoRA: HF 28K, liger-kernel ~100K, liger_core 98K)
STARTS = {
    "hf": 28672,
    "liger_kernel": 102400,
    "liger_kernel_tiled": 131072,
    "liger_core": 98304,
    "liger_core_long": 393216,
}
TINY_STARTS = dict.fromkeys(PROVIDERS, 64)
LONG_STEP_S = 60.0  # a step at least this long is timed itself (no second step)

LLAMA3_ROPE = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0)
LLAMA3 = dict(bc.LLAMA3, model_type="llama", rms_norm_eps=1e-5)
CONFIGS = {
    "llama8b-lora": dict(
        LLAMA3,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        rope_scaling=dict(LLAMA3_ROPE, factor=8.0, original_max_position_embeddings=8192),
        tie_word_embeddings=False,
    ),
    "llama3b-full": dict(
        LLAMA3,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        head_dim=128,
        rope_scaling=dict(LLAMA3_ROPE, factor=32.0, original_max_position_embeddings=8192),
        tie_word_embeddings=True,
    ),
    "qwen3b-full": dict(bc.QWEN2_5_3B, model_type="qwen2"),
}
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
LORA = dict(
    r=16, alpha=32, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
)


# ----------------------------------------------------------------------------------------------------------
# The search (pure: the attempt function is passed in)
# ----------------------------------------------------------------------------------------------------------


def search_longest(
    attempt: Callable[[int], str],
    start: int,
    resolution: int,
    max_length: int,
    out_of_time: Callable[[], bool] = lambda: False,
) -> dict:
    """The longest length (a multiple of ``resolution``, at most ``max_length``) for which ``attempt`` returns
    "ok", assuming every length below a success succeeds. ``attempt`` returns "ok", "oom" or another status
    (a failure that is not memory: the search stops there). Returns ``longest`` (None if nothing succeeded),
    ``failed`` (the shortest failure seen above it, None if none), ``complete`` (the two are one resolution
    apart, or the longest is ``max_length``) and ``reason``."""
    if resolution < 1 or max_length < resolution:
        raise ValueError(f"resolution {resolution} and max_length {max_length}: need 1 <= resolution <= max")
    top = max_length // resolution * resolution

    def snap(n: float) -> int:
        return min(top, max(resolution, round(n / resolution) * resolution))

    lo: int | None = None
    hi: int | None = None
    reason = ""
    length = snap(start)
    while True:
        if out_of_time():
            reason = "time budget spent"
            break
        status = attempt(length)
        if status == "ok":
            lo = length
        elif status == "oom":
            hi = length
        else:
            reason = f"attempt at {length} tokens: {status}"
            break
        if lo is not None and hi is not None:
            if hi - lo <= resolution:
                break
            length = (lo + hi) // 2 // resolution * resolution  # > lo: both are multiples, >= 2 apart
        elif lo is not None:
            if lo >= top:
                break
            length = snap(max(lo * 1.25, lo + resolution))
        else:
            if hi <= resolution:
                break
            length = snap(min(hi * 0.8, hi - resolution))
    bracketed = lo is not None and hi is not None and hi - lo <= resolution
    at_top = lo is not None and lo >= top
    none_fit = lo is None and hi is not None and hi <= resolution
    if not reason:
        reason = "reached --max-length" if at_top else "bracketed" if bracketed else "nothing fits"
    return dict(longest=lo, failed=hi, complete=bracketed or at_top or none_fit, reason=reason)


# ----------------------------------------------------------------------------------------------------------
# One attempt (worker process)
# ----------------------------------------------------------------------------------------------------------


def _config(setup: str, opts: dict):
    shape = dict(CONFIGS[setup])
    model_type = shape.pop("model_type")
    if opts["tiny"]:
        shape.update(TINY)
        if "rope_scaling" in shape:
            shape["rope_scaling"] = dict(shape["rope_scaling"], original_max_position_embeddings=64)
    shape["num_hidden_layers"] = opts["layers_run"]
    return bc.causal_lm_config(model_type, shape, max_position_embeddings=opts["max_positions"])


def _builtin_lora(model, r: int, alpha: int, targets: tuple[str, ...], dtype) -> int:
    """LoRA on the frozen linear layers named ``targets`` (when peft is not importable):
    y = base(x) + (alpha / r) * B(A(x)), A and B in ``dtype``, the input cast to it as peft does."""
    from torch import nn

    class LoRALinear(nn.Module):
        def __init__(self, base: nn.Linear):
            super().__init__()
            self.base_layer = base
            kw = dict(bias=False, device=base.weight.device, dtype=dtype)
            self.lora_A = nn.Linear(base.in_features, r, **kw)
            self.lora_B = nn.Linear(r, base.out_features, **kw)
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B.weight)
            self.scaling = alpha / r

        def forward(self, x):
            y = self.base_layer(x)
            return y + self.lora_B(self.lora_A(x.to(dtype))).to(y.dtype) * self.scaling

    count = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if child_name in targets and isinstance(child, nn.Linear):
                setattr(module, child_name, LoRALinear(child))
                count += 1
    return count


def _apply_lora(model, opts: dict):
    """LoRA (``LORA``) on the frozen model; adapters in fp32 (peft's default ``autocast_adapter_dtype``) or,
    with ``--adapter-dtype bf16``, in the base's dtype (no fp32 copy of each adapted layer's input)."""
    import torch

    dtype = torch.float32 if opts["adapter_dtype"] == "fp32" else getattr(torch, opts["dtype"])
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        import peft
    except ImportError:
        n = _builtin_lora(model, LORA["r"], LORA["alpha"], LORA["targets"], dtype)
        return model, f"builtin ({n} layers, {opts['adapter_dtype']} adapters)"
    config = peft.LoraConfig(
        r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0, target_modules=list(LORA["targets"])
    )
    model = peft.get_peft_model(model, config, autocast_adapter_dtype=False)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.to(dtype)
    return model, f"peft {peft.__version__} ({opts['adapter_dtype']} adapters)"


def _liger_kernel_tiled(model) -> int:
    """Bind liger-kernel's LigerTiledSwiGLUMLP forward to every MLP (its weights stay where they are)."""
    import types

    from liger_kernel.transformers import LigerTiledSwiGLUMLP

    count = 0
    for name, m in model.named_modules():
        if name.endswith(".mlp") and all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj")):
            m.num_shards = None  # automatic: ceil(tokens / hidden)
            m._mlp_forward = types.MethodType(LigerTiledSwiGLUMLP._mlp_forward, m)
            m.forward = types.MethodType(LigerTiledSwiGLUMLP.forward, m)
            count += 1
    return count


def worker(setup: str, provider: str, length: int, opts: dict) -> dict:
    import torch

    device = torch.device(opts["device"])
    cuda = device.type == "cuda"
    dtype = getattr(torch, opts["dtype"])
    result = dict(setup=setup, provider=provider, length=length, status="ok")
    if cuda and opts.get("memory_gib"):
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, opts["memory_gib"] * 2**30 / total), device)
    config = _config(setup, opts)
    if provider.startswith("liger_kernel"):
        patch = bc.liger_kernel_patch(config.model_type)
        if isinstance(patch, str):
            return dict(result, status="skipped", error=patch)
        patch()  # class level, before the model is built (its documented usage), its defaults
        result["version"] = bc.dist_version(bc.LIGER_KERNEL_DIST)

    from transformers import AutoModelForCausalLM

    model = bc.build_model(lambda: AutoModelForCausalLM.from_config(config), device, dtype)
    lora = setup.endswith("-lora")
    if lora:
        model, result["lora"] = _apply_lora(model, opts)
    if provider == "liger_kernel_tiled":
        result["tiled_mlps"] = _liger_kernel_tiled(model)
    if provider.startswith("liger_core"):
        import liger_core

        flags = dict(tiled_mlp=True, offload_checkpoints=True) if provider == "liger_core_long" else {}
        report = liger_core.apply_liger_kernel(model, **flags)
        result["version"] = liger_core.__version__
        result["patched"] = dict(report.swapped)
        if report.missing:
            result["missing"] = {k: list(v) for k, v in report.missing.items()}
    bc.enable_training(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    result["trainable_params"] = sum(p.numel() for p in trainable)
    optimizer = torch.optim.AdamW(trainable, lr=1e-5, fused=cuda)
    # the optimizer's states allocated first: the measured step is a steady-state step
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    ballast = _ballast(model, provider, length, opts, device)
    result["ballast_gib"] = ballast[0].numel() / 2**30 if ballast else 0.0
    result["host_ballast_gib"] = ballast[1].numel() / 2**30 if ballast and ballast[1] is not None else 0.0

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (1, length), generator=gen).to(device)

    def step() -> float:
        bc.sync(device)
        start = time.perf_counter()
        loss = bc.train_step(model, optimizer, dict(input_ids=ids, labels=ids))
        result.setdefault("loss", loss.item())
        bc.sync(device)
        return time.perf_counter() - start

    bc.reset_peak_memory(device)
    if provider == "liger_core_long":
        from liger_core import tuning
        from liger_core.modules.long_context import OFFLOAD_COUNTS

        # --tiny: tiles and offloading on the tiny shapes too (the defaults leave inputs this small alone)
        knobs = dict(mlp_tile_tokens=16, checkpoint_offload_min_bytes=0) if opts["tiny"] else {}
        with tuning.override(**knobs):
            first = step()
        result["offloaded"] = OFFLOAD_COUNTS["offloaded"]  # layer inputs kept in host memory, first step
    else:
        first = step()
    timed, which = first, "first"
    if cuda and first < LONG_STEP_S:
        timed, which = step(), "second"  # tiny runs on CPU time the first: their numbers mean nothing
    scale = opts["layers_full"] / opts["layers_run"]
    result.update(
        step_s=timed,
        timed_step=which,
        tokens_per_s=length / timed,
        step_s_projected=timed * scale,
        tokens_per_s_projected=length / (timed * scale),
        host_peak_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    )
    result.update(bc.peak_memory(device))
    return result


def _ballast(model, provider: str, length: int, opts: dict, device):
    """(GPU tensor, host tensor or None) holding what the layers left out by ``--layers`` would
    hold: their parameters (and, if trainable, gradients and the two AdamW states, in the parameter's dtype)
    and their checkpointed inputs (tokens x hidden x 2 bytes each; in host memory for the provider that
    offloads them)."""
    import torch

    missing = opts["layers_full"] - opts["layers_run"]
    if missing <= 0:
        return None
    layer = next(m for n, m in model.named_modules() if re.search(r"layers\.0$", n))
    per_layer = sum(p.numel() * p.element_size() * (4 if p.requires_grad else 1) for p in layer.parameters())
    hidden = model.config.hidden_size if hasattr(model, "config") else opts["hidden"]
    inputs = missing * length * hidden * 2
    offloaded = provider == "liger_core_long"
    gpu_bytes = missing * per_layer + (0 if offloaded else inputs)
    gpu = torch.empty(gpu_bytes, dtype=torch.uint8, device=device)
    host = None
    if offloaded:
        # resident host memory of the same size (not pinned: torch's pinned allocator would round it up to a
        # power of two, which liger_core's own pinned buffers avoid)
        host = torch.zeros(inputs, dtype=torch.uint8)
    return gpu, host


# ----------------------------------------------------------------------------------------------------------
# Parent: searches, results, plot
# ----------------------------------------------------------------------------------------------------------


def _spawn(setup: str, provider: str, length: int, opts: dict, timeout: float) -> dict:
    # --tiny on CPU: the liger providers' Triton kernels in the interpreter
    interpret = opts["device"] == "cpu" and provider != "hf"
    worker = f"{setup}:{provider}:{length}"
    result, proc, wall = bc.spawn_worker(__file__, worker, opts, MARK, max(timeout, 1.0), interpret)
    base = dict(setup=setup, provider=provider, length=length)
    if proc is None:
        return dict(base, status="timeout", error=f"no result within {timeout:.0f} s", wall_s=timeout)
    if result is not None:
        result["wall_s"] = wall
        if result["status"] not in ("ok", "skipped", "oom"):
            result["error"] += "\n" + bc.stderr_tail(proc)
        return result
    status, error = bc.no_result(proc)
    return dict(base, status=status, error=error, wall_s=wall)


def _environment() -> dict:
    import torch

    env = bc.environment(("transformers", "triton", bc.LIGER_KERNEL_DIST, "peft"))
    if torch.cuda.is_available():
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 2)
    try:
        env["host_memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        env["host_memory_gib"] = None
    env["pytorch_cuda_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    return env


def _command(argv: list[str]) -> str:
    """The command line that reproduces this run, without machine paths (--out shown as <dir>)."""
    parts, skip = ["python benchmarks/longest_sequence.py"], False
    for a in argv:
        if skip:
            parts.append("<dir>")
            skip = False
            continue
        parts.append(a)
        skip = a == "--out"
    return " ".join(parts)


VERSION_KEYS = ("python", "torch", "triton", "transformers", "liger_kernel", "peft")
FIELDS = [
    "setup", "provider", "length", "status", "longest", "tokens_per_s", "step_s", "timed_step",
    "tokens_per_s_projected", "step_s_projected", "peak_alloc_gib", "peak_reserved_gib", "host_peak_gib",
    "offloaded", "ballast_gib", "host_ballast_gib", "layers_run", "layers_full", "loss", "lora", "version",
    "wall_s", "error",
]  # fmt: skip


def _plot(rows: list[dict], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot"
    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return "no successful attempt: no plot"
    fig, (ax_speed, ax_mem) = plt.subplots(1, 2, figsize=(13, 4.8))
    for key in dict.fromkeys((r["setup"], r["provider"]) for r in ok):
        pts = sorted((r for r in ok if (r["setup"], r["provider"]) == key), key=lambda r: r["length"])
        xs = [r["length"] / 1024 for r in pts]
        label = f"{key[0]} / {key[1]}"
        projected = any(r.get("layers_run") != r.get("layers_full") for r in pts)
        speed = [r["tokens_per_s_projected" if projected else "tokens_per_s"] for r in pts]
        (line,) = ax_speed.plot(xs, speed, "o-", label=label + (" (projected)" if projected else ""))
        if any("peak_alloc_gib" in r for r in pts):
            ax_mem.plot(xs, [r.get("peak_alloc_gib") for r in pts], "o-", color=line.get_color(), label=label)
        longest = [r for r in pts if r.get("longest")]
        for r in longest:
            ax_speed.plot([r["length"] / 1024], [speed[pts.index(r)]], "*", ms=14, color=line.get_color())
    ax_speed.set(xlabel="sequence length (K tokens)", ylabel="tokens/s (one training step)", xscale="log")
    ax_mem.set(xlabel="sequence length (K tokens)", ylabel="peak GPU memory allocated (GiB)", xscale="log")
    ax_speed.set_title("throughput (star: longest trainable)")
    ax_mem.set_title("peak memory")
    for ax in (ax_speed, ax_mem):
        if ax.get_lines():
            ax.legend(fontsize=7)
    ax_speed.grid(alpha=0.3)
    ax_mem.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _parse_starts(items: list[str], tiny: bool) -> dict[str, int]:
    starts = dict(TINY_STARTS if tiny else STARTS)
    for item in items:
        name, _, value = item.partition("=")
        if name not in PROVIDERS or not value:
            raise SystemExit(f"--start takes PROVIDER=TOKENS with PROVIDER in {PROVIDERS}, got {item!r}")
        starts[name] = int(float(value.rstrip("kK")) * (1024 if value[-1] in "kK" else 1))
    return starts


def _search_pair(
    setup: str,
    provider: str,
    opts: dict,
    start: int,
    resolution: int,
    max_length: int,
    share_end: float,
    rows: list[dict],
    write: Callable[[], None],
) -> dict:
    """One (setup, provider) search: its attempts appended to ``rows`` (results written after each); returns
    the search's summary."""
    attempts: list[dict] = []

    def attempt(length: int) -> str:
        result = _spawn(setup, provider, length, opts, share_end - time.monotonic())
        result.update(layers_run=opts["layers_run"], layers_full=opts["layers_full"])
        attempts.append(result)
        rows.append(result)
        shown = {k: result.get(k) for k in ("status", "tokens_per_s", "peak_alloc_gib", "wall_s")}
        print(f"  {setup} {provider} {length}: {shown}", flush=True)
        if result["status"] not in ("ok", "oom"):
            print(f"    {str(result.get('error', ''))[-1500:]}", flush=True)
        write()
        return result["status"]

    found = search_longest(attempt, start, resolution, max_length, lambda: time.monotonic() >= share_end)
    for r in attempts:
        r["longest"] = r["status"] == "ok" and r["length"] == found["longest"]
    best = next((r for r in attempts if r["longest"]), {})
    projected = opts["layers_run"] != opts["layers_full"]
    return dict(
        found,
        attempts=len(attempts),
        tokens_per_s=best.get("tokens_per_s"),
        tokens_per_s_projected=best.get("tokens_per_s_projected") if projected else None,
        peak_alloc_gib=best.get("peak_alloc_gib"),
        host_peak_gib=best.get("host_peak_gib"),
        layers_run=opts["layers_run"],
        layers_full=opts["layers_full"],
        patched=best.get("patched"),
        lora=best.get("lora"),
        statuses={str(r["length"]): r["status"] for r in attempts},
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", nargs="+", choices=SETUPS, default=["llama8b-lora"])
    parser.add_argument("--providers", nargs="+", choices=PROVIDERS, default=list(PROVIDERS))
    parser.add_argument("--start", nargs="*", default=[], help="PROVIDER=TOKENS (e.g. liger_core_long=384k)")
    parser.add_argument("--resolution", type=int, default=None, help="tokens (default 4096; --tiny 32)")
    parser.add_argument("--max-length", type=int, default=None, help="tokens (default 1048576; --tiny 256)")
    parser.add_argument("--max-minutes", type=float, default=8.0, help="wall-clock budget of the whole run")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers run (the rest as ballast)")
    parser.add_argument("--memory-gib", type=float, default=None, help="cap on the GPU memory used")
    parser.add_argument(
        "--adapter-dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="LoRA adapters' dtype (fp32: peft's default, which casts each adapted layer's input to fp32)",
    )
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test of this script (tiny configs)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default results/<gpu>/)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--opts", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        setup, provider, length = args.worker.split(":")
        base = dict(setup=setup, provider=provider, length=int(length))
        opts = json.loads(args.opts)
        return bc.run_worker_main(
            MARK, base, lambda: worker(setup, provider, int(length), opts), 1500, trace_oom=False
        )

    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        print("longest_sequence: no CUDA device; --tiny runs a CPU smoke test of the script", file=sys.stderr)
        return 2
    resolution = args.resolution or (32 if args.tiny else 4096)
    max_length = args.max_length or (256 if args.tiny else 1 << 20)
    starts = _parse_starts(args.start, args.tiny)
    env = _environment()
    command = _command(argv)
    out = args.out or RESULTS / bc.hardware_folder(env["gpu"] if cuda else None)
    csv_path, meta_path = out / "longest_sequence.csv", out / "longest_sequence.meta.json"
    deadline = time.monotonic() + args.max_minutes * 60
    print(f"longest_sequence: {command}\n  {env}", flush=True)

    # earlier results of other (setup, provider) pairs in the folder are kept
    pairs = [(s, p) for s in args.setups for p in args.providers]
    rows: list[dict] = []
    searches: dict[str, dict] = {}
    if csv_path.exists() and meta_path.exists():
        with open(csv_path) as f:
            rows = [r for r in csv.DictReader(f) if (r["setup"], r["provider"]) not in pairs]
        for r in rows:
            for k in ("length", "layers_run", "layers_full"):
                r[k] = int(r[k]) if r.get(k) else r.get(k)
            for k in ("tokens_per_s", "tokens_per_s_projected", "peak_alloc_gib"):
                r[k] = float(r[k]) if r.get(k) else None
            r["longest"] = r.get("longest") == "True"
        old = json.loads(meta_path.read_text()).get("searches", {})
        searches = {k: v for k, v in old.items() if tuple(k.split("/")) not in pairs}

    def write() -> None:
        out.mkdir(parents=True, exist_ok=True)
        bc.write_csv(csv_path, FIELDS, rows)
        plot = _plot(rows, out / "longest_sequence.png")
        meta = dict(
            hardware=env["gpu"] or "cpu (tiny smoke test)",
            benchmark="longest trainable sequence (batch 1, one training step), bisection per setup/provider",
            date=time.strftime("%Y-%m-%d", time.gmtime()),
            code=env.get("liger_core_commit"),
            versions={k: env.get(k) for k in VERSION_KEYS},
            environment=env,
            command=command,
            options=dict(resolution=resolution, max_length=max_length, starts=starts, layers=args.layers,
                         memory_gib=args.memory_gib, max_minutes=args.max_minutes,
                         adapter_dtype=args.adapter_dtype),
            searches=searches,
            files=[csv_path.name, "longest_sequence.png" if plot.endswith(".png") else plot],
        )  # fmt: skip
        bc.write_json(meta_path, meta, newline=True)

    for index, (setup, provider) in enumerate(pairs):
        layers_full = TINY["num_hidden_layers"] if args.tiny else CONFIGS[setup]["num_hidden_layers"]
        layers_run = min(args.layers or layers_full, layers_full)
        opts = dict(
            device="cuda" if cuda else "cpu",
            dtype="bfloat16" if cuda else "float32",
            tiny=args.tiny,
            layers_full=layers_full,
            layers_run=layers_run,
            max_positions=max(max_length, 8192),
            memory_gib=args.memory_gib,
            adapter_dtype=args.adapter_dtype,
        )
        share_end = time.monotonic() + (deadline - time.monotonic()) / (len(pairs) - index)
        key = f"{setup}/{provider}"
        searches[key] = _search_pair(
            setup, provider, opts, starts[provider], resolution, max_length, share_end, rows, write
        )
        write()
        print(f"{key}: {searches[key]}", flush=True)
    print(f"wrote {csv_path}, {meta_path.name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

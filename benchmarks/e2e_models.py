"""End-to-end training throughput and peak memory of a VLM and a MoE at realistic shapes: Hugging Face eager
vs liger-kernel's patch vs liger_core's, each (model, mode) in its own process.

Models (random weights, bf16 weights, gradients and AdamW states (fused AdamW), gradient checkpointing
(non-reentrant), SDPA attention):
  vlm  Qwen2.5-VL-3B shape, all layers: text vocab 151936, hidden 2048, 36 layers, 16 query / 2 key-value
       heads, intermediate 11008, tied embeddings, M-RoPE (sections 16/24/24, theta 1e6); vision tower as the
       3B checkpoint configures it (32 blocks, hidden 1280, 16 heads, intermediate 3420, patch 14, spatial
       merge 2, window 112, full attention in blocks 7/15/23/31, output 2048). Batch: 4 samples, each one
       448x448 image (32x32 patches -> 256 image tokens) and text, 2048 positions in all; the loss is over the
       text positions (image and vision-marker positions are labelled -100).
  moe  Qwen3-30B-A3B shape, 6 of its 48 layers, to keep a run short and within one H100 (weights, gradients
       and AdamW states 32.5 GiB, each more layer 4.6 GiB; unpatched peak 38.7 GiB on an H200):
       vocab 151936, hidden 2048, 32 query / 4 key-value heads of dim 128, every layer a MoE block of 128
       experts (8 per token, normalised top-k, expert intermediate 768); untied embeddings. Batch 4 x 2048
       tokens; the router's auxiliary loss is off (the loss is the language-model loss alone).
  ``--vlm-layers`` / ``--moe-layers`` change the text layer counts.

Random image pixels and token ids (throughput and memory do not depend on them). The first-step losses of
the modes are a sanity check: same seed, same weights, same batch, so they must agree to bf16 noise (the
summary prints each mode's difference from hf's).

Modes:
  hf            transformers as is (its default experts implementation, recorded in the JSON)
  liger_kernel  liger-kernel's ``apply_liger_kernel_to_qwen2_5_vl()`` / ``apply_liger_kernel_to_qwen3_moe()``
                with its defaults, before the model is built; skipped, with the reason, if not importable
  liger_core    ``liger_core.apply_liger_kernel(model)`` on the built model (defaults); the JSON holds its
                PatchReport (swapped kinds and counts, missing kinds with reasons, skipped)

tokens/s = batch * positions (image tokens included) * timed steps / wall time of those steps (after warm-up,
CUDA-synchronised); peak memory = ``torch.cuda.max_memory_allocated()`` over the warm-up and timed steps
(weights, gradients and optimizer states included), reserved memory alongside.

Usage (GPU machine, repo root; liger-kernel importable for its mode):
    python benchmarks/e2e_models.py [--models vlm moe] [--modes hf liger_kernel liger_core] [--out DIR]
writes ``DIR/e2e_models.csv`` and ``.json`` (environment, options, command, per-mode details); DIR defaults
to ``benchmarks/results/<gpu>/`` (``h100``, ``h200``, ...). Results are rewritten after each mode, so a run
cut short keeps what it measured. On an H200 each mode's process took 20-55 s, except liger_kernel on the MoE:
96 s with Triton's cache warm, over 230 s on a cold one (the per-mode limit, --timeout, is 480 s).
On CPU:  python benchmarks/e2e_models.py --tiny   (tiny shapes, fp32; the liger modes run their Triton
kernels in Triton's interpreter; checks the script end to end, numbers meaningless; writes to
``benchmarks/results/tiny-cpu/``)
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as bc  # noqa: E402  (model building, workers, timing, results)

RESULTS = bc.RESULTS
MODELS = ("vlm", "moe")
MODES = ("hf", "liger_kernel", "liger_core")
MARK = "E2E_RESULT "

# Qwen2.5-VL-3B-Instruct's config.json, in its flat (hub) form: every transformers version reads that form
QWEN2_5_VL_3B = dict(
    bc.QWEN2_5_3B,
    max_position_embeddings=128000,
    mrope_section=[16, 24, 24],
    image_token_id=151655,
    video_token_id=151656,
    vision_start_token_id=151652,
    vision_end_token_id=151653,
    text_vocab=151643,  # random text ids are drawn below the special tokens
    vision_config=dict(
        depth=32,
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        hidden_act="silu",
        in_channels=3,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=112,
        fullatt_block_indexes=[7, 15, 23, 31],
        out_hidden_size=2048,
        tokens_per_second=2,
    ),
)
VLM_TINY = dict(
    QWEN2_5_VL_3B,
    **bc.TINY_TEXT,
    max_position_embeddings=512,
    mrope_section=[2, 3, 3],
    image_token_id=500,
    video_token_id=501,
    vision_start_token_id=502,
    vision_end_token_id=503,
    text_vocab=496,
    vision_config=dict(
        QWEN2_5_VL_3B["vision_config"],
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        fullatt_block_indexes=[1],
        out_hidden_size=64,
    ),
)
# Qwen3-30B-A3B's config.json (layer count cut: --moe-layers)
QWEN3_30B_A3B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=6,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    rope_theta=1000000.0,
    output_router_logits=False,
)
MOE_TINY = dict(
    QWEN3_30B_A3B,
    **bc.TINY_TEXT,
    moe_intermediate_size=32,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=512,
)
FULL_LAYERS = {"vlm": 36, "moe": 48}
# (batch, positions per sample, image side in pixels) by model, GPU and --tiny
BATCH = {"vlm": (4, 2048, 448), "moe": (4, 2048, 0)}
BATCH_TINY = {"vlm": (2, 24, 56), "moe": (2, 16, 0)}


def _vlm_config(shape: dict):
    from transformers import Qwen2_5_VLConfig

    shape = dict(shape)
    shape.pop("text_vocab")
    section = shape.pop("mrope_section")
    theta = shape.pop("rope_theta")
    config = Qwen2_5_VLConfig(
        **shape, rope_scaling={"type": "mrope", "mrope_section": section}, rope_theta=theta
    )
    text = getattr(config, "text_config", config)
    for key in ("hidden_size", "num_hidden_layers", "num_key_value_heads", "vocab_size"):
        if getattr(text, key) != shape[key]:  # a version that reads the flat form differently fails loudly
            raise RuntimeError(f"Qwen2_5_VLConfig: text {key} {getattr(text, key)} != {shape[key]}")
    vision = config.vision_config
    for key in ("depth", "hidden_size", "out_hidden_size"):
        if getattr(vision, key) != shape["vision_config"][key]:
            raise RuntimeError(f"Qwen2_5_VLConfig: vision {key} {getattr(vision, key)}")
    bc.set_rope(text, theta)
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if rope.get("mrope_section") != section:
        raise RuntimeError(f"Qwen2_5_VLConfig: mrope_section not kept ({rope})")
    vision._attn_implementation = "sdpa"
    bc.training_config(text)
    return bc.training_config(config)


def _moe_config(shape: dict):
    return bc.causal_lm_config("qwen3_moe", shape, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _build(model_name: str, shape: dict):
    if model_name == "vlm":
        from transformers import Qwen2_5_VLForConditionalGeneration

        return Qwen2_5_VLForConditionalGeneration(_vlm_config(shape))
    from transformers import Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM(_moe_config(shape))


def _batches(model_name: str, model, shape: dict, opts: dict, device, dtype, n: int) -> list[dict]:
    """``n`` random batches. VLM: each sample is [vision start, image pads, vision end, text...] with one
    image of ``image`` x ``image`` pixels, as the processor lays it out (flattened patches of
    channels x temporal patch x patch x patch values, grid (1, side/patch, side/patch))."""
    import torch

    gen = torch.Generator().manual_seed(1)
    batch, seq = opts["batch"], opts["seq"]
    out = []
    for _ in range(n):
        if model_name == "moe":
            ids = torch.randint(0, shape["vocab_size"], (batch, seq), generator=gen)
            out.append(dict(input_ids=ids.to(device), labels=ids.to(device)))
            continue
        vision = shape["vision_config"]
        grid = opts["image"] // vision["patch_size"]
        n_patches = grid * grid
        n_image_tokens = n_patches // vision["spatial_merge_size"] ** 2
        n_text = seq - n_image_tokens - 2
        if n_text < 1:
            raise ValueError(f"--seq {seq} leaves no text after {n_image_tokens} image tokens")
        text = torch.randint(0, shape["text_vocab"], (batch, n_text), generator=gen)
        image = torch.cat(
            [
                torch.full((batch, 1), shape["vision_start_token_id"]),
                torch.full((batch, n_image_tokens), shape["image_token_id"]),
                torch.full((batch, 1), shape["vision_end_token_id"]),
            ],
            dim=1,
        )
        ids = torch.cat([image, text], dim=1)
        labels = ids.clone()
        labels[:, : n_image_tokens + 2] = -100
        patch_values = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
        pixels = torch.randn(batch * n_patches, patch_values, generator=gen)
        b = dict(
            input_ids=ids.to(device),
            labels=labels.to(device),
            pixel_values=pixels.to(device=device, dtype=dtype),
            image_grid_thw=torch.tensor([[1, grid, grid]] * batch, device=device),
        )
        # transformers >= 5.2x builds M-RoPE positions from the token types; earlier releases from input_ids
        get_rope_index = getattr(getattr(model, "model", model), "get_rope_index", None)
        if get_rope_index is not None and "mm_token_type_ids" in inspect.signature(get_rope_index).parameters:
            types = torch.zeros(batch, seq, dtype=torch.int32)
            types[:, 1 : n_image_tokens + 1] = 1
            b["mm_token_type_ids"] = types.to(device)
        out.append(b)
    return out


def _liger_kernel_patch(model_name: str):
    """liger-kernel's patch function for the model, or the reason it cannot be imported."""
    return bc.liger_kernel_patch("qwen2_5_vl" if model_name == "vlm" else "qwen3_moe")


def setup(model_name: str, mode: str, opts: dict, result: dict):
    """The model of ``model_name`` patched by ``mode`` (hf, liger_kernel, liger_core), with gradient
    checkpointing as ``opts`` asks, its AdamW and two batches; None if liger-kernel is not importable (the
    reason in ``result``, status "skipped"). ``result`` gets the provider's version."""
    import torch

    device = torch.device(opts["device"])
    dtype = getattr(torch, opts["dtype"])
    shape = opts["shape"]
    if mode == "liger_kernel":
        patch = _liger_kernel_patch(model_name)
        if isinstance(patch, str):
            result.update(status="skipped", error=patch)
            return None
        patch()  # class level, before the model is built (its documented usage), its defaults
        result["version"] = bc.dist_version(bc.LIGER_KERNEL_DIST)

    model = bc.build_model(lambda: _build(model_name, shape), device, dtype)
    experts = getattr(model.config, "_experts_implementation", None)
    if model_name == "moe":
        text_config = getattr(model.config, "text_config", model.config)
        result["experts_implementation"] = getattr(text_config, "_experts_implementation", experts)
    report = None
    if mode.startswith("liger_core"):
        import liger_core

        report = liger_core.apply_liger_kernel(model)
        result["version"] = liger_core.__version__
    bc.enable_training(model, opts.get("grad_ckpt", True))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    batches = _batches(model_name, model, shape, opts, device, dtype, 2)
    return model, optimizer, batches, report


def worker(model_name: str, mode: str, opts: dict) -> dict:
    import torch

    device = torch.device(opts["device"])
    result = dict(model=model_name, mode=mode, status="ok")
    built = setup(model_name, mode, opts, result)
    if built is None:
        return result
    model, optimizer, batches, report = built
    if report is not None:
        result["report"] = dict(
            summary=str(report),
            method=report.method,
            swapped=dict(report.swapped),
            missing={k: list(v) for k, v in report.missing.items()},
            skipped=list(report.skipped),
        )
        print(str(report), flush=True)
    bc.reset_peak_memory(device)
    timed = bc.timed_steps(
        lambda b: bc.train_step(model, optimizer, b), batches, opts["warmup"], opts["steps"], device
    )
    result.update(bc.throughput(timed, opts["batch"] * opts["seq"], opts["steps"], model))
    result.update(bc.peak_memory(device))
    return result


def _spawn(model_name: str, mode: str, opts: dict, timeout: float) -> dict:
    # --tiny on CPU: the liger modes' Triton kernels in the interpreter
    interpret = opts["device"] == "cpu" and mode != "hf"
    result, proc, wall = bc.spawn_worker(__file__, f"{model_name}:{mode}", opts, MARK, timeout, interpret)
    if proc is None:
        return dict(model=model_name, mode=mode, status="timeout", error=f"no result within {timeout:.0f} s")
    if result is not None:
        result["wall_s"] = wall
        if result["status"] not in ("ok", "skipped"):
            result["error"] += "\n" + bc.stderr_tail(proc)
        return result
    status, error = bc.no_result(proc)
    return dict(model=model_name, mode=mode, status=status, error=error)


def _command(args) -> str:
    """The command line that reproduces this run, without machine paths (--out shown as <dir> if given)."""
    parts = ["python benchmarks/e2e_models.py"]
    if args.tiny:
        parts.append("--tiny")
    if list(args.models) != list(MODELS):
        parts.append("--models " + " ".join(args.models))
    if list(args.modes) != list(MODES):
        parts.append("--modes " + " ".join(args.modes))
    for flag in ("vlm_layers", "moe_layers", "steps", "warmup", "timeout"):
        value = getattr(args, flag)
        if value is not None:
            parts.append(f"--{flag.replace('_', '-')} {value}")
    if args.no_grad_ckpt:
        parts.append("--no-grad-ckpt")
    if args.out is not None:
        parts.append("--out <dir>")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--vlm-layers", type=int, default=None, help="VLM text layers (default 36, all)")
    parser.add_argument("--moe-layers", type=int, default=None, help="MoE layers (default 6 of 48)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 5; --tiny 1)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; --tiny 1)")
    parser.add_argument("--no-grad-ckpt", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test of this script (tiny shapes)")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per (model, mode) (default 480; --tiny 900)"
    )
    parser.add_argument("--out", type=Path, default=None, help="results folder (default results/<gpu>/)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--opts", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        model_name, mode = args.worker.split(":")
        base = dict(model=model_name, mode=mode)
        return bc.run_worker_main(MARK, base, lambda: worker(model_name, mode, json.loads(args.opts)), 2000)

    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        print(
            "e2e_models: no CUDA device; run with --tiny for a CPU smoke test of the script", file=sys.stderr
        )
        return 2
    env = bc.environment()
    command = _command(args)
    out = args.out or RESULTS / bc.hardware_folder(env["gpu"] if cuda else None)
    timeout = args.timeout or (480 if cuda else 900)
    print(f"e2e_models: {command}\n  {env}", flush=True)
    results, all_opts = [], {}

    def write() -> None:  # after every mode, so a run cut short keeps what it measured
        out.mkdir(parents=True, exist_ok=True)
        fields = ["model", "mode", "status", "tokens_per_s", "step_time_s", "peak_alloc_gib"]
        fields += ["peak_reserved_gib", "first_loss", "last_loss", "params", "version", "wall_s", "error"]
        bc.write_csv(out / "e2e_models.csv", fields, results)
        meta = dict(
            date=time.strftime("%Y-%m-%d"),
            command=command,
            environment=env,
            options=all_opts,
            results=results,
        )
        bc.write_json(out / "e2e_models.json", meta)

    for model_name in args.models:
        shape = dict((QWEN2_5_VL_3B, QWEN3_30B_A3B)[MODELS.index(model_name)] if cuda else
                     (VLM_TINY, MOE_TINY)[MODELS.index(model_name)])  # fmt: skip
        layers = args.vlm_layers if model_name == "vlm" else args.moe_layers
        if layers:
            shape["num_hidden_layers"] = layers
        batch, seq, image = (BATCH if cuda else BATCH_TINY)[model_name]
        opts = dict(
            device="cuda" if cuda else "cpu",
            dtype="bfloat16" if cuda else "float32",
            shape=shape,
            batch=batch,
            seq=seq,
            image=image,
            steps=args.steps or (5 if cuda else 1),
            warmup=args.warmup if args.warmup is not None else (3 if cuda else 1),
            grad_ckpt=not args.no_grad_ckpt,
        )
        all_opts[model_name] = opts
        what = {"vlm": "Qwen2.5-VL-3B shape", "moe": "Qwen3-30B-A3B shape"}[model_name] if cuda else "tiny"
        full = FULL_LAYERS[model_name]
        print(
            f"== {model_name}: {what}, {shape['num_hidden_layers']} text layers"
            f"{f' of {full}' if cuda and shape['num_hidden_layers'] != full else ''}; {opts['dtype']}, "
            f"batch {batch} x {seq} positions{f' (one {image}x{image} image each)' if image else ''}, "
            f"grad checkpointing {opts['grad_ckpt']}, AdamW (fused on CUDA), {opts['warmup']} warm-up + "
            f"{opts['steps']} timed steps",
            flush=True,
        )
        for mode in args.modes:
            result = _spawn(model_name, mode, opts, timeout)
            results.append(result)
            write()
            line = bc.progress_line(result, ("error", "report", "model"))
            print(f"  {mode}: {line}", flush=True)
            if result.get("report"):
                print(f"    {result['report']['summary']}", flush=True)
            if result.get("error"):
                print(f"    {result['status']}: {result['error']}", flush=True)

    print(
        f"\n  {'model':6}{'mode':14}{'status':>9}{'tokens/s':>12}{'peak alloc':>13}{'reserved':>10}"
        f"{'first loss':>12}{'vs hf':>10}"
    )
    for r in results:
        hf = next(
            (h for h in results if h["model"] == r["model"] and h["mode"] == "hf" and "first_loss" in h), None
        )
        tps, alloc, reserved, first = bc.summary_cells(r)
        diff = f"{r['first_loss'] - hf['first_loss']:+.4f}" if hf and "first_loss" in r else "-"
        row = f"  {r['model']:6}{r['mode']:14}{r['status']:>9}{tps:>12}{alloc:>13}{reserved:>10}"
        print(f"{row}{first:>12}{diff:>10}")
    print(f"  wrote {out / 'e2e_models.csv'} and {out / 'e2e_models.json'}")
    failed = [r for r in results if r["status"] not in ("ok", "skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

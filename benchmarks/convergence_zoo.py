"""bf16 convergence on tiny models of the architectures users fine-tune most (VLMs, MoE, hybrids), patched vs
unpatched: do the loss curves agree within bf16 noise?

Each model type is built tiny and random by the zoo test's builder (``tests/patching/zoo.py``: 2 layers,
hidden 32, 4 experts, ...; a VLM runs its text-only forward), then trained three times from the same weights
on the same batches: unpatched in fp32 (the reference curve), unpatched in bf16, and patched
(``apply_liger_kernel``) in bf16. bf16 noise is what the unpatched bf16 run's distance from fp32 shows.
Criterion (as ``benchmarks/convergence.py``): mean |patched - unpatched| over the steps <= 2 x mean
|unpatched bf16 - fp32| (+ 1e-3 for curves that bf16 leaves untouched), and the patched run no further from
fp32 than 1.5 x the unpatched bf16 run (+ 1e-3).

AdamW (lr 1e-3), pure bf16 weights and optimizer states, one fixed batch per step (batch 2 x 16 tokens).

Usage on a GPU machine: ``python benchmarks/convergence_zoo.py --out DIR`` writes
``convergence_zoo_<gpu>.csv`` (step, model, loss per run) and ``.json`` (the summary per model, versions,
command); on CPU ``--cpu --steps 3`` is a smoke test of the script (reference path).
"""

from __future__ import annotations

import argparse
import copy
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as bc  # noqa: E402  (results)

ROOT = bc.ROOT
sys.path.insert(0, str(ROOT / "tests" / "patching"))

DEFAULT_TYPES = (
    "qwen2_5_vl",
    "gemma3",
    "llama4",
    "gpt_oss",
    "deepseek_v3",
    "qwen3_next",
    "qwen3_moe",
    "llama",
)


def _train(model, batches, dtype, device, lr: float) -> list[float]:
    import torch

    model = model.to(device=device, dtype=dtype)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for batch in batches:
        batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
        out = model(**batch)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach().float()))
    return losses


def run_type(model_type: str, steps: int, device: str) -> dict:
    import torch
    import zoo

    import liger_core

    built = zoo.build_tiny(model_type)
    if isinstance(built, str):
        return {"model_type": model_type, "status": f"not built: {built}"}
    torch.manual_seed(0)
    batches = [zoo.make_batch(built) for _ in range(steps)]
    fp32 = _train(copy.deepcopy(built), batches, torch.float32, device, 1e-3)
    bf16 = _train(copy.deepcopy(built), batches, torch.bfloat16, device, 1e-3)
    patched_model = copy.deepcopy(built).to(device=device, dtype=torch.bfloat16)
    report = liger_core.apply_liger_kernel(patched_model)
    patched = _train(patched_model, batches, torch.bfloat16, device, 1e-3)

    def mean_abs(a, b):
        return sum(abs(x - y) for x, y in zip(a, b)) / len(a)

    noise, gap, far = mean_abs(bf16, fp32), mean_abs(patched, bf16), mean_abs(patched, fp32)
    ok = gap <= 2 * noise + 1e-3 and far <= 1.5 * noise + 1e-3
    return {
        "model_type": model_type,
        "status": "ok" if ok else "DIVERGES",
        "kernels": dict(report.swapped),
        "missing": {k: v for k, v in report.missing.items()},
        "bf16_noise": noise,
        "patched_vs_unpatched": gap,
        "patched_vs_fp32": far,
        "losses": {"fp32": fp32, "bf16": bf16, "patched_bf16": patched},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", nargs="+", default=list(DEFAULT_TYPES))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--cpu", action="store_true", help="smoke test on CPU (reference path)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    import torch
    import transformers

    device = "cpu" if args.cpu else "cuda"
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    results = []
    for model_type in args.types:
        start = time.perf_counter()
        try:
            result = run_type(model_type, args.steps, device)
        except Exception as e:  # noqa: BLE001 - one architecture failing is a row of the table, not the end
            result = {"model_type": model_type, "status": f"error: {type(e).__name__}: {str(e)[:200]}"}
        result["seconds"] = round(time.perf_counter() - start, 1)
        results.append(result)
        keep = ("model_type", "status", "bf16_noise", "patched_vs_unpatched", "patched_vs_fp32", "kernels")
        print({k: result[k] for k in keep if k in result}, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"convergence_zoo_{gpu.replace(' ', '_')}"
    with open(args.out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["model_type", "step", "fp32", "bf16", "patched_bf16"])
        for r in results:
            for step, row in enumerate(
                zip(*(r.get("losses", {}).get(k, []) for k in ("fp32", "bf16", "patched_bf16")))
            ):
                writer.writerow([r["model_type"], step, *row])
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": gpu,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": f"python benchmarks/convergence_zoo.py --types {' '.join(args.types)} --steps {args.steps}"
        + (" --cpu" if args.cpu else "")
        + " --out <dir>",
        "results": [{k: v for k, v in r.items() if k != "losses"} for r in results],
    }
    bc.write_json(args.out / f"{stem}.json", meta)
    print(f"{'type':14} {'status':10} {'bf16 noise':>11} {'patched-unpatched':>18} {'patched-fp32':>13}")
    for r in results:
        if "bf16_noise" in r:
            print(
                f"{r['model_type']:14} {r['status']:10} {r['bf16_noise']:11.2e} "
                f"{r['patched_vs_unpatched']:18.2e} {r['patched_vs_fp32']:13.2e}"
            )
        else:
            print(f"{r['model_type']:14} {r['status']}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

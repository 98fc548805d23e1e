"""Collect the per-rank results of benchmarks/multigpu_sft.py runs, check them, write CSV/JSON + a plot, print
a table.

    python benchmarks/multigpu_report.py benchmarks/results/run/multigpu \\
        --runs fsdp2_base fsdp2_liger zero3_base zero3_liger --world-size 2

Checks (exit status 1 when one fails, after writing everything):
- every run in --runs wrote one result per rank (a crashed or missing rank fails);
- for each engine, the loss curve with liger_core agrees with the one without it: at every logged step
  |loss_liger - loss_base| <= --loss-rtol * loss_base (bf16 training: the two runs round differently, so
  the curves drift apart slowly; 3 % over 30 steps is far above that drift and far below any real bug, which
  shows from the first step);
- the same number of steps in both runs.
Outputs in the results folder: summary.csv, summary.json, loss_curves.png (loss per step per engine, and
per-GPU peak memory and tokens/s per run).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path


def load_runs(folder: Path) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*.rank*.json")):
        result = json.loads(path.read_text())
        runs.setdefault(result["run_name"], []).append(result)
    for ranks in runs.values():
        ranks.sort(key=lambda r: r["rank"])
    return runs


def summarize(name: str, ranks: list[dict]) -> dict:
    first = ranks[0]
    peaks = [r["peak_mem_gib"] for r in ranks]
    return {
        "run": name,
        "engine": first["engine"],
        "engine_used": first.get("engine_used"),
        "liger_core": first["use_liger_kernel"],
        "gpus": first["world_size"],
        "device": first["device"],
        "model": first["model"],
        "params_m": first["params_m"],
        "seq_len": first["seq_len"],
        "per_device_batch": first["per_device_batch"],
        "steps": first["steps"],
        "tokens_per_s": first["tokens_per_s"],
        "median_step_s": first["median_step_s"],
        "peak_mem_gib_per_gpu": peaks,
        "peak_mem_gib_max": max(peaks) if None not in peaks else None,
        "first_loss": first["losses"][0] if first["losses"] else None,
        "final_loss": first["losses"][-1] if first["losses"] else None,
        "losses": first["losses"],
        "liger_core_kinds": first["liger_core_kinds"],
        "versions": first["versions"],
    }


def compare_losses(base: dict, liger: dict, rtol: float) -> tuple[list[str], float]:
    problems = []
    a, b = base["losses"], liger["losses"]
    if not a or len(a) != len(b):
        problems.append(f"{base['engine']}: {len(a)} logged losses without liger_core, {len(b)} with it")
        return problems, float("nan")
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    for step, (x, y) in enumerate(zip(a, b), start=1):
        if abs(x - y) > rtol * abs(x):
            problems.append(
                f"{base['engine']}: step {step}: loss {y:.4f} with liger_core vs {x:.4f} without "
                f"(relative difference {abs(x - y) / abs(x):.3%} > {rtol:.1%})"
            )
            break
    return problems, worst


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = sorted({r["engine"] for r in rows})
    fig, axes = plt.subplots(1, len(engines) + 1, figsize=(5 * (len(engines) + 1), 4))
    for ax, engine in zip(axes, engines):
        for r in rows:
            if r["engine"] == engine:
                label = "liger_core" if r["liger_core"] else "HF (no liger)"
                ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=label, lw=1.5)
        ax.set_title(f"{engine}: training loss")
        ax.set_xlabel("step")
        ax.legend()
    ax = axes[-1]
    names = [r["run"] for r in rows]
    mem = [r["peak_mem_gib_max"] or 0 for r in rows]
    bars = ax.bar(names, mem, color=["tab:orange" if r["liger_core"] else "tab:blue" for r in rows])
    for bar, r in zip(bars, rows):
        ax.annotate(
            f"{r['tokens_per_s']:,} tok/s",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylabel("peak GPU memory per GPU (GiB)")
    ax.set_title("peak memory (max over GPUs), tokens/s")
    ax.tick_params(axis="x", rotation=20)
    device = rows[0]["device"]
    fig.suptitle(f"{rows[0]['model']}, {rows[0]['gpus']} x {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--runs", nargs="+", required=True, help="run names: <engine>_base / <engine>_liger")
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--loss-rtol", type=float, default=0.03)
    args = parser.parse_args(argv)

    runs = load_runs(args.folder)
    problems: list[str] = []
    rows = []
    for name in args.runs:
        ranks = runs.get(name, [])
        if len(ranks) != args.world_size:
            problems.append(f"{name}: {len(ranks)} of {args.world_size} ranks wrote results")
            continue
        rows.append(summarize(name, ranks))
    by_name = {r["run"]: r for r in rows}
    agreement = {}
    for engine in sorted({name.rsplit("_", 1)[0] for name in args.runs}):
        base, liger = by_name.get(f"{engine}_base"), by_name.get(f"{engine}_liger")
        if base and liger:
            found, worst = compare_losses(base, liger, args.loss_rtol)
            problems += found
            agreement[engine] = worst

    if rows:
        fields = [k for k in rows[0] if k not in ("losses", "versions", "liger_core_kinds")]
        with open(args.folder / "summary.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            for r in rows:
                writer.writerow({**r, "peak_mem_gib_per_gpu": " ".join(map(str, r["peak_mem_gib_per_gpu"]))})
        summary = {"runs": rows, "max_relative_loss_difference": agreement, "problems": problems}
        (args.folder / "summary.json").write_text(json.dumps(summary, indent=1))
        try:
            plot(rows, args.folder / "loss_curves.png")
        except Exception as e:  # noqa: BLE001 - a missing matplotlib must not hide the table
            print(f"(no plot: {type(e).__name__}: {e})")

        print(
            f"\n{rows[0]['model']}, {rows[0]['gpus']} x {rows[0]['device']}, seq {rows[0]['seq_len']}, "
            f"batch {rows[0]['per_device_batch']}/GPU, {rows[0]['steps']} steps"
        )
        header = f"{'run':<14}{'wrapped by':>24}{'tokens/s':>10}{'step s':>9}{'peak GiB/GPU':>16}"
        header += f"{'loss 1st':>10}{'loss last':>10}"
        print(header)
        print("-" * len(header))
        for r in rows:
            peaks = "/".join(f"{p:.1f}" for p in r["peak_mem_gib_per_gpu"] if p is not None) or "-"
            print(
                f"{r['run']:<14}{str(r['engine_used']):>24}{r['tokens_per_s']:>10,}{r['median_step_s']:>9.3f}{peaks:>16}"
                f"{r['first_loss']:>10.4f}{r['final_loss']:>10.4f}"
            )
        for engine, worst in agreement.items():
            base, liger = by_name[f"{engine}_base"], by_name[f"{engine}_liger"]
            speed = liger["tokens_per_s"] / base["tokens_per_s"]
            mem = (
                f", peak memory {liger['peak_mem_gib_max']:.1f} vs {base['peak_mem_gib_max']:.1f} GiB"
                if base["peak_mem_gib_max"]
                else ""
            )
            print(
                f"{engine}: liger_core/HF tokens/s x{speed:.2f}{mem}; "
                f"max relative loss difference {worst:.3%}"
            )
    for p in problems:
        print(f"FAIL: {p}")
    print("multigpu report:", "FAILED" if problems else "OK", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""PNG plots of benchmark rows (matplotlib, imported when plotting)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from liger_core.harness.registry import OPS
from liger_core.harness.report import MODES, PROVIDERS, as_number

# ------------------------------------------------------------------------------------------------------------
# Plots
# ------------------------------------------------------------------------------------------------------------

_COLORS = {"liger_core": "#d62728", "torch": "#7f7f7f", "torch.compile": "#1f77b4", "liger_kernel": "#ff7f0e",
           "cce": "#2ca02c"}  # fmt: skip


def plot_results(rows: Sequence[dict], out_dir: Path, prefix: str) -> list[Path]:
    """PNG plots: time per op grouped by provider (fwd and fwd+bwd), % of floor, and peak extra memory; for a
    sweep (several shapes per op), % of floor against shape per op. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    cases: dict[tuple[str, str], dict[str, dict[str, dict]]] = {}
    for r in rows:
        cases.setdefault((r["op"], r["shape"]), {}).setdefault(r["provider"], {})[r["mode"]] = r
    providers = [p for p in PROVIDERS if any(p in c for c in cases.values())]
    ops = list(dict.fromkeys(op for op, _ in cases))
    written = []
    width = 0.8 / max(1, len(providers))
    n_shapes = max((sum(1 for o, _ in cases if o == op) for op in ops), default=0)

    if not any(as_number(r.get("ms")) is not None for r in rows):
        return written  # nothing was timed (a dry run's CSV): no plot rather than empty axes
    if n_shapes <= 1:
        # 1) time per op: one panel per op, groups = modes, bars = providers, floor as a dashed segment
        n = len(cases)
        cols = min(4, max(1, n))
        rows_n = max(1, math.ceil(n / cols))
        fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 3.6 * rows_n), squeeze=False)
        for ax, ((op, shape), by_p) in zip(axes.flat, cases.items()):
            for j, p in enumerate(providers):
                ys = [as_number(by_p.get(p, {}).get(m, {}).get("ms")) for m in MODES]
                xs = [i + (j - (len(providers) - 1) / 2) * width for i in range(len(MODES))]
                ax.bar(xs, [y if y is not None else 0 for y in ys], width, label=p, color=_COLORS.get(p))
            for i, m in enumerate(MODES):
                fl = next((as_number(r.get(m, {}).get("floor_ms")) for r in by_p.values() if m in r), None)
                if fl:
                    ax.hlines(fl, i - 0.45, i + 0.45, colors="k", linestyles="dashed", linewidth=1)
            ax.set_xticks(range(len(MODES)), MODES)
            ax.set_title(f"{OPS[op].title if op in OPS else op}\n{shape}", fontsize=9)
            ax.set_ylabel("ms (median)")
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7, framealpha=0.6)
        fig.suptitle(f"{prefix}: time per op (dashed: bandwidth/FLOP floor)")
        fig.tight_layout()
        written.append(_save(fig, out_dir / f"{prefix}_time.png"))

        # 2) % of floor and 3) peak extra memory, fwd+bwd, op on the x axis
        for key, ylabel, fname in (
            ("pct_of_floor", "% of floor (fwd+bwd)", "floor"),
            ("gpu_pct_of_floor", "% of floor, GPU time (CUDA-graph replay, fwd+bwd)", "gpu_floor"),
            ("peak_extra_gib", "peak extra memory, GiB (fwd+bwd)", "memory"),
        ):
            if not any(r.get(key) not in (None, "") for r in rows):
                continue  # e.g. a CSV from before the GPU-time column
            fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cases)), 4))
            for j, p in enumerate(providers):
                ys = [as_number(by_p.get(p, {}).get("fwd+bwd", {}).get(key)) for by_p in cases.values()]
                xs = [i + (j - (len(providers) - 1) / 2) * width for i in range(len(cases))]
                ax.bar(xs, [y if y is not None else 0 for y in ys], width, label=p, color=_COLORS.get(p))
            if key.endswith("pct_of_floor"):
                ax.axhline(100, color="k", linestyle="dashed", linewidth=1)
            ax.set_xticks(range(len(cases)), [OPS[o].title if o in OPS else o for o, _ in cases], rotation=20)
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
            ax.set_title(prefix)
            fig.tight_layout()
            written.append(_save(fig, out_dir / f"{prefix}_{fname}.png"))
    else:
        # sweep: per op, against shape, one line per provider: % of floor, and time / liger_core's time
        def value(op, shape, p, key):
            r = cases[(op, shape)].get(p, {}).get("fwd+bwd", {})
            v = as_number(r.get(key))
            if key in ("ms", "gpu_ms") and v is not None:
                ours = as_number(cases[(op, shape)].get("liger_core", {}).get("fwd+bwd", {}).get(key))
                v = v / ours if ours else None
            return v if v is not None else math.nan

        for key, ylabel, line, fname in (
            ("pct_of_floor", "% of floor (fwd+bwd)", 100.0, "floor"),
            ("gpu_pct_of_floor", "% of floor, GPU time (CUDA-graph replay, fwd+bwd)", 100.0, "gpu_floor"),
            ("ms", "time / liger_core time (fwd+bwd; > 1: slower)", 1.0, "relative"),
            # the kernels alone: at small shapes ``ms`` is the host's time per call, not the GPU's
            (
                "gpu_ms",
                "GPU time / liger_core GPU time (fwd+bwd; > 1: slower)",
                1.0,
                "gpu_relative",
            ),
        ):
            # the ops that have this column (a merged sweep may hold rows measured before it existed)
            ops_k = [op for op in ops if any(r.get(key) not in (None, "") for r in rows if r["op"] == op)]
            if not ops_k:
                continue
            cols = min(3, len(ops_k))
            rows_n = math.ceil(len(ops_k) / cols)
            fig, axes = plt.subplots(rows_n, cols, figsize=(6.5 * cols, 4.2 * rows_n), squeeze=False)
            for ax, op in zip(axes.flat, ops_k):
                shapes = [sh for o, sh in cases if o == op]
                for p in providers:
                    ys = [value(op, sh, p, key) for sh in shapes]
                    ax.plot(range(len(shapes)), ys, "o-", label=p, color=_COLORS.get(p), markersize=3)
                ax.axhline(line, color="k", linestyle="dashed", linewidth=1)
                if key in ("ms", "gpu_ms"):
                    ax.set_yscale("log")
                ax.set_xticks(range(len(shapes)), shapes, rotation=60, fontsize=6, ha="right")
                ax.set_ylabel(ylabel)
                ax.set_title(OPS[op].title if op in OPS else op)
            for ax in list(axes.flat)[len(ops_k) :]:
                ax.axis("off")
            axes.flat[0].legend(fontsize=7, framealpha=0.6)
            fig.suptitle(f"{prefix}: {ylabel} per shape")
            fig.tight_layout()
            written.append(_save(fig, out_dir / f"{prefix}_{fname}.png"))
    plt.close("all")
    return written


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")  # legends placed outside the axes are kept whole
    return path

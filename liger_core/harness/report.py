"""Benchmark output: the CSV sink (rows flushed one by one), the short table, the peer-wins list."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from liger_core.harness.registry import OPS

MODES = ("fwd", "fwd+bwd")
PROVIDERS = ("torch", "liger_core", "torch.compile", "liger_kernel", "cce")
CSV_COLUMNS = (
    "gpu", "op", "shape", "dtype", "mode", "provider", "ms", "ms_p20", "ms_p80", "timer", "gpu_ms",
    "gpu_timer", "gpu_pct_of_floor", "peak_extra_gib",
    "floor_ms", "floor_basis", "pct_of_floor", "rel_err", "eager_rel_err", "ref_dtype", "check",
    "worst_output",
    "writes_inputs", "error",
)  # fmt: skip


class CsvSink:
    """Rows are appended and flushed one by one, so a run cut off by a time limit keeps what it measured."""

    def __init__(self, path: Path | None, append: bool = False):
        self.path, self.rows = path, []
        if path is not None and not (append and path.exists()):
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", newline="") as f:
                csv.writer(f).writerow(CSV_COLUMNS)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self.path is not None:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, CSV_COLUMNS).writerow({k: _fmt(row.get(k)) for k in CSV_COLUMNS})


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return str(v)


def print_table(rows: Sequence[dict], log: Callable[[str], None] = print) -> None:
    """Short table: one line per (op, shape, provider); fwd and fwd+bwd side by side."""
    groups: dict[tuple, dict[str, dict[str, dict]]] = {}
    for r in rows:
        groups.setdefault((r["op"], r["shape"], r.get("dtype", "")), {}).setdefault(r["provider"], {})[
            r["mode"]
        ] = r
    head = (
        f"{'op':<14} {'shape':<26} {'provider':<14} {'fwd ms':>9} {'f+b ms':>9} {'f+b GiB':>8} {'%floor':>7}"
        f" {'f+b GPU':>9} {'%floor':>7}  check"
    )
    log(head)
    log("-" * len(head))
    for (op, shape, _dtype), by_provider in groups.items():
        floor_f = floor_fb = None
        for modes in by_provider.values():
            floor_f = floor_f or as_number(modes.get("fwd", {}).get("floor_ms"))
            floor_fb = floor_fb or as_number(modes.get("fwd+bwd", {}).get("floor_ms"))
        title = OPS[op].title if op in OPS else op
        log(f"{title:<14} {shape:<26} {'floor':<14} {_cell(floor_f)} {_cell(floor_fb)}")
        for provider, modes in by_provider.items():
            f, fb = modes.get("fwd", {}), modes.get("fwd+bwd", {})
            any_row = fb or f
            pct = as_number(fb.get("pct_of_floor"))
            check = any_row.get("check") or ""
            err = fb.get("error") or f.get("error")
            mem = as_number(fb.get("peak_extra_gib"))
            gpu = as_number(fb.get("gpu_ms"))
            gpu_pct = 100 * floor_fb / gpu if gpu and floor_fb else None
            log(
                f"{'':<14} {'':<26} {provider:<14} "
                f"{_cell(as_number(f.get('ms')))} {_cell(as_number(fb.get('ms')))} "
                f"{(f'{mem:8.3f}' if mem is not None else ' ' * 8)} {(f'{pct:6.1f}%' if pct else ' ' * 7)} "
                f"{_cell(gpu)} {(f'{gpu_pct:6.1f}%' if gpu_pct else ' ' * 7)}  "
                f"{check}{'  ' + err[:60] if err else ''}"
            )


def peer_wins(rows: Sequence[dict]) -> list[str]:
    """Cases where a peer (or eager/compiled torch) is faster than liger_core, or leaner in fwd+bwd memory.
    Each speed line also gives both GPU times (CUDA-graph replay) where measured, so a host-bound case
    (``ms`` far above the GPU time) is told apart from a slower kernel."""
    by_case: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by_case.setdefault((r["op"], r["shape"], r["mode"]), {})[r["provider"]] = r
    out = []
    for (op, shape, mode), by_p in by_case.items():
        ours = by_p.get("liger_core", {})
        ms, mem = as_number(ours.get("ms")), as_number(ours.get("peak_extra_gib"))
        if ms is None:
            continue
        for p, r in by_p.items():
            pms, pmem = as_number(r.get("ms")), as_number(r.get("peak_extra_gib"))
            if p == "liger_core" or pms is None:
                continue
            gpu, pgpu = as_number(ours.get("gpu_ms")), as_number(r.get("gpu_ms"))
            both_gpu = gpu is not None and pgpu is not None
            gpu_note = f"; GPU time {pgpu:.4g} vs {gpu:.4g} ms" if both_gpu else ""
            if pms < ms:
                out.append(
                    f"{op} {shape} {mode}: {p} {100 * (ms / pms - 1):.1f}% faster ({pms:.4g} vs {ms:.4g} ms"
                    f"{gpu_note})"
                )
            elif both_gpu and pgpu < gpu:
                out.append(
                    f"{op} {shape} {mode}: {p} {100 * (gpu / pgpu - 1):.1f}% faster in GPU time "
                    f"({pgpu:.4g} vs {gpu:.4g} ms; wall {pms:.4g} vs {ms:.4g})"
                )
            if mode == "fwd+bwd" and mem is not None and pmem is not None and pmem < mem - 1e-3:
                out.append(f"{op} {shape} {mode}: {p} leaner ({pmem:.3g} GiB vs {mem:.3g} GiB)")
    return out


def as_number(v) -> float | None:
    if v is None or v == "":
        return None
    v = float(v)
    return None if math.isnan(v) else v


def _cell(v: float | None) -> str:
    return f"{v:9.4f}" if v is not None else " " * 9


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))

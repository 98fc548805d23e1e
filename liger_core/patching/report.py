"""What a patch call did: ``PatchReport`` (returned, logged once per call), ``UnsupportedModelError``."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

logger = logging.getLogger("liger_core")

KINDS = ("rms_norm", "layer_norm", "swiglu", "geglu", "rope", "cross_entropy", "fused_linear_cross_entropy")


class UnsupportedModelError(ValueError):
    """Nothing in the model could be patched and its ``model_type`` has no recipe."""


@dataclass
class PatchReport:
    """``swapped``: kind -> number of modules (instance patching) or classes/functions (class-level patching)
    swapped by this call. ``already``: kind -> number found already patched (a second call swaps nothing and
    says so here). ``skipped``: human-readable reasons for what was left as it was. ``method``: "recipe",
    "structural" or "class". ``bool(report)``: anything swapped by this call."""

    model_type: str
    swapped: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    already: dict[str, int] = field(default_factory=dict)
    method: str = "recipe"

    def __bool__(self) -> bool:
        return any(self.swapped.values())

    def count(self, kind: str, n: int = 1) -> None:
        self.swapped[kind] = self.swapped.get(kind, 0) + n

    def count_already(self, kind: str, n: int = 1) -> None:
        self.already[kind] = self.already.get(kind, 0) + n

    def skip(self, reason: str) -> None:
        if reason not in self.skipped:
            self.skipped.append(reason)

    @staticmethod
    def _fmt(counts: dict[str, int]) -> str:
        ordered = sorted(
            counts.items(), key=lambda kv: (KINDS.index(kv[0]) if kv[0] in KINDS else len(KINDS), kv[0])
        )
        return ", ".join(f"{k} x{v}" for k, v in ordered if v)

    def __str__(self) -> str:
        how = {"structural": " (structural)", "class": " (class-level)"}.get(self.method, "")
        parts = [f"liger_core: patched {self.model_type}{how}: {self._fmt(self.swapped) or 'nothing new'}"]
        if any(self.already.values()):
            parts.append(f"already patched: {self._fmt(self.already)}")
        if self.skipped:
            parts.append(f"skipped: {'; '.join(self.skipped)}")
        return " | ".join(parts)


def summarize_reasons(reasons: list[str]) -> list[str]:
    """Collapse repeated per-module reasons ("model.layers.3.mlp: ...") into one line each with a count."""
    counts = Counter(reasons)
    return [r if n == 1 else f"{r} (x{n})" for r, n in counts.items()]

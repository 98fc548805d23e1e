"""What a patch call did: ``PatchReport`` (returned, logged once per call), and the errors patching raises."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

logger = logging.getLogger("liger_core")

KINDS = (
    "rms_norm",
    "rms_norm_gated",
    "layer_norm",
    "swiglu",
    "geglu",
    "relu_squared",
    "moe_experts",
    "rope",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "tiled_mlp",
    "offload_checkpoints",
)


class UnsupportedModelError(ValueError):
    """Nothing in the model could be patched and its ``model_type`` has no recipe."""


class PatchIncompleteError(RuntimeError):
    """``strict=True``: a kernel the model could use was not applied (``report.missing`` says which and why).

    Patching raises it after undoing the call's own swaps (``undone=True``), so the model is as it was before
    the call. A plugin that finds a miss later (an adapter added on lm_head after patching) raises it with
    ``undone=False``: then what was patched stays patched, and the message says so.
    """

    def __init__(self, report: PatchReport, *, undone: bool = True):
        self.report = report
        self.undone = undone
        missing = "; ".join(f"{kind}: {', '.join(reasons)}" for kind, reasons in report.missing.items())
        state = "this call's swaps were undone" if undone else "the kernels that were applied stay applied"
        super().__init__(
            f"liger_core: strict patching of {report.model_type} left kernels out ({missing}); {state}. "
            "Fix the cause, turn those kernels off by name, or patch without strict."
        )

    @classmethod
    def one_kernel(
        cls, owner: str, kind: str, reason: str, message: str, *, undone: bool = True
    ) -> PatchIncompleteError:
        """The error for one kernel a plugin finds it cannot apply: its report (``model_type`` ``owner``)
        misses ``kind`` for ``reason``; ``message`` is the plugin's own text, which names its setting."""
        report = PatchReport(model_type=owner)
        report.miss(kind, reason)
        error = cls(report, undone=undone)
        error.args = (message,)
        return error


@dataclass
class PatchReport:
    """What one patch call did.

    - ``swapped``: kind -> number of modules (instance patching) or classes/functions (class-level patching)
      swapped by this call.
    - ``already``: kind -> number found already patched (a second call swaps nothing and says so here).
    - ``missing``: kind -> reasons, for each kernel that was asked for (its flag on) and that the model could
      use (the recipe names it, or a module has its structure) but did not get. ``strict=True`` raises
      ``PatchIncompleteError`` when this is not empty.
    - ``skipped``: what was deliberately left as it was (a recipe's notes, modules no kernel covers).
    - ``modules``: qualified module name -> the kind patched into it ("" for the model itself).
    - ``method``: "recipe", "structural" or "class". ``bool(report)``: anything swapped by this call.
    """

    model_type: str
    swapped: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    already: dict[str, int] = field(default_factory=dict)
    method: str = "recipe"
    missing: dict[str, list[str]] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.swapped.values())

    def count(self, kind: str, n: int = 1) -> None:
        self.swapped[kind] = self.swapped.get(kind, 0) + n

    def count_already(self, kind: str, n: int = 1) -> None:
        self.already[kind] = self.already.get(kind, 0) + n

    def skip(self, reason: str) -> None:
        if reason not in self.skipped:
            self.skipped.append(reason)

    def miss(self, kind: str, reason: str) -> None:
        """``kind`` was asked for and the model could use it, but it was not applied, because ``reason``."""
        reasons = self.missing.setdefault(kind, [])
        if reason not in reasons:
            reasons.append(reason)

    @property
    def kinds(self) -> set[str]:
        """Every kind the model now runs, swapped by this call or found already patched."""
        return {k for k, n in self.swapped.items() if n} | {k for k, n in self.already.items() if n}

    def active_kernels(self) -> str:
        """The kernels the model runs after this call, with their counts (swapped now plus found already
        patched), by kind in alphabetical order: "rms_norm x5, rope x2"; "none" when there is none."""
        total = {k: self.swapped.get(k, 0) + self.already.get(k, 0) for k in {*self.swapped, *self.already}}
        return ", ".join(f"{kind} x{n}" for kind, n in sorted(total.items()) if n) or "none"

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
        if self.missing:
            missing = "; ".join(f"{k} ({', '.join(r)})" for k, r in self.missing.items())
            parts.append(f"NOT applied: {missing}")
        if self.skipped:
            parts.append(f"skipped: {'; '.join(self.skipped)}")
        return " | ".join(parts)


@dataclass
class RevertReport:
    """What ``liger_core.revert(model)`` undid (returned; earlier releases returned None).

    - ``restored``: kind -> number of modules given back their original forward (or loss function).
    - ``modules``: qualified module name -> the kind removed from it ("" for the model itself).
    - ``still_patched``: kind -> number of modules that still run a liger_core forward after the revert:
      modules built from classes that class-level patching replaced (``apply_liger_kernel_to_<type>``,
      ``AutoLigerKernelForCausalLM`` for a type with a recipe). ``revert`` cannot change a module's class;
      ``revert_model_type(model_type)`` and rebuilding the model removes those.
    ``bool(report)``: anything restored.
    """

    model_type: str
    restored: dict[str, int] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)
    still_patched: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.restored.values())

    def __str__(self) -> str:
        done = PatchReport._fmt(self.restored)
        if done:
            parts = [f"liger_core: reverted {self.model_type}: {done}"]
        else:
            parts = [f"liger_core: nothing to revert on {self.model_type} (no apply_liger_kernel swap on it)"]
        still = PatchReport._fmt(self.still_patched)
        if still:
            parts.append(
                f"still running liger_core forwards from class-level patching: {still} "
                f"(revert_model_type({self.model_type!r}) and rebuild the model to remove them)"
            )
        return " | ".join(parts)


def summarize_reasons(reasons: list[str]) -> list[str]:
    """Collapse repeated per-module reasons ("model.layers.3.mlp: ...") into one line each with a count."""
    counts = Counter(reasons)
    return [r if n == 1 else f"{r} (x{n})" for r, n in counts.items()]

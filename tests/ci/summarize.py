"""One line per test suite from pytest's JUnit XML report, and the checks that keep a suite from passing
silently: pytest's exit code 5 (no tests collected), a report with no test run, and skips whose reason is not
one a CPU-only CI has (the table below). tests/run_all.sh calls it after each suite.

    python3 tests/ci/summarize.py <suite> <junit.xml> <pytest exit code>

Prints e.g. ``core: 597 passed, 371 skipped (356: no CUDA; 15: zoo: no text-only training step)`` (explained
skips counted under their label, see the table) and exits 1 when one of the checks fails (each problem on
stderr), else 0. The pytest exit code itself decides nothing else: tests/run_all.sh fails a suite on any
non-zero code.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

# Skip reasons a CPU-only CI has: a pattern of the reason pytest reports, the label the summary counts it
# under, why CI cannot run such a test, and the suites where the reason holds (None: every suite). A skip
# with any other reason fails the suite: either the CI should install what the test needs, or the reason
# belongs here with its explanation.
EXPLAINED_SKIPS = [
    (r"no CUDA", "no CUDA", "needs a CUDA GPU (runs on the GPU machine: pytest -m gpu)", None),
    (
        r"zoo: no text-only training step: .+",
        "zoo: no text-only training step",
        "tests/patching/test_zoo.py trains every model type on text alone; these types cannot (they need "
        "pixel values, states or encoder outputs, or return no loss for labels)",
        None,
    ),
    (
        r"zoo: cannot be built on CPU: needs timm, which is not installed",
        "zoo: needs timm",
        "timm needs torchvision, and PyPI's torchvision for torch 2.13 is a CUDA build that does not load "
        "beside the CPU torch (operator torchvision::nms does not exist)",
        None,
    ),
    (
        r"could not import 'transformers\.models\.[\w.]+': No module named .+",
        "model not in this transformers",
        "the oldest supported transformers predates the model (pytest.importorskip of its module); in the "
        "newest one a missing model module is a failure",
        ("core-oldest",),
    ),
    (
        r"transformers 5\.0\.0 cannot build or train a tiny dbrx: .+",
        "DBRX broken in this transformers",
        "transformers 5.0.0's DBRX fails on its own config's round trip and in its experts' shapes; in the "
        "newest release the tiny DBRX must build and train",
        ("core-oldest",),
    ),
    (
        r"TRL \S+ has the fused LM head: covered by the 2-step run",
        "TRL has the fused LM head",
        "Axolotl: the branch for TRL without a fused LM head; with a newer TRL the 2-step DPO run covers it",
        None,
    ),
]


def label(reason: str, suite: str) -> str | None:
    """The summary label of a skip reason explained for ``suite``, None for any other reason."""
    for pattern, name, _why, suites in EXPLAINED_SKIPS:
        if re.fullmatch(pattern, reason) and (suites is None or suite in suites):
            return name
    return None


def outcomes(report: Path) -> tuple[Counter, Counter]:
    """(count per outcome, count per skip reason) of the report's test cases."""
    counts: Counter = Counter()
    skips: Counter = Counter()
    for case in ET.parse(report).getroot().iter("testcase"):
        if case.find("failure") is not None:
            counts["failed"] += 1
        elif case.find("error") is not None:
            counts["error"] += 1
        elif (skipped := case.find("skipped")) is not None:
            if skipped.get("type") == "pytest.xfail":
                counts["xfailed"] += 1
            else:
                counts["skipped"] += 1
                skips[skipped.get("message", "").strip()] += 1
        else:
            counts["passed"] += 1
    return counts, skips


def main(argv: list[str]) -> int:
    suite, report, rc = argv[0], Path(argv[1]), int(argv[2])
    problems = []
    if rc == 5:
        problems.append("pytest collected no tests (exit code 5)")
    if not report.is_file():
        print(f"{suite}: no test report (exit code {rc})")
        problems.append(f"pytest wrote no report at {report}")
    else:
        counts, skips = outcomes(report)
        parts = [f"{counts['passed']} passed"]
        if counts["skipped"]:
            grouped: Counter = Counter()
            for reason, n in skips.items():
                grouped[label(reason, suite) or reason] += n
            reasons = "; ".join(f"{n}: {reason}" for reason, n in grouped.most_common())
            parts.append(f"{counts['skipped']} skipped ({reasons})")
        parts += [f"{counts[k]} {k}" for k in ("xfailed", "failed", "error") if counts[k]]
        print(f"{suite}: {', '.join(parts)}" + (f" [pytest exit code {rc}]" if rc else ""))
        if counts["passed"] + counts["failed"] + counts["error"] == 0:
            problems.append("no test ran")
        unexplained = [reason for reason in skips if label(reason, suite) is None]
        if unexplained:
            problems.append(
                "skipped for reasons a CPU-only CI does not have (install what the tests need, or explain "
                "the reason in tests/ci/summarize.py): " + "; ".join(unexplained)
            )
    for problem in problems:
        print(f"ERROR: {suite}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The core test files that use transformers or peft: those that import them (or ``pytest.importorskip``
them), and those that import a helper module of tests/ that does (tests/patching's tiny models), except the
files in ``NEWEST_ONLY``.

    python3 tests/ci/transformers_tests.py     -> one path per line, relative to the repository

tests/run_all.sh runs these on the oldest transformers/peft that pyproject.toml allows (target core-oldest).
Exits 1 when it finds none.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
USES_HF = re.compile(
    r"^\s*(?:from|import)\s+(?:transformers|peft)\b|importorskip\(\s*[\"'](?:transformers|peft)[\"']", re.M
)


# The model zoo builds every model type of the installed transformers from shrunk configs: it is the
# coverage of the newest release (the core suite), and its shrinking follows that release's configs.
NEWEST_ONLY = {"test_zoo.py"}


def main() -> int:
    sources = {path: path.read_text() for path in sorted((ROOT / "tests").rglob("*.py"))}
    helpers = {p.stem for p, text in sources.items() if p.name[:5] != "test_" and USES_HF.search(text)}
    uses_helper = re.compile(rf"^\s*(?:from|import)\s+(?:{'|'.join(map(re.escape, helpers))})\b", re.M)
    tests = [
        path.relative_to(ROOT)
        for path, text in sources.items()
        if path.name.startswith("test_")
        and path.name not in NEWEST_ONLY
        and (USES_HF.search(text) or (helpers and uses_helper.search(text)))
    ]
    if not tests:
        print("ERROR: no test file under tests/ uses transformers or peft", file=sys.stderr)
        return 1
    print("\n".join(map(str, tests)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The oldest releases pyproject.toml allows, as pip pins: the floors (``>=``) of the ``dev`` extra.

    python3 tests/ci/floors.py transformers peft      ->  transformers==5.0 peft==0.18

tests/run_all.sh installs these in its ``core-oldest`` venv, so the floors it tests are the ones pyproject
states. Exits 1 when a package has no ``>=`` floor there.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the copy of tomli that pip vendors
    from pip._vendor import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def floor(requirements: list[str], name: str) -> str | None:
    for requirement in requirements:
        match = re.fullmatch(rf"{re.escape(name)}\s*(\[[^\]]*\])?\s*(?P<spec>[^;]*)", requirement.strip())
        if match:
            for clause in match["spec"].split(","):
                if clause.strip().startswith(">="):
                    return clause.strip()[2:].strip()
    return None


def main(names: list[str]) -> int:
    dev = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["dev"]
    pins = []
    for name in names:
        version = floor(dev, name)
        if version is None:
            print(f"ERROR: no '{name}>=' floor in the dev extra of {PYPROJECT}", file=sys.stderr)
            return 1
        pins.append(f"{name}=={version}")
    print(" ".join(pins))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

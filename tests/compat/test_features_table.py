"""``docs/features.md`` stays true: every liger_core name in the *liger_core* column exists, every name in the
*missing in liger_core* column does not (whoever adds one updates its row), the status column agrees with
the two, and the patching rows cover every Liger-Kernel patch function with the right recipe/zoo notes."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

TABLE = Path(__file__).parents[2] / "docs" / "features.md"
NAME = re.compile(r"`(liger_core(?:\.\w+)+)(?:\((\w+)\))?`")


def _rows() -> list[list[str]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if cells[0] == "Liger-Kernel 0.8.5":
            continue
        assert len(cells) == 5, f"expected 5 columns: {line}"
        rows.append(cells)
    return rows


ROWS = _rows()


def _resolve(dotted: str):
    """The object named ``dotted``, walked from ``liger_core`` by attribute (as ``from a import b`` would;
    a submodule not yet imported is imported), or None if there is none."""
    first, *rest = dotted.split(".")
    obj = importlib.import_module(first)
    for part in rest:
        value = getattr(obj, part, None)
        if value is None and inspect.ismodule(obj):
            try:
                value = importlib.import_module(f"{obj.__name__}.{part}")
            except ImportError:
                return None
        if value is None:
            return None
        obj = value
    return obj


def _exists(dotted: str, parameter: str) -> bool:
    obj = _resolve(dotted)
    if obj is None or not parameter:
        return obj is not None
    return parameter in inspect.signature(obj).parameters


def test_table_parses():
    assert len(ROWS) > 100
    assert {r[3] for r in ROWS} <= {"yes", "partial", "missing"}


@pytest.mark.parametrize("row", ROWS, ids=[r[0][:60] for r in ROWS])
def test_row_is_true(row):
    feature, present, absent, status, _ = row
    have, lack = NAME.findall(present), NAME.findall(absent)
    assert (present == "—") == (not have) and (absent == "—") == (not lack), f"{feature}: unparsed names"
    for dotted, parameter in have:
        shown = f"{dotted}({parameter})" if parameter else dotted
        assert _exists(dotted, parameter), f"{feature}: {shown} is listed as present but does not exist"
    for dotted, parameter in lack:
        shown = f"{dotted}({parameter})" if parameter else dotted
        assert not _exists(dotted, parameter), (
            f"{feature}: {shown} exists now; update its row in {TABLE.name}"
        )
    expected = "missing" if not have else ("yes" if not lack else "partial")
    assert status == expected, f"{feature}: status {status!r}, the names say {expected!r}"


def test_patching_rows_cover_every_liger_kernel_function():
    from liger_core.compat.liger_kernel.transformers import monkey_patch
    from liger_core.patching import recipe_model_types, supported_model_types

    rows = {r[0].strip("`"): r for r in ROWS if r[0].startswith("`apply_liger_kernel_to_")}
    functions = [n for n in monkey_patch.APPLY_FUNCTIONS]
    assert sorted(rows) == sorted(functions)
    for name, (_, _, _, _, notes) in rows.items():
        model_type = monkey_patch._SIGNATURES[name.removeprefix("apply_liger_kernel_to_")][0]
        assert ("recipe" in notes) == (model_type in recipe_model_types()), name
        assert ("zoo-exact" in notes) == (model_type in supported_model_types()), name

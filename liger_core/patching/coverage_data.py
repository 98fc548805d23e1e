"""What the model zoo proved about each model type: the generated ``zoo_coverage.json`` next to this file.

The zoo (``tests/patching/zoo.py``) builds every causal-LM and image-text-to-text model type of one
transformers release tiny and random, trains one step, patches it with ``apply_liger_kernel`` and trains the
same step again. Its full run writes this file (``--package-data``) together with ``docs/coverage.md``; it
is data, never edited by hand, and ``tests/patching/test_zoo.py`` checks it against the zoo run of each test
session.

A record per zoo case (a model type, or ``<type>:vlm`` for a type whose image-text-to-text class is another
class than its causal-LM one): ``model_class``, ``vlm``, ``status`` (``exact``, ``wrong``, ``patch_raised``,
``patched_forward_raised``, ``forward_error``, ``unbuildable``), ``exact``, ``method`` (``recipe`` or
``structural``), ``swapped`` (kind -> count), ``missing`` (kind -> reasons) and ``reason`` (why a case that
is not patched could not be tried).
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

COVERAGE_FILE = Path(__file__).with_name("zoo_coverage.json")
VLM_SUFFIX = ":vlm"


@functools.lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    if not COVERAGE_FILE.is_file():
        return {"types": {}}
    with COVERAGE_FILE.open() as f:
        return json.load(f)


def coverage() -> dict[str, Any]:
    """The whole file: ``transformers`` (the release the zoo ran on), ``torch``, ``kernels`` (the path the
    kernels took), ``generated_by`` (the command) and ``types`` (zoo case -> record). A copy: changing it
    changes nothing here. ``{"types": {}}`` when the file is not installed."""
    return copy.deepcopy(_load())


def model_coverage(model_type: str) -> dict[str, Any] | None:
    """The zoo's record for ``model_type`` (or ``<type>:vlm``), or None when the zoo has no such case."""
    record = _load()["types"].get(model_type)
    return copy.deepcopy(record) if record is not None else None


def zoo_exact_types() -> list[str]:
    """The model types whose every zoo case (its causal-LM class and, where another class, its
    image-text-to-text one) was patched and trained with loss and gradients equal to the unpatched model's."""
    cases: dict[str, list[bool]] = {}
    for case, record in _load()["types"].items():
        cases.setdefault(case.removesuffix(VLM_SUFFIX), []).append(bool(record.get("exact")))
    return sorted(t for t, exact in cases.items() if all(exact))

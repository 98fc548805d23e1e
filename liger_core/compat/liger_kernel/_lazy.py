"""Look-ups of liger_core names made at call time, so that names added to liger_core later are used without
changing this package, and a missing one raises ``NotImplementedError`` naming it."""

from __future__ import annotations

import importlib
import inspect
from typing import Any


def missing(what: str, hint: str = "") -> NotImplementedError:
    """The error for a Liger-Kernel feature that liger_core does not have."""
    tail = f" {hint}" if hint else ""
    return NotImplementedError(f"{what} is not available in liger_core.{tail}")


def liger_core_name(package: str, name: str, what: str) -> Any:
    """``liger_core.<package>.<name>`` (a function or class; for an op submodule, the function of the same
    name in it), looked up now; ``NotImplementedError`` naming ``what`` if liger_core has no such name."""
    try:
        pkg = importlib.import_module(f"liger_core.{package}")
    except ImportError as exc:  # pragma: no cover - liger_core's own packages always import
        raise missing(what) from exc
    obj = getattr(pkg, name, None)
    if obj is None:
        try:
            obj = importlib.import_module(f"liger_core.{package}.{name}")
        except ImportError:
            raise missing(what, f"(liger_core.{package} has no {name!r})") from None
    if inspect.ismodule(obj):
        inner = getattr(obj, name, None)
        if inner is None:
            raise missing(what, f"(liger_core.{package}.{name} defines no {name!r})")
        obj = inner
    return obj


def takes(function: Any, parameter: str) -> bool:
    """True if ``function`` accepts a keyword argument named ``parameter``."""
    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):  # pragma: no cover - liger_core's entry points have signatures
        return False
    return parameter in params

"""liger-kernel beside liger_core: find its patches in a model, refuse to patch such a model, and say which
of the two serves a framework's flag.

Frameworks (Axolotl, LLaMA-Factory, TRL, transformers' ``use_liger_kernel``) can apply the third-party
liger-kernel package, whose class-level patches replace module classes, forwards and functions of the
modeling modules (``apply_rotary_pos_emb``). liger_core patching on top of them would run two kernel sets in
one model, so the plugins stop instead, with the parts found and what may have applied them.
"""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any

__all__ = ["liger_kernel_parts", "refuse_liger_kernel", "served_by"]

LIGER_KERNEL_PACKAGE = "liger_kernel"
_LISTED = 6  # parts named in the error message


def _from_liger_kernel(obj: Any) -> bool:
    return str(getattr(obj, "__module__", None) or "").split(".")[0] == LIGER_KERNEL_PACKAGE


def liger_kernel_parts(model: Any) -> list[str]:
    """What of ``model`` comes from the liger-kernel package: module classes, class or instance forwards, and
    functions of the models' modeling modules (its class-level patches replace ``apply_rotary_pos_emb``)."""
    found: list[str] = []
    modeling_modules = set()
    for name, module in model.named_modules():
        cls = type(module)
        modeling_modules.add(cls.__module__)
        where = name or cls.__name__
        if _from_liger_kernel(cls):
            found.append(f"{where}: class {cls.__module__}.{cls.__name__}")
        elif _from_liger_kernel(getattr(cls, "forward", None)):
            found.append(f"{where}: {cls.__name__}.forward from {cls.forward.__module__}")
        elif _from_liger_kernel(module.__dict__.get("forward")):
            found.append(f"{where}: forward from {module.__dict__['forward'].__module__}")
    for module_name in sorted(modeling_modules):
        namespace = getattr(sys.modules.get(module_name), "__dict__", {})
        for attr, value in namespace.items():
            if callable(value) and not isinstance(value, type) and _from_liger_kernel(value):
                found.append(f"{module_name}.{attr} from {value.__module__}")
    return found


def refuse_liger_kernel(model: Any, *, flag: str, applied_by: str) -> None:
    """Raise ``RuntimeError`` when liger-kernel's patches are in ``model``: liger_core and liger-kernel never
    patch the same model. ``flag`` is the framework's setting that liger_core serves (``use_liger_kernel``);
    ``applied_by`` names what may have applied liger-kernel in that framework (the message's hint)."""
    parts = liger_kernel_parts(model)
    if parts:
        more = "; ..." if len(parts) > _LISTED else ""
        raise RuntimeError(
            f"liger_core: {type(model).__name__} already runs liger-kernel's patches "
            f"({'; '.join(parts[:_LISTED])}{more}); something applied liger-kernel to this model "
            f"({applied_by}). Remove it: {flag} is served by liger_core, and the two must not patch the same "
            "model."
        )


def installed_version(dist: str) -> str | None:
    """The installed version of the distribution ``dist``; None when it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def served_by(flag: str, plugin: str) -> str:
    """The line a plugin logs once: its framework's ``flag`` is served by liger_core (and by the plugin's
    distribution ``plugin``), with their versions, and whether liger-kernel is installed beside (unused)."""
    from liger_core import __version__

    line = (
        f"{flag} is served by liger_core {__version__} ({plugin} {installed_version(plugin) or '?'}), "
        "not by liger-kernel"
    )
    other = installed_version("liger-kernel")
    if other is not None:
        line += f"; liger-kernel {other} is installed and is not applied"
    return line

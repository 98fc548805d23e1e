"""Run a function right after a given module has been imported: the start-up hooks of liger_core's plugins.

A plugin's wheel ships a ``.pth`` file whose one ``import`` line Python's ``site`` module runs at every
interpreter start (``accelerate launch`` and ``torchrun`` children included). That line registers, with
``when_imported(name, callback)`` (``register`` for a table of them), what the plugin does once the
framework's module ``name`` is imported (wrap its argument parser, its trainer, ...). Registering puts one
``sys.meta_path`` finder in front (``PostImportFinder``): it finds nothing itself; for a watched name it asks
the finders after it for the module's spec and wraps the spec's loader, so that the callbacks run once the
module's code has executed. Nothing is imported and nothing is patched until a watched module is imported.

``LIGER_CORE_DISABLE_HOOK=1`` (any value but an empty string, 0, false, no or off) turns every plugin's hook
off: each plugin checks ``disabled()`` before it registers.

This module runs in every Python process of an environment with a plugin installed, so it must stay cheap:
it imports only ``os`` and ``sys`` (and ``liger_core/__init__``, which imports nothing heavy); never torch,
Triton or transformers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = [
    "ENV_DISABLE",
    "PostImportFinder",
    "disabled",
    "fully_imported",
    "is_registered",
    "is_watched",
    "register",
    "watched",
    "when_imported",
]

ENV_DISABLE = "LIGER_CORE_DISABLE_HOOK"

Callback = Callable[[ModuleType], None]
_callbacks: dict[str, list[Callback]] = {}  # module name -> its callbacks
_prefix_callbacks: dict[str, list[Callback]] = {}  # "package." -> callbacks for every module under it


def disabled() -> bool:
    """True when ``LIGER_CORE_DISABLE_HOOK`` is set to anything but an empty string, 0, false, no or off."""
    return os.environ.get(ENV_DISABLE, "").strip().lower() not in ("", "0", "false", "no", "off")


def fully_imported(module: ModuleType | None) -> bool:
    """Whether ``module`` exists and its code has finished executing (not mid-import)."""
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` each time the module ``name`` has been executed (at once if it already was).

    ``name`` ending with "." watches every module whose name starts with it (each one). Registering the same
    callback for the same name again does nothing. The callback is the caller's: it must not raise (a plugin
    catches and logs its own errors; a failing hook must not break the user's import).
    """
    if name.endswith("."):
        if callback in _prefix_callbacks.get(name, ()):
            return
        _prefix_callbacks.setdefault(name, []).append(callback)
        done = [m for n, m in list(sys.modules.items()) if n.startswith(name) and fully_imported(m)]
        for module in done:
            callback(module)
    else:
        if callback in _callbacks.get(name, ()):
            return
        _callbacks.setdefault(name, []).append(callback)
        module = sys.modules.get(name)
        if fully_imported(module):
            callback(module)
    if not any(isinstance(f, PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, PostImportFinder())


def register(after_import: Mapping[str, Callback], *, force: bool = False) -> bool:
    """``when_imported(name, callback)`` for each entry of a plugin's table, unless the hooks are off
    (``disabled()``; ``force`` registers anyway). Idempotent. Whether it registered."""
    if not force and disabled():
        return False
    for name, callback in after_import.items():
        when_imported(name, callback)
    return True


def is_registered(after_import: Mapping[str, Callback]) -> bool:
    """Whether every callback of the table ``after_import`` is registered for its module."""
    return all(callback in _callbacks.get(name, ()) for name, callback in after_import.items())


def _watchers(fullname: str) -> list[Callback]:
    found = list(_callbacks.get(fullname, ()))
    for prefix, callbacks in _prefix_callbacks.items():
        if fullname.startswith(prefix):
            found.extend(callbacks)
    return found


def is_watched(name: str) -> bool:
    """Whether a callback is registered for the module ``name`` (by its name or a prefix of it)."""
    return bool(_watchers(name))


def watched() -> list[str]:
    """The watched module names and prefixes, sorted."""
    return sorted({*_callbacks, *_prefix_callbacks})


class _Loader:
    """The module's own loader, with the watched module's callbacks run after its code has executed."""

    def __init__(self, loader: Any, callbacks: list[Callback]) -> None:
        self.loader = loader
        self.callbacks = callbacks

    def create_module(self, spec: Any) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        # the module keeps its real loader (inspect.getsource, importlib.resources and pickle look at it)
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        for callback in list(self.callbacks):
            callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class PostImportFinder:
    """A ``sys.meta_path`` finder that finds nothing itself: for a watched module name it asks the other
    finders for the spec and wraps the spec's loader so that the callbacks run once the module is executed."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in self._busy:
            return None
        callbacks = _watchers(fullname)
        if not callbacks:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # a namespace package, or a legacy loader: leave it alone
        spec.loader = _Loader(spec.loader, callbacks)
        return spec

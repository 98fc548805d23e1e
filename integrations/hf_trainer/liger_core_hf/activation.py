"""Zero-change activation: installing the plugin makes the framework's own `use_liger_kernel` run liger_core.

The plugin's wheel (and its editable install) puts `liger_core_hf.pth` into site-packages. Python's `site`
module executes its one `import` line at every interpreter start, including the children that
`accelerate launch` and `torchrun` start, and that line calls `activate()` below. `activate()` only registers
a `sys.meta_path` finder: nothing is imported and nothing is patched until a watched module is imported
(`transformers.trainer`, `transformers.hf_argparser`, TRL's modules for the TRL plugin). When one is, the
callback registered for it runs right after the module's code has executed, and installs the hook for that
module (`liger_core_hf.hook`).

`LIGER_CORE_DISABLE_HOOK=1` in the environment turns this off (transformers then handles the flag itself,
with the third-party liger-kernel package); it is read at interpreter start and again when a watched module is
imported, so setting it in a script before importing transformers works too. `python -S` (no `site`) skips
`.pth` files, so there the launchers (`liger-core-run`, `liger-core-trl`) or `liger_core_hf.install()` are the
way in.

This module must stay cheap: it runs in every Python process of the environment. It imports only `os`, `sys`
and `importlib` (already loaded at start-up).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

ENV_DISABLE = "LIGER_CORE_DISABLE_HOOK"

_callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
_active = False  # set once a hook was installed through this module
_prefix_callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
_active = False  # set once a hook was installed through this module


def disabled() -> bool:
    """True when `LIGER_CORE_DISABLE_HOOK` is set to anything but an empty string, 0, false, no or off."""
    return os.environ.get(ENV_DISABLE, "").strip().lower() not in ("", "0", "false", "no", "off")


def active() -> bool:
    """True once the activation installed a hook in this process (its log lines are then shown on stderr
    unless logging is configured for them: the script did not ask for liger_core, the user should see it)."""
    return _active


def _fully_imported(module: ModuleType | None) -> bool:
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def _run(callbacks: list[Callable[[ModuleType], None]], module: ModuleType) -> None:
    for callback in list(callbacks):
        callback(module)


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` once the module `name` has been executed (at once if it already was).

    `name` ending with "." watches every module whose name starts with it (each one, once). The callback is
    the caller's: it must not raise (plugins catch and log their own errors, a failing hook must not break
    the user's import).
    """
    if name.endswith("."):
        if callback in _prefix_callbacks.get(name, ()):
            return
        _prefix_callbacks.setdefault(name, []).append(callback)
        done = [m for n, m in list(sys.modules.items()) if n.startswith(name) and _fully_imported(m)]
        for module in done:
            callback(module)
    else:
        if callback in _callbacks.get(name, ()):
            return
        _callbacks.setdefault(name, []).append(callback)
        module = sys.modules.get(name)
        if _fully_imported(module):
            callback(module)
    _install_finder()


def _watched(fullname: str) -> list[Callable[[ModuleType], None]]:
    found = list(_callbacks.get(fullname, ()))
    for prefix, callbacks in _prefix_callbacks.items():
        if fullname.startswith(prefix):
            found.extend(callbacks)
    return found


class _Loader:
    """The module's own loader, with the watched module's callbacks run after its code has executed."""

    def __init__(self, loader: Any, callbacks: list[Callable[[ModuleType], None]]) -> None:
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
        _run(self.callbacks, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class PostImportFinder:
    """A `sys.meta_path` finder that finds nothing itself: for a watched module name it asks the finders after
    it for the spec and wraps the spec's loader so that the callbacks run once the module is executed."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in self._busy:
            return None
        callbacks = _watched(fullname)
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


def _install_finder() -> None:
    if not any(isinstance(f, PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, PostImportFinder())


def _trainer_imported(module: ModuleType) -> None:
    _guarded("transformers.trainer", "liger_core_hf.hook", "install_trainer_hook")


def _parser_imported(module: ModuleType) -> None:
    # the parser part only: transformers.trainer may be importing right now (it imports the parser module)
    _guarded("transformers.hf_argparser", "liger_core_hf.parser", "accept_json_kernel_config")


def _guarded(module_name: str, hook_module: str, hook_name: str) -> None:
    """Install one part of the hook; a failure is logged with its traceback (the user's import goes on, and
    `use_liger_kernel` then reaches transformers' own code, which the log says)."""
    global _active
    if disabled():
        return
    if hook_module in sys.modules and not _fully_imported(sys.modules[hook_module]):
        return  # the hook module itself imported `module_name`: its caller installs the hook when it is done
    try:
        import importlib

        getattr(importlib.import_module(hook_module), hook_name)()
        _active = True
    except Exception:  # noqa: BLE001 - never break the user's `import transformers`
        import logging

        logging.getLogger("liger_core_hf").exception(
            "liger_core_hf could not hook %s: use_liger_kernel is NOT served by liger_core in this process "
            "(set %s=1 to silence this and let transformers handle the flag)",
            module_name,
            ENV_DISABLE,
        )


def activate() -> None:
    """What `liger_core_hf.pth` runs at interpreter start: watch the modules handling `use_liger_kernel`."""
    if disabled():
        return
    when_imported("transformers.hf_argparser", _parser_imported)
    when_imported("transformers.trainer", _trainer_imported)

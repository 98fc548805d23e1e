"""Start-up hook: makes plain ``axolotl train`` stop on a liger_core config it would silently ignore.

The plugin's wheel ships ``liger_core_axolotl_hook.pth`` (``setup.py``); Python's ``site`` module runs its one
line, ``import liger_core_axolotl.import_hook``, at every interpreter start (``accelerate launch`` and
torchrun children included). This module only puts a finder on ``sys.meta_path`` (no torch, no Axolotl
import); the finder does nothing until a module of ``_AFTER_IMPORT`` is imported, and then runs its function
right after that module's code:

- ``axolotl.integrations.base``: ``PluginManager.register`` raises, instead of logging and going on, when a
  plugin that looks like this one (``liger_core_axolotI.LigerCorePlugin``) fails to import;
- ``axolotl.cli.config`` / ``axolotl.utils.config``: ``prepare_plugins(cfg)``, the first step that sees the
  raw config, first stops on misspelled keys of this plugin (``use_liger_kernal``) and on its keys set
  without the plugin listed (``args.preflight_errors``).

``LIGER_CORE_DISABLE_HOOK=1`` turns the hook off (shared with the other liger_core plugins).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

DISABLE_ENV = "LIGER_CORE_DISABLE_HOOK"


def _plugin_manager(module) -> None:
    from liger_core_axolotl.preflight import wrap_plugin_manager

    wrap_plugin_manager(module.PluginManager)


def _prepare_plugins(module) -> None:
    from liger_core_axolotl.preflight import wrap_prepare_plugins

    wrap_prepare_plugins(module)


_AFTER_IMPORT: dict[str, Callable] = {
    "axolotl.integrations.base": _plugin_manager,
    "axolotl.cli.config": _prepare_plugins,
    "axolotl.utils.config": _prepare_plugins,
}


class PostImportFinder:
    """A ``sys.meta_path`` finder that finds nothing itself: for the watched module names it asks the other
    finders for the spec and wraps that spec's loader so a function runs right after the module's code."""

    def __init__(self, after_import: dict[str, Callable]) -> None:
        self.after_import = dict(after_import)
        self.owner = __name__

    def find_spec(self, fullname, path=None, target=None):
        callback = self.after_import.get(fullname)
        if callback is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_hook(module):
            exec_module(module)
            self.after_import.pop(fullname, None)  # once per process
            callback(module)

        loader.exec_module = exec_then_hook  # this loader object belongs to this one spec
        return spec


def enabled_by_environment() -> bool:
    """False when ``LIGER_CORE_DISABLE_HOOK`` is set to a true value."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("1", "true", "yes", "on")


def install(force: bool = False) -> PostImportFinder | None:
    """Put the finder first on ``sys.meta_path`` (idempotent); None when disabled by the environment (unless
    ``force``). A watched module that is already imported gets its function now."""
    if not (force or enabled_by_environment()):
        return None
    for finder in sys.meta_path:
        if getattr(finder, "owner", None) == __name__:
            return finder
    finder = PostImportFinder(_AFTER_IMPORT)
    for name in list(finder.after_import):
        if name in sys.modules:
            finder.after_import.pop(name)(importlib.import_module(name))
    sys.meta_path.insert(0, finder)
    return finder


def active() -> bool:
    """Whether this process runs the hook (the finder is on ``sys.meta_path``)."""
    return any(getattr(f, "owner", None) == __name__ for f in sys.meta_path)


install()

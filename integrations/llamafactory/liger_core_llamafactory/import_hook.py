"""Start-up hook: makes plain ``llamafactory-cli`` (train, its torchrun workers, webui) use liger_core.

The plugin's wheel ships ``liger_core_llamafactory_hook.pth`` (``setup.py``); Python's ``site`` module runs
its line, ``import liger_core_llamafactory.import_hook``, at every interpreter start. This module only puts a
finder on ``sys.meta_path`` (no torch, no LLaMA-Factory import); the finder does nothing until one of the
modules in ``_AFTER_IMPORT`` is imported, and then runs its function right after that module's code:

- ``llamafactory``: a torchaudio that fails to import is replaced by a stub (``compat``), as ``liger-lmf``
  does, since LLaMA-Factory imports it at module level on every path;
- ``llamafactory.hparams.parser``: the liger keys are read and removed before LLaMA-Factory parses its
  arguments (``lmf_hooks.wrap_parser``), so ``enable_liger_kernel: true`` is served by liger_core;
- ``llamafactory.webui.interface``: LLaMA Board gets its liger_core checkbox (``webui.install``).

``LIGER_CORE_DISABLE_HOOK=1`` turns the hook off (shared with the other liger_core plugins).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

from liger_core_llamafactory import enabled_by_environment


def _torchaudio(module) -> None:
    from liger_core_llamafactory.compat import ensure_torchaudio_importable

    ensure_torchaudio_importable()


def _parser(module) -> None:
    from liger_core_llamafactory.lmf_hooks import wrap_parser

    wrap_parser(module)


def _webui(module) -> None:
    from liger_core_llamafactory import webui

    webui.install()


_AFTER_IMPORT: dict[str, Callable] = {
    "llamafactory": _torchaudio,
    "llamafactory.hparams.parser": _parser,
    "llamafactory.webui.interface": _webui,
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


def install(force: bool = False) -> PostImportFinder | None:
    """Put the finder first on ``sys.meta_path`` (idempotent); None when disabled by the environment (unless
    ``force``: ``liger-lmf``). A watched module that is already imported gets its function now."""
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

"""Start-up hook: makes plain ``llamafactory-cli`` (train, its torchrun workers, webui) use liger_core.

The plugin's wheel ships ``liger_core_llamafactory_hook.pth`` (``pyproject.toml``); Python's ``site``
module runs its line, ``import liger_core_llamafactory.import_hook``, at every interpreter start. This module
only registers the functions of ``_AFTER_IMPORT`` with liger_core's post-import finder
(``liger_core.startup_hook``; no torch, no LLaMA-Factory import); the finder does nothing until one of those
modules is imported, and then runs its function right after that module's code:

- ``llamafactory``: a torchaudio that fails to import is replaced by a stub (``compat``), as ``liger-lmf``
  does, since LLaMA-Factory imports it at module level on every path;
- ``llamafactory.hparams.parser``: the liger keys are read and removed before LLaMA-Factory parses its
  arguments (``lmf_hooks.wrap_parser``), so ``enable_liger_kernel: true`` is served by liger_core;
- ``llamafactory.webui.interface``: LLaMA Board gets its liger_core checkbox (``webui.install``).

``LIGER_CORE_DISABLE_HOOK=1`` turns the hook off (shared with the other liger_core plugins).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from liger_core import startup_hook


def _torchaudio(module) -> None:
    from liger_core_llamafactory.compat import ensure_torchaudio_importable

    ensure_torchaudio_importable()


def _parser(module) -> None:
    from liger_core_llamafactory.lmf_hooks import wrap_parser

    wrap_parser(module)


def _webui(module) -> None:
    from liger_core_llamafactory import webui

    webui.install()


_AFTER_IMPORT: dict[str, Callable[[ModuleType], None]] = {
    "llamafactory": _torchaudio,
    "llamafactory.hparams.parser": _parser,
    "llamafactory.webui.interface": _webui,
}


def install(force: bool = False) -> bool:
    """Register ``_AFTER_IMPORT`` (idempotent; a watched module already imported gets its function now);
    False when the hook is off by the environment (unless ``force``: ``liger-lmf``)."""
    return startup_hook.register(_AFTER_IMPORT, force=force)


def active() -> bool:
    """Whether this process runs the hook."""
    return startup_hook.is_registered(_AFTER_IMPORT)


install()

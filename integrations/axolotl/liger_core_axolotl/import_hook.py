"""Start-up hook: makes plain ``axolotl train`` stop on a liger_core config it would silently ignore.

The plugin's wheel ships ``liger_core_axolotl_hook.pth`` (``pyproject.toml``); Python's ``site`` module
runs its one line, ``import liger_core_axolotl.import_hook``, at every interpreter start (``accelerate
launch`` and torchrun children included). This module only registers the functions of ``_AFTER_IMPORT`` with
liger_core's post-import finder (``liger_core.startup_hook``; no torch, no Axolotl import); the finder does
nothing until one of those modules is imported, and then runs its function right after that module's code:

- ``axolotl.integrations.base``: ``PluginManager.register`` raises, instead of logging and going on, when a
  plugin that looks like this one (``liger_core_axolotI.LigerCorePlugin``) fails to import;
- ``axolotl.cli.config`` / ``axolotl.utils.config``: ``prepare_plugins(cfg)``, the first step that sees the
  raw config, first stops on misspelled keys of this plugin (``use_liger_kernal``) and on its keys set
  without the plugin listed (``args.preflight_errors``).

``LIGER_CORE_DISABLE_HOOK=1`` turns the hook off (shared with the other liger_core plugins).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from liger_core import startup_hook


def _plugin_manager(module) -> None:
    from liger_core_axolotl.preflight import wrap_plugin_manager

    wrap_plugin_manager(module.PluginManager)


def _prepare_plugins(module) -> None:
    from liger_core_axolotl.preflight import wrap_prepare_plugins

    wrap_prepare_plugins(module)


_AFTER_IMPORT: dict[str, Callable[[ModuleType], None]] = {
    "axolotl.integrations.base": _plugin_manager,
    "axolotl.cli.config": _prepare_plugins,
    "axolotl.utils.config": _prepare_plugins,
}


def install(force: bool = False) -> bool:
    """Register ``_AFTER_IMPORT`` (idempotent; a watched module already imported gets its function now);
    False when the hook is off by the environment (unless ``force``)."""
    return startup_hook.register(_AFTER_IMPORT, force=force)


def active() -> bool:
    """Whether this process runs the hook."""
    return startup_hook.is_registered(_AFTER_IMPORT)


install()

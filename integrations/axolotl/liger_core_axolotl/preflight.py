"""Checks that stop a run Axolotl would otherwise start without liger_core (used by ``import_hook`` for plain
``axolotl``, by the plugin's ``register`` and by ``liger-core-axolotl check``).

Axolotl imports each entry of ``plugins:`` and, when one fails, logs the error and goes on; pydantic then
drops that plugin's keys, and unknown keys are dropped too. So ``use_liger_kernel: true`` with a misspelled
plugin module, or ``use_liger_kernal: true``, trains with rc 0 and without liger_core.
"""

from __future__ import annotations

import difflib
import importlib
import re
from typing import Any

from liger_core_axolotl.args import INSTALL_HINT, OUR_KEYS, PLUGIN_NAME, misspelled_keys

MODULE_NAME = PLUGIN_NAME.rpartition(".")[0]


def looks_like_ours(name: str) -> bool:
    """A ``plugins:`` entry that is most likely meant to be this plugin (misspelled or not)."""
    squashed = re.sub(r"[^a-z0-9]", "", name.lower())
    if "ligercore" in squashed:
        return True
    module = name.rpartition(".")[0] or name
    return (
        difflib.SequenceMatcher(None, name, PLUGIN_NAME).ratio() >= 0.8
        or difflib.SequenceMatcher(None, module, MODULE_NAME).ratio() >= 0.8
    )


def resolve_plugin(name: str) -> type:
    """The class ``name`` refers to, found the way Axolotl's ``load_plugin`` finds it."""
    module_name, _, class_name = name.rpartition(".")
    if not module_name:
        raise ImportError(f"{name!r} is not of the form module.ClassName")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as first:
        if module_name.startswith("axolotl.integrations."):
            raise
        try:
            module = importlib.import_module("axolotl.integrations." + module_name)
        except ModuleNotFoundError:
            raise first from None
    try:
        return getattr(module, class_name)
    except AttributeError as e:
        raise ImportError(str(e)) from None


def plugin_import_error(name: str) -> str:
    """The error of importing ``plugins:`` entry ``name`` as Axolotl does (empty if it imports)."""
    try:
        resolve_plugin(name)
    except Exception as e:  # noqa: BLE001 - whatever the import raises is the reason to show
        return f"{type(e).__name__}: {e}"
    return ""


def failed_plugin_message(name: str) -> str:
    hint = f" Did you mean {PLUGIN_NAME}?" if name != PLUGIN_NAME else ""
    error = plugin_import_error(name) or "see the error above"
    return (
        f"liger_core_axolotl: plugin {name!r} cannot be imported ({error}); Axolotl would skip it, drop its "
        f"keys and train without liger_core.{hint} If liger-core-axolotl is not installed in this "
        f"environment, install it {INSTALL_HINT}."
    )


def preflight_errors(cfg: Any) -> list[str]:
    """Misspelled keys of this plugin, and its keys set while no ``plugins:`` entry is meant to be it."""
    errors = [f"liger_core_axolotl: {p}" for p in misspelled_keys(cfg)]
    ours = [k for k in OUR_KEYS if cfg.get(k) is not None]
    plugins = [str(p) for p in cfg.get("plugins") or []]
    if ours and not any(looks_like_ours(p) for p in plugins):
        errors.append(
            f"liger_core_axolotl: {', '.join(ours)} set, but {PLUGIN_NAME} is not under `plugins:`; Axolotl "
            f"would drop these keys and train without liger_core. Add:\n  plugins:\n    - {PLUGIN_NAME}"
        )
    return errors


def wrap_plugin_manager(manager_cls: Any) -> None:
    """``PluginManager.register`` raises when a plugin meant to be this one fails to import (idempotent)."""
    original = manager_cls.register
    if getattr(original, "__wrapped__", None) is not None:
        return

    def register(self, plugin_name: str):
        result = original(self, plugin_name)
        if plugin_name not in self.plugins and looks_like_ours(str(plugin_name)):
            raise ImportError(failed_plugin_message(str(plugin_name)))
        return result

    register.__wrapped__ = original
    manager_cls.register = register


def wrap_prepare_plugins(module: Any) -> None:
    """``module.prepare_plugins(cfg)`` runs ``preflight_errors`` first (idempotent)."""
    original = getattr(module, "prepare_plugins", None)
    if original is None or getattr(original, "__wrapped__", None) is not None:
        return

    def prepare_plugins(cfg, *args, **kwargs):
        errors = preflight_errors(cfg)
        if errors:
            raise ValueError("\n".join(errors))
        return original(cfg, *args, **kwargs)

    prepare_plugins.__wrapped__ = original
    module.prepare_plugins = prepare_plugins

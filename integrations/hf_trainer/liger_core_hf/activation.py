"""Zero-change activation: installing the plugin makes the framework's own `use_liger_kernel` run liger_core.

The plugin's wheel (and its editable install) puts `liger_core_hf.pth` into site-packages. Python's `site`
module executes its one `import` line at every interpreter start, including the children that
`accelerate launch` and `torchrun` start, and that line calls `activate()` below. `activate()` only registers
a `sys.meta_path` finder: nothing is imported and nothing is patched until a watched module is imported
(`transformers.trainer`, `transformers.hf_argparser`, TRL's modules for the TRL plugin). When one is, the
callback registered for it runs right after the module's code has executed, and installs the hook for that
module (`liger_core_hf.hook`).

The finder and the registry of watched modules are liger_core's (`liger_core.startup_hook`, shared by the
plugins' start-up hooks). `LIGER_CORE_DISABLE_HOOK=1` in the environment turns this off (transformers then
handles the flag itself, with the third-party liger-kernel package); it is read at interpreter start and again
when a watched module is imported, so setting it in a script before importing transformers works too.
`python -S` (no `site`) skips `.pth` files, so there the launchers (`liger-core-run`, `liger-core-trl`) or
`liger_core_hf.install()` are the way in.

This module must stay cheap: it runs in every Python process of the environment. It imports only `sys` and
`liger_core.startup_hook` (no torch, no transformers).
"""

from __future__ import annotations

import sys
from types import ModuleType

from liger_core.startup_hook import ENV_DISABLE, disabled, fully_imported, when_imported

__all__ = ["ENV_DISABLE", "activate", "active", "disabled", "when_imported"]

_active = False  # set once a hook was installed through this module


def active() -> bool:
    """True once the activation installed a hook in this process (its log lines are then shown on stderr
    unless logging is configured for them: the script did not ask for liger_core, the user should see it)."""
    return _active


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
    if hook_module in sys.modules and not fully_imported(sys.modules[hook_module]):
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

"""Zero-change activation for TRL: what `liger_core_trl.pth` runs at interpreter start.

It registers, with liger_core's post-import finder (`liger_core.startup_hook`), a callback for every
`trl.*` module: nothing is imported at start-up. When a TRL module that defines trainers has executed
(`trl.trainer.base_trainer`, `trl.trainer.sft_trainer`, ...), its trainer classes get the hook of
`liger_core_trl.hook` (the flag hidden from TRL's own handling, liger_core's log-probs in TRL's fused LM
head); so does TRL's copy of HfArgumentParser (`trl.scripts._hf_argparser`). The Trainer and
argument-parser parts come from liger_core_hf's own activation. So `trl sft ... --use_liger_kernel` works:
the `accelerate launch` child that runs TRL's script is a new interpreter, which reads the `.pth` files
again. `LIGER_CORE_DISABLE_HOOK=1` turns it off, as for liger_core_hf.
"""

from __future__ import annotations

import sys
from types import ModuleType

from liger_core_hf import activation as hf_activation

from liger_core import startup_hook

_BASE = "trl.trainer.base_trainer"
WATCHED = "trl."  # every TRL module


def _trainer_classes_of(module: ModuleType) -> list[type]:
    base_module = module if module.__name__ == _BASE else sys.modules.get(_BASE)
    base = getattr(base_module, "_BaseTrainer", None)
    if base is None:
        return []
    return [
        obj
        for obj in list(vars(module).values())
        if isinstance(obj, type) and issubclass(obj, base) and obj.__module__ == module.__name__
    ]


def _parser_classes_of(module: ModuleType) -> list[type]:
    """TRL's own copy of HfArgumentParser (`trl.scripts._hf_argparser`, TrlParser's base since TRL 1.16)."""
    parser = vars(module).get("HfArgumentParser")
    return [parser] if isinstance(parser, type) and parser.__module__ == module.__name__ else []


def _trl_module_imported(module: ModuleType) -> None:
    """Cheap for TRL's other modules: only one that defines trainers or TRL's argument parser imports the
    hook."""
    if startup_hook.disabled():
        return
    trainers, parsers = _trainer_classes_of(module), _parser_classes_of(module)
    if not trainers and not parsers:
        return
    try:
        if parsers:
            from liger_core_hf.parser import accept_json_kernel_config

            for parser in parsers:
                accept_json_kernel_config(parser)
        if trainers:
            from .hook import install_module

            install_module(module, trainers)
        hf_activation._active = True
    except Exception:  # noqa: BLE001 - never break the user's `import trl`
        import logging

        logging.getLogger("liger_core_trl").exception(
            "liger_core_trl could not hook %s: use_liger_kernel is NOT served by liger_core for its trainers "
            "(set %s=1 to silence this and let TRL handle the flag)",
            module.__name__,
            startup_hook.ENV_DISABLE,
        )


def activate() -> None:
    """What `liger_core_trl.pth` runs at interpreter start: watch TRL's modules (unless the hook is off)."""
    if startup_hook.disabled():
        return
    startup_hook.when_imported(WATCHED, _trl_module_imported)

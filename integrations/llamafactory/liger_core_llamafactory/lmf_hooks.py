"""liger_core behind LLaMA-Factory's own argument parsing (installed by ``import_hook`` for plain
``llamafactory-cli``, and used by ``liger-lmf``).

``wrap_parser`` replaces ``llamafactory.hparams.parser._parse_args``, which every train/chat/export command
goes through. For a parser that has LLaMA-Factory's model arguments it reads the arguments as LLaMA-Factory
does, and on a copy (``run_exp`` hands the same dict to several parsers):
- stops on an argument that looks like a misspelled liger key (``enable_liger_kernal``), with the key meant;
- removes ``enable_liger_kernel`` / ``use_liger_kernel`` / ``liger_kernel_config`` (``options``), so
  LLaMA-Factory never asks for the liger-kernel package and transformers' Trainer never patches with it;
- when one of them is true (or ``LIGER_CORE_LMF=1``): installs ``model_hooks`` with the toggles; when they
  patch the model, rank 0 logs which library serves the flag, with its version (``model_hooks.announce``).
torchrun workers of ``llamafactory-cli train`` read the same YAML, so each does the same.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from liger_core_llamafactory.options import (
    CONFIG_KEY,
    LIGER_KEYS,
    arg_names,
    env_enabled,
    misspelled_keys,
    pop_kernel_config,
    pop_liger_flag,
)

logger = logging.getLogger("llamafactory.liger_core")
INSTALL_HINT = "from a clone of liger_core: `pip install -e . && pip install -e integrations/llamafactory`"


def import_liger_core() -> None:
    try:
        import liger_core  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"enable_liger_kernel is served by liger_core here (liger-core-llamafactory is installed), but "
            f"liger_core cannot be imported ({err}). Install it {INSTALL_HINT}, or set "
            "LIGER_CORE_DISABLE_HOOK=1 to let LLaMA-Factory use the liger-kernel package."
        ) from err


def activate(flag: str, kernel_config: Mapping[str, bool]) -> None:
    """liger_core for this process's model loading, with ``liger_kernel_config``'s toggles."""
    import_liger_core()
    from liger_core_llamafactory import model_hooks

    model_hooks.install(kernel_config, flag)


def known_arguments(parser: Any) -> set[str]:
    import dataclasses

    names: set[str] = set()
    for cls in getattr(parser, "dataclass_types", ()):
        names.update(f.name for f in dataclasses.fields(cls))
    return names


def route(args: dict[str, Any] | list[str], known: set[str]) -> dict[str, Any] | list[str]:
    """A copy of ``args`` without the liger keys, after checking them; liger_core activated if asked."""
    problems = misspelled_keys(args, known)
    if problems:
        raise ValueError(f"liger_core: {'; '.join(problems)}")
    args = dict(args) if isinstance(args, Mapping) else list(args)
    names = arg_names(args)
    flag = next((key for key in LIGER_KEYS if key in names), None)
    has_config = CONFIG_KEY in names
    enabled = pop_liger_flag(args)
    kernel_config = pop_kernel_config(args)
    from liger_core_llamafactory import model_hooks

    if enabled:
        activate(flag, kernel_config)
    elif env_enabled() and (has_config or not model_hooks.is_installed()):
        # LIGER_CORE_LMF=1 (liger-lmf's torchrun workers); liger-lmf itself already took the keys out
        activate("LIGER_CORE_LMF=1", kernel_config)
    elif has_config and kernel_config:
        logger.warning("liger_core: %s is ignored: %s is not true", CONFIG_KEY, flag or LIGER_KEYS[0])
    return args


def wrap_parser(parser_module: Any) -> None:
    """Route the liger keys of every LLaMA-Factory parse through ``route`` (idempotent)."""
    original = parser_module._parse_args
    if getattr(original, "__wrapped__", None) is not None:
        return

    def _parse_args(parser, args=None, allow_extra_keys=False):
        known = known_arguments(parser)
        if "enable_liger_kernel" in known:  # train / chat / export / eval: LLaMA-Factory's model arguments
            args = route(parser_module.read_args(args), known)
        return original(parser, args, allow_extra_keys)

    _parse_args.__wrapped__ = original
    parser_module._parse_args = _parse_args

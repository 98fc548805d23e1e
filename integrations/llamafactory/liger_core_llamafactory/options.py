"""The liger switch and toggles in LLaMA-Factory arguments: read and removed so LLaMA-Factory never needs
liger-kernel."""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from liger_core_llamafactory import ENV_FLAG

# LLaMA-Factory's own key, and transformers' TrainingArguments key (which LLaMA-Factory also parses and which
# would make the HF Trainer import liger-kernel): under liger-lmf both mean liger_core.
LIGER_KEYS = ("enable_liger_kernel", "use_liger_kernel")
# transformers' TrainingArguments key for per-kernel toggles (as with the HF Trainer): under liger-lmf, the
# keyword arguments of liger_core.apply_liger_kernel (``config_keys()``), `strict` included
CONFIG_KEY = "liger_kernel_config"
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n"}


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{key} must be true or false, got {value!r}")


def config_keys() -> tuple[str, ...]:
    """The keys ``liger_kernel_config`` accepts: the kernel flags from liger_core's one definition
    (``liger_core.patching.KernelFlags``), then the entry points' other options (``strict``). liger_core is
    imported on first use: reading the liger switch needs neither liger_core nor torch."""
    from liger_core.patching.flags import PATCH_OPTIONS, KernelFlags

    return (*KernelFlags.names(), *PATCH_OPTIONS)


def env_enabled() -> bool:
    return os.getenv(ENV_FLAG, "0").strip().lower() in _TRUE


def pop_liger_flag(args: dict[str, Any] | list[str]) -> bool:
    """Remove the liger keys from parsed LLaMA-Factory args (a YAML/JSON dict, or ``--key value`` strings, in
    place); True if any of them was true."""
    enabled = False
    if isinstance(args, dict):
        for key in LIGER_KEYS:
            if key in args:
                enabled |= _as_bool(key, args.pop(key))
        return enabled
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name.lstrip("-") in LIGER_KEYS and name.startswith("--"):
            if eq:
                del args[i]
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args.pop(i + 1)
                del args[i]
            else:  # a bare flag, as HfArgumentParser accepts for booleans
                value = "true"
                del args[i]
            enabled |= _as_bool(name.lstrip("-"), value)
            continue
        i += 1
    return enabled


def kernel_config(value: Any) -> dict[str, bool]:
    """``liger_kernel_config`` checked: a mapping (or its JSON text) of ``config_keys()`` to booleans."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as err:
            raise ValueError(f"{CONFIG_KEY} is not valid JSON ({err.msg}): {value!r}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{CONFIG_KEY} must be a mapping of booleans, got {type(value).__name__}")
    keys = config_keys()
    unknown = sorted(str(k) for k in value if k not in keys)
    if unknown:
        named = ", ".join(f"{key!r}{did_you_mean(key, keys, 0.6)}" for key in unknown)
        raise ValueError(f"{CONFIG_KEY} has unknown key(s) {named}; liger_core accepts {list(keys)}")
    return {key: _as_bool(f"{CONFIG_KEY}.{key}", v) for key, v in value.items()}


def did_you_mean(name: str, candidates, cutoff: float) -> str:
    """`` (did you mean X?)`` for the candidate closest to ``name``, empty when none is close enough."""
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=cutoff)
    return f" (did you mean {match[0]!r}?)" if match else ""


def arg_names(args: dict[str, Any] | list[str]) -> list[str]:
    """The argument names of parsed LLaMA-Factory args (dict keys, or the names of ``--key[=value]``)."""
    if isinstance(args, dict):
        return [str(k) for k in args]
    return [a.partition("=")[0][2:] for a in args if a.startswith("--")]


def misspelled_keys(args: dict[str, Any] | list[str], known: set[str]) -> list[str]:
    """One message per argument that is not an argument of LLaMA-Factory (``known``) and looks like one of
    the liger keys (``enable_liger_kernal``, ``liger_kernel_confg``): LLaMA-Factory would reject it without a
    hint, or drop it under ``ALLOW_EXTRA_ARGS=1`` and train without liger_core."""
    ours = (*LIGER_KEYS, CONFIG_KEY)
    problems = []
    for name in arg_names(args):
        if name in known or name in ours:
            continue
        hint = did_you_mean(name, ours, 0.8)
        if hint:
            problems.append(f"unknown key {name!r}{hint}")
    return problems


def pop_kernel_config(args: dict[str, Any] | list[str]) -> dict[str, bool]:
    """Remove ``liger_kernel_config`` from parsed LLaMA-Factory args (a YAML/JSON dict, or ``--key value``
    strings, in place) and return it checked (empty when absent)."""
    if isinstance(args, dict):
        return kernel_config(args.pop(CONFIG_KEY, None))
    found: Any = None
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name == f"--{CONFIG_KEY}":
            if not eq:
                if i + 1 >= len(args):
                    raise ValueError(f"--{CONFIG_KEY} needs a value, e.g. '{{\"strict\": true}}'")
                value = args.pop(i + 1)
            del args[i]
            found = value
            continue
        i += 1
    return kernel_config(found)


def read_train_args(argv: list[str]) -> dict[str, Any] | list[str]:
    """Parse ``config.yaml|json [key=value ...]`` or ``--key value ...`` exactly as llamafactory-cli does."""
    from llamafactory.hparams.parser import read_args

    saved = sys.argv
    sys.argv = [saved[0], *argv]
    try:
        return read_args()
    finally:
        sys.argv = saved

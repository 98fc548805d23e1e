"""`liger_kernel_config`: TrainingArguments' per-kernel toggles, checked and turned into liger_core flags.

Accepted forms: None (liger_core's defaults), a dict of booleans, or the same dict as a JSON string (how it
arrives from `--liger_kernel_config '{"rope": false}'` or from a YAML file that quotes it). The keys are the
keyword arguments of `liger_core.apply_liger_kernel`: the fields of `liger_core.patching.KernelFlags`, and
`strict` (raise `liger_core.patching.PatchIncompleteError` instead of training without a kernel that was asked
for).
"""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Mapping
from typing import Any

# keys that are not kernels: `strict` makes a kernel asked for and not applied an error (default False)
OPTIONS: tuple[str, ...] = ("strict",)


def kernel_flags() -> tuple[str, ...]:
    """The kernel flag names, from liger_core's one definition (`liger_core.patching.KernelFlags`); imported
    on first use, so importing this module needs neither liger_core nor torch."""
    from liger_core.patching import KernelFlags

    return KernelFlags.names()


def config_keys() -> tuple[str, ...]:
    """Every key `liger_kernel_config` accepts: the kernel flags, then `OPTIONS`."""
    return (*kernel_flags(), *OPTIONS)


def __getattr__(name: str) -> Any:
    # KERNEL_FLAGS / CONFIG_KEYS stay importable names of this module, computed from liger_core on access
    if name == "KERNEL_FLAGS":
        return kernel_flags()
    if name == "CONFIG_KEYS":
        return config_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"liger_kernel_config[{key!r}] must be a boolean, got {value!r}")


def parse_kernel_config(config: Mapping[str, Any] | str | None) -> dict[str, bool]:
    """The `liger_core.apply_liger_kernel` keyword arguments that `config` sets (keys it leaves out keep
    liger_core's defaults), `strict` included.

    `cross_entropy=True` without a `fused_linear_cross_entropy` key turns the fused loss off, since the two
    replace the same loss: asking for the plain cross-entropy kernel means "not the fused one".
    Raises ValueError for an unknown key or bad JSON, TypeError for a non-boolean value.
    """
    if config is None:
        return {}
    if isinstance(config, str):
        text = config.strip()
        if not text:
            return {}
        try:
            config = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"liger_kernel_config is not valid JSON ({err.msg}): {text!r}") from None
    if not isinstance(config, Mapping):
        raise TypeError(
            f"liger_kernel_config must be a dict of booleans or its JSON string, got {type(config).__name__}"
        )
    keys = config_keys()
    unknown = sorted(str(k) for k in config if k not in keys)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
            if close:
                hints.append(f"{key!r}: did you mean {close[0]!r}?")
        raise ValueError(
            f"liger_kernel_config has unknown key(s) {unknown}"
            + (f" ({'; '.join(hints)})" if hints else "")
            + f"; liger_core accepts {list(keys)}"
        )
    flags = {key: _as_bool(key, value) for key, value in config.items()}
    if flags.get("cross_entropy") and "fused_linear_cross_entropy" not in flags:
        flags["fused_linear_cross_entropy"] = False
    return flags


def kernel_config_argument(text: str) -> dict[str, bool]:
    """argparse `type=` for `--liger_kernel_config`: a JSON object of booleans.

    transformers declares the field as `dict[str, bool] | None`, which argparse would call as `dict(text)` and
    reject ("invalid dict value"); the hook in `liger_core_hf.install()` puts this function in its place.
    """
    try:
        parse_kernel_config(text)
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(
            f"{err}. Example: --liger_kernel_config '{{\"rope\": false}}'"
        ) from None
    # the dict as written (validated above): TrainingArguments keeps what the user asked for
    return json.loads(text) if text.strip() else {}

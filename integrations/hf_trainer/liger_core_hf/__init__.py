"""liger_core_hf: `TrainingArguments(use_liger_kernel=True)` / `--use_liger_kernel` runs liger_core's kernels.

Three ways to turn it on (they can be combined):
- `Trainer(..., callbacks=[LigerCoreCallback()])`: this Trainer, no flag needed;
- `liger_core_hf.install()`: the flag works for every Trainer (and subclass) in the process;
- `liger-core-run train.py --use_liger_kernel ...`: an unchanged script, with `install()` active.
The third-party liger-kernel package is never imported. Wiring only: the kernels and the model patching are
liger_core's (`liger_core.apply_liger_kernel`). Names are imported lazily (`import liger_core_hf` does not
import transformers), so the launcher can report a missing liger_core before loading anything heavy.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_NAMES = {
    "LigerCoreCallback": "callback",
    "KERNEL_FLAGS": "config",
    "parse_kernel_config": "config",
    "install": "hook",
    "is_installed": "hook",
    "uninstall": "hook",
    "patch_model": "patch",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

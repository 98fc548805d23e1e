"""liger_core_hf: `TrainingArguments(use_liger_kernel=True)` / `--use_liger_kernel` runs liger_core's kernels.

Three ways to turn it on (they can be combined):
- `Trainer(..., callbacks=[LigerCoreCallback()])`: this Trainer, no flag needed;
- `liger_core_hf.install()`: the flag works for every Trainer (and subclass) in the process;
- `liger-core-run train.py --use_liger_kernel ...`: an unchanged script, with `install()` active.
The third-party liger-kernel package is never imported. Wiring only: the kernels and the model patching are
liger_core's (`liger_core.apply_liger_kernel`).
"""

from __future__ import annotations

from .callback import LigerCoreCallback
from .config import KERNEL_FLAGS, parse_kernel_config
from .hook import install, is_installed, uninstall
from .patch import patch_model

__version__ = "0.1.0"

__all__ = [
    "KERNEL_FLAGS",
    "LigerCoreCallback",
    "install",
    "is_installed",
    "parse_kernel_config",
    "patch_model",
    "uninstall",
]

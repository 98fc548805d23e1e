"""liger_core_trl: `SFTConfig(use_liger_kernel=True)` / `--use_liger_kernel` runs liger_core with TRL >= 1.15.

- `liger_core_trl.install()`: the flag works for TRL's trainers (SFT, DPO, KTO, GRPO, RLOO) and every other
  Trainer in the process (it includes `liger_core_hf.install()`);
- `liger-core-trl sft ...`: TRL's SFT script (same arguments as `trl sft`) with `install()` active.
TRL computes its losses with its own fused LM head, whose per-token log-probs come from liger_core
(`logprobs`), and liger_core adds its layer kernels underneath (see `hook`).
Names are imported lazily (`import liger_core_trl` imports neither TRL nor transformers).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_NAMES = {"install": "hook", "uninstall": "hook", "is_installed": "hook", "TESTED_TRL": "hook"}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

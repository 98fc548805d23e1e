"""LLaMA-Factory with liger_core's kernels (wiring only; the kernels and patching live in ``liger_core``).

- ``liger-lmf train config.yaml [key=value ...]``: LLaMA-Factory's training; ``enable_liger_kernel: true``
  (or ``use_liger_kernel: true``) means liger_core instead of the liger-kernel package;
  ``liger_kernel_config`` holds per-kernel toggles and ``strict`` (``options``, ``model_hooks``). Multi-GPU
  launches re-run this package's own worker module under torchrun, so every worker patches too.
- ``liger-lmf webui``: LLaMA Board with a "liger_core kernels" checkbox; runs started from it use liger_core.
- ``liger-lmf <other command>``: passed to ``llamafactory-cli`` unchanged.

The environment variable ``LIGER_CORE_LMF=1`` also turns liger_core on for ``liger-lmf train`` (it is how the
setting reaches torchrun workers).
"""

from __future__ import annotations

__version__ = "0.1.0"

ENV_FLAG = "LIGER_CORE_LMF"

"""LLaMA-Factory with liger_core's kernels (wiring only; the kernels and patching live in ``liger_core``).

- Plain ``llamafactory-cli train config.yaml`` (and its torchrun workers): ``enable_liger_kernel: true`` (or
  ``use_liger_kernel: true``) means liger_core instead of the liger-kernel package, through the start-up hook
  the wheel installs (``import_hook``, ``lmf_hooks``); ``liger_kernel_config`` holds per-kernel toggles and
  ``strict`` (``options``, ``model_hooks``).
- Plain ``llamafactory-cli webui``: LLaMA Board with a "liger_core kernels" checkbox (``webui``).
- ``liger-lmf <command>``: an alias of ``llamafactory-cli`` that works with the hook off
  (``LIGER_CORE_DISABLE_HOOK=1``); ``LIGER_CORE_LMF=1`` also turns liger_core on for ``liger-lmf train`` (it
  is how the setting reaches its own torchrun workers).
"""

from __future__ import annotations

from liger_core import startup_hook

__version__ = "0.1.0"

ENV_FLAG = "LIGER_CORE_LMF"
DISABLE_ENV = startup_hook.ENV_DISABLE  # set to a true value: the start-up hook installs nothing


def enabled_by_environment() -> bool:
    """False when ``LIGER_CORE_DISABLE_HOOK`` turns the plugins' start-up hooks off
    (``liger_core.startup_hook.disabled``)."""
    return not startup_hook.disabled()

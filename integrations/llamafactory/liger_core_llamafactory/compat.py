"""Environment workarounds needed before LLaMA-Factory is imported.

torchaudio: ``llamafactory/data/mm_plugin.py`` imports it at module level, so every train/webui path needs it
to import, although only audio datasets use it. The torchaudio wheel on the package index is a CUDA build
pinned to one torch version; next to another torch (or a CPU torch) loading it fails with
``OSError: Could not load this library: .../torchaudio/lib/_torchaudio.abi3.so``. If the import fails, we
replace it with a stub module whose attributes raise an error carrying the original failure, and log a
warning: text training works, audio datasets fail with that message. Install a torchaudio matching your torch
to use audio data.
"""

from __future__ import annotations

import importlib.machinery
import logging
import sys
import types

logger = logging.getLogger("liger_core_llamafactory")


def _stub_module(reason: str) -> types.ModuleType:
    stub = types.ModuleType("torchaudio", f"Stand-in for a torchaudio that failed to import: {reason}")
    stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)  # importlib.util.find_spec needs one

    def __getattr__(name: str):
        raise AttributeError(
            f"torchaudio.{name} is unavailable: torchaudio failed to import ({reason}), and "
            "liger-core-llamafactory put a stub in its place so that text training works. For audio datasets "
            "install a torchaudio build matching your torch."
        )

    stub.__getattr__ = __getattr__
    return stub


def ensure_torchaudio_importable() -> str | None:
    """Import torchaudio; if that fails, install the stub. Returns the failure (None if torchaudio works)."""
    if "torchaudio" in sys.modules:
        return None
    try:
        import torchaudio  # noqa: F401
    except Exception as e:  # OSError (library mismatch), ImportError, RuntimeError (missing torch ops)
        reason = f"{type(e).__name__}: {e}"
        for name in [n for n in sys.modules if n == "torchaudio" or n.startswith("torchaudio.")]:
            del sys.modules[name]
        sys.modules["torchaudio"] = _stub_module(reason)
        logger.warning(
            "liger_core_llamafactory: torchaudio failed to import (%s); using a stub so LLaMA-Factory loads. "
            "Text training "
            "is unaffected; audio datasets need a torchaudio matching this torch.",
            reason,
        )
        return reason
    return None

"""torchrun worker entry (``-m liger_core_llamafactory.worker <train args>``): hooks, then LLaMA-Factory."""

from __future__ import annotations

import sys

from liger_core_llamafactory.compat import ensure_torchaudio_importable
from liger_core_llamafactory.launch import run_training

if __name__ == "__main__":
    ensure_torchaudio_importable()
    run_training(sys.argv[1:])

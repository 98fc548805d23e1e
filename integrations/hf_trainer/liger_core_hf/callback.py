"""`LigerCoreCallback`: `Trainer(..., callbacks=[LigerCoreCallback()])` trains with liger_core's kernels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from .config import parse_kernel_config
from .hook import install
from .patch import patch_model


class LigerCoreCallback(TrainerCallback):
    """Patch the Trainer's model with liger_core at `on_init_end` (forwards only: the optimizer does not exist
    yet and accelerate/FSDP/DeepSpeed have not wrapped the model).

    `kernel_config`: per-kernel toggles (same keys as `liger_kernel_config`); None uses
    `args.liger_kernel_config`, else liger_core's defaults. The flag `use_liger_kernel` is not needed.

    Only callbacks given to the constructor see `on_init_end` (not `trainer.add_callback(...)`). The callback
    also turns on `liger_core_hf.install()`'s hook, which patches a model that `model_init` re-creates in
    `train()` (the callback itself only ever sees the first one) and keeps transformers from importing the
    third-party liger-kernel package when `use_liger_kernel=True` is set as well.
    """

    _liger_core_hf_callback = True  # how the hook recognises a Trainer that carries this callback

    def __init__(self, kernel_config: Mapping[str, Any] | str | None = None) -> None:
        parse_kernel_config(kernel_config)  # fail at construction on a bad key
        self.kernel_config = kernel_config

    def on_init_end(self, args, state, control, model=None, **kwargs):
        install()
        config = self.kernel_config if self.kernel_config is not None else args.liger_kernel_config
        patch_model(model, config)

"""`install()`: `SFTConfig(use_liger_kernel=True)` (DPO/KTO/GRPO/RLOO too) runs liger_core on TRL >= 1.15.

TRL 1.15+ handles the flag in each trainer's constructor: it warns that the flag is deprecated, raises on
`liger_kernel_config={"fused_linear_cross_entropy": True}`, and then adds its own fused LM head
(`trl.trainer.utils.add_fused_lm_head`), a forward bound on the model instance that computes the loss, the
entropy and the token accuracy in chunks without building the logits. transformers' Trainer would then apply
liger-kernel at `train()`.

With this hook:
- each TRL trainer's constructor runs with `args.use_liger_kernel` hidden (no deprecation warning, no error,
  `liger_kernel_config` left as written) and TRL's fused LM head is added as usual;
- `liger_core_hf`'s Trainer hook patches the model at `train()` (or `evaluate()`): it sees TRL's forward on
  the instance and applies liger_core's layer kernels only (RMSNorm, RoPE, SwiGLU/GeGLU, LayerNorm) inside the
  backbone that TRL's head calls. So each part is patched once: the loss is TRL's fused head (no liger_core
  fused linear cross-entropy on top), `mean_token_accuracy` and `entropy` are still TRL's metrics.
The flag stays a transformers `TrainingArguments` field, so it keeps working whatever TRL does with its own
(deprecated) handling of it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

import liger_core_hf
import trl
from liger_core_hf.hook import accept_json_kernel_config
from packaging.version import Version

logger = logging.getLogger("liger_core_trl")

# tested: 1.16.0 (CI); the fused-LM-head design this relies on appeared in 1.15.0
TESTED_TRL = (Version("1.15.0"), Version("2.0.0"))
_TRAINERS = (
    "trl.trainer.sft_trainer:SFTTrainer",
    "trl.trainer.dpo_trainer:DPOTrainer",
    "trl.trainer.kto_trainer:KTOTrainer",
    "trl.trainer.grpo_trainer:GRPOTrainer",
    "trl.trainer.rloo_trainer:RLOOTrainer",
)
_originals: dict[type, Callable[..., Any]] = {}


def _trainer_classes() -> list[type]:
    """TRL's trainers that handle `use_liger_kernel` in their constructor (plus any other `_BaseTrainer`
    subclass already defined, e.g. experimental ones)."""
    classes = []
    for path in _TRAINERS:
        module, name = path.split(":")
        classes.append(getattr(importlib.import_module(module), name))
    from trl.trainer.base_trainer import _BaseTrainer

    stack = list(_BaseTrainer.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls not in classes and "__init__" in cls.__dict__ and cls.__module__.startswith("trl."):
            classes.append(cls)
    return classes


def _hide_flag_in(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            training_args = signature.bind_partial(self, *args, **kwargs).arguments.get("args")
        except TypeError:
            training_args = None
        if not getattr(training_args, "use_liger_kernel", False):
            return original(self, *args, **kwargs)
        training_args.use_liger_kernel = False
        try:
            original(self, *args, **kwargs)
        finally:
            training_args.use_liger_kernel = True
            if (
                getattr(self, "args", None) is not None
            ):  # a trainer may have converted args to its config class
                self.args.use_liger_kernel = True

    return __init__


def install() -> None:
    """liger_core_hf.install() plus the TRL part above. Idempotent."""
    liger_core_hf.install()
    version = Version(trl.__version__)
    if not TESTED_TRL[0] <= version < TESTED_TRL[1]:
        logger.warning(
            "liger_core_trl supports TRL >= %s, < %s; TRL %s is installed: use_liger_kernel may not work",
            *TESTED_TRL,
            version,
        )
    # TRL >= 1.16 parses scripts' arguments with its own copy of HfArgumentParser
    from trl import TrlParser

    accept_json_kernel_config(TrlParser)
    for cls in _trainer_classes():
        if cls not in _originals:
            _originals[cls] = cls.__dict__["__init__"]
            cls.__init__ = _hide_flag_in(_originals[cls])


def uninstall() -> None:
    while _originals:
        cls, original = _originals.popitem()
        cls.__init__ = original
    liger_core_hf.uninstall()


def is_installed() -> bool:
    return bool(_originals) and liger_core_hf.is_installed()

"""Where liger_core enters LLaMA-Factory's model loading (``llamafactory.model.loader.load_model``).

``load_model`` calls, by module-global name:
1. ``apply_liger_kernel(config, model_args, is_trainable, require_logits)`` before ``from_pretrained``:
   LLaMA-Factory's liger-kernel step. We replace it with a function that only records ``require_logits``
   (rm, dpo, kto and ppo need logits: they get liger's plain cross-entropy, not the fused linear one, the rule
   LLaMA-Factory applies to liger-kernel).
2. ``patch_model(model, ...)`` right after the model is built, before adapters: we wrap it to patch that
   trainable model instance with ``liger_core.apply_liger_kernel`` and log what it now runs.

Instance patching, not class-level: only the trained model is touched (never a frozen reference or reward
model), unknown architectures go through liger_core's structural patching, and no transformers class-patch
mapping is registered (on transformers 5.6, the version LLaMA-Factory 0.9.5 installs, a registered mapping
makes every ``from_pretrained`` import all image-processing modules, which fails without torchvision).

Messages go to the ``llamafactory.liger_core`` logger, so LLaMA-Factory's handlers (stdout, and LLaMA
Board's running log when started from the web UI) show them; every rank logs.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from typing import Any

import liger_core
from liger_core.patching import UnsupportedModelError

logger = logging.getLogger("llamafactory.liger_core")

_installed = False


def kernel_flags(require_logits: bool) -> dict[str, bool]:
    """liger_core flags for a stage; ``require_logits`` (rm/dpo/kto/ppo, LLaMA-Factory's rule): plain CE."""
    return dict(fused_linear_cross_entropy=not require_logits, cross_entropy=require_logits)


def active_kernels(model: Any) -> str:
    """Which liger_core kernels the built model runs: patched modules per kind (including the causal LM)."""
    from liger_core.patching.instance import unwrap

    kinds = Counter(getattr(m, "_liger_core_kind", None) for m in unwrap(model).modules())
    kinds.pop(None, None)
    return ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items())) or "none"


def patch_trainable_model(model: Any, require_logits: bool) -> None:
    rank = os.getenv("RANK", "0")
    try:
        report = liger_core.apply_liger_kernel(model, **kernel_flags(require_logits))
    except UnsupportedModelError as e:
        logger.warning("[rank %s] liger_core could not patch this model; training without it: %s", rank, e)
        return
    logger.info("[rank %s] %s", rank, report)
    logger.info(
        "[rank %s] liger_core kernels active on %s: %s", rank, type(model).__name__, active_kernels(model)
    )


def install() -> None:
    """Route LLaMA-Factory's liger step to liger_core in this process (idempotent)."""
    global _installed
    if _installed:
        return
    from llamafactory.model import loader

    original_apply, original_patch_model = loader.apply_liger_kernel, loader.patch_model

    def apply_liger_kernel(config, model_args, is_trainable, require_logits):
        # load_model calls patch_model without the stage: remember what this load needs
        model_args._liger_core_require_logits = require_logits

    def patch_model(model, tokenizer, model_args, is_trainable, add_valuehead):
        original_patch_model(model, tokenizer, model_args, is_trainable, add_valuehead)
        if is_trainable:
            patch_trainable_model(model, getattr(model_args, "_liger_core_require_logits", False))

    apply_liger_kernel.__wrapped__ = original_apply
    patch_model.__wrapped__ = original_patch_model
    loader.apply_liger_kernel = apply_liger_kernel
    loader.patch_model = patch_model
    _installed = True

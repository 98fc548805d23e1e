"""Where liger_core enters LLaMA-Factory's model loading (``llamafactory.model.loader.load_model``).

``load_model`` calls, by module-global name:
1. ``apply_liger_kernel(config, model_args, is_trainable, require_logits)`` before ``from_pretrained``:
   LLaMA-Factory's liger-kernel step. We replace it with a function that only records ``require_logits``
   (rm, dpo, kto and ppo need logits: they get liger's plain cross-entropy, not the fused linear one, the rule
   LLaMA-Factory applies to liger-kernel).
2. ``patch_model(model, ...)`` right after the model is built, before adapters: we wrap it to patch that
   trainable model instance with ``liger_core.apply_liger_kernel`` and log what it now runs.
3. ``init_adapter(...)``: we wrap it to report a PEFT adapter on lm_head, through which the fused linear
   cross-entropy computes the full logits (correct, not fused): not applied.

``liger_kernel_config`` (``options.pop_kernel_config``) toggles kernels on top of the stage's loss rule, and
its ``strict: true`` turns every kernel asked for and not applied (liger_core's ``report.missing``, the
adapter on lm_head, a model liger_core cannot patch at all) into an error before training; without it each is
a warning.

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
from collections.abc import Mapping
from typing import Any

import liger_core
from liger_core.patching import (
    PatchIncompleteError,
    PatchReport,
    UnsupportedModelError,
    refuse_liger_kernel,
    served_by,
)

# what may have applied liger-kernel to a model in a LLaMA-Factory run (liger_core's refusal names it)
LIGER_KERNEL_SOURCES = "e.g. liger_kernel.transformers.apply_liger_kernel_to_*"

logger = logging.getLogger("llamafactory.liger_core")

FLCE = "fused_linear_cross_entropy"
_installed = False
_kernel_config: dict[str, bool] = {}  # liger_kernel_config of this run (options.pop_kernel_config)


def kernel_flags(require_logits: bool, config: Mapping[str, bool] | None = None) -> dict[str, bool]:
    """``liger_core.apply_liger_kernel`` keyword arguments for a stage: its loss by LLaMA-Factory's rule
    (``require_logits``, rm/dpo/kto/ppo: plain CE; else the fused linear CE), then ``config``'s toggles.
    ``cross_entropy: true`` alone turns the fused loss off; the fused loss where logits are needed is an
    error."""
    user = dict(config or {})
    if user.get("cross_entropy") and "fused_linear_cross_entropy" not in user:
        user["fused_linear_cross_entropy"] = False
    if require_logits and user.get("fused_linear_cross_entropy"):
        raise ValueError(
            "liger_kernel_config: fused_linear_cross_entropy with a stage that needs the logits "
            "(rm, dpo, kto, ppo); use cross_entropy there"
        )
    return {"fused_linear_cross_entropy": not require_logits, "cross_entropy": require_logits, **user}


_announced = False
_flag: str | None = None  # the setting that turned liger_core on in this process (``install``'s flag)


def served_by_line(flag: str) -> str:
    """Which library serves the liger flag here, and whether liger-kernel is installed beside it (unused)."""
    return f"liger_core_llamafactory: {served_by(flag, 'liger-core-llamafactory')}"


def announce(flag: str | None = None) -> None:
    """Log ``served_by_line`` once per process, on rank 0 only (``patch_trainable_model`` calls it when it
    patches the model: by then LLaMA-Factory's handlers, LLaMA Board's running log among them, are in
    place)."""
    global _announced
    flag = flag or _flag
    if _announced or flag is None:
        return
    _announced = True
    if os.getenv("RANK", "0") == "0" and os.getenv("LOCAL_RANK", "0") == "0":
        logger.info("%s", served_by_line(flag))


def patch_trainable_model(model: Any, require_logits: bool) -> PatchReport | None:
    """Patch the model LLaMA-Factory is about to train; its report (None: liger_core could not patch it)."""
    rank = os.getenv("RANK", "0")
    announce()
    refuse_liger_kernel(model, flag="enable_liger_kernel", applied_by=LIGER_KERNEL_SOURCES)
    flags = kernel_flags(require_logits, _kernel_config)
    try:
        report = liger_core.apply_liger_kernel(model, **flags)
    except UnsupportedModelError as e:
        if flags.get("strict"):
            raise
        logger.warning("[rank %s] liger_core could not patch this model; training without it: %s", rank, e)
        return None
    (logger.warning if report.missing else logger.info)("[rank %s] %s", rank, report)
    logger.info(
        "[rank %s] liger_core kernels active on %s: %s", rank, type(model).__name__, report.active_kernels()
    )
    return report


def check_adapters(model: Any) -> None:
    """After adapters, on a model patched with the fused linear cross-entropy: a PEFT layer on lm_head means
    the fused loss computes the full logits through it."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return
    get_head = getattr(model, "get_output_embeddings", None)
    if not (callable(get_head) and isinstance(get_head(), BaseTunerLayer)):
        return
    kind = FLCE
    reason = "a PEFT adapter wraps lm_head, so the fused loss computes the full logits through it"
    if _kernel_config.get("strict"):
        owner = type(model).__name__
        raise PatchIncompleteError.one_kernel(
            owner,
            kind,
            reason,
            f"liger_core: liger_kernel_config strict: {kind} cannot be applied to {owner}: {reason}. Fix the "
            "cause, or turn strict off to train without it.",
        )
    logger.warning(
        "[rank %s] liger_core: NOT applied on %s: %s (%s)",
        os.getenv("RANK", "0"),
        type(model).__name__,
        kind,
        reason,
    )


def is_installed() -> bool:
    return _installed


def install(kernel_config: Mapping[str, bool] | None = None, flag: str | None = None) -> None:
    """Route LLaMA-Factory's liger step to liger_core in this process (idempotent), with the toggles of
    ``liger_kernel_config`` (the latest call's); ``flag``: the setting that turned liger_core on (for
    ``announce``)."""
    global _installed, _kernel_config, _flag
    _kernel_config = dict(kernel_config or {})
    if flag is not None:
        _flag = flag
    if _installed:
        return
    from llamafactory.model import loader

    original_apply, original_patch_model = loader.apply_liger_kernel, loader.patch_model
    original_init_adapter = loader.init_adapter

    def apply_liger_kernel(config, model_args, is_trainable, require_logits):
        # load_model calls patch_model without the stage: remember what this load needs
        model_args._liger_core_require_logits = require_logits

    def patch_model(model, tokenizer, model_args, is_trainable, add_valuehead):
        original_patch_model(model, tokenizer, model_args, is_trainable, add_valuehead)
        if is_trainable:
            report = patch_trainable_model(model, getattr(model_args, "_liger_core_require_logits", False))
            model_args._liger_core_fused_loss = report is not None and FLCE in report.kinds

    def init_adapter(config, model, model_args, finetuning_args, is_trainable):
        model = original_init_adapter(config, model, model_args, finetuning_args, is_trainable)
        if is_trainable and getattr(model_args, "_liger_core_fused_loss", False):
            check_adapters(model)
        return model

    apply_liger_kernel.__wrapped__ = original_apply
    patch_model.__wrapped__ = original_patch_model
    init_adapter.__wrapped__ = original_init_adapter
    loader.apply_liger_kernel = apply_liger_kernel
    loader.patch_model = patch_model
    loader.init_adapter = init_adapter
    _installed = True

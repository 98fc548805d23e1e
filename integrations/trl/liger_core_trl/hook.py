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
- while a flagged trainer is built (DPO's `precompute_ref_log_probs` runs there) and while it trains,
  evaluates or predicts, TRL's fused LM head computes its per-token log-probs (and entropy, mean logit, top-1
  statistics) with `liger_core.ops.fused_linear_logprobs` instead of TRL's own kernel (`logprobs`): the
  policy's and the reference model's. TRL's losses and metrics are computed by TRL's code from them.
  `liger_kernel_config={"fused_linear_cross_entropy": false}` keeps TRL's kernel (layer kernels only).
The flag stays a transformers `TrainingArguments` field, so it keeps working whatever TRL does with its own
(deprecated) handling of it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import inspect
import logging
from collections.abc import Callable
from typing import Any

import liger_core_hf
import liger_core_hf.hook
from liger_core_hf.config import parse_kernel_config
from liger_core_hf.hook import accept_json_kernel_config, kernel_config, wants_liger
from liger_core_hf.parser import restore_methods
from liger_core_hf.patch import flag_in_use
from packaging.version import Version

from .logprobs import liger_logprobs_unsupported, use_liger_core_logprobs

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
# (class, method name) -> the class's own method before install(), or None when it inherited it
_originals: dict[tuple[type, str], Callable[..., Any] | None] = {}
_RUN_METHODS = ("train", "evaluate", "predict")
_DECLINED = "_liger_core_trl_logprobs_declined"  # set on args once the reason to keep TRL's kernel is logged


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


def use_liger_logprobs(args: Any, config: Any, owner: str) -> bool:
    """Whether a trainer that asked for liger_core (its `args`, kernel `config`) computes its log-probs with
    liger_core: yes unless the config turns the fused linear cross-entropy off or TRL needs its own kernel.

    When TRL needs its own kernel: with `strict` in the config, liger_core's `PatchIncompleteError` (naming
    `owner`, the trainer class); without it, one warning per `args`.
    """
    flags = parse_kernel_config(config)
    if flags.get("fused_linear_cross_entropy", True) is False:
        return False
    reason = liger_logprobs_unsupported(args)
    if reason is None:
        return True
    if flags.get("strict"):
        from liger_core.patching import PatchIncompleteError

        kind = "fused_linear_cross_entropy"
        raise PatchIncompleteError.one_kernel(  # the model may carry layer kernels already: own message
            owner,
            kind,
            f"TRL's own log-prob kernel is needed: {reason}",
            f"use_liger_kernel: liger_kernel_config strict: {kind} cannot be applied to {owner}: TRL's own "
            f'log-prob kernel is needed ({reason}). Fix the cause, set "{kind}": false to keep TRL\'s '
            "kernel, or turn strict off.",
        )
    if not getattr(args, _DECLINED, False):
        logger.warning(
            "use_liger_kernel: NOT applied: fused_linear_cross_entropy (TRL's own log-prob kernel is "
            "kept: %s)",
            reason,
        )
        setattr(args, _DECLINED, True)
    return False


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
        flag_in_use()
        logprobs: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if use_liger_logprobs(training_args, training_args.liger_kernel_config, type(self).__name__):
            logprobs = use_liger_core_logprobs()
            logger.info(
                "use_liger_kernel: %s's fused LM head computes its log-probs with "
                "liger_core.ops.fused_linear_logprobs",
                type(self).__name__,
            )
        training_args.use_liger_kernel = False
        try:
            with logprobs:
                original(self, *args, **kwargs)
        finally:
            training_args.use_liger_kernel = True
            if (
                getattr(self, "args", None) is not None
            ):  # a trainer may have converted args to its config class
                self.args.use_liger_kernel = True

    return __init__


def _with_liger_logprobs(cls: type, name: str, own: Callable[..., Any] | None) -> Callable[..., Any]:
    """`cls.<name>` (its own method, or the inherited one) run under liger_core's log-probs when the trainer
    asked for liger_core."""

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if own is not None:
            return own(self, *args, **kwargs)
        return getattr(super(cls, self), name)(*args, **kwargs)

    @functools.wraps(own if own is not None else getattr(cls, name))
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not (
            wants_liger(self) and use_liger_logprobs(self.args, kernel_config(self), type(self).__name__)
        ):
            return call(self, *args, **kwargs)
        with use_liger_core_logprobs():
            return call(self, *args, **kwargs)

    return method


def _wrap(cls: type, name: str, make: Callable[[Callable[..., Any] | None], Callable[..., Any]]) -> None:
    if (cls, name) in _originals:
        return
    own = cls.__dict__.get(name)
    _originals[(cls, name)] = own
    setattr(cls, name, make(own))


_version_checked = False


def _check_trl_version() -> None:
    global _version_checked
    if _version_checked:
        return
    _version_checked = True
    version = Version(importlib.metadata.version("trl"))
    if not TESTED_TRL[0] <= version < TESTED_TRL[1]:
        logger.warning(
            "liger_core_trl supports TRL >= %s, < %s; TRL %s is installed: use_liger_kernel may not work",
            *TESTED_TRL,
            version,
        )


def _install_classes(classes: list[type]) -> None:
    from trl.trainer.base_trainer import _BaseTrainer

    for cls in classes:
        if cls is not _BaseTrainer and "__init__" in cls.__dict__:
            _wrap(cls, "__init__", _hide_flag_in)
    for cls in classes:
        for name in _RUN_METHODS:
            if cls is _BaseTrainer or name in cls.__dict__:
                _wrap(cls, name, functools.partial(_with_liger_logprobs, cls, name))


def install_module(module: Any, classes: list[type]) -> None:
    """The hook for the trainer classes defined in one TRL module, right after it was imported (what the
    `.pth` activation calls; `_BaseTrainer` itself when `module` is `trl.trainer.base_trainer`). Does not
    import liger_core: a missing liger-core is reported when the flag is used."""
    _check_trl_version()
    liger_core_hf.hook.install_trainer_hook()
    _install_classes(classes)


def install() -> None:
    """liger_core_hf.install() plus the TRL part above, for TRL's trainers. Idempotent."""
    liger_core_hf.install()
    _check_trl_version()
    # TrlParser is an HfArgumentParser: liger_core_hf's parser hook covers it; kept for older copies
    from trl import TrlParser

    accept_json_kernel_config(TrlParser)
    from trl.trainer.base_trainer import _BaseTrainer

    _install_classes([_BaseTrainer, *_trainer_classes()])


def uninstall() -> None:
    restore_methods(_originals)
    liger_core_hf.uninstall()


def is_installed() -> bool:
    return bool(_originals) and liger_core_hf.is_installed()

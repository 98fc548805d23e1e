"""`install()`: `TrainingArguments(use_liger_kernel=True)` runs liger_core in every Trainer of the process.

transformers acts on the flag itself: it imports the third-party `liger_kernel` package (ImportError when
it is absent) in `Trainer.train()` since 5.3, in `Trainer.__init__` before. The hook wraps methods of the base
class `transformers.Trainer` (so every subclass goes through it: TRL's, LLaMA-Factory's, Axolotl's):

- `train()`: patches the model with liger_core, then hides the flag (`args.use_liger_kernel = False`) from
  transformers' own check and gives it back at `on_train_begin` (after the check, before the first step and
  before any evaluation, which uses it to skip the logits when only the loss is needed) or when train() exits.
  The patch happens before `create_optimizer` and before accelerate/FSDP/DeepSpeed wrap the model.
- `call_model_init()`: a model that `model_init` re-creates is patched as soon as it is built.
- `evaluate()` / `predict()` without a `train()` first: the model is patched before use.
- `__init__()` (transformers < 5.3 only, where the check is in the constructor): the flag is hidden during the
  constructor and the model patched right after it.
- `apply_liger_kernel`, the function through which transformers applies liger-kernel (imported by name into
  `transformers.trainer`, defined in `transformers.integrations.liger`), is replaced in both modules by one
  that patches with liger_core: should a release reach it with the flag visible, liger_core still serves it
  and liger-kernel is never called (`tests/test_activation.py` checks where transformers calls it).
- `HfArgumentParser`: `--liger_kernel_config '{"rope": false}'` is parsed as JSON and misspelled liger options
  are errors that name the option meant (`liger_core_hf.parser`).

A Trainer wants liger_core when its `args.use_liger_kernel` is set or when it was given a `LigerCoreCallback`.
`uninstall()` puts every original method back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import transformers
from packaging.version import Version
from transformers import Trainer, TrainerCallback

from . import parser
from .parser import accept_json_kernel_config
from .patch import is_handled, patch_model, require_liger_core

_CHECKS_IN_INIT = Version(transformers.__version__).release < (5, 3)
_originals: dict[tuple[type, str], Callable[..., Any]] = {}

_HIDDEN = "_liger_core_hf_flag_hidden"  # set on the Trainer while its args.use_liger_kernel is hidden


def _callback(trainer: Any) -> Any:
    handler = getattr(trainer, "callback_handler", None)
    for callback in getattr(handler, "callbacks", ()):
        if getattr(callback, "_liger_core_hf_callback", False):
            return callback
    return None


def wants_liger(trainer: Any) -> bool:
    """Whether `trainer` asked for liger_core (the flag, hidden or not, or a LigerCoreCallback)."""
    args = getattr(trainer, "args", None)
    return bool(
        getattr(trainer, _HIDDEN, False) or getattr(args, "use_liger_kernel", False) or _callback(trainer)
    )


def kernel_config(trainer: Any) -> Any:
    """The toggles to use: the callback's own config if it has one, else `args.liger_kernel_config`."""
    callback = _callback(trainer)
    if callback is not None and callback.kernel_config is not None:
        return callback.kernel_config
    return getattr(trainer.args, "liger_kernel_config", None)


def ensure_patched(trainer: Any) -> None:
    model = getattr(trainer, "model", None)
    if model is not None and not is_handled(model):
        patch_model(model, kernel_config(trainer))


class _GiveFlagBack(TrainerCallback):
    """First callback of a train() that hid the flag: gives it back once transformers has passed its check."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        _show_flag(self.trainer)


def _hide_flag(trainer: Any) -> None:
    trainer.args.use_liger_kernel = False
    setattr(trainer, _HIDDEN, True)


def _show_flag(trainer: Any) -> None:
    if getattr(trainer, _HIDDEN, False):
        trainer.args.use_liger_kernel = True
        setattr(trainer, _HIDDEN, False)


def _train(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def train(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, _HIDDEN, False) or not wants_liger(self):
            return original(self, *args, **kwargs)
        if self.model_init is None:  # else call_model_init patches the model that train() re-creates
            ensure_patched(self)
        if not self.args.use_liger_kernel:  # requested through the callback only: nothing to hide
            return original(self, *args, **kwargs)
        give_back = _GiveFlagBack(self)
        self.callback_handler.callbacks.insert(0, give_back)
        _hide_flag(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            _show_flag(self)
            self.callback_handler.callbacks.remove(give_back)

    return train


def _call_model_init(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call_model_init(self, *args: Any, **kwargs: Any) -> Any:
        model = original(self, *args, **kwargs)
        if wants_liger(self):
            patch_model(model, kernel_config(self))
        return model

    return call_model_init


def _patch_first(original: Callable[..., Any]) -> Callable[..., Any]:
    """evaluate()/predict(): patch a model that was not trained (nor patched) yet."""

    @functools.wraps(original)
    def method(self, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, _HIDDEN, False) and wants_liger(self):
            ensure_patched(self)
        return original(self, *args, **kwargs)

    return method


def _init(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers < 5.3 checks the flag in the constructor: hide it there, patch right after."""

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if not getattr(training_args, "use_liger_kernel", False):
            return original(self, *args, **kwargs)
        setattr(self, _HIDDEN, True)
        training_args.use_liger_kernel = False
        try:
            original(self, *args, **kwargs)
        finally:
            training_args.use_liger_kernel = True
            setattr(self, _HIDDEN, False)
        ensure_patched(self)

    return __init__


def _wrap(cls: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    if (cls, name) in _originals:
        return
    original = cls.__dict__[name]
    _originals[(cls, name)] = original
    setattr(cls, name, make(original))


# transformers' function that applies liger-kernel, by module: 5.2+ defines it in integrations.liger and
# imports it by name into trainer (whose train() calls it for the flag from 5.3)
_TRANSFORMERS_CALL_SITES = ("transformers.integrations.liger", "transformers.trainer")
_module_originals: dict[str, Callable[..., Any]] = {}


def serve_transformers_call(model: Any, kernel_config: Any = None) -> None:
    """Stands in for transformers' `apply_liger_kernel(model, kernel_config)`: liger_core patches the model
    (once: a model the Trainer hook patched already is left as it is)."""
    if not is_handled(model):
        patch_model(model, kernel_config)


def _intercept_transformers_call() -> None:
    import importlib

    for name in _TRANSFORMERS_CALL_SITES:
        if name in _module_originals:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:  # transformers < 5.2: the call is inline in Trainer.__init__ (hidden flag)
            continue
        original = getattr(module, "apply_liger_kernel", None)
        if original is None:
            continue
        _module_originals[name] = original
        module.apply_liger_kernel = serve_transformers_call


def install_trainer_hook() -> None:
    """The Trainer part of `install()`, without importing liger_core: a missing liger-core is reported when
    the flag is used (what the `.pth` activation installs when `transformers.trainer` is imported)."""
    _wrap(Trainer, "train", _train)
    _wrap(Trainer, "call_model_init", _call_model_init)
    _wrap(Trainer, "evaluate", _patch_first)
    _wrap(Trainer, "predict", _patch_first)
    if _CHECKS_IN_INIT:
        _wrap(Trainer, "__init__", _init)
    _intercept_transformers_call()
    accept_json_kernel_config()


def install() -> None:
    """Make `use_liger_kernel` / `--use_liger_kernel` run liger_core for every Trainer in this process.

    Idempotent. Raises ImportError (with the fix) if liger_core cannot be imported.
    """
    require_liger_core()
    install_trainer_hook()


def uninstall() -> None:
    """Put back every method `install()` wrapped (models already patched stay patched)."""
    import sys

    while _originals:
        (cls, name), original = _originals.popitem()
        setattr(cls, name, original)
    while _module_originals:
        name, original = _module_originals.popitem()
        sys.modules[name].apply_liger_kernel = original
    parser.uninstall()


def is_installed() -> bool:
    return bool(_originals)

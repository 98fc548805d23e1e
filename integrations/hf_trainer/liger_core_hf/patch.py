"""Patch a Trainer's model with liger_core: the one place where the plugins call into liger_core.

All kernel and patching logic lives in liger_core (`liger_core.apply_liger_kernel`); this module only decides
the flags, turns liger_core's errors into messages that name the Trainer setting, and logs once which library
serves `use_liger_kernel`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import os
import sys
import types
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from .config import parse_kernel_config

logger = logging.getLogger("liger_core_hf")

# models this plugin has already handed to liger_core (patching is idempotent; this only avoids repeated logs
# and a second patch on top of a forward that someone wrapped after us, e.g. accelerate's fp32 output wrapper)
_handled: weakref.WeakSet = weakref.WeakSet()
_announced = False


INSTALL_HINT = (
    "liger-core is installed from a clone of its repository (it is not on the package index): "
    "`pip install -e .` at the repository root, then `pip install -e integrations/hf_trainer`"
)


def require_liger_core() -> types.ModuleType:
    """`liger_core`, or an ImportError that says what is missing and how to fix it."""
    try:
        return importlib.import_module("liger_core")
    except ImportError as err:
        raise ImportError(
            "use_liger_kernel: liger_core_hf runs this flag with the liger-core package, which cannot be "
            f"imported ({err}). {INSTALL_HINT}; or turn use_liger_kernel off."
        ) from err


def rank() -> int:
    """This process's rank as torchrun / accelerate launch set it (0 when not distributed)."""
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def show_patch_logs(names: Sequence[str] = ("liger_core", "liger_core_hf", "liger_core_trl")) -> None:
    """Print the plugins' log lines (which library serves the flag, liger_core's one-line patch report) on
    stderr, at INFO on rank 0 and WARNING on other ranks, unless logging is configured for these loggers."""
    for name in names:
        log = logging.getLogger(name)
        if not log.handlers and log.level == logging.NOTSET:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO if rank() == 0 else logging.WARNING)
            log.propagate = False


def _from_liger_kernel(obj: Any) -> bool:
    func = getattr(obj, "__func__", obj)
    try:
        func = inspect.unwrap(func)
    except ValueError:
        return False
    return str(getattr(func, "__module__", "") or "").split(".")[0] == "liger_kernel"


def liger_kernel_patches(model: Any) -> list[str]:
    """Where the third-party liger-kernel has patched `model`: forwards bound on its modules, module classes
    or class forwards of liger-kernel's, and functions of the model's modeling modules that liger-kernel
    replaced (its `apply_liger_kernel_to_<model>` swaps e.g. `apply_rotary_pos_emb` module-wide)."""
    found: list[str] = []
    modules_seen: set[str] = set()
    for name, module in _unwrap(model).named_modules():
        where = name or type(module).__name__
        cls = type(module)
        if _from_liger_kernel(cls) or _from_liger_kernel(getattr(cls, "forward", None)):
            found.append(f"{where} ({cls.__module__}.{cls.__qualname__})")
        elif _from_liger_kernel(vars(module).get("forward")):
            found.append(f"{where}.forward")
        modules_seen.add(cls.__module__)
    for module_name in sorted(m for m in modules_seen if m.split(".")[0] != "liger_kernel"):
        namespace = vars(sys.modules.get(module_name, types.ModuleType(module_name)))
        for attr, value in namespace.items():
            if callable(value) and not isinstance(value, type) and _from_liger_kernel(value):
                found.append(f"{module_name}.{attr}")
    return found


def _unwrap(model: Any) -> Any:
    """The transformers model inside a PEFT wrapper (its forward is the one a fused loss would replace)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _is_liger_core_forward(forward: Any) -> bool:
    """True when the function at the bottom of `forward`'s decorator chain (`__wrapped__`, as functools.wraps
    sets it) is one of liger_core's: its fused-loss forward, bound by an earlier patch."""
    func = getattr(forward, "__func__", forward)
    try:
        func = inspect.unwrap(func)
    except ValueError:  # a cycle of __wrapped__
        return False
    return str(getattr(func, "__module__", "")).split(".")[0] == "liger_core"


def foreign_forward(model: Any) -> str | None:
    """Who replaced `model.forward` on this instance, or None if it is the class's own (or liger_core's).

    Frameworks that compute the loss themselves bind their own forward on the instance (TRL >= 1.15's fused
    LM head, `trl.trainer.utils.add_fused_lm_head`). liger_core's fused-linear-cross-entropy forward would be
    bound in the same place, so it must not be applied on top: the framework's forward would be lost.
    """
    module = _unwrap(model)
    bound = vars(module).get("forward")
    if bound is None or _is_liger_core_forward(bound):
        return None
    if getattr(module, "_hf_hook", None) is not None and "_old_forward" in vars(module):
        return None  # accelerate's device_map hook: liger_core patches the `_old_forward` it calls
    func = getattr(bound, "__func__", bound)
    code = getattr(func, "__code__", None)
    if code is None:
        return type(func).__name__
    return f"{code.co_name} from {code.co_filename}"


_PLUGINS = (("liger-core-hf", "liger_core_hf"), ("liger-core-trl", "liger_core_trl"))


def flag_in_use() -> None:
    """Where a plugin first acts on `use_liger_kernel`: under the `.pth` activation, show the plugins' log
    lines (the script did not set up liger_core, so the user should see it act); log once which library
    serves the flag."""
    from . import activation

    if activation.active():
        show_patch_logs()
    _announce_library()


def _announce_library() -> None:
    """One line, once per process, on rank 0: which library serves the flag, and its version."""
    global _announced
    if _announced:
        return
    _announced = True
    if rank() != 0:
        return
    plugins = [f"{dist} {sys.modules[name].__version__}" for dist, name in _PLUGINS if name in sys.modules]
    ours = getattr(require_liger_core(), "__version__", "?")
    line = f"use_liger_kernel is served by liger_core {ours} ({', '.join(plugins)})"
    try:
        line += f"; the installed liger-kernel {importlib.metadata.version('liger-kernel')} is not used"
    except importlib.metadata.PackageNotFoundError:
        pass
    logger.info(line)


def patch_model(model: Any, kernel_config: Mapping[str, Any] | str | None = None) -> Any:
    """Patch `model` (a transformers model, PEFT-wrapped or not) in place with liger_core; returns the report.

    Forwards are swapped, parameters are untouched, so this is safe at any time before the optimizer is built.
    Calling it again on the same model does nothing (returns None). When the model's forward was already
    replaced by someone else (see `foreign_forward`), the fused linear cross-entropy is left out and only the
    layer kernels apply. A kernel that was asked for and not applied is logged as a warning
    (`report.missing`); with `strict` in the config, liger_core's `PatchIncompleteError` is raised instead
    and the model is left unpatched.
    """
    if model is None:
        raise ValueError("use_liger_kernel: the Trainer has no model to patch")
    if model in _handled:
        return None
    liger_core = require_liger_core()
    flags = parse_kernel_config(kernel_config)
    other = liger_kernel_patches(model)
    if other:
        raise RuntimeError(
            f"use_liger_kernel: {type(_unwrap(model)).__name__} already carries liger-kernel's patches "
            f"({', '.join(other[:6])}{', ...' if len(other) > 6 else ''}); liger_core and liger-kernel "
            "must not patch the same model. Something in this process called liger-kernel (e.g. "
            "apply_liger_kernel_to_<model>, whose swaps of module functions reach every later model of that "
            "type): remove that call, or set LIGER_CORE_DISABLE_HOOK=1 to let transformers serve the flag "
            "with liger-kernel."
        )
    owner = foreign_forward(model)
    if owner is not None and flags.get("fused_linear_cross_entropy", True):
        log = logger.warning if flags.get("fused_linear_cross_entropy") else logger.info
        log(
            "use_liger_kernel: %s.forward is replaced on this model (%s), which computes the loss itself; "
            "liger_core patches the layers only (no fused linear cross-entropy on top of it)",
            type(_unwrap(model)).__name__,
            owner,
        )
        flags["fused_linear_cross_entropy"] = False
    from liger_core.patching import UnsupportedModelError

    try:
        report = liger_core.apply_liger_kernel(model, **flags)
    except UnsupportedModelError as err:
        supported = ", ".join(liger_core.supported_model_types())
        config = getattr(_unwrap(model), "config", None)
        raise UnsupportedModelError(
            f"use_liger_kernel: liger_core cannot patch {type(_unwrap(model)).__name__} "
            f"(model_type {getattr(config, 'model_type', None)!r}): {err}. "
            f"Supported model types: {supported}. "
            "Turn use_liger_kernel off for this model."
        ) from err
    _handled.add(model)
    flag_in_use()
    # str(report) names each kernel in report.missing with its reason ("NOT applied: ...")
    (logger.warning if report.missing else logger.info)("use_liger_kernel: %s", report)
    return report


def is_handled(model: Any) -> bool:
    """True once `patch_model` has patched `model` (or liger_core reports it patched by other means)."""
    if model is None:
        return False
    if model in _handled:
        return True
    from liger_core.patching import is_patched

    return bool(is_patched(model))

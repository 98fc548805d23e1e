"""``LigerCorePlugin``: Axolotl plugin hooks (config keys and validation: ``args.py``).

- ``register(cfg)``: says the plugin is active, and names every other listed plugin Axolotl failed to import
  (Axolotl only logs those and drops their keys).
- ``pre_model_load(cfg)``: class-level patching of ``cfg.model_config_type`` when liger_core has a recipe for
  it, so the model is built with liger_core layers. The patch is first checked against transformers' own
  class-patching step of ``from_pretrained``; if that step fails in this environment, the patch is undone and
  the instance path below is used instead (logged).
- ``post_model_build(cfg, model)``: if the built model is not patched (no recipe, or class-level undone),
  patch the instance (``liger_core.apply_liger_kernel``; structural patching for unknown architectures). Then
  log the kernels the model runs. Runs before adapters, so LoRA wraps the patched layers.

Log lines go to the ``axolotl.integrations.liger_core`` logger: Axolotl's console shows INFO only for
``axolotl.*`` loggers.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from typing import Any

from axolotl.integrations.base import BasePlugin

from liger_core_axolotl.args import PLUGIN_NAME, liger_core_flags, truthy

LOG = logging.getLogger("axolotl.integrations.liger_core")


def active_kernels(report: Any) -> str:
    """The liger_core kernels a built model runs, from an ``apply_liger_kernel`` report: what it swapped plus
    what it found already patched (by the class-level patch in ``pre_model_load``)."""
    kinds = Counter(report.already)
    kinds.update(report.swapped)
    return ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items()) if n) or "none"


def class_patching_failure() -> str | None:
    """Run transformers' class-patching step of ``from_pretrained`` (>= 5.3) once; its error, if any."""
    try:
        from transformers.monkey_patching import apply_patches
    except ImportError:
        return None
    try:
        with apply_patches():
            pass
    except Exception as e:  # e.g. transformers 5.5-5.16 importing every image processor without torchvision
        return f"{type(e).__name__}: {e}"
    return None


class LigerCorePlugin(BasePlugin):
    """List ``liger_core_axolotl.LigerCorePlugin`` under ``plugins:`` and set ``use_liger_kernel: true``."""

    def __init__(self) -> None:
        super().__init__()
        self.class_patched: str | None = None  # model_type patched at class level by pre_model_load

    def get_input_args(self) -> str:
        return "liger_core_axolotl.args.LigerCoreArgs"

    def register(self, cfg: dict) -> None:
        from axolotl.integrations.base import PluginManager

        loaded = set(PluginManager.get_instance().plugins)
        missing = [str(p) for p in cfg.get("plugins") or [] if str(p) not in loaded]
        if missing:
            LOG.error(
                "liger_core_axolotl: Axolotl could not import plugin(s) %s (traceback above) and will "
                "IGNORE their config keys; fix the name(s) or install them",
                ", ".join(missing),
            )
        state = (
            "on" if truthy(cfg.get("use_liger_kernel")) else "loaded, but off (set use_liger_kernel: true)"
        )
        LOG.info("liger_core_axolotl: %s is %s", PLUGIN_NAME, state)

    def pre_model_load(self, cfg: Any) -> None:
        if not cfg.use_liger_kernel:
            return
        import liger_core
        from liger_core.patching import revert_model_type, supported_model_types

        model_type = cfg.model_config_type
        if model_type not in supported_model_types():
            LOG.info("liger_core: no class-level recipe for %r; will patch the built model", model_type)
            return
        report = liger_core.patching.apply_liger_kernel_to(model_type, **liger_core_flags(cfg))
        failure = class_patching_failure()
        if failure is not None:
            revert_model_type(model_type)
            LOG.warning(
                "liger_core: class-level patching of %r undone, transformers cannot build models with it "
                "here "
                "(%s); the built model will be patched instead",
                model_type,
                failure,
            )
            return
        self.class_patched = model_type
        LOG.info("%s", report)

    def post_model_build(self, cfg: Any, model: Any) -> None:
        if not cfg.use_liger_kernel:
            return
        import liger_core

        # Idempotent: after the class-level patch it only adds what is bound per instance (rope in attention)
        # and reports the rest as already patched; without it (fallback) it patches everything.
        report = liger_core.apply_liger_kernel(model, **liger_core_flags(cfg))
        LOG.info("%s", report)
        LOG.info(
            "liger_core: kernels active on %s (rank %s): %s",
            type(model).__name__,
            os.getenv("RANK", "0"),
            active_kernels(report),
        )

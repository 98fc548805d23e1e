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
- ``post_lora_load(cfg, model)``: a PEFT adapter on lm_head makes the fused linear cross-entropy compute the
  full logits through it (correct, not fused): reported as not applied.
- ``liger_core_strict: true``: every kernel asked for and not applied (liger_core's ``report.missing``, the
  adapter on lm_head, a TRL loss liger_core cannot serve) raises ``PatchIncompleteError`` before training;
  without it each is a warning.
- ``rl:`` runs (``rl_wiring``): the layer kernels as above (policy and reference models), and
  - for the rl types whose TRL trainer has TRL's fused LM head when TRL >= 1.15 and liger-core-trl are
    installed, ``use_liger_kernel`` in the trainer's arguments (``get_training_args``), which the TRL
    plugin's start-up hook serves (this plugin does not import it): TRL's trainer then computes its
    per-token log-probs with liger_core, and its losses and metrics from them;
  - for ``rl: dpo`` / ``ipo`` / ``kto`` / ``grpo`` / ``gdpo`` on older TRL (Axolotl 0.19 pins TRL 1.9),
    ``post_trainer_create`` points the trainer's fused-loss path at liger_core's fused DPO / KTO / GRPO
    loss (``trl_dpo``, ``trl_kto``, ``trl_grpo``; the policy's logits never exist);
  - otherwise TRL computes the loss from the logits. ``register`` logs which case applies.

Log lines go to the ``axolotl.integrations.liger_core`` logger: Axolotl's console shows INFO only for
``axolotl.*`` loggers.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from axolotl.integrations.base import BasePlugin

from liger_core_axolotl.args import (
    INSTALL_HINT,
    PLUGIN_NAME,
    RL_FUSED_LOGPROBS,
    STRICT_KEY,
    layer_flags,
    liger_core_flags,
    misspelled_keys,
    rl_type,
    strict,
    truthy,
)

LOG = logging.getLogger("axolotl.integrations.liger_core")


def served_by_line() -> str:
    """Which library serves ``use_liger_kernel``, and whether liger-kernel is installed beside it (unused)."""
    try:
        from liger_core.patching import served_by
    except ImportError as err:
        raise ImportError(
            f"use_liger_kernel is served by liger_core, which cannot be imported ({err}); install it "
            f"{INSTALL_HINT}"
        ) from err
    return f"liger_core_axolotl: {served_by('use_liger_kernel', 'liger-core-axolotl')}"


# what may have applied liger-kernel to a model in an Axolotl run (liger_core's refusal names it)
LIGER_KERNEL_SOURCES = (
    "Axolotl's LigerPlugin, TRL's or transformers' use_liger_kernel, a liger_kernel.transformers call"
)


def log_report(report: Any) -> None:
    """liger_core's one-line report; a warning when it names kernels that were asked for and not applied."""
    (LOG.warning if report.missing else LOG.info)("%s", report)


def strict_failure(owner: str, kind: str, reason: str) -> Exception:
    """liger_core's ``PatchIncompleteError`` for a kernel this plugin found it cannot apply (its
    ``report.missing`` holds ``kind`` and ``reason``), with a message that names the YAML key."""
    from liger_core.patching import PatchIncompleteError

    return PatchIncompleteError.one_kernel(
        owner,
        kind,
        reason,
        f"liger_core: {STRICT_KEY}: {kind} cannot be applied to {owner}: {reason}. Fix the cause, or remove "
        f"{STRICT_KEY} to train without it.",
    )


def adapter_on_lm_head(model: Any) -> bool:
    """True when a PEFT tuner layer (LoRA, ...) wraps the model's lm_head."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return False
    get_head = getattr(model, "get_output_embeddings", None)
    return callable(get_head) and isinstance(get_head(), BaseTunerLayer)


TRL_PLUGIN_INSTALL = (
    "pip install -e integrations/trl (from a clone of liger_core; the `trl` extra of liger-core-axolotl, "
    "for an Axolotl whose TRL is >= 1.15)"
)
# a module of TRL's that liger-core-trl's start-up hook watches (it watches every `trl.` module)
TRL_TRAINER_MODULE = "trl.trainer.base_trainer"


def fused_logprobs_unavailable() -> str | None:
    """Why TRL's fused LM head cannot compute with liger_core here (None: it can).

    The TRL plugin (liger-core-trl, this plugin's optional ``trl`` extra) serves the flag: its start-up hook,
    run from its ``.pth`` file in every process, hooks TRL's trainers when TRL is imported. This plugin never
    imports it; it asks ``liger_core.startup_hook`` whether that hook watches TRL in this process."""
    try:
        import trl
        import trl.trainer.utils as trl_utils
    except ImportError as err:
        return f"TRL cannot be imported ({err})"
    if not hasattr(trl_utils, "add_fused_lm_head"):
        return f"TRL {trl.__version__} has no fused LM head (TRL >= 1.15 has)"
    from liger_core import startup_hook

    if not startup_hook.is_watched(TRL_TRAINER_MODULE):
        if startup_hook.disabled():
            return f"the start-up hooks are off ({startup_hook.ENV_DISABLE}), liger-core-trl's among them"
        return (
            "liger-core-trl, whose start-up hook serves TRL's fused LM head, is not installed (or its .pth "
            f"was not run: python -S): {TRL_PLUGIN_INSTALL}"
        )
    return None


# Axolotl rl types whose TRL trainer's pre-1.15 fused-loss path liger_core serves: the module that installs it
RL_TRL_LOSS = {"dpo": "trl_dpo", "ipo": "trl_dpo", "kto": "trl_kto", "grpo": "trl_grpo", "gdpo": "trl_grpo"}


def rl_wiring(cfg: Any) -> tuple[str | None, str]:
    """For an ``rl:`` config with liger_core on: (how the loss uses liger_core: "fused_head" for TRL's fused
    LM head, "trl_loss" for liger_core's loss in the fused-loss path of TRL's trainer (TRL < 1.15), None:
    not at all; what runs)."""
    rl = rl_type(cfg)
    layers = f"rl: {rl}: liger_core runs its layer kernels in the models Axolotl loads"
    if rl not in RL_FUSED_LOGPROBS:
        return None, f"{layers}; the {rl} trainer computes its loss from the full logits"
    reason = fused_logprobs_unavailable()
    if reason is None:
        return "fused_head", f"{layers}, and the per-token log-probs of TRL's fused LM head (liger_core_trl)"
    if rl in RL_TRL_LOSS:
        kind = RL_TRL_LOSS[rl].removeprefix("trl_").upper()
        return "trl_loss", (
            f"{layers}, and TRL's {kind} loss with liger_core's fused linear {kind} loss (TRL's fused-loss "
            f"path; no fused LM head here: {reason})"
        )
    return None, (
        f"{layers}; TRL computes the {rl} loss itself: liger_core's fused log-probs need TRL's fused LM "
        f"head, not available here: {reason}"
    )


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

        typos = misspelled_keys(cfg)
        if typos:  # also checked by the start-up hook; here for runs without it
            raise ValueError("liger_core_axolotl: " + "; ".join(typos))

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
        if truthy(cfg.get("use_liger_kernel")) and os.getenv("RANK", "0") == "0":
            LOG.info("%s", served_by_line())
        if truthy(cfg.get("use_liger_kernel")) and rl_type(cfg) is not None:
            LOG.info("liger_core_axolotl: %s", rl_wiring(cfg)[1])

    def get_training_args(self, cfg: Any) -> dict[str, Any] | None:
        """RL with TRL's fused LM head: the TRL trainer's own flag, served by liger_core_trl, with the layer
        kernels chosen here (the model is already patched: applying them again at train() adds nothing)."""
        if not (cfg.use_liger_kernel and rl_type(cfg) is not None and rl_wiring(cfg)[0] == "fused_head"):
            return None
        config: dict[str, bool] = layer_flags(cfg)
        if strict(cfg):  # liger_core_trl then stops a trainer whose fused head must keep TRL's kernel
            config["strict"] = True
        return {"use_liger_kernel": True, "liger_kernel_config": config}

    def pre_model_load(self, cfg: Any) -> None:
        if not cfg.use_liger_kernel:
            return
        import liger_core
        from liger_core.patching import recipe_model_types, revert_model_type

        model_type = cfg.model_config_type
        if model_type not in recipe_model_types():
            LOG.info("liger_core: no class-level recipe for %r; will patch the built model", model_type)
            return
        report = liger_core.patching.apply_liger_kernel_to(
            model_type, strict=strict(cfg), **liger_core_flags(cfg)
        )
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
        log_report(report)

    def post_trainer_create(self, cfg: Any, trainer: Any) -> None:
        if not (cfg.use_liger_kernel and rl_type(cfg) is not None and rl_wiring(cfg)[0] == "trl_loss"):
            return
        import importlib

        installer = importlib.import_module(f"liger_core_axolotl.{RL_TRL_LOSS[rl_type(cfg)]}")
        reason = installer.install(trainer)
        name = type(trainer).__name__
        if reason is None:
            LOG.info("liger_core: %s computes its loss with liger_core (fused lm_head)", name)
        elif strict(cfg):
            kind = f"fused linear {RL_TRL_LOSS[rl_type(cfg)].removeprefix('trl_').upper()} loss"
            raise strict_failure(name, kind, reason)
        else:
            LOG.warning("liger_core: %s keeps TRL's loss from the full logits: %s", name, reason)

    def post_model_build(self, cfg: Any, model: Any) -> None:
        if not cfg.use_liger_kernel:
            return
        import liger_core
        from liger_core.patching import refuse_liger_kernel

        refuse_liger_kernel(model, flag="use_liger_kernel", applied_by=LIGER_KERNEL_SOURCES)
        # Idempotent: after the class-level patch it only adds what is bound per instance (rope in attention)
        # and reports the rest as already patched; without it (fallback) it patches everything.
        report = liger_core.apply_liger_kernel(model, strict=strict(cfg), **liger_core_flags(cfg))
        log_report(report)
        LOG.info(
            "liger_core: kernels active on %s (rank %s): %s",
            type(model).__name__,
            os.getenv("RANK", "0"),
            report.active_kernels(),
        )

    def post_lora_load(self, cfg: Any, model: Any) -> None:
        if not (cfg.use_liger_kernel and liger_core_flags(cfg)["fused_linear_cross_entropy"]):
            return
        if not adapter_on_lm_head(model):
            return
        kind = "fused_linear_cross_entropy"
        reason = "a PEFT adapter wraps lm_head, so the fused loss computes the full logits through it"
        if strict(cfg):
            raise strict_failure(type(model).__name__, kind, reason)
        LOG.warning("liger_core: NOT applied on %s: %s (%s)", type(model).__name__, kind, reason)

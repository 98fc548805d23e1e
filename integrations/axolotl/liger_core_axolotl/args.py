"""The YAML keys this plugin adds to Axolotl's config, and the conflicts it rejects.

Axolotl merges this model into its config class (``axolotl.integrations.config.merge_input_args``), so the
``mode="before"`` validators see the whole raw config.

- ``use_liger_kernel: true``: turn liger_core on (defaults: those of ``liger_core.patching.KernelFlags``:
  rope, rms_norm, glu_activation, relu_squared, moe_experts, layer_norm and fused_linear_cross_entropy on,
  cross_entropy, tiled_mlp and offload_checkpoints off).
- ``liger_core_<kernel>: true|false``: override one kernel (``liger_core_`` prefix: Axolotl's own Liger plugin
  owns the ``liger_*`` keys). One key per field of ``KernelFlags``, except that ``glu_activation`` (Axolotl's
  name) sets both ``swiglu`` and ``geglu``. ``liger_core_cross_entropy: true`` turns the fused linear
  cross-entropy off unless that is set too, which is an error (one loss).
- ``liger_core_strict: true``: a kernel asked for that cannot be applied stops the run before training
  (``liger_core.patching.PatchIncompleteError``) instead of being logged as a warning.
- with ``rl:`` (dpo, ipo, kto, orpo, simpo, grpo, gdpo, ebft) the layer kernels apply to the models Axolotl
  loads, the SFT losses (``liger_core_fused_linear_cross_entropy``, ``liger_core_cross_entropy``) default to
  off and may not be turned on: TRL's RL trainers compute their losses from per-token log-probs. With
  TRL >= 1.15 and liger-core-trl installed, those log-probs come from liger_core for the trainers that
  have TRL's fused LM head (``RL_FUSED_LOGPROBS``); see ``plugin.rl_wiring``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, create_model, model_validator

INSTALL_HINT = "from a clone of liger_core: `pip install -e . && pip install -e integrations/axolotl`"
try:  # the kernel flags' one definition; liger_core.patching.flags imports no transformers
    from liger_core.patching.flags import KernelFlags
except ImportError as err:
    raise ImportError(
        f"liger_core_axolotl needs liger_core, which cannot be imported ({err}); install it {INSTALL_HINT}"
    ) from err

PLUGIN_NAME = "liger_core_axolotl.LigerCorePlugin"
# Axolotl's one key for the GLU MLP kernels (its own Liger plugin's name): it sets both of these flags
GLU_KEY = "glu_activation"
GLU_FLAGS = ("swiglu", "geglu")
LOSS_FLAGS = ("cross_entropy", "fused_linear_cross_entropy")


def _kernel_defaults() -> dict[str, bool]:
    """This plugin's kernel names -> defaults: ``KernelFlags``' fields in order, ``GLU_FLAGS`` as ``GLU_KEY``
    in the place of the first (the two share one default)."""
    flags = KernelFlags.defaults()
    if len({flags[name] for name in GLU_FLAGS}) != 1:
        raise AssertionError(f"{GLU_KEY} sets {GLU_FLAGS}, which need one default: {flags}")
    defaults: dict[str, bool] = {}
    for name, default in flags.items():
        defaults[GLU_KEY if name in GLU_FLAGS else name] = default
    return defaults


KERNEL_DEFAULTS = _kernel_defaults()
KERNEL_KEYS = {f"liger_core_{name}": name for name in KERNEL_DEFAULTS}
STRICT_KEY = "liger_core_strict"
OUR_KEYS = ("use_liger_kernel", *KERNEL_KEYS, STRICT_KEY)
# Axolotl's built-in Liger integration (liger-kernel), under the names load_plugin accepts
AXOLOTL_LIGER_PLUGINS = ("axolotl.integrations.liger.LigerPlugin", "liger.LigerPlugin")
OTHER_LOSS_KEYS = ("cut_cross_entropy", "chunked_cross_entropy")
SFT_LOSS_KEYS = ("liger_core_fused_linear_cross_entropy", "liger_core_cross_entropy")
# Axolotl's rl types built on a TRL trainer that gets TRL's fused LM head (TRL >= 1.15): DPO (dpo, ipo),
# KTO, GRPO (grpo, gdpo). ORPO and SimPO (TRL's experimental ORPO/CPO trainers) compute full logits.
RL_FUSED_LOGPROBS = ("dpo", "ipo", "kto", "grpo", "gdpo")


def axolotl_keys() -> set[str]:
    """The config keys Axolotl itself knows (its config class and its liger-kernel plugin's keys); empty
    when Axolotl's schema cannot be imported."""
    keys: set[str] = set()
    for module, name in (
        ("axolotl.utils.schemas.config", "AxolotlInputConfig"),
        ("axolotl.integrations.liger.args", "LigerArgs"),
    ):
        try:
            import importlib

            model = getattr(importlib.import_module(module), name)
        except Exception:  # noqa: BLE001 - a schema that fails to import only narrows the check
            continue
        for field_name, field in model.model_fields.items():
            keys.add(field_name)
            if field.alias:
                keys.add(field.alias)
    return keys


def misspelled_keys(data: Any, known: set[str] | None = None) -> list[str]:
    """One message per top-level key that looks like a misspelling of this plugin's keys: any unknown
    ``liger_core*`` key (the prefix is ours), and keys Axolotl does not know that are close to ours
    (``use_liger_kernal``, ``enable_liger_kernel``). Axolotl drops unknown keys without a word."""
    import difflib

    known = axolotl_keys() if known is None else known
    problems = []
    for key in [str(k) for k in data]:
        if key in OUR_KEYS or key in known:
            continue
        cutoff = 0.0 if key.startswith("liger_core") else 0.8  # the liger_core prefix is ours
        match = difflib.get_close_matches(key, OUR_KEYS, n=1, cutoff=cutoff)
        if not match:
            continue
        problems.append(
            f"unknown key `{key}` (did you mean `{match[0]}`?); Axolotl would drop it and "
            f"{'train without liger_core' if match[0] == 'use_liger_kernel' else 'use the default'}. "
            f"Keys of {PLUGIN_NAME}: {', '.join(OUR_KEYS)}"
        )
    return problems


def truthy(value: Any) -> bool:
    """A YAML/CLI value as a bool ("false" from a command-line override is False)."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off", "none", "null")
    return bool(value)


def rl_type(cfg: Any) -> str | None:
    """Axolotl's ``rl:`` value as a lower-case string (an ``RLType`` after validation), None without RL."""
    value = cfg.get("rl")
    if value is None or value is False or value == "":
        return None
    return str(getattr(value, "value", value)).lower()


def kernel_settings(cfg: Any) -> dict[str, bool]:
    """Per-kernel on/off from a config (dict or Axolotl's DictDefault), defaults filled in."""
    settings = {name: cfg.get(key) for key, name in KERNEL_KEYS.items()}
    if settings["cross_entropy"] is not None and truthy(settings["cross_entropy"]):
        if settings["fused_linear_cross_entropy"] is None:
            settings["fused_linear_cross_entropy"] = False
    defaults = dict(KERNEL_DEFAULTS)
    if rl_type(cfg) is not None:  # the RL trainers compute their own losses: no SFT loss kernel
        defaults["fused_linear_cross_entropy"] = False
    return {name: defaults[name] if value is None else truthy(value) for name, value in settings.items()}


def liger_core_flags(cfg: Any) -> dict[str, bool]:
    """Keyword arguments for ``liger_core.apply_liger_kernel*``: every field of ``KernelFlags``
    (glu_activation gives ``swiglu`` and ``geglu``)."""
    settings = kernel_settings(cfg)
    return {name: settings[GLU_KEY if name in GLU_FLAGS else name] for name in KernelFlags.names()}


def layer_flags(cfg: Any) -> dict[str, bool]:
    """``liger_core_flags`` without the SFT losses (``LOSS_FLAGS``): the layer kernels."""
    return {name: on for name, on in liger_core_flags(cfg).items() if name not in LOSS_FLAGS}


def strict(cfg: Any) -> bool:
    """``liger_core_strict``: the ``strict`` argument of ``liger_core.apply_liger_kernel*`` (default off)."""
    value = cfg.get(STRICT_KEY)
    return value is not None and truthy(value)


def config_conflicts(data: dict[str, Any]) -> list[str]:
    """Every reason this config cannot run liger_core as asked (empty: fine). Pure; also used by the CLI."""
    problems: list[str] = []
    enabled = truthy(data.get("use_liger_kernel"))
    set_keys = [key for key in (*KERNEL_KEYS, STRICT_KEY) if data.get(key) is not None]
    if not enabled:
        if set_keys:
            problems.append(
                f"{', '.join(set_keys)} set without `use_liger_kernel: true`; add it or remove them"
            )
        return problems
    settings = kernel_settings(data)
    rl = rl_type(data)
    sft_losses = [key for key in SFT_LOSS_KEYS if truthy(data.get(key))]
    if rl is not None and sft_losses:
        problems.append(
            f"{', '.join(sft_losses)} with `rl: {rl}`: these are SFT losses, and TRL's {rl} trainer computes "
            "its own loss from per-token log-probs; remove them (liger_core patches the layers, and with "
            f"TRL >= 1.15 and liger-core-trl computes the log-probs of {', '.join(RL_FUSED_LOGPROBS)})"
        )
    trl_flags = [key for key in ("dpo_use_liger_kernel",) if truthy(data.get(key))]
    if isinstance(data.get("trl"), dict) and truthy(data["trl"].get("use_liger_loss")):
        trl_flags.append("trl.use_liger_loss")
    if trl_flags:
        problems.append(
            f"{', '.join(trl_flags)} turns on TRL's use_liger_kernel, which (TRL < 1.15, Axolotl 0.19) "
            "computes the loss with the third-party liger-kernel and makes transformers patch the model with "
            "liger-kernel over liger_core's kernels; remove it (where TRL has its fused LM head, the plugin "
            "sets TRL's flag itself and liger_core serves it)"
        )
    if truthy(data.get("liger_core_cross_entropy")) and truthy(
        data.get("liger_core_fused_linear_cross_entropy")
    ):
        problems.append(
            "liger_core_cross_entropy and liger_core_fused_linear_cross_entropy are both true: choose one"
        )
    plugins = [str(p) for p in data.get("plugins") or []]
    builtin = [p for p in plugins if p in AXOLOTL_LIGER_PLUGINS]
    if builtin:
        problems.append(
            f"plugin {builtin[0]} (Axolotl's liger-kernel integration) and {PLUGIN_NAME} patch the same "
            "layers; "
            "list only one of them under `plugins:`"
        )
    liger_keys = sorted(
        k for k, v in data.items() if k.startswith("liger_") and not k.startswith("liger_core_") and truthy(v)
    )
    if liger_keys:
        problems.append(
            f"{', '.join(liger_keys)} belong to Axolotl's liger-kernel plugin; with use_liger_kernel use the "
            f"liger_core_* keys instead ({', '.join(KERNEL_KEYS)})"
        )
    loss_on = settings["cross_entropy"] or settings["fused_linear_cross_entropy"]
    other_losses = [k for k in OTHER_LOSS_KEYS if truthy(data.get(k))]
    if loss_on and other_losses:
        problems.append(
            f"{', '.join(other_losses)} and liger_core's "
            f"{'fused linear ' if settings['fused_linear_cross_entropy'] else ''}cross-entropy both replace "
            "the loss; disable one (e.g. `liger_core_fused_linear_cross_entropy: false`)"
        )
    tiled_mlp = truthy(data.get("tiled_mlp")) and not truthy(data.get("tiled_mlp_use_original_mlp"))
    if settings["glu_activation"] and tiled_mlp:
        problems.append(
            "tiled_mlp replaces the MLP that liger_core's SwiGLU/GeGLU patches; set "
            "`tiled_mlp_use_original_mlp: true` or `liger_core_glu_activation: false`"
        )
    if (data.get("tensor_parallel_size") or 1) > 1 and (settings["rms_norm"] or loss_on):
        problems.append(
            "tensor_parallel_size > 1: liger_core's RMSNorm and losses need whole rows on each rank; set "
            "liger_core_rms_norm, liger_core_fused_linear_cross_entropy and liger_core_cross_entropy to false"
        )
    return problems


class _LigerCoreSwitches(BaseModel):
    """The keys that are not kernels, and the check of the whole raw config."""

    use_liger_kernel: bool | None = None
    liger_core_strict: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def reject_conflicts(cls, data: Any) -> Any:
        if isinstance(data, dict):
            problems = config_conflicts(data)
            if problems:
                raise ValueError("liger_core: " + "; ".join(problems))
        return data


# Axolotl config keys added by ``liger_core_axolotl.LigerCorePlugin`` (module docstring): the switches above
# and one optional bool per kernel key (``KERNEL_KEYS``, from ``KernelFlags``). Axolotl merges this class into
# its config class by inheritance.
LigerCoreArgs = create_model(
    "LigerCoreArgs",
    __base__=_LigerCoreSwitches,
    __module__=__name__,
    **{key: (bool | None, None) for key in KERNEL_KEYS},
)
LigerCoreArgs.__doc__ = (
    "Axolotl config keys added by ``liger_core_axolotl.LigerCorePlugin`` (module docstring)."
)

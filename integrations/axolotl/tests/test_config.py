"""The plugin's keys through Axolotl's own config loading (``axolotl.cli.config.load_cfg``), its conflict
checks, the pre-flight checks of ``liger-core-axolotl``, and the two patching hooks (in process)."""

from __future__ import annotations

import os

os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")  # before axolotl is imported: no telemetry threads

import pytest
import yaml
from conftest import PLUGIN, axolotl_config
from liger_core_axolotl.args import config_conflicts, liger_core_flags
from liger_core_axolotl.cli import check_config


@pytest.fixture
def plugin_manager():
    """Axolotl's PluginManager is a process-wide singleton: restore its plugin list after each test."""
    from axolotl.integrations.base import PluginManager

    manager = PluginManager.get_instance()
    saved = dict(manager.plugins)
    yield manager
    manager.plugins.clear()
    manager.plugins.update(saved)


def _load_cfg(tmp_path, config: dict):
    from axolotl.cli.config import load_cfg

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return load_cfg(str(path))


def test_load_cfg_keeps_our_keys(tiny_llama, tiny_dataset, tmp_path, plugin_manager):
    cfg = _load_cfg(
        tmp_path,
        axolotl_config(
            tiny_llama,
            tiny_dataset,
            tmp_path,
            liger_core_rope=False,
            liger_core_layer_norm=True,
            liger_core_moe_experts=False,
            liger_core_tiled_mlp=True,
        ),
    )
    assert PLUGIN in plugin_manager.plugins
    assert (
        cfg.use_liger_kernel is True and cfg.liger_core_rope is False and cfg.liger_core_moe_experts is False
    )
    assert cfg.model_config_type == "llama"
    assert liger_core_flags(cfg) == dict(
        rope=False,
        rms_norm=True,
        swiglu=True,
        geglu=True,
        relu_squared=True,
        moe_experts=False,
        layer_norm=True,
        cross_entropy=False,
        fused_linear_cross_entropy=True,
        tiled_mlp=True,
        offload_checkpoints=False,
    )


def test_kernel_keys_follow_kernel_flags():
    """One key per field of liger_core's KernelFlags, with its default; glu_activation stands for swiglu and
    geglu together."""
    from liger_core_axolotl.args import KERNEL_KEYS, LigerCoreArgs, kernel_settings

    from liger_core.patching import KernelFlags

    names = [name for name in KernelFlags.names() if name != "geglu"]
    assert list(KERNEL_KEYS.values()) == [name.replace("swiglu", "glu_activation") for name in names]
    assert set(KERNEL_KEYS) <= set(LigerCoreArgs.model_fields)
    assert liger_core_flags({}) == KernelFlags.defaults()
    for on in (False, True):
        flags = liger_core_flags({"liger_core_glu_activation": on})
        assert flags["swiglu"] is on and flags["geglu"] is on
    assert kernel_settings({"liger_core_moe_experts": "false"})["moe_experts"] is False


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"cut_cross_entropy": True}, "cut_cross_entropy and liger_core's fused linear cross-entropy"),
        ({"chunked_cross_entropy": True}, "chunked_cross_entropy and liger_core's"),
        ({"liger_rms_norm": True}, "liger_rms_norm belong to Axolotl's liger-kernel plugin"),
        (
            {"liger_core_cross_entropy": True, "liger_core_fused_linear_cross_entropy": True},
            "both true: choose one",
        ),
        (
            {"use_liger_kernel": False, "liger_core_rope": True},
            "liger_core_rope set without `use_liger_kernel",
        ),
        ({"tiled_mlp": True}, "tiled_mlp replaces the MLP"),
        (
            {"plugins": [PLUGIN, "axolotl.integrations.liger.LigerPlugin"]},
            "plugin axolotl.integrations.liger.LigerPlugin (Axolotl's liger-kernel integration)",
        ),
    ],
)
def test_load_cfg_rejects_conflicts(tiny_llama, tiny_dataset, tmp_path, plugin_manager, extra, message):
    with pytest.raises(Exception, match="liger_core") as info:
        _load_cfg(tmp_path, axolotl_config(tiny_llama, tiny_dataset, tmp_path, **extra))
    assert message in str(info.value)


def test_conflict_rules_allow_what_does_not_clash():
    base = {"use_liger_kernel": True, "plugins": [PLUGIN]}
    # another loss is fine once liger_core's losses are off
    other_loss = {"cut_cross_entropy": True, "liger_core_fused_linear_cross_entropy": False}
    assert config_conflicts({**base, **other_loss}) == []
    assert (
        config_conflicts(
            {**base, "liger_rms_norm": False, "tiled_mlp": True, "tiled_mlp_use_original_mlp": 1}
        )
        == []
    )
    assert config_conflicts({**base, "tiled_mlp": True, "liger_core_glu_activation": False}) == []
    # plain cross-entropy turns the fused one off unless asked for both
    flags = liger_core_flags({"liger_core_cross_entropy": True})
    assert flags["cross_entropy"] and not flags["fused_linear_cross_entropy"]


def test_preflight_catches_a_misspelled_plugin():
    errors, _ = check_config({"plugins": ["liger_core_axolotl.LigerCorePlugn"], "use_liger_kernel": True})
    assert any("Did you mean liger_core_axolotl.LigerCorePlugin?" in e for e in errors), errors
    errors, _ = check_config({"plugins": ["liger_core_axolotll.LigerCorePlugin"], "use_liger_kernel": True})
    assert any("cannot be imported" in e and "Did you mean" in e for e in errors), errors
    assert any("not under `plugins:`" in e for e in errors), errors


def test_preflight_catches_keys_without_the_plugin():
    errors, _ = check_config({"use_liger_kernel": True, "liger_core_rope": False})
    assert len(errors) == 1 and "use_liger_kernel, liger_core_rope set, but" in errors[0]
    assert check_config({"plugins": [PLUGIN], "use_liger_kernel": True}) == ([], [])
    errors, warnings = check_config({"plugins": [PLUGIN]})
    assert errors == [] and "liger_core is off" in warnings[0]
    # the plugin's module path also names it
    assert check_config(
        {"plugins": ["liger_core_axolotl.plugin.LigerCorePlugin"], "use_liger_kernel": True}
    ) == (
        [],
        [],
    )


def test_a_misspelled_class_name_fails_loudly_in_axolotl():
    """Axolotl swallows ImportError from a plugin but not AttributeError: the hint names the right class."""
    from axolotl.integrations.base import load_plugin

    with pytest.raises(AttributeError, match="is liger_core_axolotl.LigerCorePlugin"):
        load_plugin("liger_core_axolotl.LigerCorePlugn")


@pytest.fixture
def llama_cfg(tiny_llama, tiny_dataset, tmp_path, plugin_manager):
    return _load_cfg(tmp_path, axolotl_config(tiny_llama, tiny_dataset, tmp_path))


def _kinds(model) -> set:
    from liger_core.patching import patched_modules

    return set(patched_modules(model).values())


def test_class_level_patch_in_pre_model_load(llama_cfg, monkeypatch, caplog):
    """Class-level first: a model built after pre_model_load is liger_core's; post_model_build keeps it."""
    from liger_core_axolotl import plugin as plugin_module
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama

    import liger_core
    from liger_core.patching import is_patched, revert_model_type

    monkeypatch.setattr(plugin_module, "class_patching_failure", lambda: None)
    plugin = plugin_module.LigerCorePlugin()
    try:
        plugin.pre_model_load(llama_cfg)
        assert plugin.class_patched == "llama"
        # built directly: transformers' from_pretrained class-patch step is not involved here
        model = modeling_llama.LlamaForCausalLM(LlamaConfig.from_pretrained(llama_cfg.base_model))
        assert is_patched(model) and {"rms_norm", "swiglu"} <= _kinds(model)
        with caplog.at_level("INFO", logger="axolotl.integrations.liger_core"):
            plugin.post_model_build(llama_cfg, model)
        assert "liger_core: patched llama: nothing new" in caplog.text  # the class-level patch did it all
        active = [line for line in caplog.text.splitlines() if "kernels active on LlamaForCausalLM" in line]
        for kind in ("fused_linear_cross_entropy", "rms_norm", "rope", "swiglu"):
            assert kind in active[0], active[0]
    finally:
        revert_model_type("llama")
    rebuilt = modeling_llama.LlamaForCausalLM(LlamaConfig.from_pretrained(llama_cfg.base_model))
    assert not liger_core.patching.is_patched(rebuilt)


def test_instance_fallback_in_post_model_build(llama_cfg, monkeypatch, caplog):
    """If transformers cannot build models with the class patch, it is undone; the built model is patched."""
    from liger_core_axolotl import plugin as plugin_module
    from transformers import AutoModelForCausalLM
    from transformers.models.llama import modeling_llama

    from liger_core.patching import is_patched, revert

    original_norm = modeling_llama.LlamaRMSNorm
    monkeypatch.setattr(plugin_module, "class_patching_failure", lambda: "SomeError: simulated")
    plugin = plugin_module.LigerCorePlugin()
    with caplog.at_level("INFO", logger="axolotl.integrations.liger_core"):
        plugin.pre_model_load(llama_cfg)
        assert plugin.class_patched is None and modeling_llama.LlamaRMSNorm is original_norm
        model = AutoModelForCausalLM.from_pretrained(llama_cfg.base_model)
        assert not is_patched(model)
        plugin.post_model_build(llama_cfg, model)
    try:
        assert (
            "class-level patching of 'llama' undone" in caplog.text and "SomeError: simulated" in caplog.text
        )
        assert {"rms_norm", "swiglu", "rope", "fused_linear_cross_entropy"} <= _kinds(model)
        assert "kernels active on LlamaForCausalLM" in caplog.text
    finally:
        revert(model)


def test_plugin_off_without_use_liger_kernel(tiny_llama, tiny_dataset, tmp_path, plugin_manager):
    from liger_core_axolotl import plugin as plugin_module
    from transformers import AutoModelForCausalLM

    cfg = _load_cfg(tmp_path, axolotl_config(tiny_llama, tiny_dataset, tmp_path, use_liger_kernel=None))
    plugin = plugin_module.LigerCorePlugin()
    plugin.pre_model_load(cfg)
    model = AutoModelForCausalLM.from_pretrained(cfg.base_model)
    plugin.post_model_build(cfg, model)
    assert plugin.class_patched is None and _kinds(model) == set()


def test_register_names_plugins_axolotl_failed_to_import(plugin_manager, caplog):
    from liger_core_axolotl.plugin import LigerCorePlugin

    plugin_manager.register(PLUGIN)
    plugin_manager.register("not_a_module.SomePlugin")  # Axolotl logs the ImportError and skips it
    with caplog.at_level("INFO", logger="axolotl.integrations.liger_core"):
        LigerCorePlugin().register({"plugins": [PLUGIN, "not_a_module.SomePlugin"], "use_liger_kernel": True})
    assert "could not import plugin(s) not_a_module.SomePlugin" in caplog.text
    assert f"{PLUGIN} is on" in caplog.text

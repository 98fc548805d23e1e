"""``liger_core_strict: true``: validated like the other ``liger_core_*`` keys, it reaches liger_core, and a
kernel that cannot apply (LoRA on lm_head, a custom lm_head, a TRL loss liger_core cannot serve) stops the run
before training; without it the run trains and the log names what was not applied."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")  # before axolotl is imported: no telemetry threads

import pytest
import yaml
from conftest import PLUGIN, axolotl_config, subprocess_env
from liger_core_axolotl.args import config_conflicts, strict
from liger_core_axolotl.cli import check_config

from liger_core.patching import PatchIncompleteError

WRAPPER = str(Path(sys.executable).parent / "liger-core-axolotl")
LORA_ON_LM_HEAD = dict(
    adapter="lora",
    lora_r=4,
    lora_alpha=8,
    lora_dropout=0.0,
    lora_target_modules=["q_proj", "v_proj", "lm_head"],
    # Axolotl turns its LoRA attention kernel on with LoRA; it rewrites the attention forward into a namespace
    # of its own, where liger_core's RoPE cannot reach (strict would stop there first): keep to lm_head
    liger_core_rope=False,
)


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


def test_strict_key_survives_axolotl_validation(tiny_llama, tiny_dataset, tmp_path, plugin_manager):
    cfg = _load_cfg(tmp_path, axolotl_config(tiny_llama, tiny_dataset, tmp_path, liger_core_strict=True))
    assert cfg.liger_core_strict is True and strict(cfg)
    cfg = _load_cfg(tmp_path, axolotl_config(tiny_llama, tiny_dataset, tmp_path))
    assert not strict(cfg)


def test_strict_key_is_checked_like_the_kernel_keys():
    problems = config_conflicts({"liger_core_strict": True})
    assert len(problems) == 1 and "liger_core_strict set without `use_liger_kernel: true`" in problems[0]
    errors, _ = check_config({"use_liger_kernel": True, "liger_core_strict": True})
    assert any("liger_core_strict" in e and f"{PLUGIN} is not under `plugins:`" in e for e in errors)
    assert config_conflicts({"use_liger_kernel": True, "liger_core_strict": "false"}) == []


def test_instance_patch_gets_strict(tiny_llama, tiny_dataset, tmp_path, plugin_manager, monkeypatch, caplog):
    """A built model whose lm_head is a class of its own (as a quantised layer is), patched on the instance:
    strict raises liger_core's error, without strict the miss is a warning and the layers are patched."""
    from liger_core_axolotl import plugin as plugin_module
    from torch import nn
    from transformers import AutoModelForCausalLM

    from liger_core.patching import is_patched, revert

    class CustomHead(nn.Linear):
        pass

    def custom_head_model():
        model = AutoModelForCausalLM.from_pretrained(tiny_llama)
        head = CustomHead(model.config.hidden_size, model.config.vocab_size, bias=False)
        head.weight = model.lm_head.weight
        model.lm_head = head
        return model

    monkeypatch.setattr(plugin_module, "class_patching_failure", lambda: "SomeError: simulated")
    plugin = plugin_module.LigerCorePlugin()
    extra = dict(liger_core_rope=False)  # RoPE is slow in Triton's interpreter; not what is tested here
    cfg = _load_cfg(
        tmp_path, axolotl_config(tiny_llama, tiny_dataset, tmp_path, liger_core_strict=True, **extra)
    )
    plugin.pre_model_load(cfg)
    model = custom_head_model()
    with pytest.raises(PatchIncompleteError, match=r"fused_linear_cross_entropy: lm_head \(CustomHead\)"):
        plugin.post_model_build(cfg, model)
    assert not is_patched(model)

    cfg = _load_cfg(tmp_path, axolotl_config(tiny_llama, tiny_dataset, tmp_path, **extra))
    plugin.pre_model_load(cfg)
    model = custom_head_model()
    with caplog.at_level("INFO", logger="axolotl.integrations.liger_core"):
        plugin.post_model_build(cfg, model)
    try:
        ours = [r for r in caplog.records if r.name == "axolotl.integrations.liger_core"]
        warned = [r for r in ours if r.levelname == "WARNING" and "NOT applied" in r.getMessage()]
        assert (
            len(warned) == 1 and "fused_linear_cross_entropy (lm_head (CustomHead)" in warned[0].getMessage()
        )
        active = [r.getMessage() for r in ours if "kernels active on" in r.getMessage()]
        assert "rms_norm" in active[0] and "fused_linear_cross_entropy" not in active[0]
    finally:
        revert(model)


def _train(config: dict, workdir: Path) -> tuple[int, str]:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [WRAPPER, "train", str(path)],
        cwd=workdir,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=480,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_lora_on_lm_head_fails_with_strict_and_trains_without(tiny_llama, tiny_dataset, tmp_path):
    """``axolotl train`` (through liger-core-axolotl): LoRA on lm_head means the fused loss would compute the
    full logits through the adapter."""
    strict_dir, lenient_dir = tmp_path / "strict", tmp_path / "lenient"
    strict_dir.mkdir()
    lenient_dir.mkdir()
    config = axolotl_config(tiny_llama, tiny_dataset, strict_dir, liger_core_strict=True, **LORA_ON_LM_HEAD)
    code, output = _train(config, strict_dir)
    assert code != 0, output[-6000:]
    assert (
        "PatchIncompleteError: liger_core: liger_core_strict: fused_linear_cross_entropy cannot be applied"
        in (output)
    ), output[-6000:]
    assert "'loss':" not in output  # stopped before the first step

    config = axolotl_config(tiny_llama, tiny_dataset, lenient_dir, max_steps=2, **LORA_ON_LM_HEAD)
    code, output = _train(config, lenient_dir)
    assert code == 0, output[-6000:]
    assert re.search(
        r"liger_core: NOT applied on \w+: fused_linear_cross_entropy \(a PEFT adapter wraps", output
    )
    losses = [float(x) for x in re.findall(r"'loss': '?([0-9.]+)", output)]
    assert len(losses) == 2 and all(0 < loss < 20 for loss in losses), losses


def test_dpo_loss_liger_core_cannot_serve_fails_with_strict(
    tiny_llama, tiny_dataset, tmp_path, plugin_manager, caplog
):
    """rl: dpo on a TRL without the fused LM head: liger_core's fused DPO loss replaces TRL's, unless it
    cannot (here: LoRA on lm_head); strict stops the run in post_trainer_create, before training."""
    import trl
    from datasets import Dataset
    from liger_core_axolotl.plugin import LigerCorePlugin, rl_wiring
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pairs = [{"prompt": "red fox", "chosen": " runs", "rejected": " sleeps"}] * 2
    dpo = dict(rl="dpo", datasets=[{"path": str(tiny_dataset), "type": "passthrough", "split": "train"}])
    cfg = _load_cfg(
        tmp_path, axolotl_config(tiny_llama, tiny_dataset, tmp_path, liger_core_strict=True, **dpo)
    )
    if rl_wiring(cfg)[0] != "trl_loss":
        pytest.skip(f"this TRL serves rl: dpo through its fused LM head: {rl_wiring(cfg)[1]}")
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    args = trl.DPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_length=16, report_to=[],
        use_cpu=True, bf16=False,
    )  # fmt: skip
    trainer = trl.DPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(pairs),
        processing_class=AutoTokenizer.from_pretrained(tiny_llama),
    )
    with pytest.raises(
        PatchIncompleteError, match="fused linear DPO loss cannot be applied .*adapter on lm_head"
    ):
        LigerCorePlugin().post_trainer_create(cfg, trainer)
    assert not trainer.use_liger_kernel

    cfg = _load_cfg(tmp_path, axolotl_config(tiny_llama, tiny_dataset, tmp_path, **dpo))
    with caplog.at_level("INFO", logger="axolotl.integrations.liger_core"):
        LigerCorePlugin().post_trainer_create(cfg, trainer)
    assert "keeps TRL's loss from the full logits: a PEFT adapter on lm_head" in caplog.text

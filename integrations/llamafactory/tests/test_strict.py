"""``liger_kernel_config`` under liger-lmf: per-kernel toggles and ``strict``, read from the YAML, its
command-line overrides or ``--liger_kernel_config``, removed before LLaMA-Factory parses them. With
``strict: true`` a kernel that cannot apply (a custom lm_head, LoRA on lm_head) stops the run before
training; without it the run trains and the log names what was not applied."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import subprocess_env, train_config
from liger_core_llamafactory.compat import ensure_torchaudio_importable
from liger_core_llamafactory.options import pop_kernel_config, read_train_args

from liger_core.patching import PatchIncompleteError

ensure_torchaudio_importable()  # before anything imports llamafactory (see compat.py)

LORA_ON_LM_HEAD = dict(finetuning_type="lora", lora_target="q_proj,lm_head", lora_rank=4)
NO_ROPE = {"rope": False}  # RoPE is the slowest kernel in Triton's interpreter; not what is tested here
MODELING = '''
from torch import nn
from transformers import LlamaForCausalLM


class CustomHead(nn.Linear):
    """An lm_head of its own class, as a quantised layer is: the fused loss must not bypass it."""


class CustomHeadLlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.lm_head = CustomHead(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
'''


@pytest.fixture
def hooks():
    """model_hooks, its toggles restored after the test (they are process-wide)."""
    from liger_core_llamafactory import model_hooks

    saved = dict(model_hooks._kernel_config)
    yield model_hooks
    model_hooks.install(saved)


@pytest.fixture(scope="session")
def custom_head_llama(tiny_llama, tmp_path_factory) -> Path:
    """The tiny Llama's files with a remote-code class whose lm_head is a CustomHead."""
    import shutil

    path = tmp_path_factory.mktemp("custom-head")
    shutil.copytree(tiny_llama, path, dirs_exist_ok=True)
    (path / "modeling_custom_head.py").write_text(MODELING)
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom_head.CustomHeadLlamaForCausalLM"}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    "args, rest",
    [
        ({"stage": "sft", "liger_kernel_config": {"strict": True, "rope": "false"}}, {"stage": "sft"}),
        ({"liger_kernel_config": '{"strict": true, "rope": false}'}, {}),
        (["--stage", "sft", "--liger_kernel_config", '{"strict": true, "rope": false}'], ["--stage", "sft"]),
        (['--liger_kernel_config={"strict": true, "rope": false}', "--stage", "sft"], ["--stage", "sft"]),
    ],
)
def test_pop_kernel_config(args, rest):
    assert pop_kernel_config(args) == {"strict": True, "rope": False}
    assert args == rest


def test_kernel_config_keys_are_liger_cores_flags():
    """Every field of liger_core's KernelFlags (moe_experts included) and `strict` are accepted."""
    from liger_core_llamafactory.options import config_keys, kernel_config

    from liger_core.patching import KernelFlags

    assert config_keys() == (*KernelFlags.names(), "strict")
    assert kernel_config({"moe_experts": "false", "geglu": True}) == {"moe_experts": False, "geglu": True}


def test_pop_kernel_config_yaml_and_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"stage": "sft", "liger_kernel_config": {"rope": False}}))
    args = read_train_args([str(path), "liger_kernel_config.strict=true"])
    assert pop_kernel_config(args) == {"rope": False, "strict": True}
    assert args == {"stage": "sft"}


@pytest.mark.parametrize(
    "value, message",
    [
        ({"stric": True}, r"unknown key\(s\) 'stric' \(did you mean 'strict'\?\)"),
        ({"strict": "maybe"}, "strict"),
        ("{x", "JSON"),
    ],
)
def test_pop_kernel_config_says_what_is_wrong(value, message):
    with pytest.raises(ValueError, match=message):
        pop_kernel_config({"liger_kernel_config": value})


def test_run_training_hands_the_toggles_to_the_hooks(monkeypatch, tmp_path, hooks):
    import llamafactory.train.tuner as tuner
    from liger_core_llamafactory import ENV_FLAG, launch

    runs, installs = [], []
    monkeypatch.setattr(tuner, "run_exp", lambda args: runs.append(args))
    monkeypatch.setattr(hooks, "install", lambda config=None, flag=None: installs.append(config))
    monkeypatch.delenv(ENV_FLAG, raising=False)
    path = tmp_path / "c.yaml"
    path.write_text("stage: sft\nenable_liger_kernel: true\nliger_kernel_config: {strict: true}\n")
    launch.run_training([str(path)])
    assert runs == [{"stage": "sft"}] and installs == [{"strict": True}]


def test_kernel_flags_stage_rule_then_toggles(hooks):
    sft, dpo = False, True  # require_logits
    assert hooks.kernel_flags(sft) == dict(fused_linear_cross_entropy=True, cross_entropy=False)
    assert hooks.kernel_flags(dpo, {"strict": True, "rope": False}) == dict(
        fused_linear_cross_entropy=False, cross_entropy=True, strict=True, rope=False
    )
    assert hooks.kernel_flags(sft, {"cross_entropy": True}) == dict(
        fused_linear_cross_entropy=False, cross_entropy=True
    )
    with pytest.raises(ValueError, match="needs the logits"):
        hooks.kernel_flags(dpo, {"fused_linear_cross_entropy": True})


def _load(model_dir, tiny_dataset_dir, tmp_path, **extra):
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer

    config = train_config(model_dir, tiny_dataset_dir, tmp_path / "out", **extra)
    model_args, _, _, finetuning_args, _ = get_train_args(config)
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    return load_model(tokenizer, model_args, finetuning_args, is_trainable=True)


def _ours(caplog, level: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "llamafactory.liger_core" and r.levelname == level
    ]


def test_custom_lm_head_fails_with_strict_and_is_a_warning_without(
    custom_head_llama, tiny_dataset_dir, tmp_path, hooks, caplog
):
    from liger_core.patching import is_patched, revert

    hooks.install({"strict": True, **NO_ROPE})
    with pytest.raises(PatchIncompleteError, match=r"fused_linear_cross_entropy: lm_head \(CustomHead\)"):
        _load(custom_head_llama, tiny_dataset_dir, tmp_path, trust_remote_code=True)

    hooks.install(NO_ROPE)
    with caplog.at_level("INFO", logger="llamafactory.liger_core"):
        model = _load(custom_head_llama, tiny_dataset_dir, tmp_path, trust_remote_code=True)
    try:
        assert is_patched(model)
        (warned,) = _ours(caplog, "WARNING")
        assert "NOT applied: fused_linear_cross_entropy (lm_head (CustomHead)" in warned
        (active,) = [m for m in _ours(caplog, "INFO") if "kernels active" in m]
        assert active.endswith("rms_norm x5, swiglu x2"), active
    finally:
        revert(model)


def test_lora_on_lm_head_fails_with_strict_and_is_a_warning_without(
    tiny_llama, tiny_dataset_dir, tmp_path, hooks, caplog
):
    hooks.install({"strict": True, **NO_ROPE})
    with pytest.raises(PatchIncompleteError, match="liger_kernel_config strict: fused_linear_cross_entropy"):
        _load(tiny_llama, tiny_dataset_dir, tmp_path, **LORA_ON_LM_HEAD)

    hooks.install(NO_ROPE)
    with caplog.at_level("INFO", logger="llamafactory.liger_core"):
        _load(tiny_llama, tiny_dataset_dir, tmp_path, **LORA_ON_LM_HEAD)
    (warned,) = _ours(caplog, "WARNING")
    assert "NOT applied on PeftModel" in warned and "a PEFT adapter wraps lm_head" in warned

    caplog.clear()
    with caplog.at_level("INFO", logger="llamafactory.liger_core"):  # LoRA elsewhere: nothing to report
        _load(tiny_llama, tiny_dataset_dir, tmp_path, finetuning_type="lora", lora_target="q_proj")
    assert _ours(caplog, "WARNING") == []


def _train(config: dict, workdir: Path) -> tuple[int, str]:
    path = workdir / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "liger_core_llamafactory", "train", str(path)]
    proc = subprocess.run(cmd, env=subprocess_env(), cwd=workdir, capture_output=True, text=True, timeout=420)
    return proc.returncode, proc.stdout + proc.stderr


def test_liger_lmf_train_strict_stops_and_lenient_trains(tiny_llama, tiny_dataset_dir, tmp_path):
    common = dict(enable_liger_kernel=True, max_steps=2, **LORA_ON_LM_HEAD)
    config = train_config(
        tiny_llama,
        tiny_dataset_dir,
        tmp_path / "strict",
        liger_kernel_config={"strict": True, **NO_ROPE},
        **common,
    )
    code, output = _train(config, tmp_path)
    assert code != 0, output[-6000:]
    assert (
        "PatchIncompleteError: liger_core: liger_kernel_config strict: fused_linear_cross_entropy" in output
    )
    assert not (tmp_path / "strict" / "trainer_log.jsonl").exists()

    config = train_config(
        tiny_llama, tiny_dataset_dir, tmp_path / "lenient", liger_kernel_config=NO_ROPE, **common
    )
    code, output = _train(config, tmp_path)
    assert code == 0, output[-6000:]
    assert "liger_core: NOT applied on PeftModel" in output
    with open(tmp_path / "lenient" / "trainer_log.jsonl", encoding="utf-8") as f:
        losses = [row["loss"] for row in map(json.loads, f) if "loss" in row]
    assert len(losses) == 2 and all(0 < loss < 20 for loss in losses), losses

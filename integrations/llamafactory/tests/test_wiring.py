"""In-process tests of the wiring: argument interception, model hooks, web UI pieces (no browser/training)."""

from __future__ import annotations

import os
import sys

import pytest
from liger_core_llamafactory.compat import ensure_torchaudio_importable
from liger_core_llamafactory.options import pop_liger_flag

ensure_torchaudio_importable()  # before anything imports llamafactory (see compat.py)


@pytest.mark.parametrize(
    "args, enabled, rest",
    [
        ({"enable_liger_kernel": True, "stage": "sft"}, True, {"stage": "sft"}),
        ({"enable_liger_kernel": "false", "stage": "sft"}, False, {"stage": "sft"}),
        ({"use_liger_kernel": True}, True, {}),
        ({"stage": "sft"}, False, {"stage": "sft"}),
        (["--stage", "sft", "--enable_liger_kernel", "true"], True, ["--stage", "sft"]),
        (["--enable_liger_kernel=False", "--stage", "sft"], False, ["--stage", "sft"]),
        (["--enable_liger_kernel", "--stage", "sft"], True, ["--stage", "sft"]),
    ],
)
def test_pop_liger_flag(args, enabled, rest):
    assert pop_liger_flag(args) is enabled
    assert args == rest


def test_pop_liger_flag_rejects_garbage():
    with pytest.raises(ValueError, match="enable_liger_kernel"):
        pop_liger_flag({"enable_liger_kernel": "maybe"})


def test_read_train_args_pops_yaml_and_override(tmp_path):
    import yaml
    from liger_core_llamafactory.options import read_train_args

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"stage": "sft", "enable_liger_kernel": False}))
    args = read_train_args([str(path), "enable_liger_kernel=true"])  # command-line override wins
    assert pop_liger_flag(args) is True
    assert args == {"stage": "sft"}


def test_run_training_routes_the_flag(monkeypatch, tmp_path):
    """enable_liger_kernel is removed before LLaMA-Factory parses it; on -> hooks + LIGER_CORE_LMF=1 for
    child processes; the environment variable alone also turns it on (how torchrun workers get it)."""
    import llamafactory.train.tuner as tuner
    from liger_core_llamafactory import ENV_FLAG, launch, model_hooks

    runs, installs = [], []
    monkeypatch.setattr(tuner, "run_exp", lambda args: runs.append(args))
    monkeypatch.setattr(model_hooks, "install", lambda kernel_config=None, flag=None: installs.append(True))
    monkeypatch.delenv(ENV_FLAG, raising=False)
    path = tmp_path / "c.yaml"
    path.write_text("stage: sft\nenable_liger_kernel: true\n")
    launch.run_training([str(path)])
    assert runs[-1] == {"stage": "sft"} and installs == [True] and os.environ[ENV_FLAG] == "1"

    monkeypatch.delenv(ENV_FLAG)
    path.write_text("stage: sft\n")
    launch.run_training([str(path)])
    assert runs[-1] == {"stage": "sft"} and installs == [True] and ENV_FLAG not in os.environ

    monkeypatch.setenv(ENV_FLAG, "1")
    launch.run_training([str(path)])
    assert installs == [True, True]


def _load(tiny_llama, tiny_dataset_dir, tmp_path, stage: str, **extra):
    from conftest import train_config
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer

    config = train_config(tiny_llama, tiny_dataset_dir, tmp_path / "out", stage=stage, **extra)
    if stage == "dpo":
        config["dataset"] = "tiny_alpaca"  # never read: we only load the model
    model_args, _, _, finetuning_args, _ = get_train_args(config)
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    return load_model(tokenizer, model_args, finetuning_args, is_trainable=True)


@pytest.mark.parametrize(
    "stage, loss_kind", [("sft", "fused_linear_cross_entropy"), ("dpo", "cross_entropy")]
)
def test_model_hooks_patch_trainable_model(tiny_llama, tiny_dataset_dir, tmp_path, stage, loss_kind, caplog):
    """The loader's liger step is ours: FLCE for sft, plain CE for stages that need logits (LLaMA-Factory's
    rule for liger-kernel)."""
    from liger_core_llamafactory import model_hooks

    from liger_core.patching import is_patched, patched_modules, revert

    model_hooks.install()
    model_hooks.install()  # idempotent
    from llamafactory.model import loader

    assert loader.patch_model.__wrapped__.__module__ == "llamafactory.model.patcher"
    with caplog.at_level("INFO", logger="llamafactory.liger_core"):
        model = _load(tiny_llama, tiny_dataset_dir, tmp_path, stage)
    try:
        assert is_patched(model)
        kinds = set(patched_modules(model).values())
        assert {"rms_norm", "swiglu", "rope", loss_kind} <= kinds
        other = "cross_entropy" if loss_kind != "cross_entropy" else "fused_linear_cross_entropy"
        assert other not in kinds
        assert "liger_core kernels active on LlamaForCausalLM" in caplog.text
    finally:
        revert(model)


def test_long_context_flags_reach_the_model_under_llamafactory_checkpointing(
    tiny_llama, tiny_dataset_dir, tmp_path
):
    """liger_kernel_config {tiled_mlp, offload_checkpoints} with LLaMA-Factory's own gradient checkpointing
    (its checkpoint function, set before the model is patched): every layer input goes to host memory and
    back, the MLPs run in tiles."""
    import torch
    from liger_core_llamafactory import model_hooks

    from liger_core import tuning
    from liger_core.modules.long_context import OFFLOAD_COUNTS
    from liger_core.patching import patched_modules, revert

    model_hooks.install(kernel_config={"tiled_mlp": True, "offload_checkpoints": True})
    try:
        model = _load(tiny_llama, tiny_dataset_dir, tmp_path, "sft", disable_gradient_checkpointing=False)
    finally:
        model_hooks.install()  # later tests: no toggles
    try:
        kinds = list(patched_modules(model).values())
        layers = model.config.num_hidden_layers
        assert kinds.count("offload_checkpoints") == layers, kinds  # tiled_mlp: counted below
        assert model.is_gradient_checkpointing
        model.train()
        ids = torch.randint(0, model.config.vocab_size, (1, 12))
        calls = [0]
        down_proj = model.model.layers[0].mlp.down_proj
        down_proj.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        OFFLOAD_COUNTS.clear()
        with tuning.override(checkpoint_offload_min_bytes=0, mlp_tile_tokens=5):
            model(input_ids=ids, labels=ids).loss.backward()
        assert OFFLOAD_COUNTS["offloaded"] == layers and OFFLOAD_COUNTS["fetched"] == layers
        assert calls[0] >= 3  # ceil(12 / 5) tiles in the forward alone
    finally:
        revert(model)


def test_webui_checkbox_reaches_training_args():
    """create_ui() has the checkbox, the train inputs include it, and ticking it sets enable_liger_kernel."""
    from liger_core_llamafactory import webui

    webui.install()
    webui.install()  # idempotent
    import gradio as gr
    from llamafactory.webui import runner
    from llamafactory.webui.engine import Engine
    from llamafactory.webui.interface import create_top, create_ui

    assert isinstance(create_ui(), gr.Blocks)  # the whole UI still builds with the wrapped pieces
    engine = Engine()
    with gr.Blocks():
        engine.manager.add_elems("top", create_top())
    checkbox = engine.manager.get_elem_by_id(webui.CHECKBOX_ID)
    assert isinstance(checkbox, gr.Checkbox) and checkbox.label == webui.CHECKBOX_LABEL
    assert checkbox in engine.manager.get_base_elems()

    wrapped = webui._wrap_parse_train_args(lambda self, data: {"stage": "sft"})
    assert wrapped(engine.runner, {checkbox: True}) == {"stage": "sft", "enable_liger_kernel": True}
    assert wrapped(engine.runner, {checkbox: False}) == {"stage": "sft"}

    calls = []
    popen = webui._wrap_popen(lambda cmd, *a, **k: calls.append(cmd))
    popen(["llamafactory-cli", "train", "x.yaml"])
    assert calls[-1] == [sys.executable, "-m", "liger_core_llamafactory", "train", "x.yaml"]
    # with the start-up hook (this process has it) the UI's own `llamafactory-cli train` runs stay as they are
    assert getattr(runner.Popen, "__wrapped__", None) is None
    assert "llamafactory-cli train" in runner.gen_cmd({"stage": "sft", "output_dir": "o"})
    webui.install_command_rewrite()  # liger-lmf webui with the hook off
    try:
        assert runner.Popen.__wrapped__ is not None
        assert "liger-lmf train" in runner.gen_cmd({"stage": "sft", "output_dir": "o"})
    finally:
        runner.Popen, runner.gen_cmd = runner.Popen.__wrapped__, runner.gen_cmd.__wrapped__


def test_torchrun_command_runs_our_worker(monkeypatch):
    from liger_core_llamafactory.launch import torchrun_command

    monkeypatch.setenv("NPROC_PER_NODE", "2")
    monkeypatch.setenv("MASTER_PORT", "29555")
    monkeypatch.delenv("RDZV_ID", raising=False)
    cmd = torchrun_command(["c.yaml", "max_steps=1"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert cmd[-4:] == ["-m", "liger_core_llamafactory.worker", "c.yaml", "max_steps=1"]


def test_v1_trainer_is_refused_with_liger_core(monkeypatch, tmp_path):
    from liger_core_llamafactory import launch

    monkeypatch.setenv("USE_V1", "1")
    path = tmp_path / "c.yaml"
    path.write_text("stage: sft\nenable_liger_kernel: true\n")
    with pytest.raises(SystemExit, match="unset USE_V1"):
        launch.train([str(path)])

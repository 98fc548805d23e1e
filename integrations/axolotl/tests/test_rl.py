"""``rl:`` configs: validation of the plugin's keys with Axolotl's RL keys, the wiring decision
(``plugin.rl_wiring``), and 2 DPO and 2 GRPO steps through Axolotl's trainer builder with and without
liger_core."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from decimal import Decimal

os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")  # before axolotl is imported: no telemetry threads

import pytest
import yaml
from conftest import PLUGIN, axolotl_config, liger_core_messages, subprocess_env
from liger_core_axolotl.args import config_conflicts, liger_core_flags

LAYERS = 2  # conftest.build_tiny_llama
PAIRS = [
    ("red fox", " runs", " sleeps"),
    ("blue sky", " glows", " falls"),
    ("tiny model", " learns", " forgets"),
    ("fast kernels", " fuse", " wait"),
]


@pytest.fixture(scope="session")
def preference_data(tmp_path_factory):
    path = tmp_path_factory.mktemp("pref") / "pairs.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n" for p, c, r in PAIRS * 2)
    )
    return path


def dpo_config(model, data, workdir, **extra) -> dict:
    config = axolotl_config(model, data, workdir, **extra)
    config.update(
        rl="dpo",
        datasets=[{"path": str(data), "type": "passthrough", "split": "train"}],
        micro_batch_size=2,
        max_steps=2,
        sequence_len=32,
        trl={"beta": 0.5},
        seed=0,  # Axolotl shuffles the dataset with cfg.seed (random without one)
    )
    config.update(extra)
    return config


@pytest.fixture
def plugin_manager():
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


def test_rl_config_loads_with_layer_kernels_and_no_sft_loss(
    tiny_llama, preference_data, tmp_path, plugin_manager, caplog
):
    from liger_core_axolotl.plugin import LigerCorePlugin, rl_wiring

    cfg = _load_cfg(tmp_path, dpo_config(tiny_llama, preference_data, tmp_path, liger_core_rope=False))
    assert cfg.use_liger_kernel is True and str(cfg.rl.value) == "dpo"
    flags = liger_core_flags(cfg)
    assert flags["rms_norm"] and flags["swiglu"] and not flags["rope"]
    assert not flags["fused_linear_cross_entropy"] and not flags["cross_entropy"]  # off by default with rl
    import trl
    import trl.trainer.utils as trl_utils

    mode, message = rl_wiring(cfg)
    if hasattr(trl_utils, "add_fused_lm_head"):
        pytest.skip(f"TRL {trl.__version__} has the fused LM head: covered by the 2-step run")
    assert mode == "trl_loss" and f"TRL {trl.__version__} has no fused LM head" in message
    assert "liger_core's fused linear DPO loss" in message
    assert LigerCorePlugin().get_training_args(cfg) is None  # TRL's flag stays off (no liger-kernel patching)
    log = logging.getLogger("axolotl.integrations.liger_core")
    log.addHandler(caplog.handler)  # Axolotl's logging config (set up by load_cfg) stops propagation
    try:
        with caplog.at_level("INFO", logger=log.name):
            LigerCorePlugin().register(dict(cfg))
    finally:
        log.removeHandler(caplog.handler)
    assert "rl: dpo: liger_core runs its layer kernels" in caplog.text


@pytest.mark.parametrize("key", ["liger_core_fused_linear_cross_entropy", "liger_core_cross_entropy"])
def test_rl_rejects_sft_loss_kernels(tiny_llama, preference_data, tmp_path, plugin_manager, key):
    with pytest.raises(Exception, match="liger_core") as info:
        _load_cfg(tmp_path, dpo_config(tiny_llama, preference_data, tmp_path, **{key: True}))
    assert f"{key} with `rl: dpo`: these are SFT losses" in str(info.value)


@pytest.mark.parametrize(
    "extra, name",
    [
        ({"dpo_use_liger_kernel": True}, "dpo_use_liger_kernel"),
        ({"trl": {"use_liger_loss": True}}, "trl.use_liger_loss"),
    ],
)
def test_rl_rejects_trl_liger_kernel_flags(
    tiny_llama, preference_data, tmp_path, plugin_manager, extra, name
):
    config = dpo_config(tiny_llama, preference_data, tmp_path)
    config.update(extra)
    with pytest.raises(Exception, match="liger_core") as info:
        _load_cfg(tmp_path, config)
    assert f"{name} turns on TRL's use_liger_kernel" in str(info.value)


def test_rl_conflict_rules():
    base = {"use_liger_kernel": True, "plugins": [PLUGIN]}
    for rl in ("dpo", "ipo", "kto", "orpo", "simpo", "grpo", "gdpo"):
        assert config_conflicts({**base, "rl": rl}) == [], rl
        assert not liger_core_flags({**base, "rl": rl})["fused_linear_cross_entropy"]
    # another loss is no conflict under rl: liger_core puts no loss kernel in
    assert config_conflicts({**base, "rl": "dpo", "cut_cross_entropy": True}) == []
    assert config_conflicts({**base, "rl": "dpo", "liger_core_fused_linear_cross_entropy": False}) == []
    assert config_conflicts({**base, "rl": "dpo", "dpo_use_liger_kernel": False, "trl": {"beta": 0.1}}) == []
    # without liger_core on, Axolotl's own keys are not this plugin's business
    assert config_conflicts({"rl": "dpo", "dpo_use_liger_kernel": True}) == []


def test_rl_wiring_with_trl_fused_head(monkeypatch):
    """Where TRL has its fused LM head and liger-core-trl is installed (TRL >= 1.15): the plugin gives the
    TRL trainer its use_liger_kernel flag with the layer kernels chosen in the YAML."""
    from axolotl.utils.dict import DictDefault
    from liger_core_axolotl import plugin as plugin_module

    monkeypatch.setattr(plugin_module, "fused_logprobs_unavailable", lambda: None)
    cfg = DictDefault({"use_liger_kernel": True, "rl": "kto", "liger_core_layer_norm": False})
    mode, message = plugin_module.rl_wiring(cfg)
    assert mode == "fused_head" and "per-token log-probs of TRL's fused LM head" in message
    assert plugin_module.LigerCorePlugin().get_training_args(cfg) == {
        "use_liger_kernel": True,
        "liger_kernel_config": {
            "rope": True,
            "rms_norm": True,
            "swiglu": True,
            "geglu": True,
            "relu_squared": True,
            "moe_experts": True,
            "layer_norm": False,
            "tiled_mlp": False,
            "offload_checkpoints": False,
        },
    }
    for rl in ("orpo", "simpo"):  # TRL's experimental ORPO/CPO trainers have no fused head
        mode, message = plugin_module.rl_wiring(DictDefault({"use_liger_kernel": True, "rl": rl}))
        assert mode is None and "computes its loss from the full logits" in message
    sft = DictDefault({"use_liger_kernel": True})
    assert plugin_module.LigerCorePlugin().get_training_args(sft) is None


def test_fused_head_needs_the_trl_plugins_start_up_hook(monkeypatch):
    """This plugin never imports liger-core-trl: TRL's fused LM head is used when TRL has one and the TRL
    plugin's start-up hook watches TRL in this process (``liger_core.startup_hook``); otherwise the reason
    names the install command, or the environment variable that turned the hooks off."""
    import trl.trainer.utils as trl_utils
    from liger_core_axolotl import plugin as plugin_module

    from liger_core import startup_hook

    monkeypatch.setattr(trl_utils, "add_fused_lm_head", lambda *a, **k: None, raising=False)
    monkeypatch.setattr(startup_hook, "_prefix_callbacks", {})  # no TRL plugin hook in this process
    monkeypatch.setattr(startup_hook, "_callbacks", {})
    monkeypatch.delenv(startup_hook.ENV_DISABLE, raising=False)
    reason = plugin_module.fused_logprobs_unavailable()
    assert reason is not None and "pip install -e integrations/trl" in reason, reason
    monkeypatch.setenv(startup_hook.ENV_DISABLE, "1")
    reason = plugin_module.fused_logprobs_unavailable()
    assert reason is not None and startup_hook.ENV_DISABLE in reason, reason
    monkeypatch.delenv(startup_hook.ENV_DISABLE)
    startup_hook.when_imported("trl.", lambda module: None)  # what liger_core_trl.activation registers
    assert plugin_module.fused_logprobs_unavailable() is None
    assert "liger_core_trl" not in sys.modules


def _train(config: dict, workdir) -> tuple[int, str]:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(  # Axolotl's own CLI, as users run it (default launcher: accelerate)
        [os.path.join(os.path.dirname(sys.executable), "axolotl"), "train", str(path)],
        cwd=workdir,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=480,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _logged_text(output: str, key: str) -> list[str]:
    return re.findall(rf"'{re.escape(key)}': '?(-?[0-9.e-]+)", output)


def _logged(output: str, key: str) -> list[float]:
    return [float(x) for x in _logged_text(output, key)]


def _assert_logged_close(runs: dict, key: str, rel: float, abs_tol: float, count: int = 2) -> None:
    """The metric ``key`` logged by both runs, compared as the decimals they were logged as: pytest.approx's
    bound, max(rel x |off|, abs_tol), on the values, plus what the logging's rounding adds to it. Each logged
    decimal is its value rounded to half a unit in its last significant place, so two values within the
    bound may be logged up to those two half units further apart when they straddle a rounding boundary (a
    CI run logged rewards/chosen 0.03624 and 0.03625, 1e-5 apart, against a 9.6e-6 bound on the values). In
    floats 0.003959 - 0.003958 is 1.0000000000001e-06, hence decimals."""
    off, on = _logged_text(runs["off"], key), _logged_text(runs["on"], key)
    assert len(off) == count and len(on) == count, (key, off, on)
    for a, b in zip(on, off):
        bound = max(Decimal(repr(rel)) * abs(Decimal(b)), Decimal(repr(abs_tol)))
        rounding = _logging_rounding(a) + _logging_rounding(b)
        assert abs(Decimal(a) - Decimal(b)) <= bound + rounding, (key, a, b, bound, rounding)


def _logging_rounding(logged: str) -> Decimal:
    """The most the logging's rounding moved a value: half a unit in its last written place, or in its 4th
    significant digit where fewer were written (HF's Trainer logs floats as ``f"{v:.4g}"``, which drops
    trailing zeros: '0.5' is 0.5000). '0.03624' -> 5e-6, '0.5' -> 5e-5, '0' -> 0."""
    value = Decimal(logged)
    if value == 0:
        return Decimal(0)
    unit = min(Decimal(1).scaleb(value.as_tuple().exponent), Decimal(1).scaleb(value.adjusted() - 3))
    return unit / 2


def test_dpo_two_steps_with_and_without_liger_core(tiny_llama, preference_data, tmp_path):
    """Axolotl's RL trainer builder -> its DPO trainer (TRL), 2 fp32 steps: the same losses, gradient norms
    and logged metrics with liger_core (layer kernels and, on TRL without a fused LM head, its fused DPO loss;
    Triton interpreter) as without the plugin (rel 1e-4)."""
    runs = {}
    for name, extra in (("off", {"plugins": [], "use_liger_kernel": None}), ("on", {})):
        workdir = tmp_path / name
        workdir.mkdir()
        config = dpo_config(tiny_llama, preference_data, workdir, **extra)
        config = {k: v for k, v in config.items() if v is not None}
        code, output = _train(config, workdir)
        assert code == 0, output[-6000:]
        runs[name] = output
    # the policy's (and the reference model's) layer kernels, no SFT loss kernel: on a 2-layer Llama two
    # RMSNorms per layer and the final one, RoPE and SwiGLU once per layer
    active = re.findall(r"kernels active on LlamaForCausalLM \(rank 0\): (.*)", runs["on"])
    assert active, runs["on"][-4000:]
    for listed in active:
        assert dict((k, int(n)) for k, n in re.findall(r"(\w+) x(\d+)", listed)) == {
            "rms_norm": 2 * LAYERS + 1,
            "rope": LAYERS,
            "swiglu": LAYERS,
        }, listed
    assert "use_liger_kernel is served by liger_core" in runs["on"]
    assert "rl: dpo: liger_core runs its layer kernels" in runs["on"]
    assert liger_core_messages(runs["off"]) == []
    import trl.trainer.utils as trl_utils

    if not hasattr(trl_utils, "add_fused_lm_head"):
        assert "AxolotlDPOTrainer computes its loss with liger_core" in runs["on"], runs["on"][-4000:]
    keys = ("loss", "grad_norm", "rewards/chosen", "rewards/margins", "logps/rejected", "logits/chosen")
    # rewards are beta x differences of fp32 sequence log-probs: known to a few ulps of the log-probs
    logps = max(abs(v) for key in ("logps/chosen", "logps/rejected") for v in _logged(runs["off"], key))
    for key in keys + ("entropy", "mean_token_accuracy"):
        tolerance = 4 * 0.5 * logps * 2**-23 if key.startswith("rewards/") else 1e-6
        _assert_logged_close(runs, key, rel=1e-4, abs_tol=tolerance)


REWARDS = '''def length_reward(prompts, completions, **kwargs):
    """Longer completions score higher (deterministic)."""
    return [float(len(c)) for c in completions]
'''


def test_grpo_two_steps_with_and_without_liger_core(tiny_llama, tmp_path):
    """Axolotl's GRPO trainer (TRL's, generation with transformers), 2 fp32 steps of 4 prompts x 2
    completions: the same gradient norms, rewards and logged metrics with liger_core (layer kernels and, on
    TRL without a fused LM head, its fused GRPO loss) as without the plugin. On-policy with zero-mean
    advantages the loss and KL are rounding noise around 0 (TRL's fp32: ~1e-9): compared absolutely."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p, _, _ in PAIRS * 2))
    runs = {}
    for name, extra in (("off", {"plugins": [], "use_liger_kernel": None}), ("on", {})):
        workdir = tmp_path / name
        workdir.mkdir()
        (workdir / "grpo_rewards.py").write_text(REWARDS)  # Axolotl imports reward functions from the cwd
        config = axolotl_config(tiny_llama, data, workdir, **extra)
        config.update(
            rl="grpo",
            datasets=[{"path": str(data), "type": "passthrough", "split": "train"}],
            micro_batch_size=4,
            max_steps=2,
            sequence_len=32,
            seed=0,
            trl={
                "beta": 0.04,
                "num_generations": 2,
                "max_completion_length": 6,
                "use_vllm": False,
                "reward_funcs": ["grpo_rewards.length_reward"],
            },
        )
        config = {k: v for k, v in config.items() if v is not None}
        code, output = _train(config, workdir)
        assert code == 0, output[-6000:]
        runs[name] = output
    import trl.trainer.utils as trl_utils

    if not hasattr(trl_utils, "add_fused_lm_head"):
        assert "AxolotlGRPOTrainer computes its loss with liger_core" in runs["on"], runs["on"][-4000:]
    assert liger_core_messages(runs["off"]) == []
    for key in ("grad_norm", "reward", "entropy", "loss"):
        _assert_logged_close(runs, key, rel=1e-4, abs_tol=1e-6)
    _assert_logged_close(runs, "kl", rel=0.0, abs_tol=1e-6)

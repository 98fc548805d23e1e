"""The start-up hook as installed (``liger_core_axolotl_hook.pth``): in site-packages after the documented
editable install and in a built wheel, cheap at start-up, off with LIGER_CORE_DISABLE_HOOK=1; Axolotl's own
config loading then stops on a misspelled plugin module or key of this plugin, with the name meant; and
``liger-core-axolotl check`` says the same."""

from __future__ import annotations

import os

os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")  # before axolotl is imported: no telemetry threads

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import PLUGIN, axolotl_config, subprocess_env

PTH = "liger_core_axolotl_hook.pth"
PLUGIN_DIR = Path(__file__).resolve().parents[1]
CHECK = str(Path(sys.executable).parent / "liger-core-axolotl")


def _python(code: str, **env: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env(**env), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


def test_editable_install_has_the_pth_and_it_is_lazy():
    pth = Path(sysconfig.get_paths()["purelib"]) / PTH
    assert pth.read_text().strip() == "import liger_core_axolotl.import_hook"
    out = _python(  # of liger_core, only its torch-free start-up hook module
        "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', "
        "'transformers', 'axolotl') or m.startswith('liger_core.') and m != 'liger_core.startup_hook'))"
    )
    assert out == "[]"
    probe = (
        "import axolotl.integrations.base as b, axolotl.cli.config as c; "
        "print(hasattr(b.PluginManager.register, '__wrapped__'), hasattr(c.prepare_plugins, '__wrapped__'))"
    )
    assert _python(probe) == "True True"
    assert _python(probe, LIGER_CORE_DISABLE_HOOK="1") == "False False"


def test_built_wheel_ships_the_pth(tmp_path):
    source = tmp_path / "src"  # a copy: the build leaves the checkout as it is
    shutil.copytree(PLUGIN_DIR, source, ignore=shutil.ignore_patterns("tests", "build"))
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [wheel] = tmp_path.glob("liger_core_axolotl-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(PTH).decode().strip() == "import liger_core_axolotl.import_hook"
        assert "liger_core_axolotl/import_hook.py" in zf.namelist()


@pytest.fixture
def plugin_manager():
    from axolotl.integrations.base import PluginManager

    manager = PluginManager.get_instance()
    saved = dict(manager.plugins)
    yield manager
    manager.plugins.clear()
    manager.plugins.update(saved)


TYPOS = [
    ({"use_liger_kernal": True}, "unknown key `use_liger_kernal` (did you mean `use_liger_kernel`?)"),
    ({"enable_liger_kernel": True}, "unknown key `enable_liger_kernel` (did you mean `use_liger_kernel`?)"),
    (
        {"liger_core_rms_nrom": False},
        "unknown key `liger_core_rms_nrom` (did you mean `liger_core_rms_norm`?)",
    ),
    ({"liger_core_stric": True}, "(did you mean `liger_core_strict`?)"),
]


@pytest.mark.parametrize("extra, message", TYPOS)
def test_axolotl_load_cfg_names_misspelled_keys(
    tiny_llama, tiny_dataset, tmp_path, plugin_manager, extra, message
):
    """Axolotl's own ``load_cfg`` (what ``axolotl train`` runs first), wrapped by the hook in this process."""
    from axolotl.cli.config import load_cfg

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(axolotl_config(tiny_llama, tiny_dataset, tmp_path, **extra)))
    with pytest.raises(ValueError) as info:
        load_cfg(str(path))
    assert message in str(info.value)


def test_axolotl_keys_close_to_ours_are_left_alone():
    """Keys Axolotl knows (its liger-kernel plugin's ``liger_rms_norm``) are never taken for typos of ours."""
    from liger_core_axolotl.args import misspelled_keys

    assert misspelled_keys({"liger_rms_norm": True, "liger_rope": True, "learning_rate": 1e-3}) == []


@pytest.mark.parametrize("extra, message", TYPOS)
def test_check_command_names_misspelled_keys(tiny_llama, tiny_dataset, tmp_path, extra, message):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(axolotl_config(tiny_llama, tiny_dataset, tmp_path, **extra)))
    proc = subprocess.run([CHECK, "check", str(path)], env=subprocess_env(), capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "OK" not in proc.stdout


def test_misspelled_plugin_module_stops_axolotl_load_cfg(tiny_llama, tiny_dataset, tmp_path, plugin_manager):
    from axolotl.cli.config import load_cfg

    config = axolotl_config(
        tiny_llama, tiny_dataset, tmp_path, plugins=["liger_core_axolotI.LigerCorePlugin"]
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ImportError) as info:
        load_cfg(str(path))
    message = str(info.value)
    assert f"Did you mean {PLUGIN}?" in message
    assert "pip install -e . && pip install -e integrations/axolotl" in message


def test_our_keys_without_the_plugin_stop_axolotl_load_cfg(
    tiny_llama, tiny_dataset, tmp_path, plugin_manager
):
    from axolotl.cli.config import load_cfg

    config = axolotl_config(tiny_llama, tiny_dataset, tmp_path, plugins=[])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(
        ValueError, match=r"use_liger_kernel set, but liger_core_axolotl.LigerCorePlugin is not"
    ):
        load_cfg(str(path))


def test_liger_kernel_patches_are_refused(tiny_llama, tiny_dataset, tmp_path):
    """Axolotl installs liger-kernel; a model its class-level patch reached (here called directly, as
    Axolotl's LigerPlugin would) is not patched again by liger_core: ``post_model_build`` stops and names what
    liger-kernel replaced. In a subprocess: the patch changes transformers' Llama classes for the process."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(axolotl_config(tiny_llama, tiny_dataset, tmp_path)))
    code = f"""
import torch
from axolotl.cli.config import load_cfg
from liger_kernel.transformers import apply_liger_kernel_to_llama
from transformers import AutoModelForCausalLM
from liger_core.patching import liger_kernel_parts
from liger_core_axolotl.plugin import LigerCorePlugin
cfg = load_cfg({str(config)!r})
plain = AutoModelForCausalLM.from_pretrained({str(tiny_llama)!r}, dtype=torch.float32)
LigerCorePlugin().post_model_build(cfg, plain)
print(liger_kernel_parts(plain))
apply_liger_kernel_to_llama()
model = AutoModelForCausalLM.from_pretrained({str(tiny_llama)!r}, dtype=torch.float32)
try:
    LigerCorePlugin().post_model_build(cfg, model)
except RuntimeError as e:
    print(e)
"""
    lines = _python(code).splitlines()
    assert lines[-2] == "[]", lines  # the model liger_core patched has no part of liger-kernel
    assert lines[-1].startswith("liger_core: LlamaForCausalLM already runs liger-kernel's patches"), lines
    assert "LigerRMSNorm" in lines[-1], lines

"""The start-up hook as installed (``liger_core_llamafactory_hook.pth``): present in site-packages after the
documented editable install and in a built wheel, cheap at start-up, acting only once LLaMA-Factory is
imported, off with LIGER_CORE_DISABLE_HOOK=1; the liger keys checked with did-you-mean; liger-kernel's
patches never on a model liger_core patches."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import subprocess_env, train_config
from liger_core_llamafactory.compat import ensure_torchaudio_importable

ensure_torchaudio_importable()  # before anything imports llamafactory (see compat.py)

PTH = "liger_core_llamafactory_hook.pth"
PLUGIN_DIR = Path(__file__).resolve().parents[1]


def _python(code: str, **env: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env(**env), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


def test_editable_install_has_the_pth_and_it_is_lazy():
    pth = Path(sysconfig.get_paths()["purelib"]) / PTH
    assert pth.read_text().strip() == "import liger_core_llamafactory.import_hook"
    # at start-up: only the finder; neither torch nor LLaMA-Factory imported
    out = _python(  # of liger_core, only its torch-free start-up hook module
        "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', "
        "'transformers', 'llamafactory') or m.startswith('liger_core.') and m != 'liger_core.startup_hook'))"
    )
    assert out == "[]"
    probe = (
        "import llamafactory.hparams.parser as p, llamafactory.webui.interface as i; "
        "print(hasattr(p._parse_args, '__wrapped__'), hasattr(i.create_top, '__wrapped__'))"
    )
    assert _python(probe) == "True True"
    probe = (  # without the hook, torchaudio needs liger-lmf's stub here (see run_tests.sh)
        "from liger_core_llamafactory.compat import ensure_torchaudio_importable as stub; stub(); "
        "import llamafactory.hparams.parser as p; print(hasattr(p._parse_args, '__wrapped__'))"
    )
    assert _python(probe, LIGER_CORE_DISABLE_HOOK="1") == "False"


def test_built_wheel_ships_the_pth(tmp_path):
    source = tmp_path / "src"  # a copy: the build leaves the checkout as it is
    shutil.copytree(PLUGIN_DIR, source, ignore=shutil.ignore_patterns("tests", "llamaboard_cache", "build"))
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [wheel] = tmp_path.glob("liger_core_llamafactory-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(PTH).decode().strip() == "import liger_core_llamafactory.import_hook"
        assert "liger_core_llamafactory/import_hook.py" in zf.namelist()


def _train_args(tmp_path, **extra):
    return train_config(Path("unused-model"), tmp_path, tmp_path / "out", **extra)


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            {"enable_liger_kernal": True},
            "unknown key 'enable_liger_kernal' (did you mean 'enable_liger_kernel'?)",
        ),
        ({"use_liger_kernels": True}, "unknown key 'use_liger_kernels' (did you mean 'use_liger_kernel'?)"),
        ({"liger_kernel_confg": {"rope": False}}, "(did you mean 'liger_kernel_config'?)"),
        (
            {"enable_liger_kernel": True, "liger_kernel_config": {"rms_nrom": False}},
            "unknown key(s) 'rms_nrom' (did you mean 'rms_norm'?)",
        ),
    ],
)
def test_misspelled_liger_keys_are_named(tmp_path, monkeypatch, extra, message):
    """Through LLaMA-Factory's own get_train_args (wrapped by the hook in this process too), also with
    ALLOW_EXTRA_ARGS=1, under which LLaMA-Factory itself would drop an unknown key."""
    from llamafactory.hparams import get_train_args

    monkeypatch.setenv("ALLOW_EXTRA_ARGS", "1")
    with pytest.raises(ValueError) as info:
        get_train_args(_train_args(tmp_path, **extra))
    assert message in str(info.value)


def test_liger_kernel_patches_are_refused(tiny_llama):
    """A model that liger-kernel's class-level patch reached (its layers and its causal-LM forward) is not
    patched again by liger_core: the run stops and names what liger-kernel replaced. In a subprocess:
    liger-kernel's patch changes transformers' Llama classes for the whole process."""
    pytest.importorskip("liger_kernel")
    code = f"""
import torch
from liger_kernel.transformers import apply_liger_kernel_to_llama
from transformers import AutoModelForCausalLM
from liger_core_llamafactory import model_hooks
apply_liger_kernel_to_llama()
model = AutoModelForCausalLM.from_pretrained({str(tiny_llama)!r}, dtype=torch.float32)
try:
    model_hooks.patch_trainable_model(model, require_logits=False)
except RuntimeError as e:
    print(e)
"""
    out = _python(code)
    assert out.startswith("liger_core: LlamaForCausalLM already runs liger-kernel's patches"), out
    assert "LigerRMSNorm" in out, out
    # and the model liger_core patched has no part of liger-kernel
    code = f"""
import torch
from transformers import AutoModelForCausalLM
from liger_core_llamafactory import model_hooks
model = AutoModelForCausalLM.from_pretrained({str(tiny_llama)!r}, dtype=torch.float32)
model_hooks.patch_trainable_model(model, require_logits=False)
import liger_kernel.transformers  # installed beside liger_core: importing it patches nothing
from liger_core.patching import liger_kernel_parts
print(liger_kernel_parts(model))
"""
    assert _python(code).splitlines()[-1] == "[]"

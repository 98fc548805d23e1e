"""Zero-change activation: with the plugin installed, an unmodified HfArgumentParser + Trainer script run with
`--use_liger_kernel` (directly, under torchrun, under accelerate launch) trains with liger_core's kernels.

The subprocesses run as a user's process does (the `.pth` activation on, `tiny.child_env`); the assertions
read the run's log lines (which library serves the flag, liger_core's patch report with kinds and counts)
and the script's own result file (losses, kinds found in the model).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import logging
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import liger_core_hf
import pytest
import transformers
from liger_core_hf import activation
from liger_core_hf import hook as hook_module
from liger_core_hf.patch import liger_kernel_patches
from packaging.version import Version
from tiny import child_env, kinds
from transformers import HfArgumentParser, TrainingArguments

PLUGIN = Path(__file__).resolve().parents[1]
SCRIPT = str(PLUGIN / "tests" / "scripts" / "train_clm.py")
BIN = Path(sys.executable).parent
REPORT = "liger_core: patched llama: rms_norm x5, swiglu x2, rope x2, fused_linear_cross_entropy x1"
SERVED = re.compile(r"use_liger_kernel is served by liger_core \S+ \(liger-core-hf \S+\)")


def liger_kernel_installed() -> bool:
    try:
        importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def script_args(tiny_dir: Path, output_dir: Path) -> list[str]:
    return [
        "--model_dir", str(tiny_dir), "--output_dir", str(output_dir), "--max_steps", "2",
        "--per_device_train_batch_size", "2", "--logging_steps", "1", "--learning_rate", "0.01",
        "--save_strategy", "no", "--report_to", "none", "--use_cpu",
        "--train_sampling_strategy", "sequential", "--disable_tqdm", "true", "--seed", "0",
    ]  # fmt: skip


def run(cmd: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=child_env(**env), timeout=300)


def result(proc: subprocess.CompletedProcess, output_dir: Path) -> dict:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads((output_dir / "result.json").read_text())


@pytest.fixture(scope="module")
def plain_losses(tiny_dir, tmp_path_factory) -> list[float]:
    """The script without the flag (the activation is on: it must leave such a run alone)."""
    out = tmp_path_factory.mktemp("plain")
    proc = run([sys.executable, SCRIPT, *script_args(tiny_dir, out)])
    plain = result(proc, out)
    assert plain["kinds"] == [] and "liger_core" not in proc.stderr
    return plain["losses"]


@pytest.mark.parametrize("launcher", ["python", "torchrun", "accelerate"])
def test_unmodified_script_with_the_flag_runs_liger_core(launcher, tiny_dir, tmp_path, plain_losses):
    prefix = {
        "python": [sys.executable],
        "torchrun": [str(BIN / "torchrun"), "--nproc_per_node", "1"],
        "accelerate": [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "1",
                       "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"],
    }[launcher]  # fmt: skip
    proc = run([*prefix, SCRIPT, *script_args(tiny_dir, tmp_path), "--use_liger_kernel"])
    launched = result(proc, tmp_path)
    log = proc.stderr
    assert len(SERVED.findall(log)) == 1, log[-3000:]  # one line (rank 0) naming the library and versions
    assert f"[liger_core_hf] use_liger_kernel: {REPORT}" in log  # kinds and counts, from liger_core's report
    assert launched["kinds"] == ["fused_linear_cross_entropy", "rms_norm", "rope", "swiglu"]
    assert launched["losses"] == pytest.approx(plain_losses, rel=1e-4)
    if liger_kernel_installed():
        version = importlib.metadata.version("liger-kernel")
        assert f"the installed liger-kernel {version} is not used" in log


def test_disabled_by_the_environment_variable(tiny_dir, tmp_path):
    """LIGER_CORE_DISABLE_HOOK=1: transformers handles the flag itself, as without the plugin (liger-kernel
    when it is installed, else transformers' ImportError)."""
    code = (
        "import liger_core_hf.hook as hook, liger_core_hf.parser as parser, transformers.trainer as trainer\n"
        "print(hook.is_installed(), parser.is_installed(), trainer.apply_liger_kernel.__module__)\n"
    )
    proc = run([sys.executable, "-c", code], LIGER_CORE_DISABLE_HOOK="1")
    assert proc.stdout.split() == ["False", "False", "transformers.integrations.liger"], proc.stderr
    if not liger_kernel_installed():  # the script with the flag: transformers' own error
        proc = run(
            [sys.executable, SCRIPT, *script_args(tiny_dir, tmp_path), "--use_liger_kernel"],
            LIGER_CORE_DISABLE_HOOK="1",
        )
        assert proc.returncode != 0
        assert "liger-kernel >= 0.3.0 is not available" in proc.stderr
        # nothing of liger_core ran: no served-by line, no patch report (paths may contain the name)
        assert "served by liger_core" not in proc.stderr and "liger_core: patched" not in proc.stderr
        assert "[liger_core_hf]" not in proc.stderr


def test_misspelled_flag_is_a_did_you_mean_error(tiny_dir, tmp_path):
    proc = run([sys.executable, SCRIPT, *script_args(tiny_dir, tmp_path), "--use_liger_kernal"])
    assert proc.returncode == 2
    assert "unknown argument --use_liger_kernal: did you mean --use_liger_kernel?" in proc.stderr
    config = '{"rms_nrom": false}'
    proc = run([sys.executable, SCRIPT, *script_args(tiny_dir, tmp_path), "--liger_kernel_config", config])
    assert proc.returncode == 2
    assert "unknown key(s) ['rms_nrom'] ('rms_nrom': did you mean 'rms_norm'?)" in proc.stderr


def test_misspelled_keys_in_process(monkeypatch, tmp_path):
    liger_core_hf.install()
    parser = HfArgumentParser(TrainingArguments)
    argv = ["train.py", "--output_dir", str(tmp_path), "--liger_kernel_confg", "{}"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):  # even where the script keeps unknown arguments for later
        parser.parse_args_into_dataclasses(return_remaining_strings=True)
    with pytest.raises(ValueError, match="unknown argument use_liger_kernell: did you mean use_liger_kernel"):
        parser.parse_dict({"output_dir": str(tmp_path), "use_liger_kernell": True})
    _, remaining = parser.parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--num_processes", "2"], return_remaining_strings=True
    )
    assert remaining == ["--num_processes", "2"]  # other unknown options are the script's business


def test_transformers_applies_liger_kernel_where_the_hook_expects(make_model):
    """Where transformers acts on the flag (5.3+: `Trainer.train()` calls `apply_liger_kernel`, imported by
    name from `transformers.integrations.liger`, which checks `is_liger_kernel_available()` and calls
    liger-kernel's `_apply_liger_kernel_to_instance`). A release that moves this fails here, by name."""
    from transformers import Trainer
    from transformers.integrations import liger as liger_integration

    original = liger_integration.apply_liger_kernel
    names = original.__code__.co_names
    assert "is_liger_kernel_available" in names and "_apply_liger_kernel_to_instance" in names
    if Version(transformers.__version__).release >= (5, 3):
        assert "apply_liger_kernel" in inspect.unwrap(Trainer.train).__code__.co_names
        assert transformers.trainer.apply_liger_kernel is original

    liger_core_hf.install()
    assert transformers.trainer.apply_liger_kernel is hook_module.serve_transformers_call
    assert liger_integration.apply_liger_kernel is hook_module.serve_transformers_call
    model = make_model()
    transformers.trainer.apply_liger_kernel(model, {"rope": False})  # what train() calls with the flag on
    assert kinds(model) == {"rms_norm", "swiglu", "fused_linear_cross_entropy"}
    assert "liger_kernel" not in sys.modules
    liger_core_hf.uninstall()
    assert transformers.trainer.apply_liger_kernel is original
    assert liger_integration.apply_liger_kernel is original


def test_model_with_liger_kernel_patches_is_refused(make_model):
    """liger-kernel and liger_core never patch the same model (liger-kernel's functions are recognised by
    their module, so this runs without liger-kernel installed)."""
    model = make_model()

    def forward(self, hidden_states):  # stands for liger-kernel's LigerRMSNorm.forward bound on an instance
        return hidden_states

    forward.__module__ = "liger_kernel.transformers.rms_norm"
    norm = model.model.norm
    norm.forward = forward.__get__(norm)
    assert liger_kernel_patches(model) == ["model.norm.forward"]
    with pytest.raises(RuntimeError, match=r"carries liger-kernel's patches \(model\.norm\.forward\)"):
        liger_core_hf.patch_model(model)
    assert kinds(model) == set()


def test_activation_is_installed_with_the_plugin():
    """The editable install of the test venv put the `.pth` next to the packages; its line activates."""
    pth = Path(sysconfig.get_paths()["purelib"]) / "liger_core_hf.pth"
    assert pth.read_text().strip() == (PLUGIN / "liger_core_hf.pth").read_text().strip()
    assert pth.read_text().startswith("import liger_core_hf.activation")
    code = "import liger_core_hf.activation, liger_core.startup_hook as s; print(s.watched())"
    proc = run([sys.executable, "-c", code])
    assert proc.stdout.split() == ["['transformers.hf_argparser',", "'transformers.trainer']"]
    off = run([sys.executable, "-c", code], LIGER_CORE_DISABLE_HOOK="1")
    assert off.stdout.strip() == "[]"


def test_built_wheel_carries_the_pth(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(PLUGIN)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("liger_core_hf-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "liger_core_hf.pth" in names and "liger_core_hf/activation.py" in names


def test_activation_is_cheap_and_lazy():
    """At start-up nothing of transformers, torch or Triton is imported (of liger_core, only its start-up
    hook module); importing the argument parser alone hooks only it."""
    code = (
        "import sys\n"
        "heavy = ('transformers', 'torch', 'triton', 'liger_core.')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy) and m != 'liger_core.startup_hook'))\n"
        "from transformers import HfArgumentParser\n"
        "import liger_core_hf.parser as p, liger_core_hf.activation as a\n"
        "print(p.is_installed(), 'transformers.trainer' in sys.modules, a.active())\n"
    )
    proc = run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "True False True"]


def test_failing_hook_is_logged_and_the_import_goes_on(monkeypatch, caplog):
    monkeypatch.delenv(activation.ENV_DISABLE)

    def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(hook_module, "install_trainer_hook", broken)
    with caplog.at_level(logging.ERROR, logger="liger_core_hf"):
        activation._trainer_imported(transformers)
    (record,) = caplog.records
    assert "NOT served by liger_core" in record.getMessage() and "boom" in record.exc_text

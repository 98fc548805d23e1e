"""Command line: the flag and its JSON config from sys.argv, the launcher on an unchanged script, errors."""

from __future__ import annotations

import json
import logging
import runpy
import subprocess
import sys
from pathlib import Path

import liger_core_hf
import pytest
from liger_core_hf import patch as patch_module
from tiny import child_env, kinds, make_trainer, toy_model
from transformers import HfArgumentParser, TrainingArguments

SCRIPTS = Path(__file__).parent / "scripts"
BIN = Path(sys.executable).parent
ONLY_NORM = '{"rope": false, "swiglu": false, "fused_linear_cross_entropy": false}'


def test_flag_and_json_config_parsed_from_argv(monkeypatch, tmp_path):
    argv = [
        "train.py",
        "--output_dir",
        str(tmp_path),
        "--use_liger_kernel",
        "--liger_kernel_config",
        '{"rope": false}',
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):  # transformers alone: "invalid dict value"
        HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()

    liger_core_hf.install()
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    assert args.use_liger_kernel is True
    assert args.liger_kernel_config == {"rope": False}

    monkeypatch.setattr(
        sys, "argv", ["train.py", "--output_dir", str(tmp_path), "--use_liger_kernel", "false"]
    )
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    assert args.use_liger_kernel is False and args.liger_kernel_config is None


@pytest.mark.parametrize(
    "value, message",
    [
        ('{"rotary": false}', "unknown key(s) ['rotary']"),
        ("{rope: false}", "not valid JSON"),
        ('{"rope": 3}', "boolean"),
    ],
)
def test_bad_config_on_the_command_line_says_what_is_wrong(monkeypatch, capsys, tmp_path, value, message):
    liger_core_hf.install()
    monkeypatch.setattr(
        sys, "argv", ["train.py", "--output_dir", str(tmp_path), "--liger_kernel_config", value]
    )
    with pytest.raises(SystemExit):
        HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    assert message in capsys.readouterr().err


def _script_args(tiny_dir: Path, output_dir: Path) -> list[str]:
    return [
        "--model_dir", str(tiny_dir), "--output_dir", str(output_dir), "--max_steps", "2",
        "--per_device_train_batch_size", "2", "--logging_steps", "1", "--learning_rate", "0.01",
        "--save_strategy", "no", "--report_to", "none", "--use_cpu",
        "--train_sampling_strategy", "sequential", "--disable_tqdm", "true", "--seed", "0",
    ]  # fmt: skip


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**child_env(), "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, **kwargs)


def _result(proc: subprocess.CompletedProcess, output_dir: Path) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((output_dir / "result.json").read_text())


def test_config_keys_are_liger_cores_kernel_flags_and_strict():
    """The accepted keys come from liger_core's one definition of the flags, not a list of this plugin's."""
    import dataclasses

    from liger_core.patching import KernelFlags

    names = tuple(f.name for f in dataclasses.fields(KernelFlags))
    assert liger_core_hf.KERNEL_FLAGS == names
    assert liger_core_hf.parse_kernel_config({name: False for name in names} | {"strict": True}) == {
        **{name: False for name in names},
        "strict": True,
    }


def test_launcher_runs_an_unchanged_script(monkeypatch, tiny_dir, tmp_path):
    plain_out, launched_out = tmp_path / "plain", tmp_path / "launched"
    script = str(SCRIPTS / "train_clm.py")
    monkeypatch.setattr(sys, "argv", [script, *_script_args(tiny_dir, plain_out)])
    runpy.run_path(script, run_name="__main__")  # the script as it is, flag off (in this process: faster)
    plain = json.loads((plain_out / "result.json").read_text())
    proc = _run(
        [
            str(BIN / "liger-core-run"), script, *_script_args(tiny_dir, launched_out),
            "--use_liger_kernel", "--liger_kernel_config", '{"rope": false}',
        ]
    )  # fmt: skip
    launched = _result(proc, launched_out)
    assert plain["kinds"] == [] and plain["use_liger_kernel"] is False
    assert launched["kinds"] == ["fused_linear_cross_entropy", "rms_norm", "swiglu"]
    assert launched["use_liger_kernel"] is True and launched["liger_kernel_config"] == {"rope": False}
    assert len(launched["losses"]) == 2
    assert launched["losses"] == pytest.approx(plain["losses"], rel=1e-4)


def test_launcher_module_form(tiny_dir, tmp_path):
    cmd = [sys.executable, "-m", "liger_core_hf", "-m", "train_clm", *_script_args(tiny_dir, tmp_path)]
    proc = _run([*cmd, "--use_liger_kernel", "--liger_kernel_config", ONLY_NORM], cwd=SCRIPTS)
    assert _result(proc, tmp_path)["kinds"] == ["rms_norm"]


def test_missing_liger_core_fails_early_with_the_fix(tiny_dir, tmp_path):
    argv = [str(SCRIPTS / "train_clm.py"), *_script_args(tiny_dir, tmp_path), "--use_liger_kernel"]
    code = (
        "import sys; sys.modules['liger_core'] = None\n"  # what an environment without liger-core looks like
        f"from liger_core_hf.launch import main; main({argv!r})\n"
    )
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode != 0
    assert "liger-core package, which cannot be imported" in proc.stderr
    assert "`pip install -e .` at the repository root" in proc.stderr
    assert "pip install liger-core`" not in proc.stderr  # no package index serves liger-core
    assert not (tmp_path / "result.json").exists()  # the script never started


def test_missing_liger_core_in_process(monkeypatch, make_model):
    monkeypatch.setitem(sys.modules, "liger_core", None)
    with pytest.raises(ImportError, match="pip install -e \\.` at the repository root"):
        liger_core_hf.install()
    with pytest.raises(ImportError, match="pip install -e \\.` at the repository root"):
        liger_core_hf.patch_model(make_model())


def test_unsupported_model_type_is_a_clear_error(tokenizer, train_rows, tmp_path):
    liger_core_hf.install()
    trainer = make_trainer(toy_model(), tokenizer, train_rows, tmp_path, use_liger_kernel=True, max_steps=1)
    with pytest.raises(ValueError, match=r"cannot patch ToyLM \(model_type 'toy_unpatchable'\)") as info:
        trainer.train()
    assert "Supported model types: " in str(info.value) and "llama" in str(info.value)
    assert "use_liger_kernel off" in str(info.value)


def _fake_liger_kernel(root: Path) -> None:
    """An installed-looking liger-kernel 0.8.5 whose import fails loudly: it must never be imported."""
    (root / "liger_kernel").mkdir()
    (root / "liger_kernel" / "__init__.py").write_text(
        "raise ImportError('the fake liger_kernel was imported')\n"
    )
    dist = root / "liger_kernel-0.8.5.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: liger-kernel\nVersion: 0.8.5\n")


def test_liger_kernel_installed_too_one_log_line_and_never_imported(
    monkeypatch, caplog, make_model, tokenizer, train_rows, tmp_path
):
    from transformers.utils import import_utils

    _fake_liger_kernel(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import_utils.is_liger_kernel_available.cache_clear()
    monkeypatch.setattr(patch_module, "_announced", False)
    try:
        assert import_utils.is_liger_kernel_available()  # transformers would use it
        liger_core_hf.install()
        model = make_model()
        trainer = make_trainer(
            model, tokenizer, train_rows, tmp_path / "out", use_liger_kernel=True, max_steps=1,
            liger_kernel_config=json.loads(ONLY_NORM),
        )  # fmt: skip
        with caplog.at_level(logging.INFO, logger="liger_core_hf"):
            trainer.train()
    finally:
        import_utils.is_liger_kernel_available.cache_clear()
    assert kinds(model) == {"rms_norm"}
    assert "liger_kernel" not in sys.modules
    lines = [r.getMessage() for r in caplog.records if "liger-kernel" in r.getMessage()]
    assert len(lines) == 1 and "liger_core" in lines[0] and "0.8.5 is not used" in lines[0]

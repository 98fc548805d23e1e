"""LLaMA-Factory's own, unmodified ``llamafactory-cli webui`` (the plugin's start-up hook adds the checkbox)
in a real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright; no browser download): tick
"liger_core kernels", start a tiny CPU training run from the UI, and check that the run it started (the UI's
own ``llamafactory-cli train`` subprocess) used liger_core."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import free_port, subprocess_env

CHROMIUM = os.getenv("LIGER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and os.getenv("LIGER_REQUIRE_BROWSER") != "1",
    reason=f"no Chromium at {CHROMIUM} (apt-get install chromium; run_tests.sh installs it)",
)
# Overrides for the run, typed into the UI's "Extra arguments" box: 2 short steps on CPU in fp32.
EXTRA_ARGS = {
    "optim": "adamw_torch",
    "max_steps": 2,
    "bf16": False,
    "fp16": False,
    "cutoff_len": 64,
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 1,
    "preprocessing_num_workers": 1,
    "disable_gradient_checkpointing": True,
    "logging_steps": 1,
    "report_to": "none",
    "save_strategy": "no",
}


@pytest.fixture
def webui(tmp_path):
    """A ``llamafactory-cli webui`` server on 127.0.0.1 (own working directory: it writes saves/ there)."""
    port = free_port()
    log_path = tmp_path / "webui.log"
    env = subprocess_env(GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), BROWSER="true")
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [str(Path(sys.executable).parent / "llamafactory-cli"), "webui"],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + 240
        while True:
            assert server.poll() is None, log_path.read_text()[-4000:]
            try:
                if urllib.request.urlopen(url, timeout=5).status == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "web UI did not come up:\n" + log_path.read_text()[-4000:]
            time.sleep(1)
        yield url, tmp_path, log_path
    finally:
        os.killpg(server.pid, 15)  # the server and the training run it started (own session)
        server.wait(timeout=30)


def _textbox(page, label: str):
    """The visible Gradio textbox labelled ``label`` (its accessible name also holds the info text)."""
    return page.get_by_label(label).filter(visible=True).first


def _pick(page, label: str, option: str) -> None:
    """Choose ``option`` in the visible Gradio dropdown labelled ``label``. Typed with the keyboard after the
    click: LLaMA Board refreshes some dropdowns on focus, and the refreshed one loses its label."""
    page.get_by_label(label, exact=True).filter(visible=True).first.click()
    page.keyboard.press("Control+A")  # replace the current value
    page.keyboard.type(option)
    page.get_by_role("option", name=option, exact=True).first.click()


def _fill_and_keep(page, label: str, value: str) -> None:
    """Type ``value`` into the textbox ``label`` and check it is still there a moment later (a UI event
    handler may reset the box after it was filled); retyped if it was reset."""
    from playwright.sync_api import expect

    box = _textbox(page, label)
    for _ in range(5):
        box.fill(value)
        box.press("Tab")
        page.wait_for_timeout(1500)
        if box.input_value() == value:
            break
    expect(box).to_have_value(value)


def test_checkbox_starts_training_with_liger_core(webui, tiny_llama, tiny_dataset_dir):
    from playwright.sync_api import expect, sync_playwright

    url, workdir, log_path = webui
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(url)
            expect(page.get_by_label("Booster", exact=True)).to_have_value("auto", timeout=120_000)

            checkbox = page.get_by_label("liger_core kernels", exact=True)
            expect(checkbox).to_be_visible()
            expect(checkbox).not_to_be_checked()
            checkbox.check()
            expect(checkbox).to_be_checked()

            _pick(page, "Model name", "Custom")
            _pick(page, "Finetuning method", "full")
            _textbox(page, "Data dir").fill(str(tiny_dataset_dir))
            _pick(page, "Dataset", "tiny_alpaca")  # focusing it lists the datasets of the data dir
            page.get_by_text("Extra configurations", exact=True).click()
            extra = _textbox(page, "Extra arguments")
            extra.fill(json.dumps(EXTRA_ARGS))
            extra.press("Tab")
            # The model path last: picking "Custom" makes LLaMA Board reset it asynchronously, which once
            # cleared a path typed right after the pick ("Model not found." on Start); wait until it holds.
            _fill_and_keep(page, "Model path", str(tiny_llama))

            page.get_by_role("button", name="Start", exact=True).click()
            # The UI shows the run's log (LLaMA Board's running_log.txt) while it trains, then "Finished."
            expect(
                page.get_by_text(re.compile("liger_core kernels active on LlamaForCausalLM")).first
            ).to_be_visible(timeout=420_000)
            expect(page.get_by_text(re.compile(r"^(Finished|Failed)\.")).first).to_be_visible(timeout=420_000)
            page.screenshot(path=str(workdir / "after_run.png"))
            assert page.get_by_text(re.compile(r"^Failed\.")).count() == 0, log_path.read_text()[-6000:]
        except Exception:
            page.screenshot(path=str(workdir / "failure.png"), full_page=True)  # kept in pytest's tmp dir
            raise
        finally:
            browser.close()

    # The run the UI started: its YAML has the checkbox's setting; its log: liger_core patched, then trained
    [args_file] = list((workdir / "saves").rglob("training_args.yaml"))
    run_args = yaml.safe_load(args_file.read_text())
    assert run_args["enable_liger_kernel"] is True
    run_log = (args_file.parent / "running_log.txt").read_text()
    from test_train_cli import LAYERS, active_kernels, expected_sft_kernels

    assert active_kernels(run_log) == expected_sft_kernels(LAYERS), run_log[-4000:]
    assert "enable_liger_kernel is served by liger_core" in run_log, run_log[-4000:]
    with open(args_file.parent / "trainer_log.jsonl", encoding="utf-8") as f:
        losses = [row["loss"] for row in map(json.loads, f) if "loss" in row]
    assert len(losses) == 2 and all(0 < loss < 20 for loss in losses), losses

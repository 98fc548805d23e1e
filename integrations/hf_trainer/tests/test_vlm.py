"""A vision-language model fine-tuned on images through the flag: a tiny Qwen2.5-VL (no recipe: patched
structurally), batches of `pixel_values` + `image_grid_thw` + `input_ids` with image tokens.

The patch report names every kernel swapped in (text model and vision tower, whose tokens-first rotary
function gets liger_core's RoPE too) and nothing left out; counting the calls into `liger_core.ops` during
training shows each swapped module ran once a step; the losses and trained
weights equal an unpatched run on the same batches (fp32).
"""

from __future__ import annotations

import logging
import math
from collections import Counter

import liger_core_hf
import pytest
import torch
from tiny import collate_images, image_rows, kinds, make_trainer, qwen2_5_vl_model, step_losses
from transformers import TrainerCallback

import liger_core
import liger_core.ops
from liger_core.patching import is_patched

# (height, width, text tokens): 4, 6, 6 and 4 image tokens; with 2 rows a batch, steps 3 and 4 repeat the
# batches of steps 1 and 2
SIZES = [(8, 8, 5), (8, 12, 3), (12, 8, 6), (8, 8, 2)]
STEPS = 4
# the functions of liger_core.ops that patched modules call, and the kind each one serves
OPS = {
    "rms_norm": "rms_norm",
    "swiglu": "swiglu",
    "glu_down_proj": "swiglu",  # SwiGLU fused with a plain down projection
    "rope": "rope",
    "fused_linear_cross_entropy": "fused_linear_cross_entropy",
}


class _CountKernelCalls(TrainerCallback):
    """Calls into `liger_core.ops` per kind, from the first training step on (patching's own numeric probes,
    which run before it, are not counted)."""

    def __init__(self, monkeypatch):
        self.calls: Counter = Counter()
        self.training = False
        for name, kind in OPS.items():
            monkeypatch.setattr(liger_core.ops, name, self._counting(getattr(liger_core.ops, name), kind))

    def _counting(self, op, kind):
        def counted(*args, **kwargs):
            if self.training:
                self.calls[kind] += 1
            return op(*args, **kwargs)

        return counted

    def on_train_begin(self, args, state, control, **kwargs):
        self.training = True

    def on_train_end(self, args, state, control, **kwargs):
        self.training = False


def _capture_reports(monkeypatch) -> list:
    """The PatchReport of each `liger_core.apply_liger_kernel` call (the plugin looks it up on the module)."""
    reports = []
    apply = liger_core.apply_liger_kernel

    def spy(*args, **kwargs):
        reports.append(apply(*args, **kwargs))
        return reports[-1]

    monkeypatch.setattr(liger_core, "apply_liger_kernel", spy)
    return reports


def test_qwen2_5_vl_trains_on_images_with_the_kernels_and_equal_losses(monkeypatch, caplog, tmp_path):
    rows = image_rows(SIZES)
    common = dict(data_collator=collate_images, max_steps=STEPS, per_device_train_batch_size=2)
    liger_core_hf.install()

    off = make_trainer(qwen2_5_vl_model(), None, rows, tmp_path / "off", **common)
    off.train()
    assert not is_patched(off.model)

    reports = _capture_reports(monkeypatch)
    counter = _CountKernelCalls(monkeypatch)
    model = qwen2_5_vl_model()
    n_text_layers = model.config.text_config.num_hidden_layers
    n_vision_blocks = model.config.vision_config.depth
    on = make_trainer(
        model, None, rows, tmp_path / "on", callbacks=[counter], use_liger_kernel=True, **common
    )
    with caplog.at_level(logging.INFO, logger="liger_core_hf"):
        on.train()

    # the report: what was swapped where, nothing left out
    (report,) = reports
    assert report.model_type == "qwen2_5_vl" and report.method == "structural"
    # norms: 2 per decoder layer + the final one; 2 per vision block + the patch merger's
    assert report.swapped.get("rms_norm") == 2 * n_text_layers + 1 + 2 * n_vision_blocks + 1
    assert report.swapped.get("swiglu") == n_text_layers + n_vision_blocks  # gated MLPs, text and vision
    # the rotary function of every text and every vision attention
    assert report.swapped.get("rope") == n_text_layers + n_vision_blocks
    assert report.swapped.get("fused_linear_cross_entropy") == 1
    assert kinds(model) == {"rms_norm", "swiglu", "rope", "fused_linear_cross_entropy"}
    rope_modules = [name for name, kind in report.modules.items() if kind == "rope"]
    assert sum(".language_model." in n for n in rope_modules) == n_text_layers
    assert sum(".visual." in n for n in rope_modules) == n_vision_blocks
    assert report.missing == {}
    # logged by the plugin at INFO (nothing left out)
    logged = [r for r in caplog.records if r.name == "liger_core_hf" and str(report) in r.getMessage()]
    assert [r.levelno for r in logged] == [logging.INFO]

    # the kernels ran: every swapped module once per step (forward), on image batches
    expected = {kind: n * STEPS for kind, n in report.swapped.items() if n}
    assert dict(counter.calls) == expected

    # same losses and trained weights as without the flag; the loss goes down on repeated batches
    losses_off, losses_on = step_losses(off), step_losses(on)
    assert len(losses_on) == len(losses_off) == STEPS
    assert all(math.isfinite(x) for x in losses_on)
    assert losses_on == pytest.approx(losses_off, rel=1e-5)
    assert losses_on[2] < losses_on[0] and losses_on[3] < losses_on[1]
    for (name, p_off), p_on in zip(off.model.named_parameters(), on.model.parameters()):
        torch.testing.assert_close(p_on, p_off, rtol=1e-4, atol=1e-5, msg=name)

"""``trl_kto``: TRL's own KTOTrainer (the version Axolotl pins) with its fused-loss path served by liger_core
gives the loss, the gradients and every logged metric of TRL's unfused path."""

from __future__ import annotations

import os

os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")

import pytest
from conftest import assert_same_step, policy_and_reference, trainer_step
from liger_core_axolotl import trl_kto

trl = pytest.importorskip("trl")
BETA = 0.5
ROWS = [
    ("red fox", " runs fast", True),
    ("blue sky", " falls down hard", False),
    ("tiny model", " learns", True),
    ("fast kernels", " wait", False),
    ("exact loss", " holds", True),
    ("rope turns", " breaks it all", True),
]
SETTINGS = {
    "kto": dict(),
    "kto+weights": dict(desirable_weight=1.3, undesirable_weight=0.7),
    "apo_zero_unpaired": dict(loss_type="apo_zero_unpaired"),
}


def _trainer(tiny_llama, tmp_path, **options):
    from datasets import Dataset

    model, ref, tokenizer = policy_and_reference(tiny_llama)
    data = Dataset.from_list([{"prompt": p, "completion": c, "label": y} for p, c, y in ROWS])
    args = trl.KTOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=6, beta=BETA, max_length=32,
        report_to=[], use_cpu=True, bf16=False, **options,
    )  # fmt: skip
    return trl.KTOTrainer(
        model=model, ref_model=ref, args=args, train_dataset=data, processing_class=tokenizer
    )


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_liger_core_loss_equals_trl_unfused(tiny_llama, tmp_path, setting):
    trainer = _trainer(tiny_llama, tmp_path, **SETTINGS[setting])
    trainer.model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    off = trainer_step(trainer, batch)
    assert trl_kto.install(trainer) is None
    assert trainer.use_liger_kernel and not trainer.args.use_liger_kernel
    on = trainer_step(trainer, batch)
    # rewards are beta x differences of fp32 sequence log-probs: known to a few of their ulps
    logps = max(abs(v) for key in ("logps/chosen", "logps/rejected") for v in off[2][key])
    assert_same_step(on, off, lambda key: 4 * BETA * logps * 2**-23 if key.startswith("rewards/") else 1e-6)


def test_unsupported_settings_keep_trls_path(tiny_llama, tmp_path):
    trainer = _trainer(tiny_llama, tmp_path, precompute_ref_log_probs=True)
    assert "precompute_ref_log_probs" in trl_kto.install(trainer)
    assert not trainer.use_liger_kernel

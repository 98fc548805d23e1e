"""``trl_dpo``: TRL's own DPOTrainer (the version Axolotl pins) with its fused-loss path served by liger_core
gives the loss, the gradients and every logged metric of TRL's unfused path, for several loss settings."""

from __future__ import annotations

import os

os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")

import pytest
from conftest import assert_same_step, policy_and_reference, trainer_step
from liger_core_axolotl import trl_dpo

trl = pytest.importorskip("trl")
PAIRS = [
    ("red fox", " runs fast", " sleeps"),
    ("blue sky", " glows", " falls down hard"),
    ("tiny model", " learns", " forgets it all"),
    ("fast kernels", " fuse", " wait"),
]

BETA = 0.5
SETTINGS = {
    "sigmoid": dict(loss_type=["sigmoid"]),
    "sigmoid+sft": dict(loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.5]),
    "ipo": dict(loss_type=["ipo"]),
    "robust+wpo": dict(loss_type=["robust"], label_smoothing=0.1, use_weighting=True),
    "sigmoid_norm": dict(loss_type=["sigmoid_norm"]),
    "sigmoid+alpha": dict(loss_type=["sigmoid"], f_divergence_type="alpha_divergence"),
    "apo_zero+discopop": dict(loss_type=["apo_zero", "discopop"], loss_weights=[0.3, 1.0]),
}


def _trainer(tiny_llama, tmp_path, **options):
    from datasets import Dataset

    model, ref, tokenizer = policy_and_reference(tiny_llama)
    data = Dataset.from_list([{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS])
    args = trl.DPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, beta=BETA, max_length=32,
        report_to=[], use_cpu=True, bf16=False, **options,  # bf16 would autocast the reference model only
    )  # fmt: skip
    return trl.DPOTrainer(
        model=model, ref_model=ref, args=args, train_dataset=data, processing_class=tokenizer
    )


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_liger_core_loss_equals_trl_unfused(tiny_llama, tmp_path, setting):
    trainer = _trainer(tiny_llama, tmp_path, **SETTINGS[setting])
    trainer.model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    off = trainer_step(trainer, batch)
    assert trl_dpo.install(trainer) is None
    assert isinstance(trainer.liger_loss, trl_dpo.TRLDPOLoss) and not trainer.args.use_liger_kernel
    on = trainer_step(trainer, batch)
    # rewards are beta x differences of fp32 sequence log-probs (~-60 here): known to a few of their ulps
    logps = max(abs(v) for key in ("logps/chosen", "logps/rejected") for v in off[2][key])
    assert_same_step(on, off, lambda key: 4 * BETA * logps * 2**-23 if key.startswith("rewards/") else 1e-6)


def test_unsupported_settings_keep_trls_path(tiny_llama, tmp_path):
    trainer = _trainer(tiny_llama, tmp_path, ld_alpha=0.5)
    assert "ld_alpha" in trl_dpo.install(trainer)
    assert not trainer.use_liger_kernel
    trainer = _trainer(tiny_llama, tmp_path, precompute_ref_log_probs=True)
    assert "precompute_ref_log_probs" in trl_dpo.unsupported(trainer)
    # an option TRL takes and liger_core refuses: the reason is liger_core's own error
    trainer = _trainer(tiny_llama, tmp_path, loss_type=["apo_zero"], f_divergence_type="js_divergence")
    assert "f_divergence_type" in trl_dpo.unsupported(trainer)
    # TRL 1.9 drops f'(t)'s constant, which does not cancel in a length-normalised loss
    trainer = _trainer(tiny_llama, tmp_path, loss_type=["sigmoid_norm"], f_divergence_type="alpha_divergence")
    assert "drops the f-divergence's constant" in trl_dpo.unsupported(trainer)

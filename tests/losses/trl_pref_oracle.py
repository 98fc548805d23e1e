"""Runs TRL's own preference-loss code on given per-token log-probs (not a test: test_preference.py and
test_kto.py call it with the Python that pref_common.trl_python finds).

    python trl_pref_oracle.py cases.pt results.pt

cases.pt: a list of dicts with ``trainer`` ("dpo", "kto", "orpo", "cpo"), the per-token tensors the fused LM
head would return (``log_probs (R, T)``, ``entropy``, ``mean_logits``, ``is_top1``, ``log_sum_sq_probs``), the
token mask ``mask (R, T)`` (True on completion tokens) and the reference log-probs, plus the trainer's config
values. Each case runs on a stand-in trainer object whose model returns those tensors, so that the loss, its
gradient with respect to ``log_probs`` and the logged metrics come from TRL's code:
DPOTrainer._compute_loss and KTOTrainer._compute_loss (trl.trainer), ORPOTrainer.get_batch_loss_metrics and
CPOTrainer.get_batch_loss_metrics (trl.experimental; their forward replaced by one returning the sequence
log-probs and NLL computed as their ``get_batch_logps`` and ``cross_entropy_loss`` do).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from types import SimpleNamespace

import torch
from trl.experimental.cpo.cpo_trainer import CPOTrainer
from trl.experimental.orpo.orpo_trainer import ORPOTrainer
from trl.trainer.dpo_trainer import DPOTrainer
from trl.trainer.kto_trainer import KTOTrainer


class _OneProcess:
    """accelerate's collectives for this process alone."""

    device = torch.device("cpu")

    def gather(self, t):
        return t

    def gather_for_metrics(self, t):
        return t


def _model_outputs(case, log_probs):
    return SimpleNamespace(
        log_probs=log_probs,
        entropy=case["entropy"],
        mean_logits=case["mean_logits"],
        is_top1=case["is_top1"],
        log_sum_sq_probs=case["log_sum_sq_probs"],
        aux_loss=None,
    )


def _token_inputs(mask):
    """input_ids/attention_mask/completion_mask of width T + 1 whose shifted completion mask is ``mask``."""
    rows = mask.shape[0]
    completion = torch.cat([torch.zeros(rows, 1, dtype=torch.long), mask.long()], dim=1)
    return {
        "input_ids": torch.ones_like(completion),
        "attention_mask": torch.ones_like(completion),
        "completion_mask": completion,
    }


def _trainer(case):
    trainer = SimpleNamespace()
    trainer.accelerator = _OneProcess()
    trainer.model = SimpleNamespace(training=True)
    trainer.aux_loss_enabled = False
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer._total_train_tokens = 0
    trainer._tp_size = 1
    trainer.beta = case["beta"]
    trainer.label_smoothing = case.get("label_smoothing", 0.0)
    return trainer


def dpo(case, log_probs):
    trainer = _trainer(case)
    trainer.precompute_ref_logps = True
    trainer.ld_alpha = None
    trainer.f_divergence_type = case.get("f_divergence_type", "reverse_kl")
    trainer.f_alpha_divergence_coef = case.get("f_alpha_divergence_coef", 0.5)
    trainer.loss_types = case["loss_type"]
    trainer.loss_weights = case.get("loss_weights") or [1.0] * len(case["loss_type"])
    trainer.use_weighting = case.get("use_weighting", False)
    trainer.args = SimpleNamespace(
        discopop_tau=case.get("discopop_tau", 0.05), gradient_checkpointing_kwargs=None
    )
    inputs = _token_inputs(case["mask"])
    inputs["ref_chosen_logps"] = case["ref_chosen_logps"]
    inputs["ref_rejected_logps"] = case["ref_rejected_logps"]
    model = lambda **kwargs: _model_outputs(case, log_probs)  # noqa: E731
    loss = DPOTrainer._compute_loss(trainer, model, inputs, False)
    return loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}


def kto(case, log_probs):
    trainer = _trainer(case)
    trainer.precompute_ref_logps = True
    trainer.calculate_KL = case["loss_type"] == "kto"
    trainer.loss_type = case["loss_type"]
    trainer.desirable_weight = case.get("desirable_weight", 1.0)
    trainer.undesirable_weight = case.get("undesirable_weight", 1.0)
    trainer._compute_kl_logps = lambda model, batch: case["kl_logps"] if trainer.calculate_KL else None
    inputs = _token_inputs(case["mask"])
    inputs["label"] = case["labels"]
    inputs["ref_logps"] = case["ref_logps"]
    inputs["ref_KL_logps"] = case["ref_kl_logps"]
    model = lambda **kwargs: _model_outputs(case, log_probs)  # noqa: E731
    loss = KTOTrainer._compute_loss(trainer, model, inputs, False)
    return loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}


def _sequence_logps(log_probs, mask, average):
    # as get_batch_logps: (per_token_logps * loss_mask).sum(-1) [/ loss_mask.sum(-1)]
    total = (log_probs * mask).sum(-1)
    return total / mask.sum(-1) if average else total


def _chosen_nll(log_probs, mask, n_pairs):
    # as cross_entropy_loss: nn.CrossEntropyLoss() mean over the chosen rows' non-ignored tokens
    return -(log_probs[:n_pairs] * mask[:n_pairs]).sum() / mask[:n_pairs].sum()


def orpo(case, log_probs):
    trainer = _trainer(case)
    mask = case["mask"]
    n_pairs = mask.shape[0] // 2
    logps = _sequence_logps(log_probs, mask, average=True)
    dummy = torch.zeros(n_pairs, 1, 1)
    trainer.concatenated_forward = lambda model, batch: (
        logps[:n_pairs], logps[n_pairs:], dummy, dummy, _chosen_nll(log_probs, mask, n_pairs)
    )  # fmt: skip
    trainer.odds_ratio_loss = lambda c, r: ORPOTrainer.odds_ratio_loss(trainer, c, r)
    trainer.store_metrics = lambda *a, **k: None
    return ORPOTrainer.get_batch_loss_metrics(trainer, None, {}, "train")


def cpo(case, log_probs):
    trainer = _trainer(case)
    trainer.loss_type = case["loss_type"]
    trainer.alpha = case.get("alpha", 0.0)
    trainer.simpo_gamma = case.get("simpo_gamma", 0.5)
    trainer.cpo_alpha = case.get("cpo_alpha", 1.0)
    mask = case["mask"]
    n_pairs = mask.shape[0] // 2
    logps = _sequence_logps(log_probs, mask, average=trainer.loss_type in ("ipo", "simpo"))
    nll = _chosen_nll(log_probs, mask, n_pairs) if trainer.cpo_alpha != 0 else torch.tensor(0.0)
    dummy = torch.zeros(n_pairs, 1, 1)
    trainer.concatenated_forward = lambda model, batch: (logps[:n_pairs], logps[n_pairs:], dummy, dummy, nll)
    trainer.cpo_loss = lambda c, r: CPOTrainer.cpo_loss(trainer, c, r)
    return CPOTrainer.get_batch_loss_metrics(trainer, None, {}, "train")


def run(case: dict) -> dict:
    log_probs = case["log_probs"].clone().requires_grad_(True)
    loss, metrics = {"dpo": dpo, "kto": kto, "orpo": orpo, "cpo": cpo}[case["trainer"]](case, log_probs)
    (grad,) = torch.autograd.grad(loss, log_probs, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(log_probs)
    metrics = {k: float(v) for k, v in metrics.items() if k not in ("num_tokens",)}
    return {"loss": loss.detach(), "grad": grad, "metrics": metrics}


if __name__ == "__main__":
    cases = torch.load(sys.argv[1])
    torch.save([run(case) for case in cases], sys.argv[2])

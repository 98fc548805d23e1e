"""Runs TRL's own GRPOTrainer._compute_loss on given per-token log-probs (not a test: test_grpo.py calls it
with the Python that pref_common.trl_python finds).

    python trl_grpo_oracle.py cases.pt results.pt

cases.pt: a list of dicts: tensors (per_token_logps, completion_mask, advantages and the optional
old_per_token_logps, ref_per_token_logps, importance_sampling_ratio, sampling_per_token_logps,
num_items_in_batch, entropies) and TRL config values (loss_type, beta, ...). For each case the trainer's
method runs on a stand-in trainer object whose model returns those log-probs, so the loss, its gradient with
respect to the log-probs and the logged metrics are TRL's, computed by TRL's code.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from types import SimpleNamespace

import torch
from trl.trainer.grpo_trainer import GRPOTrainer


class _OneProcess:
    """accelerate's collectives for this process alone (what TRL's metrics see on one process)."""

    def __init__(self, num_processes: int) -> None:
        self.num_processes = num_processes

    def reduce(self, t, reduction="sum"):
        return t

    def gather(self, t):
        return t

    def gather_for_metrics(self, t):
        return t


def trl_loss(case: dict) -> dict:
    logps = case["per_token_logps"].clone().requires_grad_(True)
    entropies = case.get("entropies")
    if entropies is None:
        entropies = torch.zeros_like(logps)
    batch, length = logps.shape
    trainer = SimpleNamespace()
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logps, entropies, None)
    trainer.top_entropy_quantile = 1.0
    trainer.off_policy_mask_threshold = case.get("off_policy_mask_threshold")
    trainer.get_off_policy_mask = GRPOTrainer.get_off_policy_mask
    trainer.get_gamma_weights = GRPOTrainer.get_gamma_weights
    trainer.importance_sampling_level = case.get("importance_sampling_level", "token")
    trainer.beta = case.get("beta", 0.0)
    trainer.loss_type = case["loss_type"]
    trainer.epsilon_low = case.get("epsilon", 0.2)
    trainer.epsilon_high = case.get("epsilon_high") or trainer.epsilon_low
    trainer.args = SimpleNamespace(
        use_bias_correction_kl=case.get("use_bias_correction_kl", True),
        delta=case.get("delta"),
        sapo_temperature_pos=case.get("sapo_temperature_pos", 1.0),
        sapo_temperature_neg=case.get("sapo_temperature_neg", 1.05),
        vespo_k_pos=2.0,
        vespo_lambda_pos=3.0,
        vespo_k_neg=3.0,
        vespo_lambda_neg=2.0,
        steps_per_generation=case.get("steps_per_generation", case.get("gradient_accumulation_steps", 1)),
    )
    has_is_ratio = case.get("importance_sampling_ratio") is not None
    trainer.use_vllm = has_is_ratio
    trainer.vllm_importance_sampling_correction = has_is_ratio
    trainer.model = SimpleNamespace(training=True)
    trainer.current_gradient_accumulation_steps = case.get("gradient_accumulation_steps", 1)
    trainer.max_completion_length = case.get("max_completion_length")
    trainer.accelerator = _OneProcess(case.get("num_processes", 1))
    trainer._entropy_bonus_enabled = False
    trainer.aux_loss_enabled = False
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    mask = case["completion_mask"]
    inputs = {
        "prompt_ids": torch.zeros(batch, 1, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 1, dtype=torch.long),
        "completion_ids": torch.zeros(batch, length, dtype=torch.long),
        "completion_mask": mask,
        "advantages": case["advantages"],
        "num_items_in_batch": case.get("num_items_in_batch", mask.sum()),
    }
    optional = (
        "old_per_token_logps",
        "ref_per_token_logps",
        "importance_sampling_ratio",
        "sampling_per_token_logps",
    )
    for key in optional:
        if case.get(key) is not None:
            inputs[key] = case[key]
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    (grad,) = torch.autograd.grad(loss, logps)
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    return {"loss": loss.detach(), "grad": grad, "metrics": metrics}


if __name__ == "__main__":
    cases = torch.load(sys.argv[1])
    torch.save([trl_loss(case) for case in cases], sys.argv[2])

"""TRL < 1.15 (Axolotl 0.19 pins TRL 1.9): the GRPO trainer's loss, served by liger_core.

TRL 1.9's ``GRPOTrainer`` has no fused LM head to hook. With ``use_liger_kernel`` its ``compute_loss`` runs
``compute_liger_loss``: the backbone's last hidden states of the completion positions (TRL's
``_get_last_hidden_state``) and a liger-kernel loss, which logs only ``kl`` and ``clip_ratio``.
``install(trainer)`` replaces that method on the instance: the same hidden states go to
``liger_core.losses.fused_linear_grpo_loss`` with the trainer's settings (every loss type of TRL 1.9 and its
normalisation, clipping, KL with bias correction, token/sequence importance sampling, the off-policy mask,
vLLM's importance-sampling correction), and the metrics are logged under TRL's names with TRL's reductions
across processes (``entropy``, ``kl``, the clip ratios, ``cispo_clip_ratio``, ``vespo/phi_seq_mean``).
``args.use_liger_kernel`` stays off, so transformers never applies liger-kernel to the model.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from liger_core_axolotl.trl_dpo import install_fused_path, peft_problem

# ratio metrics: means over sequences with sequence-level importance sampling, else over tokens (kl and
# entropy: always tokens); TRL all-reduces each mean's sum and count
_PER_SEQUENCE_OR_TOKEN = (
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "cispo_clip_ratio",
)
_EXTREMES = {"clip_ratio/low_min": torch.min, "clip_ratio/high_max": torch.max}


def unsupported(trainer: Any) -> str | None:
    """Why ``trainer`` cannot take liger_core's fused GRPO loss (None: it can)."""
    if not hasattr(trainer, "compute_liger_loss") or not hasattr(trainer, "_get_last_hidden_state"):
        return f"{type(trainer).__name__} has no fused-loss path (TRL 1.9's GRPOTrainer has)"
    import trl

    overridden = [
        name
        for name in ("compute_loss", "_compute_loss", "compute_liger_loss")
        if getattr(type(trainer), name, None) is not getattr(trl.GRPOTrainer, name, None)
    ]
    if overridden:  # e.g. Axolotl's async GRPO trainers: their own loss code
        return f"{type(trainer).__name__} overrides TRL's {', '.join(overridden)}"
    if getattr(trainer, "top_entropy_quantile", 1.0) < 1.0:
        return "top_entropy_quantile < 1 (masks tokens by every token's entropy before the loss)"
    if getattr(trainer, "_entropy_bonus_enabled", False):
        return "an entropy bonus (entropy_coef / use_adaptive_entropy)"
    if getattr(trainer, "aux_loss_enabled", False):
        return "a MoE router auxiliary loss (needs the model's full forward)"
    if trainer.loss_type == "luspo" and trainer.importance_sampling_level != "sequence":
        return "loss_type='luspo' with token-level importance sampling (TRL scales each token by its length)"
    if trainer.loss_type == "vespo" and trainer.use_vllm:
        return "loss_type='vespo' with vLLM (its importance-sampling ratio enters the gamma weights)"
    from liger_core.losses.grpo import GRPO_LOSS_TYPES

    if trainer.loss_type not in GRPO_LOSS_TYPES:
        return f"loss_type={trainer.loss_type!r} (liger_core has {', '.join(GRPO_LOSS_TYPES)})"
    return peft_problem(trainer)


def compute_liger_loss(self: Any, unwrapped_model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """TRL 1.9 ``GRPOTrainer.compute_liger_loss`` with liger_core's loss and TRL's unfused metrics."""
    from liger_core.losses import fused_linear_grpo_loss

    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
    extra = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "spatial_shapes", "image_sizes")
    extra += ("image_position_ids",)
    hidden = self._get_last_hidden_state(
        unwrapped_model, input_ids, attention_mask, completion_ids.size(1), *(inputs.get(k) for k in extra)
    )
    mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
    mode = "train" if self.model.training else "eval"
    accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
    args = self.args
    correct = self.use_vllm and self.vllm_importance_sampling_correction and self.loss_type != "vespo"
    lm_head = unwrapped_model.lm_head
    loss, metrics = fused_linear_grpo_loss(
        hidden, lm_head.weight, completion_ids, lm_head.bias,
        advantages=inputs["advantages"], completion_mask=mask,
        old_per_token_logps=inputs.get("old_per_token_logps"),
        ref_per_token_logps=inputs.get("ref_per_token_logps") if self.beta != 0.0 else None,
        beta=self.beta, epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high, delta=args.delta,
        loss_type=self.loss_type, importance_sampling_level=self.importance_sampling_level,
        use_bias_correction_kl=args.use_bias_correction_kl, temperature=self.temperature,
        max_completion_length=self.max_completion_length, num_items_in_batch=inputs.get("num_items_in_batch"),
        num_processes=self.accelerator.num_processes,
        # TRL 1.9 divides by the accumulation steps (dapo/cispo/vespo: by the tokens per process only)
        gradient_accumulation_steps=accumulation, steps_per_generation=accumulation,
        importance_sampling_ratio=inputs.get("importance_sampling_ratio") if correct else None,
        off_policy_mask_threshold=self.off_policy_mask_threshold,
        sampling_per_token_logps=inputs.get("sampling_per_token_logps", inputs.get("old_per_token_logps")),
        sapo_temperature_pos=args.sapo_temperature_pos, sapo_temperature_neg=args.sapo_temperature_neg,
        vespo_k_pos=args.vespo_k_pos, vespo_lambda_pos=args.vespo_lambda_pos,
        vespo_k_neg=args.vespo_k_neg, vespo_lambda_neg=args.vespo_lambda_neg,
    )  # fmt: skip
    _log(self, mode, metrics, mask)
    return loss


def _log(trainer: Any, mode: str, metrics: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
    """Log ``metrics`` (this process's values) as TRL's unfused path does: means by all-reduced sums and
    counts, extremes by gathering each process's."""
    tokens = mask.sum().float()
    sequences = torch.tensor(float(mask.shape[0]), device=mask.device)
    sequence_level = trainer.importance_sampling_level == "sequence"
    for name, value in metrics.items():
        if name == "clip_ratio":  # Liger-Kernel's token-weighted ratio: TRL's unfused path logs clip_ratio/*
            continue
        value = value.detach().float()
        if name in _EXTREMES:
            gathered = trainer.accelerator.gather(value.reshape(1))
            finite = gathered[~torch.isnan(gathered)]
            logged = _EXTREMES[name](finite).item() if finite.numel() else float("nan")
        else:
            per_sequence = name == "vespo/phi_seq_mean" or (sequence_level and name in _PER_SEQUENCE_OR_TOKEN)
            count = sequences if per_sequence else tokens
            totals = trainer.accelerator.reduce(torch.stack([value * count, count]), reduction="sum")
            logged = (totals[0] / totals[1].clamp(min=1.0)).item()
        trainer._metrics[mode][name].append(logged)


def install(trainer: Any) -> str | None:
    """Make ``trainer`` (TRL 1.9 ``GRPOTrainer``) compute its loss with liger_core; the reason it cannot (and
    is left as it is) otherwise."""
    return install_fused_path(
        trainer, unsupported, lambda: {"compute_liger_loss": types.MethodType(compute_liger_loss, trainer)}
    )

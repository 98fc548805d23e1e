"""TRL < 1.15 (Axolotl 0.19 pins TRL 1.9): the KTO trainer's loss, served by liger_core.

TRL 1.9's ``KTOTrainer`` has no fused LM head to hook. With ``use_liger_kernel`` its ``compute_loss`` runs
``_compute_loss_liger``: the backbones of the policy and reference models on the batch, the KL term from
the mismatched completions (TRL's ``_compute_kl_logps``), and a liger-kernel loss whose metrics differ from
TRL's unfused ones (per-sequence mean logits, no entropy). ``install(trainer)`` replaces that method on the
instance: the same inputs go to ``liger_core.losses.fused_linear_kto_loss`` (TRL's KTO and
apo_zero_unpaired losses, desirable/undesirable weights), and the metrics are logged as TRL's unfused path
logs them, with its reductions across processes. ``args.use_liger_kernel`` stays off, so transformers never
applies liger-kernel to the model.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from liger_core_axolotl.trl_dpo import install_fused_path, peft_problem

_NON_MODEL_KEYS = {
    "completion_mask", "KL_input_ids", "KL_attention_mask", "KL_completion_mask", "KL_token_type_ids",
    "KL_mm_token_type_ids", "label", "ref_logps", "ref_KL_logps",
}  # fmt: skip


def unsupported(trainer: Any) -> str | None:
    """Why ``trainer`` cannot take liger_core's fused KTO loss (None: it can)."""
    if not hasattr(trainer, "_compute_loss_liger") or not hasattr(trainer, "_compute_kl_logps"):
        return f"{type(trainer).__name__} has no fused-loss path (TRL 1.9's KTOTrainer has)"
    if getattr(trainer, "_is_vlm", False):
        return "a vision-language model"
    if getattr(trainer, "precompute_ref_logps", False):
        return "precompute_ref_log_probs (TRL's fused path recomputes the reference)"
    if getattr(trainer, "aux_loss_enabled", False):
        return "a MoE router auxiliary loss (needs the model's full forward)"
    if trainer.loss_type not in ("kto", "apo_zero_unpaired"):
        return f"loss_type={trainer.loss_type!r}"
    return peft_problem(trainer)


def _backbone_and_head(model: Any) -> tuple[Any, Any]:
    inner = model.base_model.model if hasattr(model, "peft_config") else model
    return inner.base_model, inner.get_output_embeddings()


def compute_loss_liger(self: Any, model: Any, inputs: dict[str, Any], return_outputs: bool) -> torch.Tensor:
    """TRL 1.9 ``KTOTrainer._compute_loss_liger`` with liger_core's loss and TRL's unfused metrics."""
    from liger_core.losses import fused_linear_kto_loss

    if return_outputs:
        raise RuntimeError("return_outputs=True needs the logits, which the fused KTO loss never builds")
    mode = "train" if self.model.training else "eval"
    device = self.accelerator.device
    batch = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    kl_logps = self._compute_kl_logps(model, batch)
    model_kwargs = {k: v for k, v in batch.items() if k not in _NON_MODEL_KEYS}
    model_kwargs["use_cache"] = False
    backbone, lm_head = _backbone_and_head(model)
    hidden = backbone(**model_kwargs).last_hidden_state[:, :-1]
    with torch.no_grad():
        if self.ref_model is None:  # PEFT: the base model (or the "ref" adapter) is the reference
            from trl.trainer.utils import use_adapter

            unwrapped = self.accelerator.unwrap_model(self.model)
            with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
                ref_kl_logps = self._compute_kl_logps(self.model, batch)
                ref_backbone, ref_head = _backbone_and_head(unwrapped)
                ref_hidden = ref_backbone(**model_kwargs).last_hidden_state[:, :-1]
        else:
            ref_kl_logps = self._compute_kl_logps(self.ref_model, batch)
            ref_backbone, ref_head = _backbone_and_head(self.ref_model)
            ref_hidden = ref_backbone(**model_kwargs).last_hidden_state[:, :-1]
    if self.calculate_KL:
        kl = (kl_logps - ref_kl_logps).mean().detach()
        kl = self.accelerator.gather_for_metrics(kl).mean().clamp(min=0)
    else:
        kl = torch.zeros((), device=device)
    target = batch["input_ids"][:, 1:].masked_fill(batch["completion_mask"][:, 1:] == 0, -100)
    labels = torch.as_tensor(batch["label"], dtype=torch.bool, device=device)
    loss, metrics = fused_linear_kto_loss(
        hidden, lm_head.weight, target, labels, lm_head.bias,
        ref_hidden=ref_hidden, ref_weight=ref_head.weight, ref_bias=ref_head.bias, kl=kl, beta=self.beta,
        loss_type=self.loss_type, desirable_weight=self.desirable_weight,
        undesirable_weight=self.undesirable_weight,
    )  # fmt: skip
    _log(self, mode, metrics, kl, batch, labels, target != -100)
    return loss


def _log(trainer: Any, mode: str, metrics: dict, kl: torch.Tensor, batch: dict, labels, mask) -> None:
    """TRL 1.9's unfused KTO metrics from this process's means: token means by gathered sums and counts,
    per-sequence means by gathered sums over the gathered number of chosen (rejected) completions."""
    gather = trainer.accelerator.gather_for_metrics
    log = trainer._metrics[mode]
    log["kl"].append(kl.item())
    tokens = mask.sum()
    log["entropy"].append(
        (gather(metrics["entropy"] * tokens).sum() / gather(tokens).sum().clamp(min=1)).item()
    )
    if mode == "train":
        trainer._total_train_tokens += gather(batch["attention_mask"].sum()).sum().item()
    log["num_tokens"] = [trainer._total_train_tokens]
    for side, rows in (("chosen", labels), ("rejected", ~labels)):
        side_tokens = (mask & rows[:, None]).sum()
        total_tokens = gather(side_tokens).sum()
        if total_tokens > 0:
            logits_sum = torch.nan_to_num(metrics[f"logits/{side}"]) * side_tokens
            log[f"logits/{side}"].append((gather(logits_sum).sum() / total_tokens).item())
    counts = {
        side: gather(rows.sum()).sum().item() for side, rows in (("chosen", labels), ("rejected", ~labels))
    }
    for side, rows in (("chosen", labels), ("rejected", ~labels)):
        if counts[side] > 0:
            for name in ("rewards", "logps"):
                local_sum = torch.nan_to_num(metrics[f"{name}/{side}"]) * rows.sum()
                log[f"{name}/{side}"].append(gather(local_sum).sum().item() / counts[side])
    if counts["chosen"] > 0 and counts["rejected"] > 0:
        log["rewards/margins"].append(log["rewards/chosen"][-1] - log["rewards/rejected"][-1])


def install(trainer: Any) -> str | None:
    """Make ``trainer`` (TRL 1.9 ``KTOTrainer``) compute its loss with liger_core; the reason it cannot (and
    is left as it is) otherwise."""
    return install_fused_path(
        trainer, unsupported, lambda: {"_compute_loss_liger": types.MethodType(compute_loss_liger, trainer)}
    )

"""TRL < 1.15 (Axolotl 0.19 pins TRL 1.9): the DPO trainer's fused-loss path, served by liger_core.

TRL 1.9's ``DPOTrainer`` has no fused LM head to hook (``liger_core_trl`` needs TRL >= 1.15). With
``use_liger_kernel`` it runs only the backbone of the policy and of the reference model and calls
``self.liger_loss(weight, hidden, labels, bias, ref_hidden, ref_weight, ref_bias)``, a liger-kernel module
whose loss options are limited (one loss type, no WPO weighting) and which logs neither ``entropy`` nor
``mean_token_accuracy``. ``install(trainer)`` points that path at :class:`TRLDPOLoss`: TRL's own loss of
the batch (every loss type and weight, label smoothing, WPO weighting, f-divergences; the formula of
``DPOTrainer._compute_loss``) computed by ``liger_core.losses.fused_linear_dpo_loss``, plus the two metrics
TRL's fused path drops, gathered as TRL's unfused path gathers them. ``args.use_liger_kernel`` stays off, so
transformers never applies liger-kernel to the model: liger_core's layer kernels are already in it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# The unfused path's features that TRL 1.9's fused path (hidden states in, loss out) cannot reproduce
_UNSUPPORTED = {
    "ld_alpha": "ld_alpha (LD-DPO) weights the tokens past the shorter completion",
    "precompute_ref_logps": "precompute_ref_log_probs (TRL's fused path recomputes the reference)",
    "aux_loss_enabled": "a MoE router auxiliary loss (needs the model's full forward)",
    "compute_metrics": "compute_metrics (needs the logits)",
}


def unsupported(trainer: Any) -> str | None:
    """Why ``trainer`` cannot take liger_core's fused DPO loss (None: it can)."""
    if not hasattr(trainer, "_compute_loss_liger") or not hasattr(trainer, "loss_types"):
        return f"{type(trainer).__name__} has no fused-loss path (TRL 1.9's DPOTrainer has)"
    for attribute, why in _UNSUPPORTED.items():
        if getattr(trainer, attribute, None) not in (None, False):
            return why
    options = loss_options(trainer)
    normalised = {"ipo", "sigmoid_norm"} & set(options["loss_type"])
    if options["f_divergence_type"] != "reverse_kl" and normalised:
        # TRL 1.9 drops the constant of f'(t) (alpha: exp(t) / (alpha - 1), not expm1(t) / (alpha - 1)):
        # it cancels in chosen - rejected, not in the per-token averages of these losses. liger_core keeps
        # it, as TRL >= 1.16 does, so the two losses would differ.
        return (
            f"f_divergence_type={options['f_divergence_type']!r} with {sorted(normalised)}: TRL "
            f"{_trl_version()} drops the f-divergence's constant, which changes these length-normalised "
            "losses"
        )
    from liger_core.losses import dpo_loss_from_logps

    one = torch.zeros(1)
    try:  # liger_core's own validation of the options, on one dummy pair
        dpo_loss_from_logps(
            one, one, one, one, chosen_lengths=one + 1, rejected_lengths=one + 1, sft_loss=one.sum(),
            **options,
        )  # fmt: skip
    except ValueError as err:
        return f"liger_core's DPO loss: {err}"
    return peft_problem(trainer)


def peft_problem(trainer: Any) -> str | None:
    """A PEFT setup a fused loss (hidden states of the backbone times lm_head.weight) would get wrong."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "peft_config"):
        from peft import PromptLearningConfig
        from peft.tuners.tuners_utils import BaseTunerLayer

        if isinstance(model.get_output_embeddings(), BaseTunerLayer):
            return "a PEFT adapter on lm_head (the fused loss reads lm_head.weight)"
        if any(isinstance(config, PromptLearningConfig) for config in model.peft_config.values()):
            return "a prompt-learning PEFT method (its virtual tokens are added by PeftModel.forward)"
    return None


def _trl_version() -> str:
    import trl

    return trl.__version__


def loss_options(trainer: Any) -> dict[str, Any]:
    """The trainer's DPO loss settings, as liger_core's keywords."""
    return dict(
        beta=trainer.beta,
        loss_type=list(trainer.loss_types),
        loss_weights=list(trainer.loss_weights),
        label_smoothing=trainer.label_smoothing,
        f_divergence_type=str(getattr(trainer.f_divergence_type, "value", trainer.f_divergence_type)),
        f_alpha_divergence_coef=trainer.f_alpha_divergence_coef,
        discopop_tau=getattr(trainer.args, "discopop_tau", 0.05),
    )


class TRLDPOLoss(torch.nn.Module):
    """The ``liger_loss`` of a TRL 1.9 ``DPOTrainer``: its call signature and outputs, liger_core's loss."""

    def __init__(self, trainer: Any) -> None:
        super().__init__()
        self.trainer = trainer

    def forward(self, weight, hidden, labels, bias=None, ref_hidden=None, ref_weight=None, ref_bias=None):
        from liger_core.losses import fused_linear_dpo_loss

        loss, metrics = fused_linear_dpo_loss(
            hidden, weight, labels, bias, ref_hidden=ref_hidden, ref_weight=ref_weight, ref_bias=ref_bias,
            use_weighting=bool(self.trainer.use_weighting), per_pair=True, **loss_options(self.trainer),
        )  # fmt: skip
        self._log_dropped_metrics(metrics, labels)
        return loss, (
            metrics["chosen_logps"],
            metrics["rejected_logps"],
            metrics["logits/chosen"],
            metrics["logits/rejected"],
            None,  # nll_loss: unused by TRL's fused path
            metrics["chosen_rewards"],
            metrics["rejected_rewards"],
        )

    def _log_dropped_metrics(self, metrics: dict[str, torch.Tensor], labels: torch.Tensor) -> None:
        """``entropy`` (over every completion token) and ``mean_token_accuracy`` (chosen completion tokens),
        summed and counted per process and gathered, as TRL's unfused path logs them."""
        t = self.trainer
        mode = "train" if t.model.training else "eval"
        mask = labels != -100
        n_chosen = labels.shape[0] // 2
        for name, count in (("entropy", mask.sum()), ("mean_token_accuracy", mask[:n_chosen].sum())):
            total = t.accelerator.gather_for_metrics(metrics[name].detach() * count).sum()
            tokens = t.accelerator.gather_for_metrics(count).sum()
            t._metrics[mode][name].append((total / tokens).item() if tokens > 0 else 0.0)


def install(trainer: Any) -> str | None:
    """Make ``trainer`` (TRL 1.9 ``DPOTrainer``) compute its loss with liger_core; the reason it cannot (and
    is left as it is) otherwise."""
    return install_fused_path(trainer, unsupported, lambda: {"liger_loss": TRLDPOLoss(trainer)})


def install_fused_path(
    trainer: Any, unsupported: Callable[[Any], str | None], attributes: Callable[[], dict[str, Any]]
) -> str | None:
    """``route_fused_path(trainer, **attributes())`` unless ``unsupported(trainer)`` gives a reason to leave
    the trainer as it is; that reason (None: routed). The ``install`` of ``trl_dpo``, ``trl_kto``,
    ``trl_grpo``."""
    reason = unsupported(trainer)
    if reason is None:
        route_fused_path(trainer, **attributes())
    return reason


def route_fused_path(trainer: Any, **attributes: Any) -> None:
    """Set ``attributes`` on the trainer instance and turn on TRL 1.9's fused-loss path: the instance flag its
    ``compute_loss`` reads (``args.use_liger_kernel`` stays off) and the forward redirection that makes
    ZeRO-3 / FSDP gather lm_head around the loss."""
    from trl.models.utils import _ForwardRedirection

    for name, value in attributes.items():
        setattr(trainer, name, value)
    trainer._forward_redirection = _ForwardRedirection()
    trainer.use_liger_kernel = True

"""Chunked post-training losses on hidden states + lm_head weight (the logits never exist in full): the
formulas of TRL 1.16's trainers on per-token log-probs from ``liger_core.ops.fused_linear_logprobs``.

Each ``fused_linear_*_loss`` returns ``(loss, metrics)``, metrics under TRL's logged names; each
``*_from_logps`` is the bare formula on sequence log-probs; the ``LigerFusedLinear*Loss`` modules hold the
hyper-parameters. ``fused_linear_distill_loss`` (student/teacher divergence on ``fused_linear_jsd``) returns
the loss alone.
"""

from liger_core.losses.distill import LigerFusedLinearDistillLoss, fused_linear_distill_loss
from liger_core.losses.grpo import LigerFusedLinearGRPOLoss, fused_linear_grpo_loss, grpo_loss_from_logps
from liger_core.losses.kto import (
    LigerFusedLinearKTOLoss,
    fused_linear_kto_loss,
    kto_kl_estimate,
    kto_loss_from_logps,
)
from liger_core.losses.preference import (
    LigerFusedLinearCPOLoss,
    LigerFusedLinearDPOLoss,
    LigerFusedLinearORPOLoss,
    LigerFusedLinearSimPOLoss,
    cpo_loss_from_logps,
    dpo_loss_from_logps,
    fused_linear_cpo_loss,
    fused_linear_dpo_loss,
    fused_linear_orpo_loss,
    fused_linear_simpo_loss,
    orpo_loss_from_logps,
)

__all__ = [
    "LigerFusedLinearCPOLoss",
    "LigerFusedLinearDPOLoss",
    "LigerFusedLinearDistillLoss",
    "LigerFusedLinearGRPOLoss",
    "LigerFusedLinearKTOLoss",
    "LigerFusedLinearORPOLoss",
    "LigerFusedLinearSimPOLoss",
    "cpo_loss_from_logps",
    "dpo_loss_from_logps",
    "fused_linear_cpo_loss",
    "fused_linear_distill_loss",
    "fused_linear_dpo_loss",
    "fused_linear_grpo_loss",
    "fused_linear_kto_loss",
    "fused_linear_orpo_loss",
    "fused_linear_simpo_loss",
    "grpo_loss_from_logps",
    "kto_kl_estimate",
    "kto_loss_from_logps",
    "orpo_loss_from_logps",
]

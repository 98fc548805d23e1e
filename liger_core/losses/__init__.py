"""Chunked post-training losses on hidden states + lm_head weight (the logits never exist in full): the
formulas of TRL 1.16's trainers on per-token log-probs from ``liger_core.ops.fused_linear_logprobs``.

Each ``fused_linear_*_loss`` returns ``(loss, metrics)``, metrics under TRL's logged names; each
``*_from_logps`` is the bare formula on sequence log-probs; the ``LigerFusedLinear*Loss`` modules hold the
hyper-parameters. Each family's hyper-parameters are one checked object (``grpo_options``, ``dpo_options``,
``cpo_options``, ``simpo_options``), taken as keywords or whole (``options=``).
``fused_linear_distill_loss`` (student/teacher divergence on ``fused_linear_jsd``) returns the loss alone.
"""

from liger_core.losses.distill import (
    LigerFusedLinearCosineSimilarityLoss,
    LigerFusedLinearDistillLoss,
    fused_linear_distill_loss,
)
from liger_core.losses.grpo import (
    GRPOOptions,
    LigerFusedLinearGRPOLoss,
    fused_linear_grpo_loss,
    grpo_loss_from_logps,
    grpo_options,
)
from liger_core.losses.kto import (
    LigerFusedLinearKTOLoss,
    fused_linear_kto_loss,
    kto_kl_estimate,
    kto_loss_from_logps,
)
from liger_core.losses.preference import (
    CPOOptions,
    DPOOptions,
    LigerFusedLinearCPOLoss,
    LigerFusedLinearDPOLoss,
    LigerFusedLinearORPOLoss,
    LigerFusedLinearSimPOLoss,
    cpo_loss_from_logps,
    cpo_options,
    dpo_loss_from_logps,
    dpo_options,
    fused_linear_cpo_loss,
    fused_linear_dpo_loss,
    fused_linear_orpo_loss,
    fused_linear_simpo_loss,
    orpo_loss_from_logps,
    simpo_options,
)

__all__ = [
    "CPOOptions",
    "DPOOptions",
    "GRPOOptions",
    "LigerFusedLinearCPOLoss",
    "LigerFusedLinearDPOLoss",
    "LigerFusedLinearCosineSimilarityLoss",
    "LigerFusedLinearDistillLoss",
    "LigerFusedLinearGRPOLoss",
    "LigerFusedLinearKTOLoss",
    "LigerFusedLinearORPOLoss",
    "LigerFusedLinearSimPOLoss",
    "cpo_loss_from_logps",
    "cpo_options",
    "dpo_loss_from_logps",
    "dpo_options",
    "fused_linear_cpo_loss",
    "fused_linear_distill_loss",
    "fused_linear_dpo_loss",
    "fused_linear_grpo_loss",
    "fused_linear_kto_loss",
    "fused_linear_orpo_loss",
    "fused_linear_simpo_loss",
    "grpo_loss_from_logps",
    "grpo_options",
    "kto_kl_estimate",
    "kto_loss_from_logps",
    "orpo_loss_from_logps",
    "simpo_options",
]

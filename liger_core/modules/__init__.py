"""nn.Module wrappers around liger_core.ops (drop-ins for the Hugging Face modules they replace)."""

from liger_core.modules.distill import LigerFusedLinearJSD, LigerJSD, LigerKLDIVLoss
from liger_core.modules.losses import LigerCrossEntropyLoss, LigerFusedLinearCrossEntropyLoss
from liger_core.modules.mlp import LigerGEGLUMLP, LigerSwiGLUMLP
from liger_core.modules.norm_variants import (
    LigerDyT,
    LigerFusedAddRMSNorm,
    LigerGroupNorm,
    LigerModulatedRMSNorm,
    LigerPolyNorm,
    LigerRMSNormNoWeight,
)
from liger_core.modules.norms import LigerLayerNorm, LigerRMSNorm, LigerRMSNormForGemma

__all__ = [
    "LigerCrossEntropyLoss",
    "LigerDyT",
    "LigerFusedAddRMSNorm",
    "LigerFusedLinearCrossEntropyLoss",
    "LigerFusedLinearJSD",
    "LigerGEGLUMLP",
    "LigerGroupNorm",
    "LigerJSD",
    "LigerKLDIVLoss",
    "LigerLayerNorm",
    "LigerModulatedRMSNorm",
    "LigerPolyNorm",
    "LigerRMSNorm",
    "LigerRMSNormForGemma",
    "LigerRMSNormNoWeight",
    "LigerSwiGLUMLP",
]

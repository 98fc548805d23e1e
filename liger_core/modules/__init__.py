"""nn.Module wrappers around liger_core.ops (drop-ins for the Hugging Face modules they replace)."""

from liger_core.modules.activations import LigerReLUSquared, LigerSoftmax, LigerSparsemax
from liger_core.modules.attention import LigerFusedNeighborhoodAttention, LigerMultiTokenAttention
from liger_core.modules.distill import (
    LigerFusedLinearJSD,
    LigerFusedLinearKLDiv,
    LigerJSD,
    LigerKLDIVLoss,
    LigerTVDLoss,
)
from liger_core.modules.losses import (
    LigerCrossEntropyLoss,
    LigerFusedCETVDLoss,
    LigerFusedLinearCrossEntropyLoss,
    LigerFusedLinearScaledCrossEntropy,
    LigerVocabParallelCrossEntropy,
)
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
    "LigerFusedCETVDLoss",
    "LigerFusedLinearCrossEntropyLoss",
    "LigerFusedLinearJSD",
    "LigerFusedLinearKLDiv",
    "LigerFusedLinearScaledCrossEntropy",
    "LigerFusedNeighborhoodAttention",
    "LigerGEGLUMLP",
    "LigerGroupNorm",
    "LigerJSD",
    "LigerKLDIVLoss",
    "LigerLayerNorm",
    "LigerModulatedRMSNorm",
    "LigerMultiTokenAttention",
    "LigerPolyNorm",
    "LigerRMSNorm",
    "LigerRMSNormForGemma",
    "LigerRMSNormNoWeight",
    "LigerReLUSquared",
    "LigerSoftmax",
    "LigerSparsemax",
    "LigerSwiGLUMLP",
    "LigerTVDLoss",
    "LigerVocabParallelCrossEntropy",
]

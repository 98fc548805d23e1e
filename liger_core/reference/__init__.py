"""Pure-PyTorch reference implementations: ground truth for the tests (after upcasting to float64) and the
CPU fallback when Triton cannot run. Each has the same signature as its functional entry point in
``liger_core.ops`` and computes in the input dtype exactly as the eager PyTorch / HF code it replaces.
"""

from __future__ import annotations

# Each reference lives in the submodule of its own name; these imports bind the function over the submodule.
from liger_core.reference.cross_entropy import cross_entropy
from liger_core.reference.cross_entropy_tvd import cross_entropy_tvd
from liger_core.reference.dyt import dyt
from liger_core.reference.fused_add_rms_norm import fused_add_rms_norm
from liger_core.reference.fused_linear_cosine_similarity import fused_linear_cosine_similarity
from liger_core.reference.fused_linear_cross_entropy import fused_linear_cross_entropy
from liger_core.reference.fused_linear_jsd import fused_linear_jsd, fused_linear_kl_div
from liger_core.reference.fused_linear_logprobs import (
    fused_linear_logprobs,
    fused_linear_scaled_cross_entropy,
)
from liger_core.reference.fused_neighborhood_attention import fused_neighborhood_attention
from liger_core.reference.geglu import geglu
from liger_core.reference.group_norm import group_norm
from liger_core.reference.jsd import jsd
from liger_core.reference.kl_div import kl_div
from liger_core.reference.layer_norm import layer_norm
from liger_core.reference.modulated_rms_norm import modulated_rms_norm
from liger_core.reference.multi_token_attention import multi_token_attention
from liger_core.reference.poly_norm import poly_norm
from liger_core.reference.relu_squared import relu_squared
from liger_core.reference.rms_norm import rms_norm
from liger_core.reference.rms_norm_gated import rms_norm_gated
from liger_core.reference.rms_norm_no_weight import rms_norm_no_weight
from liger_core.reference.rope import rope
from liger_core.reference.softmax import softmax
from liger_core.reference.sparsemax import sparsemax
from liger_core.reference.swiglu import swiglu
from liger_core.reference.tvd import tvd
from liger_core.reference.vocab_parallel_cross_entropy import vocab_parallel_cross_entropy

__all__ = [
    "cross_entropy",
    "dyt",
    "fused_add_rms_norm",
    "cross_entropy_tvd",
    "fused_linear_cosine_similarity",
    "fused_linear_cross_entropy",
    "fused_linear_jsd",
    "fused_linear_kl_div",
    "fused_linear_logprobs",
    "fused_linear_scaled_cross_entropy",
    "fused_neighborhood_attention",
    "geglu",
    "group_norm",
    "jsd",
    "kl_div",
    "layer_norm",
    "relu_squared",
    "modulated_rms_norm",
    "multi_token_attention",
    "poly_norm",
    "rms_norm",
    "rms_norm_gated",
    "rms_norm_no_weight",
    "rope",
    "softmax",
    "sparsemax",
    "swiglu",
    "tvd",
    "vocab_parallel_cross_entropy",
]

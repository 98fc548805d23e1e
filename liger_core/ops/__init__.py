"""Functional entry points: one file per op, each with its Triton kernels and autograd Function."""

from __future__ import annotations

from liger_core.dispatch import triton_status

triton_status()  # decide compiled/interpreted once, before any kernel is traced by torch.compile

# Each op lives in the submodule of its own name; these imports bind the function over the submodule,
# so `from liger_core.ops import swiglu` gives the function.
from liger_core.ops.cross_entropy import cross_entropy  # noqa: E402
from liger_core.ops.cross_entropy_tvd import cross_entropy_tvd  # noqa: E402
from liger_core.ops.dyt import dyt  # noqa: E402
from liger_core.ops.fused_add_rms_norm import fused_add_rms_norm  # noqa: E402
from liger_core.ops.fused_linear_cosine_similarity import fused_linear_cosine_similarity  # noqa: E402
from liger_core.ops.fused_linear_cross_entropy import fused_linear_cross_entropy  # noqa: E402
from liger_core.ops.fused_linear_jsd import fused_linear_jsd, fused_linear_kl_div  # noqa: E402
from liger_core.ops.fused_linear_logprob_loss import fused_linear_logprob_loss  # noqa: E402
from liger_core.ops.fused_linear_logprobs import (  # noqa: E402
    FusedLogProbs,
    fused_linear_logprobs,
    fused_linear_scaled_cross_entropy,
)
from liger_core.ops.fused_neighborhood_attention import fused_neighborhood_attention  # noqa: E402
from liger_core.ops.geglu import geglu  # noqa: E402
from liger_core.ops.glu_down_proj import glu_down_proj  # noqa: E402
from liger_core.ops.group_norm import group_norm  # noqa: E402
from liger_core.ops.jsd import jsd  # noqa: E402
from liger_core.ops.kl_div import kl_div  # noqa: E402
from liger_core.ops.layer_norm import layer_norm  # noqa: E402
from liger_core.ops.modulated_rms_norm import modulated_rms_norm  # noqa: E402
from liger_core.ops.multi_token_attention import multi_token_attention  # noqa: E402
from liger_core.ops.poly_norm import poly_norm  # noqa: E402
from liger_core.ops.relu_squared import relu_squared  # noqa: E402
from liger_core.ops.rms_norm import rms_norm  # noqa: E402
from liger_core.ops.rms_norm_gated import rms_norm_gated  # noqa: E402
from liger_core.ops.rms_norm_no_weight import rms_norm_no_weight  # noqa: E402
from liger_core.ops.rope import rope  # noqa: E402
from liger_core.ops.softmax import softmax  # noqa: E402
from liger_core.ops.sparsemax import sparsemax  # noqa: E402
from liger_core.ops.swiglu import swiglu, swiglu_packed  # noqa: E402
from liger_core.ops.tvd import tvd  # noqa: E402
from liger_core.ops.vocab_parallel_cross_entropy import vocab_parallel_cross_entropy  # noqa: E402

__all__ = [
    "cross_entropy",
    "dyt",
    "fused_add_rms_norm",
    "cross_entropy_tvd",
    "fused_linear_cosine_similarity",
    "fused_linear_cross_entropy",
    "FusedLogProbs",
    "fused_linear_jsd",
    "fused_linear_kl_div",
    "fused_linear_logprob_loss",
    "fused_linear_logprobs",
    "fused_linear_scaled_cross_entropy",
    "fused_neighborhood_attention",
    "geglu",
    "glu_down_proj",
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
    "swiglu_packed",
    "tvd",
    "vocab_parallel_cross_entropy",
]

"""liger_core's fused log-probs in place of TRL's own kernel, under TRL's fused LM head (TRL >= 1.15).

Every TRL trainer (SFT, DPO, KTO, GRPO, RLOO) adds a fused LM head to its model(s) with
`trl.trainer.utils.add_fused_lm_head`; its forward calls `_ChunkedLogProbFunction.apply(hidden, weight, bias,
labels, temperature, chunk_size, final_logit_softcapping, logit_scale, outputs)`, a name it looks up in
`trl.trainer.utils` at each call. While `use_liger_core_logprobs()` is active that name is
`LigerCoreLogProbFunction`, whose `apply` has the same signature and returns the same five per-token tensors
from `liger_core.ops.fused_linear_logprobs`. Everything else (masking, the SFT loss, the DPO/KTO/GRPO losses,
rewards, margins, accuracies, KL, clip ratios, entropy and token-accuracy metrics) stays TRL's own code.

Two cases keep TRL's kernel, because liger_core's op gives no gradient through the entropy and does not
gather ZeRO-3-partitioned weights in its backward: GRPO with an entropy bonus (`entropy_coef != 0` or
`use_adaptive_entropy`), and DeepSpeed ZeRO-3. Both are decided per trainer (`liger_logprobs_unsupported`,
when it is built and again when it trains), ZeRO-3 also per call (warned once), for a DeepSpeed setup that
appears only once the trainer runs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import trl.trainer.utils as trl_utils

logger = logging.getLogger("liger_core_trl")

TRL_KERNEL_NAME = "_ChunkedLogProbFunction"  # the name add_fused_lm_head's forward resolves at call time
_warned_zero3 = False


def trl_kernel() -> Any:
    """TRL's own kernel class, whatever `trl.trainer.utils._ChunkedLogProbFunction` is bound to right now."""
    from trl.kernels import ChunkedLogProbFunction

    return ChunkedLogProbFunction


def _zero3_enabled() -> bool:
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled()


class LigerCoreLogProbFunction:
    """Drop-in for TRL's `ChunkedLogProbFunction` (only `apply` is used): liger_core computes the per-token
    log-probs (with gradient to hidden, weight and bias) and the detached statistics TRL asks for."""

    @staticmethod
    def apply(
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
        final_logit_softcapping: float | None = None,
        logit_scale: float = 1.0,
        outputs: tuple[str, ...] = ("log_probs",),
    ) -> tuple[torch.Tensor | None, ...]:
        global _warned_zero3
        if _zero3_enabled():
            # the weight is gathered for this call only (maybe_gather_lm_head_ctx); TRL's backward re-gathers
            if not _warned_zero3:
                logger.warning("liger_core_trl: DeepSpeed ZeRO-3 is on: TRL's own log-prob kernel is used")
                _warned_zero3 = True
            return trl_kernel().apply(
                hidden,
                weight,
                bias,
                targets,
                temperature,
                chunk_size,
                final_logit_softcapping,
                logit_scale,
                outputs,
            )
        import liger_core.ops

        # Under autocast (bf16 training of an fp32 model) the op casts hidden/weight/bias to the autocast
        # dtype, as TRL's kernel runs its GEMM in it. The log-probs are always computed (TRL's `loss` is
        # built from them), the statistics on request.
        result = liger_core.ops.fused_linear_logprobs(
            hidden,
            weight,
            targets,
            bias,
            temperature=temperature,
            softcap=final_logit_softcapping,
            logit_scale=logit_scale,
            outputs=outputs,
        )
        return tuple(result)


def liger_logprobs_unsupported(args: Any) -> str | None:
    """Why a trainer with these (TRL config) arguments must keep TRL's kernel, or None if it need not."""
    if not hasattr(trl_utils, TRL_KERNEL_NAME):
        return f"this TRL has no trl.trainer.utils.{TRL_KERNEL_NAME} to replace (tested: TRL 1.16)"
    if getattr(args, "entropy_coef", 0.0) or getattr(args, "use_adaptive_entropy", False):
        return (
            "the GRPO entropy bonus (entropy_coef / use_adaptive_entropy) backpropagates through the "
            "entropy, which liger_core's fused log-probs return as a statistic without gradient"
        )
    if _zero3_enabled():
        return (
            "DeepSpeed ZeRO-3 is on: TRL's backward re-gathers the partitioned lm_head, liger_core's does not"
        )
    return None


@contextlib.contextmanager
def use_liger_core_logprobs() -> Iterator[None]:
    """While active, TRL's fused LM heads (every model given one by `add_fused_lm_head`) compute with
    liger_core. Re-entrant: each exit restores the binding found at its entry."""
    previous = getattr(trl_utils, TRL_KERNEL_NAME)
    setattr(trl_utils, TRL_KERNEL_NAME, LigerCoreLogProbFunction)
    try:
        yield
    finally:
        setattr(trl_utils, TRL_KERNEL_NAME, previous)


def is_active() -> bool:
    return getattr(trl_utils, TRL_KERNEL_NAME) is LigerCoreLogProbFunction

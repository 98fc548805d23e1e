"""Shared pieces of the fused preference losses: per-token log-probs from hidden states (layer 1,
``liger_core.ops.fused_linear_logprobs``), sequence log-probs, masked means, batch checks.

Batch layout (TRL's): ``hidden (R, T, H)`` and ``target (R, T)``, already shifted (``target[:, t]`` is the
token predicted from ``hidden[:, t]``), ``ignore_index`` on prompt and padding positions. Paired losses take
``R = 2B`` rows, the B chosen completions first, then the B rejected ones in the same order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from liger_core.dispatch import INDEX_DTYPES, check_same_device, check_shape, check_tensor
from liger_core.ops.fused_linear_logprobs import FusedLogProbs, fused_linear_logprobs

# log-probs may be float64 (references, tests): the formulas run in the log-probs' dtype, fp32 at least
LOGPS_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def check_batch(hidden: torch.Tensor, target: torch.Tensor, *, paired: bool) -> int:
    """Validate ``hidden (R, T, H)`` and ``target (R, T)``; returns R (paired: R = 2B, R even)."""
    check_tensor("hidden", hidden, ndim=3)
    check_tensor("target", target, dtypes=INDEX_DTYPES, ndim=2)
    check_shape("target", target, tuple(hidden.shape[:2]), "target must be (rows, T) like hidden[..., 0]")
    check_same_device("hidden", hidden, target=target)
    rows = hidden.shape[0]
    if paired and rows % 2:
        raise ValueError(
            f"hidden has {rows} rows; a paired batch has 2B rows (B chosen completions, then B rejected)"
        )
    if paired and rows == 0:
        raise ValueError("hidden has 0 rows; a paired batch needs at least one chosen/rejected pair")
    return rows


def check_sequence_logps(name: str, logps: torch.Tensor | None, rows: int, device: torch.device) -> None:
    """Precomputed per-sequence log-probs: ``(rows,)`` floats on ``device`` (or None)."""
    if logps is None:
        return
    check_tensor(name, logps, dtypes=LOGPS_DTYPES, ndim=1)
    check_shape(name, logps, (rows,), "one log-prob per sequence")
    if logps.device != device:
        raise ValueError(f"{name} is on {logps.device} but hidden is on {device}; move them to one device")


@dataclass(frozen=True)
class LogprobHead:
    """How a loss scores its targets (layer 1, ``liger_core.ops.fused_linear_logprobs``): the target value
    that is never scored, TRL's logit transform (``logit_scale``, ``softcap``, then 1 / ``temperature``) and
    the op's chunking and gradient dtype. One object, passed whole to every log-prob pass of a loss (policy,
    reference, KL completions)."""

    ignore_index: int = -100
    temperature: float = 1.0
    softcap: float | None = None
    logit_scale: float = 1.0
    chunk_size: int | None = None
    max_chunk_bytes: int | None = None
    accum_dtype: torch.dtype | None = torch.float32

    def replace(self, **changes) -> LogprobHead:
        return dataclasses.replace(self, **changes)

    def transform(self) -> dict:
        """The logit-transform keywords (``fused_linear_logprob_loss`` chunks by groups, not by these)."""
        return {"temperature": self.temperature, "softcap": self.softcap, "logit_scale": self.logit_scale}

    def op_kwargs(self) -> dict:
        """Every field, as ``fused_linear_logprobs``' keywords."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    head: LogprobHead,
    *,
    outputs: tuple[str, ...] = (),
) -> FusedLogProbs:
    """Per-token log-probs (and the statistics in ``outputs``) of ``target`` under ``hidden @ weight.T +
    bias``, shapes ``(R, T)``: layer 1 with the loss's ``head``."""
    return fused_linear_logprobs(hidden, weight, target, bias, outputs=outputs, **head.op_kwargs())


def reference_token_logprobs(
    ref_hidden: torch.Tensor,
    ref_weight: torch.Tensor,
    target: torch.Tensor,
    ref_bias: torch.Tensor | None,
    head: LogprobHead,
    *,
    shape_hint: str = "(rows, T, H_ref)",
) -> torch.Tensor:
    """The reference model's per-token log-probs: the same op, under no_grad (no graph, no gradient GEMMs);
    ``ref_hidden`` must be ``(rows, T, H_ref)`` for ``target (rows, T)`` (``shape_hint``: in the error)."""
    check_tensor("ref_hidden", ref_hidden, ndim=3)
    check_shape("ref_hidden", ref_hidden, tuple(target.shape) + (ref_hidden.shape[-1],), shape_hint)
    if ref_weight is None:
        raise ValueError("ref_hidden needs ref_weight (the reference model's lm_head weight)")
    with torch.no_grad():
        return token_logprobs(
            ref_hidden.detach(),
            ref_weight.detach(),
            target,
            ref_bias.detach() if ref_bias is not None else None,
            head,
        ).log_probs


def sequence_logps(log_probs: torch.Tensor, mask: torch.Tensor, *, average: bool = False) -> torch.Tensor:
    """``sum_t log_probs * mask`` per row, or that sum over the row's token count (``average``); a row with no
    token gives 0, not TRL's 0 / 0 = NaN (the loss formulas then see a log-prob of 0)."""
    total = torch.where(mask, log_probs, torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)).sum(
        -1
    )
    if not average:
        return total
    return total / mask.sum(-1).clamp(min=1).to(total.dtype)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the True entries of ``mask`` (0 when there are none), detached, >= fp32."""
    values = values.detach()
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    total = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum()
    return total / mask.sum().clamp(min=1).to(total.dtype)


def detached_mean(values: torch.Tensor) -> torch.Tensor:
    """Mean of a per-sequence metric (0 for an empty one), detached."""
    values = values.detach()
    if values.numel() == 0:
        return values.new_zeros(())
    return values.mean()


def token_metrics(stats: FusedLogProbs, mask: torch.Tensor, n_chosen: int) -> dict[str, torch.Tensor]:
    """TRL's per-token metrics of a paired batch (DPOTrainer): ``logits/chosen`` and ``logits/rejected`` (mean
    logit over the completion tokens of each half), ``entropy`` (mean over all completion tokens) and
    ``mean_token_accuracy`` (argmax == target over the chosen completion tokens)."""
    metrics = {}
    if stats.mean_logits is not None:
        metrics["logits/chosen"] = masked_mean(stats.mean_logits[:n_chosen], mask[:n_chosen])
        metrics["logits/rejected"] = masked_mean(stats.mean_logits[n_chosen:], mask[n_chosen:])
    if stats.entropy is not None:
        metrics["entropy"] = masked_mean(stats.entropy, mask)
    if stats.is_top1 is not None:
        metrics["mean_token_accuracy"] = masked_mean(stats.is_top1[:n_chosen].float(), mask[:n_chosen])
    return metrics

"""Reference generalised Jensen-Shannon divergence: the eager composition used for distillation (TRL's GKD
``generalized_jsd_loss`` convention, Liger-Kernel's ``jsd``), on fp32 log-probs (16-bit ones are upcast).

With ``Q = exp(student_logp)`` (student), ``P = exp(teacher_logp)`` (teacher), per row::

    M         = beta * P + (1 - beta) * Q
    JSD_beta  = beta * KL(P || M) + (1 - beta) * KL(Q || M)          0 < beta < 1
    beta == 0 : KL(P || Q)   forward KL (teacher || student)
    beta == 1 : KL(Q || P)   reverse KL (student || teacher)

The two endpoints are taken by name (as TRL and Liger do), not as limits of the mixture formula (which tends
to 0 there). The loss is the mean over rows whose ``shift_labels`` is not ``ignore_index`` (all rows when
``shift_labels`` is None), fp32 (float64 for float64 inputs); 0 with zero gradients when there is no such
row. As the Triton op, and unlike the plain eager formula (NaN there), a term whose probability is 0
contributes 0 (``0 * log 0 = 0``: -inf log-probs of a masked vocabulary entry), gradients included.
``teacher_logp`` gets no gradient.
"""

from __future__ import annotations

import math

import torch


def _weighted_log_ratio(logp: torch.Tensor, log_other: torch.Tensor) -> torch.Tensor:
    """``exp(logp) * (logp - log_other)`` elementwise, 0 where ``exp(logp)`` is 0 (``0 * log 0 = 0``); those
    elements are computed on zeros, so that no NaN reaches the gradient through them either."""
    zero = logp.exp() == 0
    logp = logp.masked_fill(zero, 0.0)
    log_other = log_other.masked_fill(zero, 0.0)
    return (logp.exp() * (logp - log_other)).masked_fill(zero, 0.0)


def jsd_rows(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-row generalised JSD of (rows, V) log-probabilities, in their dtype."""
    s, t = student_logp, teacher_logp
    if beta == 0.0:
        return _weighted_log_ratio(t, s).sum(-1)
    if beta == 1.0:
        return _weighted_log_ratio(s, t).sum(-1)
    # where both probabilities are 0 the terms are 0: log M of zeros instead of -inf (whose gradient is NaN)
    both = (s == -math.inf) & (t == -math.inf)
    log_m = torch.logaddexp(
        t.masked_fill(both, 0.0) + math.log(beta), s.masked_fill(both, 0.0) + math.log1p(-beta)
    )
    return beta * _weighted_log_ratio(t, log_m).sum(-1) + (1.0 - beta) * _weighted_log_ratio(s, log_m).sum(-1)


def jsd(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    beta: float = 0.5,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    vocab = student_logp.shape[-1]
    dtype = torch.promote_types(student_logp.dtype, torch.float32)
    s = student_logp.reshape(-1, vocab).to(dtype)
    t = teacher_logp.detach().reshape(-1, vocab).to(dtype)
    if shift_labels is None:
        return jsd_rows(s, t, beta).sum() / max(s.shape[0], 1)  # no rows: the empty sum, 0
    keep = shift_labels.reshape(-1) != ignore_index
    # Ignored rows are dropped before any math, so whatever they hold cannot reach the loss or the gradient;
    # none kept: the empty sum, 0, with zero gradients
    return jsd_rows(s[keep], t[keep], beta).sum() / keep.sum().clamp_min(1)

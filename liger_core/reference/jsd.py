"""Reference generalised Jensen-Shannon divergence: the eager composition used for distillation (TRL's GKD
``generalized_jsd_loss`` convention, Liger-Kernel's ``jsd``), in the input dtype.

With ``Q = exp(student_logp)`` (student), ``P = exp(teacher_logp)`` (teacher), per row::

    M         = beta * P + (1 - beta) * Q
    JSD_beta  = beta * KL(P || M) + (1 - beta) * KL(Q || M)          0 < beta < 1
    beta == 0 : KL(P || Q)   forward KL (teacher || student)
    beta == 1 : KL(Q || P)   reverse KL (student || teacher)

The two endpoints are taken by name (as TRL and Liger do), not as limits of the mixture formula (which tends
to 0 there). The loss is the mean over rows whose ``shift_labels`` is not ``ignore_index`` (all rows when
``shift_labels`` is None); 0 when every row is ignored. ``teacher_logp`` gets no gradient.
"""

from __future__ import annotations

import math

import torch


def jsd_rows(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-row generalised JSD of (rows, V) log-probabilities, in their dtype."""
    s, t = student_logp, teacher_logp
    if beta == 0.0:
        return (t.exp() * (t - s)).sum(-1)
    if beta == 1.0:
        return (s.exp() * (s - t)).sum(-1)
    log_m = torch.logaddexp(t + math.log(beta), s + math.log1p(-beta))
    return beta * (t.exp() * (t - log_m)).sum(-1) + (1.0 - beta) * (s.exp() * (s - log_m)).sum(-1)


def jsd(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    beta: float = 0.5,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    vocab = student_logp.shape[-1]
    s = student_logp.reshape(-1, vocab)
    t = teacher_logp.detach().reshape(-1, vocab)
    if shift_labels is None:
        return jsd_rows(s, t, beta).sum() / s.shape[0]
    keep = shift_labels.reshape(-1) != ignore_index
    n_kept = int(keep.sum())
    # Ignored rows are dropped before any math, so whatever they hold cannot reach the loss or the gradient.
    loss = jsd_rows(s[keep], t[keep], beta).sum()
    return loss / n_kept if n_kept else loss  # an empty sum is 0, with zero gradients

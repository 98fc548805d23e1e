"""Reference fused linear + JSD: the eager composition it replaces, which materialises both models' logits.

    student_logp = log_softmax(float(student_hidden @ student_weight^T + student_bias) / temperature)
    teacher_logp = log_softmax(float(teacher_hidden @ teacher_weight^T + teacher_bias) / temperature)
                                                                          (no gradient; biases optional)
    loss         = jsd(student_logp, teacher_logp, beta, ignore_index, shift_labels)     (fp32)

Logits are produced in the models' dtype (as an lm_head does), then upcast: the softmax and the loss are fp32
(float64 for float64 inputs). Temperature divides the logits; the loss is not rescaled by temperature^2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from liger_core.reference.jsd import jsd


def _upcast(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def fused_linear_jsd(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    shift_labels: torch.Tensor | None = None,
    beta: float = 0.5,
    ignore_index: int = -100,
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    del chunk_size  # the composition holds every row's logits at once
    student_logits = F.linear(student_hidden, student_weight, student_bias)
    with torch.no_grad():
        teacher_logits = F.linear(teacher_hidden, teacher_weight, teacher_bias)
    student_logp = torch.log_softmax(_upcast(student_logits) / temperature, dim=-1)
    teacher_logp = torch.log_softmax(_upcast(teacher_logits) / temperature, dim=-1)
    return jsd(student_logp, teacher_logp, beta=beta, ignore_index=ignore_index, shift_labels=shift_labels)


def fused_linear_kl_div(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    shift_labels: torch.Tensor | None = None,
    ignore_index: int = -100,
    temperature: float = 1.0,
    *,
    reverse: bool = False,
) -> torch.Tensor:
    """``fused_linear_jsd`` at beta = 0 (``KL(P_teacher || Q_student)``) or, with ``reverse``, beta = 1."""
    return fused_linear_jsd(
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        shift_labels,
        1.0 if reverse else 0.0,
        ignore_index,
        temperature,
    )

"""Reference per-token cross-entropy and total variation distance to a teacher: the eager composition (both
softmaxes in full, fp32 math; float64 for float64 logits).

    ce  = -log_softmax(z_s)[y],   tvd = 0.5 * sum |softmax(z_s) - softmax(z_t)|   (0 where y == ignore_index)
"""

from __future__ import annotations

import torch


def cross_entropy_tvd(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor]:
    upcast = torch.promote_types(student_logits.dtype, torch.float32)
    log_p = torch.log_softmax(student_logits.to(upcast), dim=-1)
    q = torch.softmax(teacher_logits.detach().to(upcast), dim=-1)
    keep = target != ignore_index
    picked = log_p.gather(-1, torch.where(keep, target, 0).unsqueeze(-1)).squeeze(-1)
    ce = torch.where(keep, -picked, 0.0)
    tvd = torch.where(keep, 0.5 * (log_p.exp() - q).abs().sum(-1), 0.0)
    return ce, tvd

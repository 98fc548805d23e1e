"""Distillation losses as nn.Modules: thin wrappers around liger_core.ops.kl_div / jsd / tvd /
fused_linear_jsd.

They hold only their hyper-parameters (no parameters, no buffers), so swapping one in for an eager loss never
changes a state_dict.
"""

from __future__ import annotations

import torch
from torch import nn

from liger_core.ops._divergence_math import check_beta, check_ignore_index, check_temperature
from liger_core.ops.fused_linear_jsd import fused_linear_jsd, fused_linear_kl_div
from liger_core.ops.jsd import jsd
from liger_core.ops.kl_div import REDUCTIONS, kl_div
from liger_core.ops.tvd import tvd


class LigerKLDIVLoss(nn.Module):
    """``torch.nn.KLDivLoss`` (input = log-probs) with a Triton kernel; gradient w.r.t. the input only, in its
    dtype; the loss is fp32 whatever the input dtype (``liger_core.ops.kl_div``)."""

    def __init__(self, reduction: str = "batchmean", log_target: bool = False) -> None:
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction={reduction!r} is not supported; choose one of {REDUCTIONS}")
        self.reduction = reduction
        self.log_target = log_target

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return kl_div(input, target, reduction=self.reduction, log_target=self.log_target)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, log_target={self.log_target}"


class LigerJSD(nn.Module):
    """Generalised JSD between student and teacher log-probs (beta = 0: forward KL, beta = 1: reverse KL),
    averaged over the rows whose ``shift_labels`` is not ``ignore_index`` (0 where there is none); an fp32
    loss whatever the inputs' dtype (``liger_core.ops.jsd``)."""

    def __init__(self, beta: float = 0.5, ignore_index: int = -100) -> None:
        super().__init__()
        self.beta = check_beta(beta)
        self.ignore_index = check_ignore_index(ignore_index)

    def forward(
        self, student_logp: torch.Tensor, teacher_logp: torch.Tensor, shift_labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        return jsd(student_logp, teacher_logp, self.beta, self.ignore_index, shift_labels)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, ignore_index={self.ignore_index}"


class LigerFusedLinearJSD(nn.Module):
    """lm_head projections of student and teacher + generalised JSD, chunked over tokens so that neither
    model's logits are materialised; an fp32 loss. The weights are passed to forward (they belong to the
    models)."""

    def __init__(self, beta: float = 0.5, ignore_index: int = -100, temperature: float = 1.0) -> None:
        super().__init__()
        self.beta = check_beta(beta)
        self.ignore_index = check_ignore_index(ignore_index)
        self.temperature = check_temperature(temperature, finite=False)

    def forward(
        self,
        student_hidden: torch.Tensor,
        student_weight: torch.Tensor,
        teacher_hidden: torch.Tensor,
        teacher_weight: torch.Tensor,
        shift_labels: torch.Tensor | None = None,
        student_bias: torch.Tensor | None = None,
        teacher_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return fused_linear_jsd(
            student_hidden,
            student_weight,
            teacher_hidden,
            teacher_weight,
            shift_labels,
            beta=self.beta,
            ignore_index=self.ignore_index,
            temperature=self.temperature,
            student_bias=student_bias,
            teacher_bias=teacher_bias,
        )

    def extra_repr(self) -> str:
        return f"beta={self.beta}, ignore_index={self.ignore_index}, temperature={self.temperature}"


class LigerFusedLinearKLDiv(nn.Module):
    """lm_head projections of student and teacher + KL(teacher || student) (``reverse=True``: KL(student ||
    teacher)), chunked over tokens so that neither model's logits are materialised; an fp32 loss
    (``liger_core.ops.fused_linear_kl_div``). The weights are passed to forward."""

    def __init__(self, ignore_index: int = -100, temperature: float = 1.0, reverse: bool = False) -> None:
        super().__init__()
        self.ignore_index = check_ignore_index(ignore_index)
        self.temperature = check_temperature(temperature, finite=False)
        if not isinstance(reverse, bool):
            raise TypeError(f"reverse must be a bool, got {type(reverse).__name__}")
        self.reverse = reverse

    def forward(
        self,
        student_hidden: torch.Tensor,
        student_weight: torch.Tensor,
        teacher_hidden: torch.Tensor,
        teacher_weight: torch.Tensor,
        shift_labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return fused_linear_kl_div(
            student_hidden,
            student_weight,
            teacher_hidden,
            teacher_weight,
            shift_labels,
            ignore_index=self.ignore_index,
            temperature=self.temperature,
            reverse=self.reverse,
        )

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, temperature={self.temperature}, reverse={self.reverse}"


class LigerTVDLoss(nn.Module):
    """Total variation distance ``0.5 * |p - q|`` between probabilities (liger-kernel's ``LigerTVDLoss``):
    reduced by ``reduction`` over the rows whose ``shift_labels`` is not ``ignore_index``; an fp32 loss,
    gradients for p and q in their dtype (``liger_core.ops.tvd``)."""

    def __init__(self, reduction: str = "batchmean", ignore_index: int = -100) -> None:
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction={reduction!r} is not supported; choose one of {REDUCTIONS}")
        self.reduction = reduction
        self.ignore_index = check_ignore_index(ignore_index)

    def forward(
        self, p: torch.Tensor, q: torch.Tensor, shift_labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        return tvd(p, q, shift_labels, self.reduction, self.ignore_index)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, ignore_index={self.ignore_index}"

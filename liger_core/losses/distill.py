"""Distillation losses between a student's and a teacher's lm_head outputs, fused with the projections so that
neither model's logits exist in full: a thin layer on ``liger_core.ops.fused_linear_jsd``.

With ``Q = softmax((h_s W_s^T + b_s) / T)`` (student) and ``P = softmax((h_t W_t^T + b_t) / T)`` (teacher;
the lm_head biases b optional), per kept token::

    forward_kl   KL(P || Q)                                            (fused_linear_jsd beta = 0)
    reverse_kl   KL(Q || P)                                            (beta = 1)
    jsd          beta KL(P || M) + (1 - beta) KL(Q || M),  M = beta P + (1 - beta) Q      (0 < beta < 1)

as TRL's distillation / GKD trainers define them (beta weights the teacher; 0 and 1 are the two KLs by name).
The loss is the sum over tokens whose target is not ``ignore_index`` divided by their number, or by
``num_items_in_batch`` when given (TRL's gradient-accumulation-correct reduction: the kept tokens of the whole
accumulated batch). No temperature^2 factor (neither TRL nor the reference composition applies one).

``LigerFusedLinearCosineSimilarityLoss`` is Liger-Kernel's cosine-similarity distillation on
``liger_core.ops.fused_linear_cosine_similarity``: ``weight_hard_loss * CE(student, labels) +
weight_soft_loss * beta * mean(1 - cos(student logits, teacher logits))`` over the kept tokens.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from liger_core.dispatch import check_choice
from liger_core.ops._divergence_math import check_temperature
from liger_core.ops.fused_linear_cosine_similarity import fused_linear_cosine_similarity
from liger_core.ops.fused_linear_jsd import fused_linear_jsd

DISTILL_LOSSES = ("jsd", "forward_kl", "reverse_kl")
# fused_linear_jsd's beta for each divergence taken by name
_KL_BETA = {"forward_kl": 0.0, "reverse_kl": 1.0}


def distill_beta(loss: str, beta: float | None) -> float:
    """fused_linear_jsd's beta for ``loss``; ``beta`` only applies to (and defaults to 0.5 for) the JSD."""
    check_choice("loss", loss, DISTILL_LOSSES)
    if loss == "jsd":
        return 0.5 if beta is None else beta  # fused_linear_jsd checks its range
    if beta is not None and beta != _KL_BETA[loss]:
        raise ValueError(f"beta={beta!r} does not apply to loss={loss!r} (it is the JSD's mixture weight)")
    return _KL_BETA[loss]


def fused_linear_distill_loss(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    target: torch.Tensor | None = None,
    *,
    loss: str = "jsd",
    beta: float | None = None,
    temperature: float = 1.0,
    ignore_index: int = -100,
    num_items_in_batch: torch.Tensor | int | None = None,
    chunk_size: int | None = None,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Divergence (module docstring) between the student's and the teacher's next-token distributions.

    student_hidden ``(..., Hs)`` with student_weight ``(V, Hs)``, teacher_hidden ``(..., Ht)`` with
    teacher_weight ``(V, Ht)``; target ``(...)`` (already shifted) only selects the tokens: those equal to
    ignore_index are left out (None: every token counts); student_bias, teacher_bias ``(V,)``: the lm_heads'
    biases, if any. Returns an fp32 0-dim loss; gradients flow to student_hidden, student_weight and
    student_bias only. A batch with no kept token gives 0 with zero gradients.
    """
    mixture_beta = distill_beta(loss, beta)
    mean = fused_linear_jsd(
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        target,
        beta=mixture_beta,
        ignore_index=ignore_index,
        temperature=temperature,
        chunk_size=chunk_size,
        student_bias=student_bias,
        teacher_bias=teacher_bias,
    )
    if num_items_in_batch is None:
        return mean
    if isinstance(num_items_in_batch, torch.Tensor):
        if num_items_in_batch.numel() != 1:
            raise ValueError(
                f"num_items_in_batch must be a scalar, got shape {tuple(num_items_in_batch.shape)}"
            )
        n_items = num_items_in_batch.to(device=mean.device, dtype=torch.float64).reshape(())
    elif isinstance(num_items_in_batch, bool) or not isinstance(num_items_in_batch, (int, float)):
        raise ValueError(f"num_items_in_batch={num_items_in_batch!r} must be a number or a 0-dim tensor")
    elif not (math.isfinite(num_items_in_batch) and num_items_in_batch > 0):
        raise ValueError(f"num_items_in_batch={num_items_in_batch!r} must be positive")
    else:
        n_items = torch.tensor(float(num_items_in_batch), dtype=torch.float64, device=mean.device)
    if target is None:
        n_kept = torch.tensor(float(student_hidden[..., 0].numel()), dtype=torch.float64, device=mean.device)
    else:
        n_kept = (target != ignore_index).sum().to(torch.float64)
    # sum over this batch's kept tokens / tokens of the accumulated batch, rescaled in float64: one more
    # rounding of the (correctly rounded) mean
    return (mean.double() * (n_kept.clamp(min=1.0) / n_items)).to(mean.dtype)


class LigerFusedLinearDistillLoss(nn.Module):
    """Module form of ``fused_linear_distill_loss`` (no parameters: the heads are passed to forward)."""

    def __init__(
        self,
        loss: str = "jsd",
        beta: float | None = None,
        temperature: float = 1.0,
        ignore_index: int = -100,
        chunk_size: int | None = None,
    ) -> None:
        super().__init__()
        distill_beta(loss, beta)
        self.loss, self.beta, self.temperature = loss, beta, check_temperature(temperature)
        self.ignore_index, self.chunk_size = ignore_index, chunk_size

    def forward(
        self,
        student_hidden: torch.Tensor,
        student_weight: torch.Tensor,
        teacher_hidden: torch.Tensor,
        teacher_weight: torch.Tensor,
        target: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        student_bias: torch.Tensor | None = None,
        teacher_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return fused_linear_distill_loss(
            student_hidden,
            student_weight,
            teacher_hidden,
            teacher_weight,
            target,
            loss=self.loss,
            beta=self.beta,
            temperature=self.temperature,
            ignore_index=self.ignore_index,
            num_items_in_batch=num_items_in_batch,
            chunk_size=self.chunk_size,
            student_bias=student_bias,
            teacher_bias=teacher_bias,
        )

    def extra_repr(self) -> str:
        return (
            f"loss={self.loss!r}, beta={self.beta}, temperature={self.temperature}, "
            f"ignore_index={self.ignore_index}"
        )


class LigerFusedLinearCosineSimilarityLoss(nn.Module):
    """Module form of ``liger_core.ops.fused_linear_cosine_similarity`` (no parameters: the heads are passed
    to forward), with Liger-Kernel's hyper-parameters: the loss is ``weight_hard_loss * CE +
    weight_soft_loss * beta * mean(1 - cos)`` over the tokens whose label is not ``ignore_index``;
    ``return_soft_hard_loss`` gives ``(loss, soft_loss, hard_loss)``. ``temperature`` (positive)
    leaves the cosine unchanged."""

    def __init__(
        self,
        weight_hard_loss: float = 0.5,
        weight_soft_loss: float = 0.5,
        beta: float = 0.5,
        ignore_index: int = -100,
        temperature: float = 1.0,
        chunk_size: int | None = None,
        return_soft_hard_loss: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (
            ("weight_hard_loss", weight_hard_loss),
            ("weight_soft_loss", weight_soft_loss),
            ("beta", beta),
            ("temperature", temperature),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}={value!r} must be a finite number")
        if temperature <= 0:
            raise ValueError(f"temperature={temperature!r} must be positive")
        self.weight_hard_loss, self.weight_soft_loss = float(weight_hard_loss), float(weight_soft_loss)
        self.beta, self.temperature = float(beta), float(temperature)
        self.ignore_index, self.chunk_size = ignore_index, chunk_size
        self.return_soft_hard_loss = return_soft_hard_loss

    def forward(
        self,
        student_input: torch.Tensor,
        student_weight: torch.Tensor,
        teacher_input: torch.Tensor,
        teacher_weight: torch.Tensor,
        true_labels: torch.Tensor,
        student_bias: torch.Tensor | None = None,
        teacher_bias: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return fused_linear_cosine_similarity(
            student_input,
            student_weight,
            teacher_input,
            teacher_weight,
            true_labels,
            student_bias,
            teacher_bias,
            weight_hard_loss=self.weight_hard_loss,
            weight_soft_loss=self.weight_soft_loss,
            beta=self.beta,
            ignore_index=self.ignore_index,
            temperature=self.temperature,
            chunk_size=self.chunk_size,
            return_soft_hard_loss=self.return_soft_hard_loss,
        )

    def extra_repr(self) -> str:
        return (
            f"weight_hard_loss={self.weight_hard_loss}, weight_soft_loss={self.weight_soft_loss}, "
            f"beta={self.beta}, ignore_index={self.ignore_index}, temperature={self.temperature}"
        )

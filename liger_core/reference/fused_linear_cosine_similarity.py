"""Reference fused linear + cosine-similarity distillation: the eager composition, which materialises both
models' logits.

    z_s = student_hidden @ student_weight^T + student_bias       (V_s entries; the model's dtype)
    z_t = teacher_hidden @ teacher_weight^T + teacher_bias       (V_t >= V_s entries; no gradient)
    hard_i = logsumexp(z_s_i) - z_s_i[target_i]                  (fp32 math, float64 for float64 inputs)
    soft_i = beta * (1 - <z_s_i, z_t_i> / (|z_s_i| |z_t_i|))     (z_s padded with zeros to V_t; cos = 0
                                                                  where a norm is 0, with zero gradient)
    loss = weight_hard_loss * sum hard_i / n + weight_soft_loss * sum soft_i / n

over the rows whose target is not ``ignore_index``, n their number (at least 1). The temperature divides both
logits before the cosine, which it leaves unchanged (the cosine is scale-invariant).
"""

from __future__ import annotations

import torch


def _upcast(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def fused_linear_cosine_similarity(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    target: torch.Tensor,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    *,
    weight_hard_loss: float = 0.5,
    weight_soft_loss: float = 0.5,
    beta: float = 0.5,
    ignore_index: int = -100,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    return_soft_hard_loss: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hs = student_hidden.reshape(-1, student_hidden.shape[-1])
    ht = teacher_hidden.reshape(-1, teacher_hidden.shape[-1])
    labels = target.reshape(-1)
    zs = hs @ student_weight.t()
    if student_bias is not None:
        zs = zs + student_bias
    with torch.no_grad():
        zt = ht @ teacher_weight.t()
        if teacher_bias is not None:
            zt = zt + teacher_bias
    zs, zt = _upcast(zs), _upcast(zt)
    keep = labels != ignore_index
    n_kept = keep.sum().clamp_min(1).to(zs.dtype)

    if weight_hard_loss != 0 or return_soft_hard_loss:  # Liger-Kernel's: no cross-entropy otherwise
        log_probs = torch.log_softmax(zs, dim=-1)
        picked = log_probs.gather(-1, torch.where(keep, labels, 0).unsqueeze(-1)).squeeze(-1)
        hard = torch.where(keep, -picked, 0.0).sum() / n_kept
    else:
        hard = zs.new_zeros(())

    s, t = zs / temperature, zt / temperature
    t_head = t[:, : s.shape[-1]]  # the student's zero padding adds nothing to the dot product
    dot = (s * t_head).sum(-1)
    denom = s.norm(dim=-1) * t.norm(dim=-1)
    zero = denom == 0
    cos = torch.where(zero, 0.0, dot / torch.where(zero, 1.0, denom))
    soft = torch.where(keep, beta * (1.0 - cos), 0.0).sum() / n_kept

    loss = weight_soft_loss * soft
    if weight_hard_loss != 0:
        loss = loss + weight_hard_loss * hard
    loss = loss.to(torch.promote_types(loss.dtype, torch.float32))
    if return_soft_hard_loss:
        return loss, soft.detach(), hard.detach()
    return loss

"""Liger-Kernel 0.8.5's ``liger_kernel.chunked_loss`` classes, backed by ``liger_core.losses``.

Constructor parameters, ``forward`` argument order and the ``(loss, aux)`` return structure are
Liger-Kernel's; the loss and its gradients are liger_core's (the formulas of TRL's trainers on per-token
log-probs from ``liger_core.ops.fused_linear_logprobs``, logits never materialised). ``compiled`` and
``chunk_size`` (Liger-Kernel's ``torch.compile`` switch and rows-per-chunk) are accepted and unused:
liger_core runs Triton kernels and sizes its own chunks.

Paired preference losses (DPO, ORPO, CPO, SimPO): ``_input (2B, T, H)`` with the chosen rows first, ``target
(2B, T)`` aligned with it (positions equal to ``ignore_index`` masked). ``aux`` is ``(chosen_logps,
rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss, chosen_rewards, rejected_rewards)``
(ORPO adds ``log_odds_ratio, log_odds_chosen``): per-sequence log-probs ``(B,)`` (sums; ORPO and SimPO
averages), the mean logit over every position (masked ones too) and vocabulary entry of the chosen /
rejected rows, the mean token NLL of the chosen completions (0 where the loss has no NLL term), per-sequence
rewards ``(B,)``. ``aux`` holds no gradient; its log-probs
and logit means come from one extra no-grad pass of ``fused_linear_logprobs``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from liger_core.compat.liger_kernel._lazy import liger_core_name, missing


def _sequence_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    ignore_index: int,
    average: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row sequence log-prob (sum, or mean over the row's tokens), per-row logit mean over every position
    and the vocabulary, per-row sum of token log-probs and per-row token count; no gradient."""
    from liger_core.ops import fused_linear_logprobs

    with torch.no_grad():
        mask = target != ignore_index
        # every position scored (the logit means cover masked positions too); masked log-probs dropped below
        out = fused_linear_logprobs(
            hidden, weight, target.masked_fill(~mask, 0), bias, outputs=("log_probs", "mean_logits")
        )
        token_sum = torch.where(mask, out.log_probs.float(), 0.0).sum(-1)
        counts = mask.sum(-1)
        seq = token_sum / counts.clamp(min=1) if average else token_sum
        return seq, out.mean_logits.float().mean(-1), token_sum, counts


def _ref_hidden(
    use_ref_model: bool, ref_input: Any, ref_weight: Any, ref_bias: Any, precomputed: Any = None
) -> dict[str, Any]:
    """The reference model's hidden states and lm_head as liger_core's ``ref_*`` keywords ({} without a
    reference model); raises where the reference is needed and neither they nor ``precomputed`` log-probs
    are given."""
    if not use_ref_model:
        return {}
    if precomputed is None and (ref_input is None or ref_weight is None):
        raise ValueError(
            "use_ref_model=True needs ref_input and ref_weight "
            "(the reference model's hidden states and lm_head)"
        )
    return dict(ref_hidden=ref_input, ref_weight=ref_weight, ref_bias=ref_bias)


class _PairedBase(nn.Module):
    ignore_index: int
    beta: float
    compute_nll_loss: bool

    def _aux_head(
        self, weight: torch.Tensor, hidden: torch.Tensor, target: torch.Tensor, bias: Any, average: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(chosen_logps, rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss)."""
        seq, logit_mean, token_sum, counts = _sequence_stats(
            hidden, weight, bias, target, self.ignore_index, average
        )
        n = target.shape[0] // 2
        nll = -token_sum[:n].sum() / counts[:n].sum().clamp(min=1)
        if not self.compute_nll_loss:  # Liger-Kernel reports 0 where the loss has no NLL term
            nll = torch.zeros_like(nll)
        return seq[:n], seq[n:], logit_mean[:n].mean(), logit_mean[n:].mean(), nll

    def _policy_aux(
        self,
        weight: torch.Tensor,
        hidden: torch.Tensor,
        target: torch.Tensor,
        bias: Any,
        average: bool,
        nll: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Liger-Kernel's seven-entry ``aux`` with rewards ``beta * logps`` (no reference model); ``nll``
        replaces the chosen completions' NLL where the loss reports its own."""
        chosen, rejected, chosen_mean, rejected_mean, own_nll = self._aux_head(
            weight, hidden, target, bias, average
        )
        nll = own_nll if nll is None else nll
        return chosen, rejected, chosen_mean, rejected_mean, nll, self.beta * chosen, self.beta * rejected


class LigerFusedLinearDPOLoss(_PairedBase):
    """DPO (``liger_core.losses.fused_linear_dpo_loss``): ``loss_type`` and ``label_smoothing`` as there,
    except that the ``sigmoid`` loss ignores ``label_smoothing`` as Liger-Kernel's does; ``compute_nll_loss``
    adds ``alpha`` times the chosen completions' NLL (TRL's RPO); ``use_ref_model=False`` is reference-free
    DPO. Rewards: ``beta * (logps - ref_logps)``. ``average_log_prob``: sequence log-probs are per-token means
    (policy and reference alike), in the loss and in the reported log-probs and rewards."""

    def __init__(
        self,
        ignore_index: int = -100,
        beta: float = 0.1,
        alpha: float = 1.0,
        compute_nll_loss: bool = False,
        compiled: bool = True,
        use_ref_model: bool = True,
        average_log_prob: bool = False,
        chunk_size: int = 1,
        loss_type: str = "sigmoid",
        label_smoothing: float = 0.0,
        discopop_tau: float = 0.05,
    ) -> None:
        super().__init__()
        self.ignore_index, self.beta, self.alpha = ignore_index, beta, alpha
        self.average_log_prob = average_log_prob
        self.compute_nll_loss, self.use_ref_model = compute_nll_loss, use_ref_model
        self.loss_type, self.label_smoothing, self.discopop_tau = loss_type, label_smoothing, discopop_tau

    def forward(
        self,
        lin_weight: torch.Tensor,
        _input: torch.Tensor,
        target: torch.Tensor,
        bias: torch.Tensor | None = None,
        ref_input: torch.Tensor | None = None,
        ref_weight: torch.Tensor | None = None,
        ref_bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        from liger_core.losses import fused_linear_dpo_loss

        ref = _ref_hidden(self.use_ref_model, ref_input, ref_weight, ref_bias)
        loss_type: Any = self.loss_type
        weights = None
        if self.compute_nll_loss:
            loss_type, weights = [self.loss_type, "sft"], [1.0, self.alpha]
        loss, metrics = fused_linear_dpo_loss(
            _input,
            lin_weight,
            target,
            bias,
            **ref,
            reference_free=not self.use_ref_model,
            ignore_index=self.ignore_index,
            per_pair=True,
            beta=self.beta,
            loss_type=loss_type,
            loss_weights=weights,
            # Liger-Kernel's sigmoid DPO has no label smoothing (it is used by robust and exo_pair)
            label_smoothing=0.0 if self.loss_type == "sigmoid" else self.label_smoothing,
            discopop_tau=self.discopop_tau,
            average_log_prob=self.average_log_prob,
        )
        _, _, chosen_mean, rejected_mean, nll = self._aux_head(
            lin_weight, _input, target, bias, average=False
        )
        aux = (
            metrics["chosen_logps"],
            metrics["rejected_logps"],
            chosen_mean,
            rejected_mean,
            nll,
            metrics["chosen_rewards"],
            metrics["rejected_rewards"],
        )
        return loss, aux


class LigerFusedLinearORPOLoss(_PairedBase):
    """ORPO (``liger_core.losses.fused_linear_orpo_loss``): NLL of the chosen completions (or of
    ``nll_target``) minus ``beta`` times the mean log-sigmoid of the log odds ratio. Rewards: ``beta *
    average logps``."""

    def __init__(
        self,
        ignore_index: int = -100,
        beta: float = 0.1,
        compute_nll_loss: bool = True,
        compiled: bool = True,
        chunk_size: int = 1,
    ) -> None:
        super().__init__()
        if not compute_nll_loss:
            raise missing(
                "LigerFusedLinearORPOLoss(compute_nll_loss=False)", "Its ORPO loss includes the NLL."
            )
        self.ignore_index, self.beta, self.compute_nll_loss = ignore_index, beta, True

    def forward(
        self,
        lin_weight: torch.Tensor,
        _input: torch.Tensor,
        target: torch.Tensor,
        bias: torch.Tensor | None = None,
        nll_target: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        from liger_core.losses import fused_linear_orpo_loss

        if nll_target is not None and nll_target.shape[0] == target.shape[0]:
            nll_target = nll_target[: target.shape[0] // 2]  # Liger-Kernel's full-batch form: its chosen rows
        loss, metrics = fused_linear_orpo_loss(
            _input,
            lin_weight,
            target,
            bias,
            beta=self.beta,
            nll_target=nll_target,
            ignore_index=self.ignore_index,
        )
        aux = self._policy_aux(lin_weight, _input, target, bias, True, nll=metrics["nll_loss"])
        return loss, (*aux, metrics["log_odds_ratio"], metrics["log_odds_chosen"])


class LigerFusedLinearCPOLoss(_PairedBase):
    """CPO (``liger_core.losses.fused_linear_cpo_loss``, sigmoid loss on summed log-probs): ``-(1 - eps) log
    sig(beta d) - eps log sig(-beta d)`` plus ``alpha`` times the chosen NLL (``compute_nll_loss``). Rewards:
    ``beta * logps``."""

    _averages = False  # the loss's sequence log-probs: sums (CPO) or per-token means (SimPO)

    def __init__(
        self,
        ignore_index: int = -100,
        beta: float = 0.1,
        alpha: float = 1.0,
        label_smoothing: float = 0.0,
        compute_nll_loss: bool = True,
        compiled: bool = True,
        average_log_prob: bool = False,
        chunk_size: int = 1,
    ) -> None:
        super().__init__()
        if average_log_prob:
            raise missing(
                "LigerFusedLinearCPOLoss(average_log_prob=True)", "CPO's sigmoid loss uses summed log-probs."
            )
        self.ignore_index, self.beta, self.alpha = ignore_index, beta, alpha
        self.label_smoothing, self.compute_nll_loss = label_smoothing, compute_nll_loss

    def _options(self) -> dict[str, Any]:
        return dict(
            beta=self.beta,
            label_smoothing=self.label_smoothing,
            cpo_alpha=self.alpha if self.compute_nll_loss else 0.0,
            ignore_index=self.ignore_index,
        )

    def _loss(
        self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        from liger_core.losses import fused_linear_cpo_loss

        return fused_linear_cpo_loss(
            _input, lin_weight, target, bias, loss_type="sigmoid", **self._options()
        )[0]

    def forward(
        self,
        lin_weight: torch.Tensor,
        _input: torch.Tensor,
        target: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        loss = self._loss(lin_weight, _input, target, bias)
        return loss, self._policy_aux(lin_weight, _input, target, bias, self._averages)


class LigerFusedLinearSimPOLoss(LigerFusedLinearCPOLoss):
    """SimPO (``liger_core.losses.fused_linear_simpo_loss``): average log-probs, margin ``gamma``:
    ``-(1 - eps) log sig(beta d - gamma) - eps log sig(gamma - beta d)`` plus ``alpha`` times the chosen NLL
    (``compute_nll_loss``). Rewards: ``beta * average logps``."""

    _averages = True

    def __init__(
        self,
        ignore_index: int = -100,
        beta: float = 0.1,
        alpha: float = 1.0,
        label_smoothing: float = 0.0,
        compute_nll_loss: bool = True,
        compiled: bool = True,
        gamma: float = 0.5,
        chunk_size: int = 1,
    ) -> None:
        super().__init__(ignore_index, beta, alpha, label_smoothing, compute_nll_loss)
        self.gamma = gamma

    def _loss(
        self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        from liger_core.losses import fused_linear_simpo_loss

        return fused_linear_simpo_loss(
            _input, lin_weight, target, bias, simpo_gamma=self.gamma, **self._options()
        )[0]


class LigerFusedLinearKTOLoss(nn.Module):
    """KTO (``liger_core.losses.fused_linear_kto_loss``) on unpaired rows with boolean
    ``preference_labels`` (True: desirable). ``forward`` returns ``(loss, (chosen_logps_sum,
    rejected_logps_sum, chosen_logits_sum, rejected_logits_sum, chosen_rewards_sum, rejected_rewards_sum))``:
    sums over the desirable / undesirable rows of the sequence log-probs, of every logit, and of the rewards
    ``beta * (logps - ref_logps)``; ``use_ref_model=False``: reference log-probs 0. ``average_log_prob``:
    sequence log-probs are per-token means (policy and reference alike)."""

    def __init__(
        self,
        ignore_index: int = -100,
        beta: float = 0.1,
        compiled: bool = True,
        use_ref_model: bool = False,
        average_log_prob: bool = False,
        chunk_size: int = 1,
    ) -> None:
        super().__init__()
        self.ignore_index, self.beta, self.use_ref_model = ignore_index, beta, use_ref_model
        self.average_log_prob = average_log_prob

    def forward(
        self,
        _input: torch.Tensor,
        lin_weight: torch.Tensor,
        target: torch.Tensor,
        bias: torch.Tensor | None = None,
        preference_labels: torch.Tensor | None = None,
        ref_input: torch.Tensor | None = None,
        ref_weight: torch.Tensor | None = None,
        ref_bias: torch.Tensor | None = None,
        kl: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        from liger_core.losses import fused_linear_kto_loss

        if preference_labels is None:
            raise ValueError("preference_labels is required (a bool tensor, True for desirable rows)")
        ref = _ref_hidden(self.use_ref_model, ref_input, ref_weight, ref_bias)
        labels = preference_labels.bool()
        average = self.average_log_prob
        seq, logit_mean, _, _ = _sequence_stats(_input, lin_weight, bias, target, self.ignore_index, average)
        if self.use_ref_model:
            ref_seq = _sequence_stats(ref_input, ref_weight, ref_bias, target, self.ignore_index, average)[0]
        else:
            ref_seq = torch.zeros_like(seq)
            ref = dict(ref_logps=ref_seq)
        loss, _ = fused_linear_kto_loss(
            _input,
            lin_weight,
            target,
            labels,
            bias,
            **ref,
            kl=kl,
            beta=self.beta,
            ignore_index=self.ignore_index,
            average_log_prob=average,
        )
        logit_sum = logit_mean * (target.shape[-1] * lin_weight.shape[0])
        rewards = self.beta * (seq - ref_seq)
        aux = (
            seq[labels].sum(),
            seq[~labels].sum(),
            logit_sum[labels].sum(),
            logit_sum[~labels].sum(),
            rewards[labels].sum(),
            rewards[~labels].sum(),
        )
        return loss, aux


class LigerFusedLinearGRPOLoss(nn.Module):
    """GRPO and its variants (``liger_core.losses.LigerFusedLinearGRPOLoss``, TRL's formulas) with
    Liger-Kernel's parameters. ``forward(_input, lin_weight, selected_token_ids, attention_mask, advantages,
    ...)`` returns ``(loss, metrics)``, metrics ``(kl_mean, clip_ratio)`` (``kl_mean`` only when ``beta !=
    0``, 0 with ``use_ref_model=False``; ``clip_ratio``: the share of completion tokens whose ratio was
    clipped in the direction of their advantage, token-weighted: at sequence level a completion's clipping
    counts once per completion token, as Liger-Kernel counts it). ``use_ref_model=False`` drops the KL term
    (beta 0); ``vllm_is_ratio`` is TRL's ``importance_sampling_ratio``. Known difference from Liger-Kernel
    0.8.5: ``loss_type="luspo"`` is normalised as TRL 1.16 does (``liger_core.losses.grpo``)."""

    def __init__(
        self,
        beta: float = 0.04,
        compiled: bool = True,
        use_ref_model: bool = True,
        chunk_size: int = 1,
        epsilon_low: float = 0.2,
        epsilon_high: float = 0.2,
        loss_type: str = "dapo",
        max_completion_length: int | None = None,
        importance_sampling_level: str = "token",
        sapo_temperature_pos: float = 1.0,
        sapo_temperature_neg: float = 1.05,
        temperature: float = 1.0,
        delta: float | None = None,
        use_bias_correction_kl: bool = False,
        vespo_k_pos: float = 2.0,
        vespo_lambda_pos: float = 3.0,
        vespo_k_neg: float = 3.0,
        vespo_lambda_neg: float = 2.0,
    ) -> None:
        super().__init__()
        from liger_core.losses import LigerFusedLinearGRPOLoss as Core
        from liger_core.losses import grpo_options

        self.beta = beta if use_ref_model else 0.0
        self.reports_kl = (
            beta != 0.0
        )  # Liger-Kernel lists the KL metric for beta != 0 (0 without a reference)
        self.use_ref_model = use_ref_model
        options = grpo_options(
            beta=self.beta,
            epsilon_low=epsilon_low,
            epsilon_high=epsilon_high,
            delta=delta,
            loss_type=loss_type,
            importance_sampling_level=importance_sampling_level,
            use_bias_correction_kl=use_bias_correction_kl,
            max_completion_length=max_completion_length,
            sapo_temperature_pos=sapo_temperature_pos,
            sapo_temperature_neg=sapo_temperature_neg,
            vespo_k_pos=vespo_k_pos,
            vespo_lambda_pos=vespo_lambda_pos,
            vespo_k_neg=vespo_k_neg,
            vespo_lambda_neg=vespo_lambda_neg,
        )
        self.core = Core(options=options, temperature=temperature)

    def forward(
        self,
        _input: torch.Tensor,
        lin_weight: torch.Tensor,
        selected_token_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        advantages: torch.Tensor,
        bias: torch.Tensor | None = None,
        ref_per_token_logps: torch.Tensor | None = None,
        old_per_token_logps: torch.Tensor | None = None,
        ref_input: torch.Tensor | None = None,
        ref_weight: torch.Tensor | None = None,
        ref_bias: torch.Tensor | None = None,
        vllm_is_ratio: torch.Tensor | None = None,
        num_items_in_batch: Any = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        ref = _ref_hidden(self.beta != 0.0, ref_input, ref_weight, ref_bias, ref_per_token_logps)
        loss, metrics = self.core(
            _input,
            lin_weight,
            selected_token_ids,
            bias,
            advantages=advantages,
            completion_mask=attention_mask,
            old_per_token_logps=old_per_token_logps,
            ref_per_token_logps=ref_per_token_logps if self.beta != 0.0 else None,
            num_items_in_batch=num_items_in_batch,
            importance_sampling_ratio=vllm_is_ratio,
            **ref,
        )
        # the clipped share: the ratio clipped against the advantage's sign (CISPO: the capped share); the
        # losses without clipping (sapo, vespo) report 0, as Liger-Kernel does
        zero = loss.new_zeros(()).detach()
        clip = metrics.get("clip_ratio", metrics.get("cispo_clip_ratio"))
        clip = zero if clip is None else clip
        out = ([metrics.get("kl", zero)] if self.reports_kl else []) + [clip]
        return loss, tuple(out)


class _DistillBase(nn.Module):
    """Liger-Kernel's distillation constructor and ``forward`` arguments; ``_loss`` computes the loss."""

    def __init__(
        self,
        weight_hard_loss: float = 0.5,
        weight_soft_loss: float = 0.5,
        beta: float = 0.5,
        ignore_index: int = -100,
        temperature: float = 1.0,
        compiled: bool = True,
        chunk_size: int = 1024,
        return_soft_hard_loss: bool = False,
    ) -> None:
        super().__init__()
        self.weight_hard_loss, self.weight_soft_loss = weight_hard_loss, weight_soft_loss
        self.beta, self.ignore_index, self.temperature = beta, ignore_index, temperature
        self.return_soft_hard_loss = return_soft_hard_loss
        self._setup()

    def _setup(self) -> None:
        """Construction-time work of a subclass (after the options are stored)."""

    def _loss(self, *args: Any) -> Any:
        raise NotImplementedError

    def forward(
        self,
        student_input: torch.Tensor,
        student_weight: torch.Tensor,
        teacher_input: torch.Tensor,
        teacher_weight: torch.Tensor,
        true_labels: torch.Tensor,
        student_bias: torch.Tensor | None = None,
        teacher_bias: torch.Tensor | None = None,
    ) -> Any:
        return self._loss(
            student_input,
            student_weight,
            teacher_input,
            teacher_weight,
            true_labels,
            student_bias,
            teacher_bias,
        )


class LigerFusedLinearJSDLoss(_DistillBase):
    """Distillation: ``weight_hard_loss * CE(student, true_labels) + weight_soft_loss * JSD_beta(student,
    teacher)`` at ``temperature`` (both means over the tokens whose label is not ``ignore_index``), on
    ``liger_core.ops.fused_linear_cross_entropy`` and ``liger_core.ops.fused_linear_jsd`` (``beta`` as there).
    ``return_soft_hard_loss``: ``(loss, soft_loss, hard_loss)``. ``student_bias`` / ``teacher_bias``: the
    lm_heads' biases (the student's in both terms)."""

    def _loss(
        self, student_input: torch.Tensor, student_weight: torch.Tensor, teacher_input: torch.Tensor,
        teacher_weight: torch.Tensor, true_labels: torch.Tensor, student_bias: Any, teacher_bias: Any,
    ) -> Any:  # fmt: skip
        from liger_core.ops import fused_linear_cross_entropy, fused_linear_jsd

        labels = true_labels.reshape(-1)
        student = student_input.reshape(-1, student_input.shape[-1])
        teacher = teacher_input.reshape(-1, teacher_input.shape[-1])
        hard = fused_linear_cross_entropy(
            student, student_weight, labels, student_bias, ignore_index=self.ignore_index
        )
        soft = fused_linear_jsd(
            student,
            student_weight,
            teacher,
            teacher_weight,
            labels,
            beta=self.beta,
            ignore_index=self.ignore_index,
            temperature=self.temperature,
            student_bias=student_bias,
            teacher_bias=teacher_bias,
        )
        loss = self.weight_hard_loss * hard + self.weight_soft_loss * soft
        return (loss, soft, hard) if self.return_soft_hard_loss else loss


class LigerFusedLinearCosineSimilarityLoss(_DistillBase):
    """Distillation: ``weight_hard_loss * CE(student, true_labels) + weight_soft_loss * beta * mean(1 -
    cos(student logits, teacher logits))`` over the tokens whose label is not ``ignore_index``
    (``liger_core.losses.LigerFusedLinearCosineSimilarityLoss``); ``return_soft_hard_loss``: ``(loss,
    soft_loss, hard_loss)``. Where a logit vector is all zeros its gradient is 0 (Liger-Kernel's clamped
    normalisation gives one of order 1e20 there)."""

    def _setup(self) -> None:
        core = liger_core_name(
            "losses", "LigerFusedLinearCosineSimilarityLoss", "LigerFusedLinearCosineSimilarityLoss"
        )
        # built here so that bad options raise at construction, as Liger-Kernel's do
        self.core = core(
            weight_hard_loss=self.weight_hard_loss,
            weight_soft_loss=self.weight_soft_loss,
            beta=self.beta,
            ignore_index=self.ignore_index,
            temperature=self.temperature,
            return_soft_hard_loss=self.return_soft_hard_loss,
        )

    def _loss(self, *args: Any) -> Any:
        return self.core(*args)


__all__ = [
    "LigerFusedLinearCPOLoss",
    "LigerFusedLinearCosineSimilarityLoss",
    "LigerFusedLinearDPOLoss",
    "LigerFusedLinearGRPOLoss",
    "LigerFusedLinearJSDLoss",
    "LigerFusedLinearKTOLoss",
    "LigerFusedLinearORPOLoss",
    "LigerFusedLinearSimPOLoss",
]

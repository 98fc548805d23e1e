"""Liger-Kernel's ``liger_kernel.transformers.functional``: its ``liger_*`` functions with its parameters,
backed by ``liger_core.ops``.

The functions liger_core has no op for raise ``NotImplementedError`` naming them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from liger_core.compat.liger_kernel._lazy import missing, takes


@dataclasses.dataclass
class CrossEntropyOutput:
    """What the cross-entropy entry points return when an extra output is asked for (Liger-Kernel's
    structure): the loss, and ``z_loss`` / ``token_accuracy`` / ``predicted_tokens`` where asked for."""

    loss: torch.Tensor
    z_loss: torch.Tensor | None = None
    token_accuracy: torch.Tensor | None = None
    predicted_tokens: torch.Tensor | None = None


def _ops() -> Any:
    import liger_core.ops as ops

    return ops


def _extra_outputs(function: Any, what: str, **flags: bool) -> dict[str, bool]:
    """The extra-output flags that are on, passed on where the liger_core entry point takes them."""
    on = {name: value for name, value in flags.items() if value}
    for name in on:
        if not takes(function, name):
            raise missing(f"{what}({name}=True)")
    return on


def _pack(result: Any, return_z_loss: bool, extra: dict[str, bool]) -> Any:
    """Liger-Kernel's return structure: the loss alone, or a ``CrossEntropyOutput``."""
    if not return_z_loss and not extra:
        return result
    if isinstance(result, CrossEntropyOutput):
        return result
    if hasattr(result, "token_accuracy"):  # liger_core's CrossEntropyOutput (a named tuple): same fields
        return CrossEntropyOutput(
            loss=result.loss,
            z_loss=result.z_loss,
            token_accuracy=result.token_accuracy,
            predicted_tokens=result.predicted_tokens,
        )
    parts = list(result) if isinstance(result, tuple) else [result]
    out = CrossEntropyOutput(loss=parts.pop(0))
    if return_z_loss:
        out.z_loss = parts.pop(0)
    for name in ("return_token_accuracy", "return_predicted_tokens"):
        if name in extra:
            setattr(out, name.removeprefix("return_"), parts.pop(0))
    return out


def _reduction(size_average: Any, reduce: Any, reduction: str) -> str:
    if size_average is None and reduce is None:
        return reduction
    from torch.nn import _reduction

    return _reduction.legacy_get_string(size_average, reduce, emit_warning=False)


def liger_cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    return_z_loss: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
) -> Any:
    """``liger_core.ops.cross_entropy`` (``size_average``/``reduce``: torch's legacy reduction arguments)."""
    ops = _ops()
    extra = _extra_outputs(
        ops.cross_entropy,
        "liger_cross_entropy",
        return_token_accuracy=return_token_accuracy,
        return_predicted_tokens=return_predicted_tokens,
    )
    result = ops.cross_entropy(
        input,
        target,
        weight=weight,
        ignore_index=ignore_index,
        reduction=_reduction(size_average, reduce, reduction),
        label_smoothing=label_smoothing,
        lse_square_scale=lse_square_scale,
        softcap=softcap,
        return_z_loss=return_z_loss,
        **extra,
    )
    return _pack(result, return_z_loss, extra)


def liger_fused_linear_cross_entropy(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ce_weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    lse_square_scale: float = 0.0,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    softcap: float | None = None,
    return_z_loss: bool = False,
    accum_dtype: torch.dtype | None = None,
    use_token_scaling: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    chunk_mem_const: int = 1,
) -> Any:
    """``liger_core.ops.fused_linear_cross_entropy``. ``chunk_mem_const`` (Liger-Kernel's chunk-size knob) is
    accepted and unused: liger_core sizes its chunks itself (``liger_core.tuning``)."""
    ops = _ops()
    extra = _extra_outputs(
        ops.fused_linear_cross_entropy,
        "liger_fused_linear_cross_entropy",
        use_token_scaling=use_token_scaling,
        return_token_accuracy=return_token_accuracy,
        return_predicted_tokens=return_predicted_tokens,
    )
    result = ops.fused_linear_cross_entropy(
        input,
        weight,
        target,
        bias,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
        lse_square_scale=lse_square_scale,
        softcap=softcap,
        return_z_loss=return_z_loss,
        ce_weight=ce_weight,
        accum_dtype=accum_dtype,
        **extra,
    )
    extra.pop("use_token_scaling", None)
    return _pack(result, return_z_loss, extra)


def liger_fused_linear_jsd(
    student_input: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_input: torch.Tensor,
    teacher_weight: torch.Tensor,
    shift_labels: torch.Tensor | None = None,
    jsd_beta: float = 0.5,
    ignore_index: int = -100,
    temperature: float = 1.0,
    accum_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``liger_core.ops.fused_linear_jsd`` (``jsd_beta`` is its ``beta``). liger_core accumulates in fp32,
    so ``accum_dtype`` may be None or ``torch.float32``."""
    if accum_dtype not in (None, torch.float32):
        raise missing(f"liger_fused_linear_jsd(accum_dtype={accum_dtype})", "It accumulates in float32.")
    return _ops().fused_linear_jsd(
        student_input,
        student_weight,
        teacher_input,
        teacher_weight,
        shift_labels,
        beta=jsd_beta,
        ignore_index=ignore_index,
        temperature=temperature,
    )


def liger_geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(a) * b`` (``liger_core.ops.geglu``)."""
    return _ops().geglu(a, b)


def liger_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` (``liger_core.ops.swiglu``)."""
    return _ops().swiglu(a, b)


def liger_jsd(
    input: torch.Tensor,
    target: torch.Tensor,
    shift_labels: torch.Tensor | None = None,
    beta: float = 0.5,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Generalised JSD of student log-probs ``input`` and teacher log-probs ``target``
    (``liger_core.ops.jsd``)."""
    return _ops().jsd(input, target, beta=beta, ignore_index=ignore_index, shift_labels=shift_labels)


def liger_kl_div(
    input: torch.Tensor,
    target: torch.Tensor,
    size_average: bool = True,
    reduce: bool = True,
    reduction: str = "mean",
    log_target: bool = False,
    eps: float = 1e-10,
) -> torch.Tensor:
    """``torch.nn.functional.kl_div(input, target, reduction, log_target)`` (``liger_core.ops.kl_div``).
    liger_core computes ``target * log(target)`` as 0 at ``target == 0`` (xlogy), so ``eps`` (Liger-Kernel's
    clamp of the target inside the log) is not used; ``size_average``/``reduce`` are Liger-Kernel's unused
    legacy arguments and must keep their defaults."""
    if size_average is not True or reduce is not True:
        raise TypeError("liger_kl_div: size_average and reduce are not used; pass reduction= instead")
    return _ops().kl_div(input, target, reduction=reduction, log_target=log_target)


def liger_layer_norm(X: torch.Tensor, W: torch.Tensor, B: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``liger_core.ops.layer_norm``."""
    return _ops().layer_norm(X, W, B, eps)


def liger_rms_norm(
    X: torch.Tensor,
    W: torch.Tensor,
    eps: float,
    offset: float = 0.0,
    casting_mode: str = "llama",
    in_place: bool = True,
) -> torch.Tensor:
    """``liger_core.ops.rms_norm``."""
    return _ops().rms_norm(X, W, eps, offset=offset, casting_mode=casting_mode, in_place=in_place)


def liger_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1,
    rotary_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's ``apply_rotary_pos_emb`` (``liger_core.ops.rope``). Partial rotary: liger_core rotates
    the first ``cos.shape[-1]`` features of each head, so ``rotary_dim``, if given, must equal that width."""
    if rotary_dim is not None and rotary_dim != cos.shape[-1]:
        raise ValueError(
            f"rotary_dim={rotary_dim} must equal cos.shape[-1]={cos.shape[-1]} (the rotated width)"
        )
    return _ops().rope(q, k, cos, sin, position_ids, unsqueeze_dim)


def liger_fused_add_rms_norm(
    X: torch.Tensor,
    R: torch.Tensor,
    W: torch.Tensor,
    eps: float,
    offset: float = 0.0,
    casting_mode: str = "llama",
    in_place: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``liger_core.ops.fused_add_rms_norm``: ``(RMSNorm(X + R), X + R)``. ``in_place`` (Liger-Kernel's
    choice of overwriting the output gradient in backward) is accepted and unused: the result is the same."""
    return _ops().fused_add_rms_norm(X, R, W, eps, offset=offset, casting_mode=casting_mode)


def liger_modulated_rms_norm(
    X: torch.Tensor,
    W: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor | None = None,
    eps: float = 1e-6,
    offset: float = 0.0,
    casting_mode: str = "llama",
    in_place: bool = True,
) -> torch.Tensor:
    """``liger_core.ops.modulated_rms_norm``: ``(1 + scale) * RMSNorm(X) + shift``. ``in_place`` is accepted
    and unused (as in ``liger_fused_add_rms_norm``)."""
    return _ops().modulated_rms_norm(X, W, scale, shift, eps=eps, offset=offset, casting_mode=casting_mode)


def liger_poly_norm(
    X: torch.Tensor, W: torch.Tensor, B: torch.Tensor, eps: float = 1e-6, in_place: bool = True
) -> torch.Tensor:
    """``liger_core.ops.poly_norm``. ``in_place`` is accepted and unused (as in
    ``liger_fused_add_rms_norm``)."""
    return _ops().poly_norm(X, W, B, eps=eps)


def liger_dyt(
    x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None
) -> torch.Tensor:
    """``liger_core.ops.dyt`` (dynamic tanh)."""
    return _ops().dyt(x, alpha, gamma, beta)


def liger_group_norm(
    X: torch.Tensor,
    affine_scaling_weight: torch.Tensor,
    affine_shifting_bias: torch.Tensor,
    num_channels: int,
    num_groups: int,
    eps: float,
) -> torch.Tensor:
    """``liger_core.ops.group_norm`` over ``X`` of shape ``(batch, num_channels, *)``."""
    if X.dim() < 2 or X.shape[1] != num_channels:
        raise ValueError(
            f"X must have num_channels={num_channels} channels in dim 1, got shape {tuple(X.shape)}"
        )
    return _ops().group_norm(X, num_groups, affine_scaling_weight, affine_shifting_bias, eps)


def liger_relu_squared(x: torch.Tensor) -> torch.Tensor:
    """``liger_core.ops.relu_squared``."""
    return _ops().relu_squared(x)


def liger_softmax(x: torch.Tensor) -> torch.Tensor:
    """``liger_core.ops.softmax`` (over the last dimension)."""
    return _ops().softmax(x)


def liger_sparsemax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``liger_core.ops.sparsemax``."""
    return _ops().sparsemax(input, dim=dim)


def liger_tvd(
    input: torch.Tensor,
    target: torch.Tensor,
    shift_labels: torch.Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int = -100,
) -> torch.Tensor:
    """``liger_core.ops.tvd`` (total variation distance)."""
    return _ops().tvd(
        input, target, shift_labels=shift_labels, reduction=reduction, ignore_index=ignore_index
    )


def liger_multi_token_attention(
    scores: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
    sparse: bool = False,
) -> torch.Tensor:
    """``liger_core.ops.multi_token_attention``."""
    return _ops().multi_token_attention(scores, weight, bias, stride, padding, dilation, groups, sparse)


def liger_fused_neighborhood_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kernel_size: int = 7,
    dilation: int = 1,
    scale: float | None = None,
) -> torch.Tensor:
    """``liger_core.ops.fused_neighborhood_attention``."""
    return _ops().fused_neighborhood_attention(query, key, value, kernel_size, dilation, scale)


def _not_in_liger_core(name: str):
    def function(*args: Any, **kwargs: Any) -> Any:
        raise missing(name)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = (
        f"Liger-Kernel's ``{name}``: liger_core has no equivalent (raises NotImplementedError)."
    )
    return function


def liger_fused_linear_kl_div(
    student_input: torch.Tensor,
    student_weight: torch.Tensor,
    target: torch.Tensor,
    shift_labels: torch.Tensor | None = None,
    reduction: str = "batchmean",
    ignore_index: int = -100,
    temperature: float = 1.0,
    eps: float = 1e-10,
    accum_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Liger-Kernel's fused-linear KL divergence against a teacher *probability* tensor ``target``.
    liger_core's ``liger_core.ops.fused_linear_kl_div`` fuses the teacher's lm_head as well (it takes the
    teacher's hidden states and weight), so this signature has no liger_core backing: raises
    ``NotImplementedError``."""
    raise missing(
        "liger_fused_linear_kl_div(target=<teacher probabilities>)",
        "(liger_core.ops.fused_linear_kl_div takes the teacher's hidden states and lm_head weight instead)",
    )


# Liger-Kernel functions liger_core has no op for.
NOT_IN_LIGER_CORE = (
    "liger_attn_res",
    "liger_fused_linear_scaled_cross_entropy_tp",
    "liger_mhc_apply",
    "liger_mhc_coeffs",
    "liger_mhc_forward",
    "liger_mhc_post_res",
    "liger_mhc_pre",
    "liger_qwen2vl_mrope",
)
for _name in NOT_IN_LIGER_CORE:
    globals()[_name] = _not_in_liger_core(_name)
del _name

__all__ = [
    "CrossEntropyOutput",
    "liger_cross_entropy",
    "liger_dyt",
    "liger_fused_add_rms_norm",
    "liger_fused_linear_cross_entropy",
    "liger_fused_linear_jsd",
    "liger_fused_linear_kl_div",
    "liger_fused_neighborhood_attention",
    "liger_geglu",
    "liger_group_norm",
    "liger_jsd",
    "liger_kl_div",
    "liger_layer_norm",
    "liger_modulated_rms_norm",
    "liger_multi_token_attention",
    "liger_poly_norm",
    "liger_relu_squared",
    "liger_rms_norm",
    "liger_rope",
    "liger_softmax",
    "liger_sparsemax",
    "liger_swiglu",
    "liger_tvd",
    *NOT_IN_LIGER_CORE,
]

"""Gated RMSNorm over the last dimension (or groups of it): ``y = norm(x) * (offset + w) * act(gate)`` or,
with ``norm_before_gate=False``, ``y = norm(x * act(gate)) * (offset + w)``, rounded as HF does
(``casting_mode``).

Math (per row and group of n = group_size columns; fp32 inside the kernels, row statistics in fp64 for fp32
data; ``a = act(gate)``, ``a' = act'(gate)``, ``W = offset + w``)::

    h    = x                   (norm_before_gate)      h = x * a       (gate before the norm)
    rstd = 1 / sqrt(sum(h**2) / n + eps)               (the only per-row-and-group value saved for backward)
    hn   = h * rstd
    y    = hn * W * a          (norm_before_gate)      y = hn * W      (gate before the norm)
           "llama": hn is rounded to x's dtype before the weight, and for a weight of x's 16-bit dtype the
           product hn * W too (HF multiplies in that dtype); "gemma": one rounding, of y
    g    = dy * a * W          (norm_before_gate)      g = dy * W
    dh   = rstd * (g - hn * sum(g * hn) / n)
    dx   = dh                  (norm_before_gate)      dx = dh * a
    dgate = dy * hn * W * a'   (norm_before_gate)      dgate = dh * x * a'
    dw   = sum over rows of g / W * hn                 (dy * a * hn, or dy * hn)

with ``silu' = s + g * s * (1 - s)`` and ``sigmoid' = s * (1 - s)`` (``s = sigmoid(gate)``, evaluated through
``_activation_math``'s overflow-free ``sigmoid(-|gate|)``).

The reference implementation (HF's code, bit for bit) is ``liger_core.reference.rms_norm_gated``; its module
doc lists the HF class each (casting_mode, norm_before_gate, activation) setting reproduces.

Grid: forward, one program per block of rows and per group; backward, a persistent grid (a few programs per
SM, each looping over a contiguous block of rows) per group, accumulating dw in fp32 registers (Kahan for fp32
data) and writing one partial row of it per program, summed afterwards (no atomics). A group is held in
registers whole (up to 65536 columns; past ~16384 the backward spills, still exact).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core import reference, tuning
from liger_core.dispatch import (
    check_choice,
    check_same_device,
    check_shape,
    check_tensor,
    launcher,
    use_triton,
)
from liger_core.ops import _launch
from liger_core.ops._activation_math import sigmoid_from_m, sigmoid_of_minus_abs, times_sigmoid
from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import cdiv, next_power_of_2, persistent_grid
from liger_core.ops._norm_math import (
    accumulate,
    as_shape,
    inv_sqrt_mean,
    partials_buffer,
    rows_view,
    store_lane_sums,
    store_tile,
    sum_partials,
    widen,
)
from liger_core.reference.rms_norm_gated import ACTIVATIONS, CASTING_MODES, output_dtype
from liger_core.sharding import any_dtensor, check_not_zero3_partitioned, is_dtensor

# PRECISE (constexpr, set for fp32 data): the row statistics in fp64 and dw Kahan-compensated (as rms_norm).


@triton.jit
def _activation(g, SIGMOID: tl.constexpr):
    """(act(g), act'(g)) in fp32: silu or sigmoid, with torch's values at +-inf."""
    m = sigmoid_of_minus_abs(g)  # sigmoid(-|g|): s and 1 - s are m and 1 - m
    if SIGMOID:
        a = sigmoid_from_m(g, m)
        da = m * (1.0 - m)
    else:
        a = times_sigmoid(g, m)
        da = sigmoid_from_m(g, m) + g * (m * (1.0 - m))
    return a, da


@fast_launch
@triton.jit
def _rms_norm_gated_fwd_kernel(
    x_ptr,
    gate_ptr,
    w_ptr,
    y_ptr,
    rstd_ptr,
    n_rows,
    group_size,
    x_row_stride,
    gate_row_stride,
    y_row_stride,
    eps,
    offset,
    NORM_BEFORE_GATE: tl.constexpr,
    SIGMOID: tl.constexpr,
    ROUND_NORMED: tl.constexpr,  # "llama": hn rounded to x's dtype before the weight
    ROUND_PRODUCT: tl.constexpr,  # "llama" with w of x's 16-bit dtype: hn * W rounded to that dtype
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISE: tl.constexpr,
):
    # int64 row indices: rows * stride passes 2^31 for long sequences x wide hidden sizes
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    group = tl.program_id(1)
    n_groups = tl.num_programs(1)
    row_mask = rows < n_rows
    cols = group * group_size + tl.arange(0, BLOCK_N)  # this group's columns
    col_mask = tl.arange(0, BLOCK_N) < group_size
    mask = row_mask[:, None] & col_mask[None, :]
    x_dtype = x_ptr.dtype.element_ty

    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + rows[:, None] * gate_row_stride + cols[None, :], mask=mask, other=0.0)
    a, _ = _activation(g.to(tl.float32), SIGMOID)
    if NORM_BEFORE_GATE:
        h = x
    else:
        h = x * a
    h_wide = widen(h, PRECISE)
    rstd = inv_sqrt_mean(tl.sum(h_wide * h_wide, axis=1), group_size, eps)
    tl.store(rstd_ptr + rows * n_groups + group, rstd, mask=row_mask)

    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
    hn = h * rstd[:, None]
    if ROUND_NORMED:
        hn = hn.to(x_dtype).to(tl.float32)
    y = hn * w[None, :]
    if ROUND_PRODUCT:
        y = y.to(x_dtype).to(tl.float32)
    if NORM_BEFORE_GATE:
        y = y * a
    store_tile(y_ptr, rows, cols, y_row_stride, y, mask)


@fast_launch
@triton.jit
def _rms_norm_gated_bwd_kernel(
    dy_ptr,
    x_ptr,
    gate_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    dgate_ptr,
    dw_partial_ptr,
    n_rows,
    n_cols,
    group_size,
    dy_row_stride,
    x_row_stride,
    gate_row_stride,
    dx_row_stride,
    dgate_row_stride,
    offset,
    tiles_per_program,
    NORM_BEFORE_GATE: tl.constexpr,
    SIGMOID: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    n_groups = tl.num_programs(1)
    cols = group * group_size + tl.arange(0, BLOCK_N)
    col_mask = tl.arange(0, BLOCK_N) < group_size
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
    # dw accumulates per row lane over this program's tiles; the BLOCK_M lanes are summed once at the end
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    dw_comp = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    rows = pid * tiles_per_program * BLOCK_M + tl.arange(0, BLOCK_M)
    for _ in range(0, tiles_per_program):
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + cols[None, :], mask=mask, other=0.0)
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0)
        g = tl.load(gate_ptr + rows[:, None] * gate_row_stride + cols[None, :], mask=mask, other=0.0)
        dy = dy.to(tl.float32)
        x = x.to(tl.float32)
        a, da = _activation(g.to(tl.float32), SIGMOID)
        rstd = tl.load(rstd_ptr + rows * n_groups + group, mask=row_mask, other=0.0)
        if NORM_BEFORE_GATE:
            hn = x * rstd[:, None]
            dy_a = dy * a  # the gradient reaching hn * W
            dw_term = dy_a * hn
            gw = dy_a * w[None, :]
            dgate = dy * hn * w[None, :] * da
        else:
            hn = x * a * rstd[:, None]
            dw_term = dy * hn
            gw = dy * w[None, :]
        mean_ghn = tl.sum(gw * hn, axis=1) / group_size
        dh = rstd[:, None] * (gw - hn * mean_ghn[:, None])
        if NORM_BEFORE_GATE:
            dx = dh
        else:
            dx = dh * a
            dgate = dh * x * da
        dw_acc, dw_comp = accumulate(dw_acc, dw_comp, dw_term, PRECISE)
        if PRECISE:
            # an infinite gate makes an infinite dw term: no rounding error to carry (inf - inf would be NaN)
            dw_comp = tl.where(tl.abs(dw_acc) < float("inf"), dw_comp, 0.0)
        store_tile(dx_ptr, rows, cols, dx_row_stride, dx, mask)
        store_tile(dgate_ptr, rows, cols, dgate_row_stride, dgate, mask)
        rows += BLOCK_M
    store_lane_sums(dw_partial_ptr + pid * n_cols, cols, dw_acc, dw_comp, col_mask, PRECISE)


def _tile(group_size: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): whole groups of BLOCK_N (padded) columns, several rows per tile for
    short groups (the rms_norm tile size and elements per thread)."""
    block_n = next_power_of_2(group_size)
    block_m = max(1, tuning.NORM_TILE_ELEMENTS // block_n)
    warps = min(32, max(4, block_m * block_n // (32 * tuning.NORM_FWD_ELEMENTS_PER_THREAD)))
    return block_m, block_n, warps


# Kernel launchers are torch.library custom ops (with fake implementations) so torch.compile traces a patched
# model through them without graph breaks; in eager mode the autograd Function calls the plain
# implementations (``dispatch.launcher``). Inputs arrive as 2-D rows with unit column stride, w contiguous.
def _rms_norm_gated_fwd_impl(
    x: torch.Tensor,
    gate: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    offset: float,
    group_size: int,
    activation: str,
    casting_mode: str,
    norm_before_gate: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, n_cols = x.shape
    n_groups = n_cols // group_size
    y_dtype = output_dtype(x.dtype, w.dtype, casting_mode, norm_before_gate)
    y = torch.empty((n_rows, n_cols), dtype=y_dtype, device=x.device)
    rstd = torch.empty((n_rows, n_groups), dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, rstd
    block_m, block_n, warps = _tile(group_size)
    llama = casting_mode == "llama"
    _rms_norm_gated_fwd_kernel[(cdiv(n_rows, block_m), n_groups)](
        x, gate, w, y, rstd, n_rows, group_size, x.stride(0), gate.stride(0), y.stride(0), eps, offset,
        NORM_BEFORE_GATE=norm_before_gate, SIGMOID=activation == "sigmoid", ROUND_NORMED=llama,
        ROUND_PRODUCT=llama and w.dtype == x.dtype and x.dtype != torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, PRECISE=x.dtype == torch.float32, num_warps=warps,
    )  # fmt: skip
    return y, rstd


def _rms_norm_gated_bwd_impl(
    dy: torch.Tensor,
    x: torch.Tensor,
    gate: torch.Tensor,
    w: torch.Tensor,
    rstd: torch.Tensor,
    offset: float,
    group_size: int,
    activation: str,
    norm_before_gate: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n_rows, n_cols = x.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    dgate = torch.empty((n_rows, n_cols), dtype=gate.dtype, device=x.device)
    if n_rows == 0:
        return dx, dgate, torch.zeros_like(w)
    block_m, block_n, warps = _tile(group_size)
    programs, tiles_per_program = persistent_grid(
        x.device, cdiv(n_rows, block_m), tuning.NORM_BWD_PROGRAMS_PER_SM
    )
    precise = x.dtype == torch.float32
    partials = partials_buffer(x, (programs, n_cols))
    _rms_norm_gated_bwd_kernel[(programs, n_cols // group_size)](
        dy, x, gate, w, rstd, dx, dgate, partials, n_rows, n_cols, group_size, dy.stride(0), x.stride(0),
        gate.stride(0), dx.stride(0), dgate.stride(0), offset, tiles_per_program,
        NORM_BEFORE_GATE=norm_before_gate, SIGMOID=activation == "sigmoid", BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISE=precise, num_warps=warps,
    )  # fmt: skip
    return dx, dgate, sum_partials(partials, w.dtype)


_rms_norm_gated_fwd = torch.library.custom_op(
    "liger_core::rms_norm_gated_fwd", _rms_norm_gated_fwd_impl, mutates_args=()
)
_rms_norm_gated_bwd = torch.library.custom_op(
    "liger_core::rms_norm_gated_bwd", _rms_norm_gated_bwd_impl, mutates_args=()
)


@_rms_norm_gated_fwd.register_fake
def _(x, gate, w, eps, offset, group_size, activation, casting_mode, norm_before_gate):
    y = x.new_empty(x.shape, dtype=output_dtype(x.dtype, w.dtype, casting_mode, norm_before_gate))
    return y, x.new_empty((x.shape[0], x.shape[1] // group_size), dtype=torch.float32)


@_rms_norm_gated_bwd.register_fake
def _(dy, x, gate, w, rstd, offset, group_size, activation, norm_before_gate):
    return x.new_empty(x.shape), gate.new_empty(gate.shape), torch.empty_like(w)


class RMSNormGatedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate, w, eps, offset, group_size, activation, casting_mode, norm_before_gate):
        x2d, gate2d = rows_view(x), rows_view(gate)
        fwd = launcher(_rms_norm_gated_fwd, _rms_norm_gated_fwd_impl)
        y, rstd = fwd(x2d, gate2d, w, eps, offset, group_size, activation, casting_mode, norm_before_gate)
        ctx.save_for_backward(x2d, gate2d, w, rstd)
        ctx.options = (offset, group_size, activation, norm_before_gate)
        ctx.x_shape = x.shape
        return as_shape(y, x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2d, gate2d, w, rstd = ctx.saved_tensors
        bwd = launcher(_rms_norm_gated_bwd, _rms_norm_gated_bwd_impl)
        dx, dgate, dw = bwd(rows_view(dy), x2d, gate2d, w, rstd, *ctx.options)
        return as_shape(dx, ctx.x_shape), as_shape(dgate, ctx.x_shape), dw, None, None, None, None, None, None


def rms_norm_gated(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    activation: str = "silu",
    casting_mode: str = "llama",
    offset: float = 0.0,
    norm_before_gate: bool = True,
    group_size: int | None = None,
) -> torch.Tensor:
    """Gated RMSNorm of ``x`` over its last dimension (module doc), rounded as HF does.

    Args:
        x: ``(..., n)``; any strides (rows without unit column stride are copied).
        gate: the shape of ``x``, any float dtype (its gradient has its dtype).
        weight: ``(n,)``, used as ``offset + weight``.
        activation: "silu" or "sigmoid", applied to ``gate`` in fp32.
        casting_mode: "llama" (the normalised value is rounded to x's dtype before the weight; Qwen3-Next,
            Qwen3.5, OlmoHybrid, and Mamba2-style norms) or "gemma" (fp32 throughout, one final rounding;
            KimiLinear, BailingHybrid, FalconH1).
        norm_before_gate: True: ``norm(x) * W * act(gate)``; False (Mamba2, FalconH1's option):
            ``norm(x * act(gate)) * W``.
        group_size: normalise each consecutive group of this many features separately (Mamba2's
            ``group_size``, FalconH1's ``n / n_groups``); default ``n`` (one group).

    Returns:
        ``y`` of x's shape and HF's dtype: x's, except ``promote_types(x.dtype, weight.dtype)`` for
        "llama" with ``norm_before_gate=False`` (MambaRMSNormGated's final ``weight * ...``).
        ``liger_core.reference.rms_norm_gated`` lists the HF class each setting reproduces.
    """
    if is_dtensor(x) or is_dtensor(gate):
        raise TypeError("x and gate must be plain tensors (DTensor activations are not supported here)")
    if any_dtensor(weight):  # an FSDP2 weight outside its unit's forward: gather it (gradient flows back)
        weight = weight.full_tensor()
    check_not_zero3_partitioned(weight=weight)
    check_tensor("x", x, min_ndim=1)
    check_tensor("gate", gate)
    check_tensor("weight", weight, ndim=1)
    check_shape("gate", gate, tuple(x.shape), "gate must have the shape of x")
    check_shape("weight", weight, (x.shape[-1],), "weight must match the last dimension of x")
    check_same_device("x", x, gate=gate, weight=weight)
    check_choice("activation", activation, ACTIVATIONS)
    check_choice("casting_mode", casting_mode, CASTING_MODES)
    n = x.shape[-1]
    if n == 0:
        raise ValueError("x has an empty last dimension; RMSNorm needs at least one element per row")
    group_size = n if group_size is None else group_size
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0 or n % group_size:
        raise ValueError(f"group_size={group_size!r} must be a positive int dividing x.shape[-1]={n}")
    options = dict(
        activation=activation, casting_mode=casting_mode, offset=offset, norm_before_gate=norm_before_gate
    )
    if not use_triton(x):
        return reference.rms_norm_gated(x, gate, weight, eps, group_size=group_size, **options)
    if next_power_of_2(group_size) > _launch.MAX_FUSED_SIZE:
        raise ValueError(
            f"group_size={group_size} (x.shape[-1]={n} by default) exceeds the {_launch.MAX_FUSED_SIZE} "
            "columns a program holds"
        )
    if not weight.is_contiguous():
        weight = weight.contiguous()  # the kernels read it with unit stride; dw flows back through the copy
    # the Function works on rows; the caller's shape is a view taken outside it, so a model may modify the
    # output in place (a view made inside a custom Function may not be)
    y = RMSNormGatedFunction.apply(
        rows_view(x), rows_view(gate), weight, float(eps), float(offset), int(group_size), activation,
        casting_mode, bool(norm_before_gate),
    )  # fmt: skip
    return as_shape(y, x.shape)

"""Row math shared by the divergence losses (``jsd``, ``kl_div``, ``fused_linear_jsd``).

- Row tiling: ``row_tiles`` picks rows per program, the column step and warps for a (rows, vocab) pass;
  ``tile_rows`` / ``kept_rows`` are the in-kernel row indices and the ignore-index mask.
- ``compute_dtype``: fp32 math for 16-bit inputs, float64 for fp32 inputs, so every output of fp32 inputs is
  its exact value rounded once.
- ``exp_precise`` / ``log_precise``: exp and log to about 1 ulp in fp32 on every backend (``tl.exp`` /
  ``tl.log`` on NVIDIA GPUs are approximations several ulp off for fp32).
- ``jsd_terms``: one tile's generalised JSD loss terms and student gradient (``jsd_mode`` picks forward KL,
  reverse KL or the mixture from beta; the math is in ``ops.jsd``'s docstring).
- Host helpers: ``as_rows`` (a (rows, last dim) view with unit column stride), ``rows_along`` / ``from_rows``
  / ``apply_along_dim`` (a row-wise op along any dim), ``kept_count`` (the loss's
  divisor as a device tensor) and the argument checks the divergence ops share.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from liger_core.dispatch import (
    INDEX_DTYPES,
    check_dim,
    check_same_device,
    check_shape,
    check_tensor,
    use_triton,
)
from liger_core.ops._launch import cdiv, next_power_of_2

FORWARD_KL, REVERSE_KL, MIXTURE = 0, 1, 2


class RowTiles(NamedTuple):
    block_m: int  # rows per program
    block_n: int  # columns per step of the loop along the row
    num_warps: int

    def grid(self, n_rows: int) -> tuple[int]:
        return (cdiv(n_rows, self.block_m),)


def row_tiles(n_rows: int, n_cols: int, device: torch.device) -> RowTiles:
    """Tile shape for kernels that stream rows of ``n_cols`` elements, several short rows per program.

    A vocabulary-sized row (32k-256k) gets a program of its own, looping in 4096-column blocks; short rows
    share a program (4096-element tiles) so small vocabularies still move enough bytes per program. Under
    the CPU interpreter, whose cost is per interpreted operation, tiles are 4x larger.
    """
    tile = 4 * 4096 if device.type == "cpu" else 4096
    block_n = min(tile, next_power_of_2(max(n_cols, 1)))
    block_m = max(1, min(tile // block_n, next_power_of_2(max(n_rows, 1))))
    return RowTiles(block_m, block_n, 8 if block_m * block_n >= 2048 else 4)


@triton.jit
def tile_rows(n_rows, BLOCK_M: tl.constexpr):
    """This program's row indices (int64: row * stride can pass 2^31) and their in-range mask."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    return rows, rows < n_rows


@triton.jit
def kept_rows(labels_ptr, rows, row_mask, ignore_index, HAS_LABELS: tl.constexpr):
    """Mask of the rows that count: in range and (with labels) not labelled ignore_index."""
    keep = row_mask
    if HAS_LABELS:
        keep = row_mask & (tl.load(labels_ptr + rows, mask=row_mask, other=ignore_index) != ignore_index)
    return keep


def compute_dtype(dtype: torch.dtype) -> tl.dtype:
    """Dtype of the kernels' elementwise math: float64 for fp32 tensors, so that each fp32 output is the
    correctly rounded value of the exact one (fp32 math would leave an error of the same size as eager's,
    and which of two equally good results is closer is luck); fp32 for bf16/fp16 ones, where it is plenty."""
    return tl.float64 if dtype == torch.float32 else tl.float32


def jsd_mode(beta: float) -> int:
    return FORWARD_KL if beta == 0.0 else REVERSE_KL if beta == 1.0 else MIXTURE


@triton.jit
def exp_precise(x):
    """e^x to about 1 ulp on every backend: ``_exp_fp32`` for fp32, ``tl.exp`` (accurate there) for float64.

    On NVIDIA GPUs an fp32 ``tl.exp`` is ``ex2.approx(x * log2(e))``, whose relative error grows with |x|
    (several ulp at x = -10) and would make fp32 results less accurate than eager PyTorch's.
    """
    if x.dtype == tl.float64:
        result = tl.exp(x)
    else:
        result = _exp_fp32(x)
    return result


@triton.jit
def _exp_fp32(x):
    """Cody-Waite reduction x = k ln2 + r (k ln2_hi exact), |r| <= ln2 / 2, a degree-7 Taylor polynomial for
    e^r (truncation < 0.1 ulp) and 2^k built from its bits. Results below the smallest normal float
    (x < -87.3) are flushed to 0."""
    x = tl.where(x > 89.0, 89.0, x)  # e^89 overflows: 2^128 * p = inf, as it should (NaN passes through)
    k = tl.floor(x * 1.4426950408889634 + 0.5)
    k = tl.where(k < -126.0, -126.0, k)
    r = x - k * 0.693145751953125
    r = r - k * 1.4286068203094173e-06
    p = r * (1.0 / 5040.0) + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    two_k = ((k.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(x < -87.33654, 0.0, p * two_k)


@triton.jit
def log_precise(x):
    """ln(x) to about 1 ulp on every backend: ``_log_fp32`` for fp32 (an fp32 ``tl.log`` is lg2.approx-based
    on NVIDIA GPUs), ``tl.log`` for float64."""
    if x.dtype == tl.float64:
        result = tl.log(x)
    else:
        result = _log_fp32(x)
    return result


@triton.jit
def _log_fp32(x):
    """x = 2^e * m with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, odd
    series to s^11 (truncation < 1e-10). Zero, subnormal, negative, inf and NaN inputs go to ``tl.log``."""
    bits = x.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    m = ((bits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    big = m > 1.4142135623730951
    m = tl.where(big, m * 0.5, m)
    e = tl.where(big, e + 1, e)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = s2 * (2.0 / 11.0) + 2.0 / 9.0
    p = p * s2 + 2.0 / 7.0
    p = p * s2 + 2.0 / 5.0
    p = p * s2 + 2.0 / 3.0
    p = p * s2 + 2.0
    ef = e.to(tl.float32)
    result = ef * 0.693145751953125 + (ef * 1.4286068203094173e-06 + p * s)
    normal = (x >= 1.1754943508222875e-38) & (x < float("inf"))
    return tl.where(normal, result, tl.log(x))


@triton.jit
def jsd_terms(x, y, beta, MODE: tl.constexpr):
    """Elementwise (loss, dloss/dx) for student log-probs ``x`` and teacher log-probs ``y`` (fp32 or float64).

    The mixture's log-ratios are computed from d = x - y, never as y - log M with log M rounded on its own:
    with e = exp(-|d|) (no overflow), L = -log(beta + (1 - beta) e) when d <= 0, else -log(1 - beta + beta e),

        y - log M = L (d <= 0) or L - d,      x - log M = L + d (d <= 0) or L,

    so their error is an ulp of the (small) ratio rather than of |log M| (~10 for a large vocabulary): for a
    student close to its teacher, the case distillation converges to, this is what keeps the loss exact.
    A term whose probability is 0 is 0 (so -inf inputs and masked-off lanes loaded as -inf contribute nothing
    instead of 0 * inf = NaN); NaN inputs still give NaN, and so do +inf ones (not a probability) wherever
    the eager formula's gradient is NaN.
    """
    if MODE == 0:  # forward KL(P || Q)
        p = exp_precise(y)
        loss = tl.where(p == 0.0, 0.0, p * (y - x))
        dx = -p
    elif MODE == 1:  # reverse KL(Q || P)
        q = exp_precise(x)
        d = x - y
        loss = tl.where(q == 0.0, 0.0, q * d)
        dx = tl.where(q == 0.0, 0.0, q * (d + 1.0))
    else:
        d = x - y
        e = exp_precise(-tl.abs(d))
        student_ahead = d > 0.0
        log_ratio = -log_precise(tl.where(student_ahead, (1.0 - beta) + beta * e, beta + (1.0 - beta) * e))
        y_minus_log_m = tl.where(student_ahead, log_ratio - d, log_ratio)
        x_minus_log_m = tl.where(student_ahead, log_ratio, log_ratio + d)
        p_part = beta * exp_precise(y)
        q_part = (1.0 - beta) * exp_precise(x)
        dx = tl.where(q_part == 0.0, 0.0, q_part * x_minus_log_m)
        loss = tl.where(p_part == 0.0, 0.0, p_part * y_minus_log_m) + dx
        # dx is +-inf only for a +inf log-prob (no probability), whose eager gradient is NaN (inf * 0): made
        # NaN by adding dx * 0 (exactly dx where finite; a select here cost 1 % of the backward, H200)
        dx = dx + dx * 0.0
    return loss, dx


def kept_count(
    labels: torch.Tensor | None, ignore_index: int, n_rows: int, device: torch.device
) -> torch.Tensor:
    """Rows whose label is not ignore_index (all rows without labels), at least 1, as an fp32 0-dim device
    tensor: the loss divides by it without a host sync, and an all-ignored batch gives 0 / 1 = 0."""
    if labels is None:
        return torch.full((), max(n_rows, 1), dtype=torch.float32, device=device)
    return (labels != ignore_index).sum().clamp_min(1).to(torch.float32)


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as (rows, last dim) with unit column stride (copied only when it cannot be); any row
    stride, including 0 (rows expanded from one)."""
    rows = t.reshape(math.prod(t.shape[:-1]), t.shape[-1])  # not -1: ambiguous for an empty last dim
    return rows if rows.stride(-1) == 1 or rows.shape[-1] <= 1 else rows.contiguous()


def launch_over_rows(kernel: Any, args: tuple, n_rows: int, n_cols: int, data: torch.Tensor) -> None:
    """``kernel[grid](*args)`` over (n_rows, n_cols) row tiles (``row_tiles``), math in ``compute_dtype`` of
    ``data``'s dtype; nothing for an empty tensor."""
    if n_rows and n_cols:
        tiles = row_tiles(n_rows, n_cols, data.device)
        kernel[tiles.grid(n_rows)](
            *args, COMPUTE=compute_dtype(data.dtype),
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.num_warps,
        )  # fmt: skip


def rows_along(t: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Size]:
    """``t`` with ``dim`` moved last, as ``as_rows`` rows, and the moved shape (for ``from_rows``)."""
    moved = t.movedim(dim, -1)
    return as_rows(moved), moved.shape


def from_rows(rows: torch.Tensor, moved_shape: torch.Size, dim: int) -> torch.Tensor:
    """The inverse of ``rows_along``: contiguous rows back in the layout whose ``dim`` was moved last."""
    return rows.view(moved_shape).movedim(-1, dim)


def apply_along_dim(function: Any, fallback: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
    """The functional entry of a row-wise op along any ``dim`` (softmax, sparsemax): checks ``x`` and
    ``dim``, runs ``fallback(x, dim)`` (the reference) where Triton does not run, a 0-dim ``x`` as one row of
    one, else ``function.apply(x, dim)``."""
    check_tensor("x", x)
    dim = check_dim(dim, x.dim())
    if not use_triton(x):
        return fallback(x, dim)
    if x.dim() == 0:
        return function.apply(x.reshape(1), 0).reshape(())
    return function.apply(x, dim)


def check_temperature(temperature: object, finite: bool = True) -> float:
    """``temperature`` as a float: a positive number (``finite``: and finite), not a bool."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        ok = False
    else:
        ok = 0.0 < float(temperature) < math.inf if finite else temperature > 0
    if not ok:
        kind = "a positive finite number" if finite else "a positive number"
        raise ValueError(f"temperature={temperature!r} must be {kind}")
    return float(temperature)


def check_beta(beta: object) -> float:
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= float(beta) <= 1.0:
        raise ValueError(f"beta={beta!r} must be a number in [0, 1]")
    return float(beta)


def check_ignore_index(ignore_index: object) -> int:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    return ignore_index


def check_shift_labels(
    shift_labels: torch.Tensor | None, leading_shape: tuple[int, ...], ref_name: str, ref: torch.Tensor
) -> torch.Tensor | None:
    """Check ``shift_labels`` (shape: the inputs' leading dims, or flat); return it flat and contiguous."""
    if shift_labels is None:
        return None
    check_tensor("shift_labels", shift_labels, dtypes=INDEX_DTYPES)
    n_rows = 1
    for d in leading_shape:
        n_rows *= d
    if tuple(shift_labels.shape) != tuple(leading_shape) and tuple(shift_labels.shape) != (n_rows,):
        check_shape("shift_labels", shift_labels, leading_shape, f"one label per row of {ref_name}")
    check_same_device(ref_name, ref, shift_labels=shift_labels)
    return shift_labels.reshape(-1).contiguous()

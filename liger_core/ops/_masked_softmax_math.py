"""Row softmax over a structured mask of a (…, L, L) score matrix, shared by the attention ops
(``multi_token_attention``: causal mask; ``fused_neighborhood_attention``: a dilated band).

Rows are the flattened (…, L) query rows; row r is query i = r mod L, column j a key. Visible keys:

    CAUSAL:        j <= i
    NEIGHBORHOOD:  |j - i| <= (kernel_size // 2) * dilation  and  (j - i) mod dilation == 0

Math, per row x (scaled by ``scale`` first; float64 math for fp32 tensors, fp32 math for bf16/fp16)::

    m = max_{j visible} x_j,  s = sum_{j visible} e^(x_j - m),  y_j = e^(x_j - m) / s  (0 off the mask)
    dx_j = scale * y_j * (dy_j - sum_k dy_k y_k)   (0 off the mask)

Entries off the mask are never read into the math (a NaN or inf there changes nothing). A row whose visible
entries are all -inf (a query with nothing to attend to) gives y = 0 and dx = 0 instead of 0 / 0; a visible
+inf or NaN gives a NaN row, as eager. ``causal_fill`` writes ``value`` over the entries above the diagonal
(col > row) of each (…, R, C) matrix and copies the rest.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core.ops._divergence_math import compute_dtype, exp_precise, row_tiles, tile_rows

CAUSAL, NEIGHBORHOOD = 0, 1
_MAX_START = tl.constexpr(-3.4028234663852886e38)


@triton.jit
def _visible(q, offsets, n_cols, half_span, dilation, MASK: tl.constexpr):
    """(rows, cols) mask of the keys query ``q`` attends to (the module doc)."""
    j = offsets[None, :]
    i = q[:, None]
    inside = j < n_cols
    if MASK == 0:
        vis = inside & (j <= i)
    else:
        d = j - i
        vis = inside & (d <= half_span) & (d >= -half_span) & ((d % dilation) == 0)
    return vis


@triton.jit
def _masked_softmax_fwd_kernel(
    x_ptr,
    x_row_stride,
    y_ptr,
    scale_ptr,
    n_rows,
    n_cols,
    half_span,
    dilation,
    MASK: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    q = rows % n_cols
    cols = tl.arange(0, BLOCK_N)
    scale = tl.load(scale_ptr).to(COMPUTE)
    m = tl.full([BLOCK_M], _MAX_START, dtype=COMPUTE)
    s = tl.zeros([BLOCK_M], dtype=COMPUTE)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        vis = row_mask[:, None] & _visible(q, offsets, n_cols, half_span, dilation, MASK)
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + offsets[None, :], mask=vis, other=float("-inf"))
        x = tl.where(vis, x.to(COMPUTE) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        s = s * exp_precise(m - m_new) + tl.sum(exp_precise(x - m_new[:, None]), axis=1)
        m = m_new
    # s == 0 only where every visible entry is -inf: that row is all zeros (NaN != 0 keeps NaN rows NaN)
    dead = s == 0.0
    inv = 1.0 / tl.where(dead, 1.0, s)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        inside = row_mask[:, None] & (offsets < n_cols)[None, :]
        vis = row_mask[:, None] & _visible(q, offsets, n_cols, half_span, dilation, MASK)
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + offsets[None, :], mask=vis, other=float("-inf"))
        y = exp_precise(x.to(COMPUTE) * scale - m[:, None]) * inv[:, None]
        y = tl.where(vis & ~dead[:, None], y, 0.0)
        tl.store(y_ptr + rows[:, None] * n_cols + offsets[None, :], y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _masked_softmax_bwd_kernel(
    dy_ptr,
    dy_row_stride,
    y_ptr,
    dx_ptr,
    scale_ptr,
    n_rows,
    n_cols,
    half_span,
    dilation,
    MASK: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    q = rows % n_cols
    cols = tl.arange(0, BLOCK_N)
    scale = tl.load(scale_ptr).to(COMPUTE)
    dot = tl.zeros([BLOCK_M], dtype=COMPUTE)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        vis = row_mask[:, None] & _visible(q, offsets, n_cols, half_span, dilation, MASK)
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + offsets[None, :], mask=vis, other=0.0)
        y = tl.load(y_ptr + rows[:, None] * n_cols + offsets[None, :], mask=vis, other=0.0)
        dot += tl.sum(dy.to(COMPUTE) * y.to(COMPUTE), axis=1)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        inside = row_mask[:, None] & (offsets < n_cols)[None, :]
        vis = row_mask[:, None] & _visible(q, offsets, n_cols, half_span, dilation, MASK)
        dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + offsets[None, :], mask=vis, other=0.0)
        y = tl.load(y_ptr + rows[:, None] * n_cols + offsets[None, :], mask=vis, other=0.0)
        dx = y.to(COMPUTE) * (dy.to(COMPUTE) - dot[:, None]) * scale
        dx = tl.where(vis, dx, 0.0)
        tl.store(
            dx_ptr + rows[:, None] * n_cols + offsets[None, :], dx.to(dx_ptr.dtype.element_ty), mask=inside
        )


@triton.jit
def _causal_fill_kernel(
    x_ptr,
    x_row_stride,
    out_ptr,
    n_rows,
    n_rows_per_matrix,
    n_cols,
    NEG_INF: tl.constexpr,  # fill with -inf, else with 0
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_mask = tile_rows(n_rows, BLOCK_M)
    q = rows % n_rows_per_matrix
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, n_cols, BLOCK_N):
        offsets = start + cols
        inside = row_mask[:, None] & (offsets < n_cols)[None, :]
        keep = inside & (offsets[None, :] <= q[:, None])
        x = tl.load(x_ptr + rows[:, None] * x_row_stride + offsets[None, :], mask=keep, other=0.0)
        if NEG_INF:
            out = tl.where(keep, x, float("-inf")).to(x.dtype)
        else:
            out = tl.where(keep, x, 0.0).to(x.dtype)
        tl.store(out_ptr + rows[:, None] * n_cols + offsets[None, :], out, mask=inside)


def _scale_tensor(scale: float, device: torch.device) -> torch.Tensor:
    # a float64 scalar in memory: a Python float kernel argument would be rounded to fp32
    return torch.tensor([scale], dtype=torch.float64, device=device)


def masked_softmax_fwd(x: torch.Tensor, scale: float, mask: int, half_span: int = 0, dilation: int = 1):
    """Masked softmax of each row of a (rows, L) tensor with unit column stride (rows = (…) * L); a
    contiguous result in x's dtype."""
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows and n_cols:
        tiles = row_tiles(n_rows, n_cols, x.device)
        _masked_softmax_fwd_kernel[tiles.grid(n_rows)](
            x, x.stride(0), y, _scale_tensor(scale, x.device), n_rows, n_cols, half_span, dilation,
            MASK=mask, COMPUTE=compute_dtype(x.dtype),
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.num_warps,
        )  # fmt: skip
    return y


def masked_softmax_bwd(
    dy: torch.Tensor, y: torch.Tensor, scale: float, mask: int, half_span: int = 0, dilation: int = 1
) -> torch.Tensor:
    """dx of ``masked_softmax_fwd`` from its saved contiguous output y and a unit-column-stride dy."""
    n_rows, n_cols = y.shape
    dx = torch.empty_like(y)
    if n_rows and n_cols:
        tiles = row_tiles(n_rows, n_cols, y.device)
        _masked_softmax_bwd_kernel[tiles.grid(n_rows)](
            dy, dy.stride(0), y, dx, _scale_tensor(scale, y.device), n_rows, n_cols, half_span, dilation,
            MASK=mask, COMPUTE=compute_dtype(y.dtype),
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.num_warps,
        )  # fmt: skip
    return dx


def causal_fill(x: torch.Tensor, n_rows_per_matrix: int, fill: float) -> torch.Tensor:
    """A contiguous copy of a (rows, C) unit-column-stride tensor (rows = (…) * R) with ``fill`` (0 or
    -inf) above each (R, C) matrix's diagonal."""
    if fill not in (0.0, float("-inf")):
        raise ValueError(f"fill must be 0 or -inf, got {fill}")
    n_rows, n_cols = x.shape
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows and n_cols:
        tiles = row_tiles(n_rows, n_cols, x.device)
        _causal_fill_kernel[tiles.grid(n_rows)](
            x, x.stride(0), out, n_rows, n_rows_per_matrix, n_cols, NEG_INF=fill != 0.0,
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.num_warps,
        )  # fmt: skip
    return out

"""Row-normalisation pieces shared by the norm ops (RMSNorm, gated RMSNorm, LayerNorm): the precision helpers
of the row statistics, the tile loads and stores, the persistent backward's tile pipeline and dW/dB partial
rows (in registers, or in global memory for rows wider than a tile), the sum of those partial rows, and the
host-side buffers and (rows, hidden) views. The Triton helpers are inlined: a kernel that calls them compiles
to the same code as one that spells them out.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from liger_core.ops._fastlaunch import fast_launch
from liger_core.ops._launch import cdiv

# PRECISE (constexpr, set for fp32 data): fp32 arithmetic alone would make our error comparable to eager's,
# so the row statistics (sums, mean, rstd) are computed in fp64 and the dW/dB accumulators are Kahan
# compensated. For bf16/fp16 data the final rounding dominates by ~2^16: plain fp32 (fewer registers).


@triton.jit
def widen(x, PRECISE: tl.constexpr):
    """``x`` (fp32) in the precision of the row statistics: fp64 when PRECISE."""
    # one return: the compiler types every return statement, even in a branch it drops
    if PRECISE:
        wide = x.to(tl.float64)
    else:
        wide = x
    return wide


@triton.jit
def inv_sqrt_mean(sum_sq, n_cols, eps):
    """``1 / sqrt(sum_sq / n_cols + eps)`` per row, as fp32 (``sum_sq`` from ``widen``-ed values)."""
    return (1.0 / tl.sqrt(sum_sq / n_cols + eps)).to(tl.float32)


@triton.jit
def accumulate(acc, comp, value, PRECISE: tl.constexpr):
    """``acc += value``; Kahan-compensated when PRECISE (the sum is then ``acc - comp``, to about fp32
    precision however many rows a program adds up)."""
    if PRECISE:
        corrected = value - comp
        total = acc + corrected
        comp = (total - acc) - corrected
        acc = total
    else:
        acc += value
    return acc, comp


@triton.jit
def load_tiles(dy_ptr, x_ptr, rows, cols, dy_row_stride, x_row_stride, mask):
    """The (dy, x) tiles of ``rows`` x ``cols`` (int64 rows), in their storage dtype."""
    dy = tl.load(dy_ptr + rows[:, None] * dy_row_stride + cols[None, :], mask=mask, other=0.0)
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0)
    return dy, x


@triton.jit
def reload_tiles(dy_ptr, x_ptr, rows, cols, dy_row_stride, x_row_stride, mask):
    """``load_tiles`` again, for a tile just read: evict-first, which also keeps the compiler from merging it
    with the first load (a string constexpr default argument does not compile in Triton 3.6)."""
    dy_tile = dy_ptr + rows[:, None] * dy_row_stride + cols[None, :]
    dy = tl.load(dy_tile, mask=mask, other=0.0, eviction_policy="evict_first")
    x = tl.load(
        x_ptr + rows[:, None] * x_row_stride + cols[None, :],
        mask=mask,
        other=0.0,
        eviction_policy="evict_first",
    )
    return dy, x


@triton.jit
def row_block(x_ptr, y_ptr, n_rows, x_row_stride, y_row_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A forward program's block of BLOCK_M rows: (rows, row mask, columns of a tile, x and y row starts)."""
    # int64 row indices: rows * stride passes 2^31 for long sequences x wide hidden sizes
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    cols = tl.arange(0, BLOCK_N)
    x_rows = x_ptr + rows[:, None] * x_row_stride
    y_rows = y_ptr + rows[:, None] * y_row_stride
    return rows, row_mask, cols, x_rows, y_rows


@triton.jit
def block_tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A forward program's tile of BLOCK_M whole rows: (rows, row mask, columns, column mask, tile mask)."""
    # int64 row indices: rows * stride passes 2^31 for long sequences x wide hidden sizes
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    return rows, row_mask, cols, col_mask, row_mask[:, None] & col_mask[None, :]


@triton.jit
def chunk_mask(row_mask, chunk, n_cols):
    """The (rows, columns) mask of a tile: ``row_mask`` rows x the columns of ``chunk`` below ``n_cols``."""
    return row_mask[:, None] & (chunk[None, :] < n_cols)


@triton.jit
def load_rows(rows_ptr, cols, mask):
    """The fp32 tile at columns ``cols`` of the rows ``rows_ptr`` (a column of row-start pointers)."""
    return tl.load(rows_ptr + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_rows(rows_ptr, cols, value, mask):
    """``value`` stored at columns ``cols`` of the rows ``rows_ptr``, rounded to their dtype."""
    tl.store(rows_ptr + cols[None, :], value.to(rows_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_tile(ptr, rows, cols, row_stride, value, mask):
    """``value`` stored at ``rows`` x ``cols`` (int64 rows) of the matrix at ``ptr``, rounded to its dtype."""
    tl.store(ptr + rows[:, None] * row_stride + cols[None, :], value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_wide_tile(ptr, rows, cols, row_stride, value, mask):
    """``store_tile`` of a value in the math dtype: an fp64 value bound for a 16-bit tensor goes through
    fp32 first, as torch's cast does."""
    if ptr.dtype.element_ty != tl.float64:
        value = value.to(tl.float32)
    store_tile(ptr, rows, cols, row_stride, value, mask)


# The persistent backward grids: each program loops over a contiguous block of row tiles, loading (dy, x)
# tiles; with PREFETCH the next tile's loads are issued before this tile's math (two tiles in flight).


@triton.jit
def first_tiles(
    dy_ptr,
    x_ptr,
    first_row,
    cols,
    n_rows,
    col_mask,
    dy_row_stride,
    x_row_stride,
    tiles_per_program,
    BLOCK_M: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """(rows of the program's first tile, end of its rows, the loads carried into ``next_tiles``): with
    PREFETCH the first tile's (dy, x) loads, else placeholders (loop-carried values that ``next_tiles``
    returns unchanged, which the compiler drops)."""
    rows = first_row + tl.arange(0, BLOCK_M)
    rows_end = tl.minimum(first_row + tiles_per_program * BLOCK_M, n_rows)  # this program's rows
    if PREFETCH:
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        dy_next, x_next = load_tiles(dy_ptr, x_ptr, rows, cols, dy_row_stride, x_row_stride, mask)
    else:
        dy_next = 0.0
        x_next = 0.0
    return rows, rows_end, dy_next, x_next


@triton.jit
def next_tiles(
    dy_ptr,
    x_ptr,
    rows,
    cols,
    n_rows,
    rows_end,
    col_mask,
    dy_row_stride,
    x_row_stride,
    dy_next,
    x_next,
    BLOCK_M: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """(dy, x) of the tile at ``rows`` in fp32, its row and tile masks, and the loads in flight for the next
    tile (PREFETCH: the next tile's, issued now, up to ``rows_end``; else ``first_tiles``' placeholders)."""
    row_mask = rows < n_rows
    mask = row_mask[:, None] & col_mask[None, :]
    if PREFETCH:
        dy, x = dy_next, x_next
        next_mask = (rows + BLOCK_M < rows_end)[:, None] & col_mask[None, :]
        dy_next, x_next = load_tiles(
            dy_ptr, x_ptr, rows + BLOCK_M, cols, dy_row_stride, x_row_stride, next_mask
        )
    else:
        dy, x = load_tiles(dy_ptr, x_ptr, rows, cols, dy_row_stride, x_row_stride, mask)
    return dy.to(tl.float32), x.to(tl.float32), row_mask, mask, dy_next, x_next


@triton.jit
def store_lane_sums(partial_row, cols, acc, comp, col_mask, PRECISE: tl.constexpr):
    """The program's partial row: the sum over the BLOCK_M row lanes of a compensated accumulator
    (``accumulate``), in fp64 when PRECISE."""
    total = tl.sum(widen(acc, PRECISE) - widen(comp, PRECISE), axis=0)
    tl.store(partial_row + cols, total, mask=col_mask)


# Rows wider than a tile (SINGLE_PASS=False): one row at a time over column chunks, the partial rows in
# global memory, each element read and written by the same thread (same layout). ``TWO``: LayerNorm's dB
# partial row beside dW's.


@triton.jit
def load_row_chunk(dy_ptr, x_ptr, w_ptr, row, start, cols, n_cols, dy_row_stride, x_row_stride):
    """(columns, mask, dy, x, w) of one row's column chunk from ``start`` (dy, x, w in fp32)."""
    chunk = start + cols
    mask = chunk < n_cols
    dy = tl.load(dy_ptr + row * dy_row_stride + chunk, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * x_row_stride + chunk, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + chunk, mask=mask, other=0.0).to(tl.float32)
    return chunk, mask, dy, x, w


@triton.jit
def zero_partial_rows(dw_row, db_row, n_cols, BLOCK_N: tl.constexpr, TWO: tl.constexpr):
    """Zero the program's dW partial row of ``n_cols`` (and its dB one)."""
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, n_cols, BLOCK_N):
        chunk = start + cols
        tl.store(dw_row + chunk, tl.zeros([BLOCK_N], dtype=tl.float32), mask=chunk < n_cols)
        if TWO:
            tl.store(db_row + chunk, tl.zeros([BLOCK_N], dtype=tl.float32), mask=chunk < n_cols)


@triton.jit
def add_to_partial_rows(dw_row, db_row, chunk, dy, xn, mask, PRECISE: tl.constexpr, TWO: tl.constexpr):
    """``dy * xn`` added to the dW partial row at ``chunk`` (and ``dy`` to the dB one), in its precision."""
    dw_old = tl.load(dw_row + chunk, mask=mask, other=0.0)
    tl.store(dw_row + chunk, dw_old + widen(dy * xn, PRECISE), mask=mask)
    if TWO:
        db_old = tl.load(db_row + chunk, mask=mask, other=0.0)
        tl.store(db_row + chunk, db_old + widen(dy, PRECISE), mask=mask)


@fast_launch
@triton.jit
def _sum_partials_kernel(
    partials_ptr,
    out_ptr,
    n_partials,
    n_cols,
    n_sums,
    rows_per_group,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """``out[s, g, :] = sum_p partials[s, p, :]`` over the rows p of group g (``rows_per_group`` each; program
    axis 1), cast to out's dtype, for each of ``n_sums`` stacked partial matrices (dW, and dB for LayerNorm):
    one launch instead of a sum and a cast per matrix. The partials are fp32 (fp64 for fp32 data) and are
    added in their own dtype, as ``torch.sum`` would."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    group = tl.program_id(1)
    n_groups = tl.num_programs(1)
    first = group * rows_per_group
    last = tl.minimum(first + rows_per_group, n_partials)
    parts = tl.arange(0, BLOCK_P)
    for s in range(0, n_sums):
        base = partials_ptr + s * n_partials * n_cols  # < 2^31: programs x columns
        acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=partials_ptr.dtype.element_ty)
        # the loop's bound is an argument, not ``last``: bounds computed in the kernel made it slower,
        # probably unpipelined (H100, RMSNorm's 264 partial rows x 1024 columns: 7.8 vs 4.2 us)
        for start in range(0, rows_per_group, BLOCK_P):
            rows = first + start + parts
            mask = (rows < last)[:, None] & col_mask[None, :]
            acc += tl.load(base + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
        total = tl.sum(acc, axis=0)
        if out_ptr.dtype.element_ty != tl.float64:
            total = total.to(tl.float32)  # fp64 -> 16-bit goes through fp32, as torch's cast does
        tl.store(
            out_ptr + (s * n_groups + group) * n_cols + cols,
            total.to(out_ptr.dtype.element_ty),
            mask=col_mask,
        )


# More partial rows than this are summed in two launches: groups of PARTIALS_GROUP_ROWS rows in parallel, then
# the group sums (one program per 64 columns reading thousands of rows sequentially is slow).
PARTIALS_SPLIT_ABOVE = 512
PARTIALS_GROUP_ROWS = 64


def sum_partials(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(n_sums, n_partials, n_cols) partial rows -> (n_sums, n_cols) sums in ``dtype``; a 2-D
    (n_partials, n_cols) input gives the (n_cols,) sum (no view on either side: host time per call)."""
    if partials.dim() == 2:
        n_sums, (n_partials, n_cols) = 1, partials.shape
    else:
        n_sums, n_partials, n_cols = partials.shape
    block_n = 64
    block_p = 64 if partials.dtype == torch.float32 else 32
    if n_partials > PARTIALS_SPLIT_ABOVE:
        n_groups = cdiv(n_partials, PARTIALS_GROUP_ROWS)
        groups = partials.new_empty((n_sums, n_groups, n_cols))
        _sum_partials_kernel[(cdiv(n_cols, block_n), n_groups)](
            partials, groups, n_partials, n_cols, n_sums, PARTIALS_GROUP_ROWS,
            BLOCK_P=block_p, BLOCK_N=block_n, num_warps=4,
        )  # fmt: skip
        return sum_partials(groups if partials.dim() == 3 else groups[0], dtype)
    out = partials.new_empty((n_sums, n_cols) if partials.dim() == 3 else n_cols, dtype=dtype)
    _sum_partials_kernel[(cdiv(n_cols, block_n), 1)](
        partials, out, n_partials, n_cols, n_sums, n_partials, BLOCK_P=block_p, BLOCK_N=block_n, num_warps=4
    )
    return out


def partials_buffer(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The per-program partial rows of a backward over rows of ``x``: fp64 where the data is fp32, fp32
    otherwise (bf16/fp16 sums: fp32 is ~2^16 finer than the final rounding)."""
    dtype = torch.float64 if x.dtype == torch.float32 else torch.float32
    return torch.empty(shape, dtype=dtype, device=x.device)


def as_shape(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``t.view(shape)``, skipped when ``t`` has that shape; ints rather than a ``torch.Size`` (whose view
    goes through symbolic-shape checks: ~2x the host time)."""
    return t if t.shape == shape else t.view(*shape)


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """2-D (rows, hidden) view with unit column stride (a copy only when no such view exists)."""
    if t.dim() == 2 and t.stride(1) == 1:
        return t  # already rows: no view op (host time on every call)
    t2d = t.reshape(-1, t.shape[-1])
    return t2d if t2d.stride(-1) == 1 else t2d.contiguous()


def check_group_size(group_size: int | None, n_cols: int) -> int | None:
    """``group_size`` if it splits rows of ``n_cols`` into several groups, None if it is the whole row."""
    if group_size is None or group_size == n_cols:
        return None
    if not isinstance(group_size, int) or group_size <= 0 or n_cols % group_size:
        raise ValueError(
            f"group_size={group_size!r} must be a positive divisor of the last dimension {n_cols}"
        )
    return group_size


def per_group(norm, x: torch.Tensor, params: tuple, group_size: int, **options) -> torch.Tensor:
    """``norm`` applied to each group of ``group_size`` features of ``x``'s rows, with the slices of the
    per-feature ``params`` (weight, bias; None stays None) at the group's position, concatenated.

    Each group is a column slice of ``x``: a strided (rows, group_size) view, which the norm kernels read
    without a copy. The weight and bias slices are views: their gradients are written back into the full
    parameters' gradients at disjoint positions (exact).
    """
    parts = [
        norm(
            x[..., s : s + group_size],
            *(p if p is None else p[s : s + group_size] for p in params),
            **options,
        )
        for s in range(0, x.shape[-1], group_size)
    ]
    return torch.cat(parts, dim=-1)

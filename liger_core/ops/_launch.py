"""Launch heuristics shared by the ops: block sizes and warps keyed on the problem shape (one table, here)."""

from __future__ import annotations

from typing import NamedTuple

import triton

# Largest row that one program keeps in registers; above it a kernel must loop over column blocks.
MAX_FUSED_SIZE = 65536


def row_settings(n_cols: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for kernels that hold one whole row of ``n_cols`` elements in registers."""
    block = triton.next_power_of_2(n_cols)
    if block > MAX_FUSED_SIZE:
        raise ValueError(f"rows of {n_cols} elements exceed the fused limit of {MAX_FUSED_SIZE}")
    if block >= 32768:
        warps = 32
    elif block >= 8192:
        warps = 16
    elif block >= 2048:
        warps = 8
    else:
        warps = 4
    return block, warps


def elementwise_settings(n_elements: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for flat elementwise kernels."""
    block = min(4096, max(128, triton.next_power_of_2(n_elements)))
    return block, 8 if block >= 2048 else 4


def num_sms(device) -> int:
    """Streaming multiprocessors on a CUDA device (a small constant for the CPU interpreter)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


# ----------------------------------------------------------------------------------------------------------
# Row-normalisation kernels (RMSNorm, LayerNorm): one tile = BLOCK_M rows x BLOCK_N columns.
# ----------------------------------------------------------------------------------------------------------

# Rows up to this many columns stay in registers (forward: one read of x; backward: one read of dy and x).
# Longer rows loop over column chunks of NORM_CHUNK_COLS, re-reading the row (from L2) once per pass.
NORM_FUSED_MAX_COLS = 16384
NORM_CHUNK_COLS = 4096
# Elements per tile for short rows: several rows per program so that small hidden sizes still move
# enough bytes per program.
NORM_TILE_ELEMENTS = 4096
# Warps resident per SM that the persistent backward grid aims for (programs per SM = this / num_warps).
NORM_BWD_WARPS_PER_SM = 16


class NormSettings(NamedTuple):
    block_m: int  # rows per tile
    block_n: int  # columns per tile: the whole (padded) row when single_pass, else a chunk
    num_warps: int
    single_pass: bool  # the whole row fits in one tile


def norm_settings(n_cols: int) -> NormSettings:
    """Tile shape and warps for a row-normalisation kernel over rows of ``n_cols`` elements."""
    block_n = triton.next_power_of_2(n_cols)
    if block_n > NORM_FUSED_MAX_COLS:
        return NormSettings(1, NORM_CHUNK_COLS, 8, False)
    block_m = max(1, NORM_TILE_ELEMENTS // block_n)
    warps = min(32, max(4, block_m * block_n // 512))
    return NormSettings(block_m, block_n, warps, True)


def norm_bwd_programs(device, n_tiles: int, num_warps: int) -> tuple[int, int]:
    """(programs, tiles per program) for a persistent backward grid that writes one fp32 partial row of
    dW (and dB) per program: about NORM_BWD_WARPS_PER_SM warps per SM, every program at least one tile."""
    target = num_sms(device) * max(1, NORM_BWD_WARPS_PER_SM // num_warps)
    tiles_per_program = triton.cdiv(n_tiles, max(1, min(target, n_tiles)))
    return triton.cdiv(n_tiles, tiles_per_program), tiles_per_program

"""Launch heuristics shared by the ops: block sizes and warps keyed on the problem shape (one table, here)."""

from __future__ import annotations

from typing import NamedTuple

# Largest row that one program keeps in registers; above it a kernel must loop over column blocks.
MAX_FUSED_SIZE = 65536


# Flat elementwise kernels: the largest block, and the warps of blocks of at least 2048 elements.
ELEMENTWISE_MAX_BLOCK = 4096
ELEMENTWISE_LARGE_BLOCK_WARPS = 8


def elementwise_settings(n_elements: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for flat elementwise kernels."""
    block = min(ELEMENTWISE_MAX_BLOCK, max(128, _next_power_of_2(n_elements)))
    return block, ELEMENTWISE_LARGE_BLOCK_WARPS if block >= 2048 else 4


_SMS: dict[int | None, int] = {}


def num_sms(device) -> int:
    """Streaming multiprocessors on a CUDA device (a small constant for the CPU interpreter); cached, as it is
    asked on every backward launch."""
    if device.type != "cuda":
        return 4
    sms = _SMS.get(device.index)
    if sms is None:
        import torch

        sms = _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return sms


# ----------------------------------------------------------------------------------------------------------
# Row-normalisation kernels (RMSNorm, LayerNorm): one tile = BLOCK_M rows x BLOCK_N columns.
# ----------------------------------------------------------------------------------------------------------

# Rows up to this many columns stay in registers (forward: one read of x; backward: one read of dy and x).
# Longer rows loop over column chunks of NORM_CHUNK_COLS, re-reading the row once per pass. The backward holds
# ~11 registers per element (dy, x, w, dW accumulator, temporaries) and spills at 16384 columns, yet one
# spilling pass beats the two-pass loop there (H100, bf16 RMSNorm bwd: 16384x16384 0.729 vs 1.489 ms,
# 4093x16384 0.207 vs 0.382, the shape sweep's losers; script at 0aa2349: `python benchmarks/variants_norm.py
# --shapes ...`).
NORM_FUSED_MAX_COLS = 16384
NORM_BWD_FUSED_MAX_COLS = 16384
NORM_CHUNK_COLS = 4096
# Elements per tile for short rows: several rows per program so that small hidden sizes still move
# enough bytes per program.
NORM_TILE_ELEMENTS = 4096
# LayerNorm backward at rows of 4096 columns: two rows per tile (16 warps) keep more bytes in flight for its
# one program per SM (H100, bf16: 16384x4096 0.183 -> 0.161 ms, 4093x4096 0.061 -> 0.055; RMSNorm 0.156
# either way; script at 0aa2349: `python benchmarks/variants_norm.py`). Shorter rows keep NORM_TILE_ELEMENTS
# (16384x1024: 0.066 vs 0.082 ms with 8192-element tiles, 16384x2048: 0.105 vs 0.115).
NORM_BWD_TILE_ELEMENTS_LAYER_NORM = 8192
# Elements of a tile per thread (sets num_warps). Forward: 16. Backward: 16 with a software prefetch of the
# next tile (8 warps at hidden 4096: RMSNorm 113-124 registers, LayerNorm 166, no spills; H100, triton 3.6).
# Measured (GPU time, CUDA-graph replays, bf16 16384x4096): RMSNorm bwd 0.200 ms at 8 elements (16 warps) ->
# 0.157 at 16; LayerNorm 0.191 -> 0.178 (with 1 program per SM).
NORM_FWD_ELEMENTS_PER_THREAD = 16
NORM_BWD_ELEMENTS_PER_THREAD = 16
# Programs per SM of the persistent backward grid (each writes one partial row of dW/dB). Measured best:
# RMSNorm 2 (0.157 vs 0.174 ms with 1), LayerNorm 1 (0.177 vs 0.189 with 2; its kernel holds more registers).
NORM_BWD_PROGRAMS_PER_SM = 2
NORM_BWD_PROGRAMS_PER_SM_LAYER_NORM = 1
# Backward: issue the next tile's loads before this tile's math (tiles up to NORM_TILE_ELEMENTS).
NORM_BWD_PREFETCH = True
# Backward of wide rows (one row per tile, more than NORM_TILE_ELEMENTS columns, no prefetch), by the row's
# padded width: (elements per thread, reload). reload: w is not held in registers across rows, and dy, x, w
# are loaded again (L1/L2: the row was just read) after the row's reductions instead of holding dy * w and the
# normalised x across them; the held values spill at 16384 columns (LayerNorm: w, dW and dB accumulators, g,
# xhat at the 64-register cap of 32 warps). One program per SM (NORM_BWD_WIDE_PROGRAMS_PER_SM): a second one
# does not fit beside it in registers, so it only formed a second wave. H100, bf16, kernel alone, ms (script
# at 0aa2349: `python benchmarks/variants_norm.py --shapes 16384x16384,32768x16384,4093x16384,16384x8192,
# 65536x8192`):
# RMSNorm 16384 cols: 32 elements + reload 0.578 / 1.134 / 0.160 vs 16 elements 0.619 / 1.207 / 0.195 (held
#   or reloaded alike); 8192 cols: held 0.321 / 1.223, reloaded 0.346 / 1.296.
# LayerNorm 16384 cols: 16 elements + reload 0.848 / 1.663 / 0.242 vs held 1.104 / 2.172 / 0.307 (32
#   elements + reload 0.869); 8192 cols: 32 elements + reload 0.373 / 1.400 vs 16 held 0.388 / 1.458.
NORM_BWD_WIDE_RMS_NORM = {8192: (16, False), 16384: (32, True)}
NORM_BWD_WIDE_LAYER_NORM = {8192: (32, True), 16384: (16, True)}
NORM_BWD_WIDE_DEFAULT = (16, False)  # other widths (none between 4096 and 8192 or above 16384 single-pass)
NORM_BWD_WIDE_PROGRAMS_PER_SM = 1
# LayerNorm backward of 16-bit rows of these padded widths: one row at a time in 1-D tiles
# (``layer_norm._layer_norm_bwd_row_kernel``), one program per SM, NORM_BWD_ROWWISE_WARPS warps. H100, kernel
# alone (CUDA-graph timing; benchmarks/results/h100/layer_norm_rowwise.log, 2026-11-24; its .meta.json has the
# command): 65536 x 8192 1.270 ms vs 1.393 for the 2-D tile kernel, 16384 x 8192 0.332 vs 0.365; it loses at
# 4096 columns (0.632 at best vs 0.568) and 16384 (0.884 vs 0.860), which keep the 2-D kernel.
NORM_BWD_ROWWISE_LAYER_NORM: tuple[int, ...] = (8192,)
NORM_BWD_ROWWISE_WARPS = 16
# LayerNorm backward of 16-bit rows of these padded widths: one row per tile (TILE_ELEMENTS below), its dW/dB
# terms added into one row of fp32 accumulators, 4 warps, 8 programs per SM, no prefetch (few registers, many
# programs in flight: torch.compile's structure at this width). H100, bf16, kernel + partial sums alone
# (CUDA-graph timing; script at 0aa2349: `python benchmarks/variants_norm.py --quick --graph --only kernels
# --ops layer_norm --variants "P2 E8 pf (current),TS"`): 65536 x 1024 0.1563 ms vs 0.1831 for the 2-D tile
# kernel, 16384 x 1024 0.0505 vs 0.0575, 4093 x 1024 0.0188 vs 0.0201; it loses at 2048 columns (16384 x 2048
# 0.1060 vs 0.0936), which keep the 2-D kernel.
NORM_BWD_TILE_SUM_LAYER_NORM: tuple[int, ...] = (1024,)
NORM_BWD_TILE_SUM_TILE_ELEMENTS = 1024
NORM_BWD_TILE_SUM_PROGRAMS_PER_SM = 8
NORM_BWD_TILE_SUM_PREFETCH = False
NORM_BWD_TILE_SUM_WARPS = 4


def _next_power_of_2(n: int) -> int:
    # plain int arithmetic: triton.next_power_of_2 is a wrapped constexpr function in recent Triton (host time
    # on every launch)
    return 1 << max(0, n - 1).bit_length()


# Host-side launch arithmetic in plain ints (triton.cdiv / triton.next_power_of_2 are constexpr_function
# wrappers since Triton 3.5: microseconds of host time per call, on every launch).
next_power_of_2 = _next_power_of_2


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class NormSettings(NamedTuple):
    block_m: int  # rows per tile
    block_n: int  # columns per tile: the whole (padded) row when single_pass, else a chunk
    num_warps: int
    single_pass: bool  # the whole row fits in one tile
    prefetch: bool  # backward: load the next tile before computing this one
    reload: bool  # backward: re-load dy, x, w after the row reductions (see NORM_BWD_WIDE_RMS_NORM)
    programs_per_sm: int  # backward: of the persistent grid


_NORM_SETTINGS: dict[tuple, NormSettings] = {}


def norm_settings(n_cols: int, backward: bool = False, layer_norm: bool = False) -> NormSettings:
    """Tile shape and warps for a row-normalisation kernel (forward or backward) over rows of ``n_cols``;
    cached (host time on every launch), keyed on the knobs too since benchmarks change them."""
    wide = NORM_BWD_WIDE_LAYER_NORM if layer_norm else NORM_BWD_WIDE_RMS_NORM
    key = (
        n_cols, backward, layer_norm, NORM_FUSED_MAX_COLS, NORM_BWD_FUSED_MAX_COLS, NORM_CHUNK_COLS,
        NORM_TILE_ELEMENTS, NORM_BWD_TILE_ELEMENTS_LAYER_NORM, NORM_FWD_ELEMENTS_PER_THREAD,
        NORM_BWD_ELEMENTS_PER_THREAD, NORM_BWD_PREFETCH, NORM_BWD_PROGRAMS_PER_SM,
        NORM_BWD_PROGRAMS_PER_SM_LAYER_NORM, tuple(sorted(wide.items())), NORM_BWD_WIDE_DEFAULT,
        NORM_BWD_WIDE_PROGRAMS_PER_SM,
    )  # fmt: skip
    settings = _NORM_SETTINGS.get(key)
    if settings is None:
        wide_rows = _next_power_of_2(n_cols) >= 4096
        tile_elements = (
            NORM_BWD_TILE_ELEMENTS_LAYER_NORM if backward and layer_norm and wide_rows else NORM_TILE_ELEMENTS
        )
        settings = _NORM_SETTINGS[key] = _norm_settings(n_cols, backward, layer_norm, tile_elements, wide)
    return settings


def _norm_settings(
    n_cols: int, backward: bool, layer_norm: bool, tile_elements: int, wide: dict[int, tuple[int, bool]]
) -> NormSettings:
    block_n = _next_power_of_2(n_cols)
    if block_n > (NORM_BWD_FUSED_MAX_COLS if backward else NORM_FUSED_MAX_COLS):
        block_m, block_n, single_pass = 1, NORM_CHUNK_COLS, False
    else:
        block_m, single_pass = max(1, tile_elements // block_n), True
    tile = block_m * block_n
    prefetch = NORM_BWD_PREFETCH and backward and single_pass and block_n <= NORM_TILE_ELEMENTS
    per_thread, reload = NORM_FWD_ELEMENTS_PER_THREAD, False
    per_sm = NORM_BWD_PROGRAMS_PER_SM_LAYER_NORM if layer_norm else NORM_BWD_PROGRAMS_PER_SM
    if backward and single_pass and block_m == 1 and block_n > NORM_TILE_ELEMENTS:
        per_thread, reload = wide.get(block_n, NORM_BWD_WIDE_DEFAULT)
        per_sm = NORM_BWD_WIDE_PROGRAMS_PER_SM
    elif backward and (prefetch or not single_pass or not NORM_BWD_PREFETCH):
        per_thread = NORM_BWD_ELEMENTS_PER_THREAD
    warps = min(32, max(4, tile // (32 * per_thread)))
    return NormSettings(block_m, block_n, warps, single_pass, prefetch, reload, per_sm)


def norm_bwd_programs(device, n_tiles: int, settings: NormSettings) -> tuple[int, int]:
    """(programs, tiles per program) for the persistent backward grid: ``settings.programs_per_sm`` programs
    per SM, each with a contiguous block of >= 1 tile."""
    target = num_sms(device) * settings.programs_per_sm
    tiles_per_program = cdiv(n_tiles, max(1, min(target, n_tiles)))
    return cdiv(n_tiles, tiles_per_program), tiles_per_program

"""Launch heuristics shared by the ops: block sizes and warps keyed on the problem shape.

The measured tables the row-normalisation settings read are knobs in ``liger_core.tuning`` (``NORM_*``).
"""

from __future__ import annotations

from typing import NamedTuple

from liger_core import tuning

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
    reload: bool  # backward: re-load dy, x, w after the row reductions (see tuning.NORM_BWD_WIDE_RMS_NORM)
    programs_per_sm: int  # backward: of the persistent grid


_NORM_SETTINGS: dict[tuple, NormSettings] = {}
# The tuning knobs ``norm_settings`` reads (part of its cache key: tests and benchmarks override them).
_NORM_KNOBS = (
    "NORM_FUSED_MAX_COLS", "NORM_BWD_FUSED_MAX_COLS", "NORM_CHUNK_COLS", "NORM_TILE_ELEMENTS",
    "NORM_BWD_TILE_ELEMENTS_LAYER_NORM", "NORM_FWD_ELEMENTS_PER_THREAD", "NORM_BWD_ELEMENTS_PER_THREAD",
    "NORM_BWD_PREFETCH", "NORM_BWD_PROGRAMS_PER_SM", "NORM_BWD_PROGRAMS_PER_SM_LAYER_NORM",
    "NORM_BWD_WIDE_DEFAULT", "NORM_BWD_WIDE_PROGRAMS_PER_SM",
)  # fmt: skip


def norm_settings(n_cols: int, backward: bool = False, layer_norm: bool = False) -> NormSettings:
    """Tile shape and warps for a row-normalisation kernel (forward or backward) over rows of ``n_cols``;
    cached (host time on every launch), keyed on the knobs too since benchmarks change them."""
    wide = tuning.NORM_BWD_WIDE_LAYER_NORM if layer_norm else tuning.NORM_BWD_WIDE_RMS_NORM
    key = (
        n_cols,
        backward,
        layer_norm,
        tuple(sorted(wide.items())),
        *(getattr(tuning, n) for n in _NORM_KNOBS),
    )
    settings = _NORM_SETTINGS.get(key)
    if settings is None:
        wide_rows = _next_power_of_2(n_cols) >= 4096
        tile_elements = (
            tuning.NORM_BWD_TILE_ELEMENTS_LAYER_NORM
            if backward and layer_norm and wide_rows
            else tuning.NORM_TILE_ELEMENTS
        )
        settings = _NORM_SETTINGS[key] = _norm_settings(n_cols, backward, layer_norm, tile_elements, wide)
    return settings


def _norm_settings(
    n_cols: int, backward: bool, layer_norm: bool, tile_elements: int, wide: dict[int, tuple[int, bool]]
) -> NormSettings:
    block_n = _next_power_of_2(n_cols)
    if block_n > (tuning.NORM_BWD_FUSED_MAX_COLS if backward else tuning.NORM_FUSED_MAX_COLS):
        block_m, block_n, single_pass = 1, tuning.NORM_CHUNK_COLS, False
    else:
        block_m, single_pass = max(1, tile_elements // block_n), True
    tile = block_m * block_n
    prefetch = tuning.NORM_BWD_PREFETCH and backward and single_pass and block_n <= tuning.NORM_TILE_ELEMENTS
    per_thread, reload = tuning.NORM_FWD_ELEMENTS_PER_THREAD, False
    per_sm = tuning.NORM_BWD_PROGRAMS_PER_SM_LAYER_NORM if layer_norm else tuning.NORM_BWD_PROGRAMS_PER_SM
    if backward and single_pass and block_m == 1 and block_n > tuning.NORM_TILE_ELEMENTS:
        per_thread, reload = wide.get(block_n, tuning.NORM_BWD_WIDE_DEFAULT)
        per_sm = tuning.NORM_BWD_WIDE_PROGRAMS_PER_SM
    elif backward and (prefetch or not single_pass or not tuning.NORM_BWD_PREFETCH):
        per_thread = tuning.NORM_BWD_ELEMENTS_PER_THREAD
    warps = min(32, max(4, tile // (32 * per_thread)))
    return NormSettings(block_m, block_n, warps, single_pass, prefetch, reload, per_sm)


def norm_bwd_programs(device, n_tiles: int, settings: NormSettings) -> tuple[int, int]:
    """(programs, tiles per program) for the persistent backward grid: ``settings.programs_per_sm`` programs
    per SM, each with a contiguous block of >= 1 tile."""
    return persistent_grid(device, n_tiles, settings.programs_per_sm)


def persistent_grid(device, n_tiles: int, programs_per_sm: int) -> tuple[int, int]:
    """(programs, tiles per program) for a persistent grid of ``programs_per_sm`` programs per SM, each with
    a contiguous block of >= 1 tile."""
    target = num_sms(device) * programs_per_sm
    tiles_per_program = cdiv(n_tiles, max(1, min(target, n_tiles)))
    return cdiv(n_tiles, tiles_per_program), tiles_per_program

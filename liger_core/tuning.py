"""Tuning knobs: process-wide switches between code paths that give the same results, read at call time.

Every knob defaults to what the library does in training; tests and benchmarks set one for a scope with
``override`` (restored on exit, also when the block raises)::

    from liger_core import tuning

    with tuning.override(ce_resident=False, use_headroom=False):
        loss = liger_core.ops.cross_entropy(logits, target)  # the looped CE kernel even on Hopper

``override`` takes the knob names in lower case and rejects unknown ones. The knobs are module globals, so an
override applies to every thread of the process while it is active.

Knobs:

- ``CE_RESIDENT``: 16-bit logits on Hopper with rows of up to ``_cross_entropy_resident.RESIDENT_MAX_COLS``
  columns run the Gluon kernel that keeps the row in shared memory and registers between the passes
  (``liger_core.ops._cross_entropy_resident``); off: the looped kernel (``liger_core.ops._ce_kernel``).
- ``USE_HEADROOM``: fused-linear loops and chunk sizes may use the memory headroom under the process's own
  earlier peak. Benchmarks of the op alone turn it off: a timing loop's leftover gradients would otherwise
  give the timed runs a faster loop than the one whose memory the one-shot measurement reports.
- ``HEADROOM_CHUNK_BYTES``: largest default chunk of logits taken from memory headroom
  (``_chunked_linear.choose_chunk_tokens``), and the chunk the fp32-accumulating token-major loop of
  ``fused_linear_cross_entropy`` needs beside its accumulators. Beyond ~1000-2000 tokens of a 128k vocabulary
  the GEMMs are as efficient as they get (H100: 1024 tokens 40.0 ms, 2048 39.2 ms).
- ``FAST_LAUNCH``: kernels decorated with ``ops._fastlaunch.fast_launch`` skip Triton's per-call argument
  binding where a compiled kernel is cached; off: Triton's own ``kernel[grid](...)`` launch.
- ``EAGER_VIA_CUSTOM_OPS``: eager calls go through the ``torch.library`` custom ops too (by default only
  torch.compile's tracing does; see ``dispatch.launcher``).
- ``FUSE_DOWN_PROJ``: patched GLU MLPs compute the activation and the down projection in one op
  (``ops.glu_down_proj``) where ``modules.mlp.fusable_down_proj`` allows it; off: activation, then the module.

- ``MLP_TILE_TOKENS``: with the ``tiled_mlp`` patch flag, MLPs run over tiles of this many tokens
  (``modules.long_context.tiled_mlp``); inputs of at most this many tokens run untiled. The tile's
  intermediate activations (gate, up and their product: 3 x tokens x intermediate) are the MLP's working set.
- ``CHECKPOINT_OFFLOAD_MIN_BYTES``: with the ``offload_checkpoints`` patch flag, checkpointed layer inputs of
  at least this many bytes are kept in host memory (``modules.long_context.offloaded_checkpoint``); smaller
  ones stay where they are (the copy would cost more than the memory it frees).

- Launch tables (``NORM_*``, ``ROPE_TILE_ELEMENTS``): tile shapes, warps and programs per SM of the
  row-normalisation and RoPE kernels, each commented below with the measurement behind it. Tests set small
  tiles to reach the multi-tile paths on small shapes: ``override(norm_tile_elements=64)``.

``LOOP_COUNTS`` is not a knob: calls per loop of ``fused_linear_cross_entropy`` (benchmarks and tests read
which loop ran).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

CE_RESIDENT = True
USE_HEADROOM = True
HEADROOM_CHUNK_BYTES = 512 * 2**20
FAST_LAUNCH = True
EAGER_VIA_CUSTOM_OPS = False
FUSE_DOWN_PROJ = True
# Llama-3.1-8B (intermediate 14336, bf16): 3 x 8192 x 14336 x 2 bytes = 0.66 GiB per tile, GEMMs of 8192 rows
# run at full efficiency.
MLP_TILE_TOKENS = 8192
CHECKPOINT_OFFLOAD_MIN_BYTES = 2**20


# ----------------------------------------------------------------------------------------------------------
# Launch tables: tile shapes and warps of the row-normalisation kernels (RMSNorm, LayerNorm, read by
# ``ops._launch.norm_settings`` and the norm ops; one tile = BLOCK_M rows x BLOCK_N columns) and of RoPE.
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

# Rotary embedding (``ops.rope``): elements of one [heads x half-rotary] tile a program holds in registers per
# step of its head loop. When q's and k's heads each fit in one tile (up to 64 heads of head_dim 64, 32 of
# 128), all of a token's loads are issued before its first store.
ROPE_TILE_ELEMENTS = 2048

KNOBS = (
    "ce_resident", "use_headroom", "headroom_chunk_bytes", "fast_launch", "eager_via_custom_ops",
    "fuse_down_proj", "mlp_tile_tokens", "checkpoint_offload_min_bytes", "norm_fused_max_cols",
    "norm_bwd_fused_max_cols", "norm_chunk_cols",
    "norm_tile_elements", "norm_bwd_tile_elements_layer_norm", "norm_fwd_elements_per_thread",
    "norm_bwd_elements_per_thread", "norm_bwd_programs_per_sm", "norm_bwd_programs_per_sm_layer_norm",
    "norm_bwd_prefetch", "norm_bwd_wide_rms_norm", "norm_bwd_wide_layer_norm", "norm_bwd_wide_default",
    "norm_bwd_wide_programs_per_sm", "norm_bwd_rowwise_layer_norm", "norm_bwd_rowwise_warps",
    "norm_bwd_tile_sum_layer_norm", "norm_bwd_tile_sum_tile_elements",
    "norm_bwd_tile_sum_programs_per_sm", "norm_bwd_tile_sum_prefetch", "norm_bwd_tile_sum_warps",
    "rope_tile_elements",
)  # fmt: skip

LOOP_COUNTS: collections.Counter = collections.Counter()


def current() -> dict:
    """Every knob's value now, keyed by its ``override`` name."""
    return {name: globals()[name.upper()] for name in KNOBS}


@contextlib.contextmanager
def override(**values) -> Iterator[None]:
    """Set knobs (lower-case names, see the module docstring) for the ``with`` block; the previous values come
    back on exit, also when the block raises. Nested overrides restore in order."""
    unknown = sorted(set(values) - set(KNOBS))
    if unknown:
        raise TypeError(f"unknown tuning knob(s) {unknown}; knobs: {list(KNOBS)}")
    module = globals()
    saved = {name: module[name.upper()] for name in values}
    try:
        for name, value in values.items():
            module[name.upper()] = value
        yield
    finally:
        for name, value in saved.items():
            module[name.upper()] = value

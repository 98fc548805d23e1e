"""Launch heuristics shared by the ops: block sizes and warps keyed on the problem shape (one table, here)."""

from __future__ import annotations

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

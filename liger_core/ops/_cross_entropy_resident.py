"""Cross-entropy with the whole row on chip: a Gluon kernel for 16-bit logits on Hopper GPUs.

Why: ``_cross_entropy_kernel`` streams each row twice (pass 1: max and sum; pass 2: gradient) and relies on L2
for the second read. With one 32-warp program per SM, ~132 rows of 256 KB (V = 128256, bf16) are live in a
50 MB L2 that the gradient stores also pass through, so a part of the second read goes to HBM again: 82 % of
the floor (one read + one write) at 8192 x 128256 on the H100
(``python benchmarks/ce_kernel_study.py``, script at 0aa2349); this kernel reaches 90 %
(``benchmarks/results/h100/ops.csv``, 2026-11-24).

Here the row never leaves the SM between the passes: the first ``NUM_SLOTS * SLOT`` columns are copied into
shared memory (``cp.async``, all slots in flight at once), the rest (at most ``REG_COLS``) into registers.
H100: 28 slots of 4096 bf16 columns (224 KB of the 227 KB a block may use) + 16384 in registers hold rows of
up to 131072 columns, every Llama-3 vocabulary (128256). The math is that of ``_cross_entropy_kernel``::

    pass 1a  m      = max_c x_c                        (per lane as the slots land, one reduction)
             acc    = sum_c (x_c - s)                  (label smoothing only; s = x_y, or 0 where x_y = -inf)
    pass 1b  d      = sum_c exp(x_c - m)               (from shared memory)
    pass 2   dx_c   = coef_p * exp(x_c - m) - coef_c - coef_y * [c == y]

with the per-row fp64 scalars of ``_grad_coefs`` / ``_row_loss``. Supported: bf16/fp16 logits, no class
weights, no softcap (``resident_supported``); everything else takes ``_cross_entropy_kernel``.

Gluon (``triton.experimental.gluon``) has no CPU interpreter: this kernel runs only on a CUDA GPU of compute
capability 9.x, and is checked against float64 there by ``tests/ops/test_cross_entropy.py`` (``-m gpu``). The
import is guarded: where Gluon is missing or its API differs, ``RESIDENT_AVAILABLE`` is False and nothing
changes.
"""

from __future__ import annotations

import functools

import torch

from liger_core.ops._fastlaunch import fast_launch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

    _GLUON_IMPORTED = True
except Exception:  # noqa: BLE001 - any failure (missing module, renamed API) means: not available
    _GLUON_IMPORTED = False

# Shared-memory slots: SLOT columns each (8 KB of bf16), NUM_SLOTS of them at most; REG_COLS columns in
# registers at most. Capacity 28 * 4096 + 16384 = 131072 columns.
SLOT = 4096
MAX_SLOTS = 28
MAX_REG_COLS = 16384
# H100 (`python benchmarks/ce_resident_study.py`, script at 0aa2349): 16 warps 1-1.5 % faster at 65536-131072
# columns, 8 warps at 32000; None: that rule, an int: always that many
NUM_WARPS: int | None = None
RESIDENT_MAX_COLS = MAX_SLOTS * SLOT + MAX_REG_COLS


def resident_layout(n_cols: int) -> tuple[int, int]:
    """(NUM_SLOTS, REG_COLS) for a row of ``n_cols``: shared memory first, the rest (a power of two, or 0)
    in registers."""
    slots = min(MAX_SLOTS, -(-n_cols // SLOT))
    rest = n_cols - slots * SLOT
    reg_cols = 0 if rest <= 0 else max(1024, 1 << (rest - 1).bit_length())
    return slots, reg_cols


if _GLUON_IMPORTED:
    try:

        @gluon.jit
        def _f64(hi, lo):
            return hi.to(gl.float64) + lo.to(gl.float64)

        @fast_launch  # Gluon's own launch path costs ~0.2 ms of host time per call (H100 machine, sweep)
        @gluon.jit
        def _cross_entropy_resident_kernel(
            logits_ptr,
            logits_row_stride,
            grad_ptr,  # may equal logits_ptr (in place)
            grad_row_stride,
            target_ptr,
            loss_ptr,  # (N,) fp64 per-row cross-entropy, unscaled (as _cross_entropy_kernel)
            z_loss_ptr,  # (N,) fp64 per-row z-loss, unscaled
            grad_scale_ptr,
            stats_ptr,
            state_ptr,  # (N, 4) fp64 out (STORE_STATE): m, coef_p, coef_c, coef_y of the gradient pass
            n_cols,
            ignore_index,
            smoothing_hi, smoothing_lo,
            z_scale_hi, z_scale_lo,
            MEAN: gl.constexpr,
            HAS_SMOOTHING: gl.constexpr,
            HAS_GRAD_SCALE: gl.constexpr,
            COMPUTE_GRAD: gl.constexpr,
            STORE_STATE: gl.constexpr,  # with COMPUTE_GRAD: for the same gradient of recomputed logits
            SLOT: gl.constexpr,
            NUM_SLOTS: gl.constexpr,
            REG_COLS: gl.constexpr,
            NUM_WARPS: gl.constexpr,
        ):  # fmt: skip
            # 8 contiguous 16-bit columns (16 bytes) per thread and access; the copy and the reads of a slot
            # use the same layout, so each thread reads back only what its own cp.async wrote (wait_group
            # orders a thread's own copies; no barrier needed)
            layout: gl.constexpr = gl.BlockedLayout([8], [32], [NUM_WARPS], [0])
            smem_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
            row = gl.program_id(0).to(gl.int64)  # int64: rows * V passes 2^31
            logits_row = logits_ptr + row * logits_row_stride
            grad_row = grad_ptr + row * grad_row_stride
            y = gl.load(target_ptr + row).to(gl.int64)
            offs = gl.arange(0, SLOT, layout=layout)

            if y == ignore_index:
                gl.store(loss_ptr + row, 0.0)
                gl.store(z_loss_ptr + row, 0.0)
                if COMPUTE_GRAD:
                    zero = gl.zeros([SLOT], gl.float32, layout).to(grad_ptr.dtype.element_ty)
                    for start in range(0, n_cols, SLOT):
                        gl.store(grad_row + start + offs, zero, mask=start + offs < n_cols)
                return

            smem = gl.allocate_shared_memory(logits_ptr.dtype.element_ty, [NUM_SLOTS, SLOT], smem_layout)
            for k in gl.static_range(NUM_SLOTS):
                cols = k * SLOT + offs
                cp.async_copy_global_to_shared(smem.index(k), logits_row + cols, mask=cols < n_cols)
                cp.commit_group()
            if REG_COLS > 0:
                reg_cols = NUM_SLOTS * SLOT + gl.arange(0, REG_COLS, layout=layout)
                reg_mask = reg_cols < n_cols
                x_reg = gl.load(logits_row + reg_cols, mask=reg_mask, other=-float("inf"))

            # per-row scalars that do not depend on the max and the sum, while the copies are in flight
            y_safe = gl.minimum(gl.maximum(y, 0), n_cols - 1)
            x_y = gl.load(logits_row + y_safe).to(gl.float32)
            # the smoothing sum's shift (cross_entropy.smoothing_shift): x_y, or 0 where it is -inf
            shift = gl.where(x_y == -float("inf"), 0.0, x_y)
            eps = _f64(smoothing_hi, smoothing_lo)
            zs = _f64(z_scale_hi, z_scale_lo)
            n_classes = n_cols.to(gl.float64)
            if COMPUTE_GRAD:
                g = gl.full([], 1.0, gl.float64)
                if HAS_GRAD_SCALE:
                    g = gl.load(grad_scale_ptr + row).to(gl.float64)
                ce_s = g
                z_s = g
                if MEAN:  # IEEE division, as _grad_coefs
                    ce_s = g / gl.load(stats_ptr + 1)
                    z_s = g / gl.load(stats_ptr + 0)
                p_ce = ce_s * ((1.0 - eps) + eps)  # w_y = 1, w_total = n_classes
                p_z = z_s * 2.0 * zs
                coef_c = (ce_s * eps / n_classes).to(gl.float32)
                coef_y = (ce_s * (1.0 - eps)).to(gl.float32)

            # pass 1a: max (and the smoothing sum) per lane as the slots land
            m_lane = gl.full([SLOT], -float("inf"), gl.float32, layout)
            s_lane = gl.zeros([SLOT], gl.float32, layout)
            for k in gl.static_range(NUM_SLOTS):
                cp.wait_group(NUM_SLOTS - 1 - k)
                cols = k * SLOT + offs
                valid = cols < n_cols
                x = gl.where(valid, smem.index(k).load(layout).to(gl.float32), -float("inf"))
                m_lane = gl.maximum(m_lane, x)
                if HAS_SMOOTHING:
                    s_lane += gl.where(valid, x - shift, 0.0)
            m = gl.max(m_lane, axis=0)
            smooth_acc = gl.sum(s_lane, axis=0) if HAS_SMOOTHING else 0.0
            if REG_COLS > 0:
                x_reg32 = x_reg.to(gl.float32)
                m = gl.maximum(m, gl.max(x_reg32, axis=0))
                if HAS_SMOOTHING:
                    smooth_acc += gl.sum(gl.where(reg_mask, x_reg32 - shift, 0.0), axis=0)

            # pass 1b: sum of exp(x - m) from shared memory (masked lanes are -inf: exp gives 0)
            d_lane = gl.zeros([SLOT], gl.float32, layout)
            for k in range(NUM_SLOTS):
                cols = k * SLOT + offs
                x = gl.where(cols < n_cols, smem.index(k).load(layout).to(gl.float32), -float("inf"))
                d_lane += gl.exp(x - m)
            d = gl.sum(d_lane, axis=0)
            if REG_COLS > 0:
                d += gl.sum(gl.exp(x_reg32 - m), axis=0)

            # per-row fp64 scalars (as _cross_entropy_kernel: m and log(d) kept apart)
            d64 = d.to(gl.float64)
            log_d = gl.log(d64)
            m64 = m.to(gl.float64)
            lse = m64 + log_d
            nll = (m64 - x_y.to(gl.float64)) + log_d
            ce = (1.0 - eps) * nll
            if HAS_SMOOTHING:
                nll_shift = (m64 - shift.to(gl.float64)) + log_d
                ce += eps / n_classes * (n_classes * nll_shift - smooth_acc.to(gl.float64))
            gl.store(loss_ptr + row, ce)
            gl.store(z_loss_ptr + row, zs * lse * lse)

            if COMPUTE_GRAD:
                coef_p = ((p_ce + p_z * lse) / d64).to(gl.float32)
                if STORE_STATE:  # the values pass 2 uses, as fused_linear_cross_entropy's _row_stats_kernel
                    state = state_ptr + row * 4
                    gl.store(state + 0, m64)
                    gl.store(state + 1, coef_p.to(gl.float64))
                    gl.store(state + 2, coef_c.to(gl.float64))
                    gl.store(state + 3, coef_y.to(gl.float64))
                # pass 2: gradient from shared memory, then the register columns
                for k in range(NUM_SLOTS):
                    cols = k * SLOT + offs
                    x = smem.index(k).load(layout).to(gl.float32)
                    dx = coef_p * gl.exp(x - m)
                    if HAS_SMOOTHING:
                        dx -= coef_c
                    dx = gl.where(cols == y, dx - coef_y, dx)
                    gl.store(
                        grad_row + cols, dx.to(grad_ptr.dtype.element_ty), mask=cols < n_cols,
                        eviction_policy="evict_first",
                    )  # fmt: skip
                if REG_COLS > 0:
                    dx = coef_p * gl.exp(x_reg32 - m)
                    if HAS_SMOOTHING:
                        dx -= coef_c
                    dx = gl.where(reg_cols == y, dx - coef_y, dx)
                    gl.store(
                        grad_row + reg_cols, dx.to(grad_ptr.dtype.element_ty), mask=reg_mask,
                        eviction_policy="evict_first",
                    )  # fmt: skip

        RESIDENT_AVAILABLE = True
    except Exception:  # noqa: BLE001 - a Gluon API this code does not match: not available
        RESIDENT_AVAILABLE = False
else:
    RESIDENT_AVAILABLE = False


def resident_warps(n_cols: int) -> int:
    if NUM_WARPS is not None:
        return NUM_WARPS
    return 16 if n_cols >= 65536 else 8


def resident_supported(logits: torch.Tensor, weight: torch.Tensor | None, softcap: float | None) -> bool:
    """Whether ``_cross_entropy_resident_kernel`` handles this call (else ``_cross_entropy_kernel``)."""
    if not RESIDENT_AVAILABLE or logits.device.type != "cuda":
        return False
    if logits.dtype not in (torch.bfloat16, torch.float16) or weight is not None or softcap is not None:
        return False
    n_cols = logits.shape[1]
    if n_cols > RESIDENT_MAX_COLS or logits.stride(1) != 1:
        return False
    # cp.async moves at least 4 bytes per thread: Triton vectorises the copies only where it can prove 16-byte
    # alignment (pointer, row stride and column count divisible by 16 elements); otherwise the kernel does not
    # compile for this specialisation
    if n_cols % 16 or logits.stride(0) % 16 or logits.data_ptr() % 16:
        return False
    return _is_hopper(logits.device.index if logits.device.index is not None else torch.cuda.current_device())


@functools.cache
def _is_hopper(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] == 9

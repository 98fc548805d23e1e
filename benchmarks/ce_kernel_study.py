"""Cross-entropy kernel structures beside the production kernel, in one GPU call (issue 7, CE row).

    PYTHONPATH=. python benchmarks/ce_kernel_study.py [--n 8192] [--vocab 128256]

The production kernel (``liger_core.ops.cross_entropy``) streams each row twice: pass 1 (max, sum of
exponentials) and pass 2 (gradient), one program per row, with eviction hints so that pass 2 re-reads from L2.
It runs at ~79 % of the HBM floor
(one read + one write of the logits). The variants here do the plain case
(no class weights, smoothing, softcap or z-loss; mean reduction) and differ only in structure:

- ``prefetch``: one program per row; pass 1 issues the next block's load before reducing the current block, so
  the SM keeps loads in flight during the two block reductions;
- ``prefetch ..., pass 1 num_stages S, no prefetch`` (S = 2, 3): pass 1 as ``tl.range(..., num_stages=S)``
  without the register prefetch, i.e. Triton's software pipeliner (cp.async through shared memory, S - 1
  blocks ahead): does a deeper load queue keep HBM busy through the reductions? (With the register prefetch
  kept, Triton 3.9 does not pipeline the loop: the same PTX as plain ``prefetch``, so not run.)
- ``staggered B/W, P/SM``: persistent, P programs per SM (program p owns rows p, p + G, ...); iteration k
  runs pass 2 of row k interleaved block by block with pass 1 of row k + 1, so that each SM streams HBM reads
  (pass 1), L2 re-reads and HBM writes (pass 2) at the same time, and the pass-1 reductions overlap the
  gradient stores. Tests whether the production kernel loses HBM time because each SM alternates a pass-1
  phase (reads stalled by block reductions) with a pass-2 phase (no HBM reads). ``, prefetch``: the register
  prefetch of pass 1 inside that loop too;
- ``split S``: S programs per row (consecutive program ids), each loads its 1/S slice once and keeps it in
  registers, publishes (max, sum) to a scratch buffer, waits for its S - 1 siblings through an atomic counter,
  combines, and writes the gradient from registers: HBM sees exactly one read and one write. Safe from
  deadlock because blocks are dispatched in program-id order (only the last partly resident group can wait on
  a program not yet running); GPU only (the interpreter runs programs one after another);
- ``cluster``: a whole row in one block spread over a thread-block cluster (``num_ctas``), if this Triton
  lowers cross-CTA reductions.
Each variant is checked against float64 (loss rows and gradient) beside the production kernel, then timed with
``triton.testing.do_bench`` (L2 flushed before each run). On CPU it checks ``prefetch`` (plain and with
``num_stages``, which the interpreter ignores) and ``staggered`` (3 programs, 5 rows) at a tiny shape.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from liger_core.ops import cross_entropy as ce_public  # noqa: E402,F401

ce_mod = sys.modules["liger_core.ops._ce_kernel"]  # the CE kernel, its launcher and launch knobs
ce_math = sys.modules["liger_core.ops._ce_math"]
GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")


@triton.jit
def _ce_prefetch_kernel(
    x_ptr, g_ptr, t_ptr, loss_ptr, stride, n_cols, inv_n, BLOCK: tl.constexpr,
    P1: tl.constexpr, P2: tl.constexpr, PS: tl.constexpr, EARLY_RETURN: tl.constexpr = False,
    NUM_STAGES: tl.constexpr = None, PREFETCH: tl.constexpr = True,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    xr = x_ptr + row * stride
    gr = g_ptr + row * stride
    y = tl.load(t_ptr + row).to(tl.int64)
    if EARLY_RETURN:  # the production kernel's ignored-row exit: is the rest slower when nested in a branch?
        if y == -100:
            for start in range(0, n_cols, BLOCK):
                c = start + tl.arange(0, BLOCK)
                tl.store(gr + c, tl.zeros([BLOCK], tl.float32).to(g_ptr.dtype.element_ty), mask=c < n_cols)
            return
    x_y = tl.load(xr + y).to(tl.float32)
    cols = tl.arange(0, BLOCK)
    if PREFETCH:
        x_next = tl.load(xr + cols, mask=cols < n_cols, other=-float("inf"), eviction_policy=P1)
    m = tl.full([], -float("inf"), tl.float32)
    d = tl.full([], 0.0, tl.float32)
    # NUM_STAGES None: the same loop as a plain range; else Triton's software pipeliner on pass 1
    for start in tl.range(0, n_cols, BLOCK, num_stages=NUM_STAGES):
        if PREFETCH:
            x = x_next.to(tl.float32)
            nxt = start + BLOCK + cols
            x_next = tl.load(xr + nxt, mask=nxt < n_cols, other=-float("inf"), eviction_policy=P1)
        else:
            c = start + cols
            x = tl.load(xr + c, mask=c < n_cols, other=-float("inf"), eviction_policy=P1).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    d64 = d.to(tl.float64)
    tl.store(loss_ptr + row, m.to(tl.float64) - x_y.to(tl.float64) + tl.log(d64))
    coef = (inv_n / d64).to(tl.float32)
    for start in range(0, n_cols, BLOCK):
        c = start + cols
        mask = c < n_cols
        x = tl.load(xr + c, mask=mask, other=0.0, eviction_policy=P2).to(tl.float32)
        dx = coef * tl.exp(x - m)
        dx = tl.where(c == y, dx - inv_n, dx)
        tl.store(gr + c, dx.to(g_ptr.dtype.element_ty), mask=mask, eviction_policy=PS)


@triton.jit
def _ce_staggered_kernel(
    x_ptr, g_ptr, t_ptr, loss_ptr, stride, n_rows, n_cols, inv_n, BLOCK: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):  # fmt: skip
    """Persistent: program p owns rows p, p + G, p + 2G, ... (G programs). Iteration k runs pass 1 of row r_k
    (evict_last reads from HBM) interleaved block by block with pass 2 of row r_{k-1} (evict_first re-reads
    from L2, gradient stores), so that HBM reads and writes are in flight together and the pass-1 reductions
    overlap the gradient stores. Iteration 0 has no pass 2, iteration n_mine no pass 1: both are masked
    off (per-row column limits of 0, so their loads touch no memory). Ignored rows (-100): no pass-1 reads,
    loss 0, zero gradient."""
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    n_mine = tl.cdiv(n_rows - pid, n_progs)
    cols = tl.arange(0, BLOCK)
    # the row in pass 2: its column limits for loads (0 if none or ignored) and for stores (0 if none),
    # target, max and gradient coefficient
    lim_c = n_cols * 0
    slim_c = n_cols * 0
    y_c = tl.full([], -100, tl.int64)
    m_c = tl.full([], 0.0, tl.float32)
    coef_c = tl.full([], 0.0, tl.float32)
    for k in range(0, n_mine + 1):
        row_n = pid.to(tl.int64) + k * n_progs  # the row in pass 1 (row_n < n_rows iff k < n_mine)
        row_c = row_n - n_progs  # the row in pass 2
        has_n = k < n_mine
        y_n = tl.load(t_ptr + row_n, mask=has_n, other=-100).to(tl.int64)
        valid_n = has_n & (y_n != -100)
        lim_n = tl.where(valid_n, n_cols, 0)
        # masked lanes: -inf (exp gives 0); 0 in an ignored row (all masked), so that m and d stay finite
        fill = tl.where(valid_n, -float("inf"), 0.0)
        xn = x_ptr + row_n * stride
        xc = x_ptr + row_c * stride
        gc = g_ptr + row_c * stride
        x_y = tl.load(xn + y_n, mask=valid_n, other=0.0).to(tl.float32)
        m = tl.full([], -float("inf"), tl.float32)
        d = tl.full([], 0.0, tl.float32)
        if PREFETCH:
            a_next = tl.load(xn + cols, mask=cols < lim_n, other=fill, eviction_policy="evict_last")
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            if PREFETCH:
                a = a_next
                nxt = c + BLOCK
                a_next = tl.load(xn + nxt, mask=nxt < lim_n, other=fill, eviction_policy="evict_last")
            else:
                a = tl.load(xn + c, mask=c < lim_n, other=fill, eviction_policy="evict_last")
            b = tl.load(xc + c, mask=c < lim_c, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dx = coef_c * tl.exp(b - m_c)
            dx = tl.where(c == y_c, dx - inv_n, dx)
            tl.store(gc + c, dx.to(g_ptr.dtype.element_ty), mask=c < slim_c, eviction_policy="evict_first")
            a = a.to(tl.float32)
            m_new = tl.maximum(m, tl.max(a, 0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(a - m_new), 0)
            m = m_new
        d64 = d.to(tl.float64)
        loss_n = m.to(tl.float64) - x_y.to(tl.float64) + tl.log(d64)
        tl.store(loss_ptr + row_n, tl.where(valid_n, loss_n, 0.0), mask=has_n)
        lim_c = lim_n
        slim_c = tl.where(has_n, n_cols, 0)
        y_c = y_n
        m_c = tl.where(valid_n, m, 0.0)
        coef_c = tl.where(valid_n, (inv_n / d64).to(tl.float32), 0.0)


@triton.jit
def _ce_split_kernel(
    x_ptr, g_ptr, t_ptr, loss_ptr, part_ptr, count_ptr, stride, n_cols, inv_n,
    SPLIT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    row = (pid // SPLIT).to(tl.int64)
    part = pid % SPLIT
    xr = x_ptr + row * stride
    gr = g_ptr + row * stride
    y = tl.load(t_ptr + row).to(tl.int64)
    c = part * BLOCK + tl.arange(0, BLOCK)
    mask = c < n_cols
    x = tl.load(xr + c, mask=mask, other=-float("inf"), eviction_policy="evict_first").to(tl.float32)
    m_i = tl.max(x, 0)
    d_i = tl.sum(tl.exp(x - m_i), 0)
    tl.store(part_ptr + (row * SPLIT + part) * 2, m_i)
    tl.store(part_ptr + (row * SPLIT + part) * 2 + 1, d_i)
    # release: the partials are visible before the count moves; acquire: the siblings' partials are visible
    tl.atomic_add(count_ptr + row, 1, sem="release")
    n_done = tl.atomic_add(count_ptr + row, 0, sem="acquire")
    while n_done < SPLIT:
        n_done = tl.atomic_add(count_ptr + row, 0, sem="acquire")
    parts = tl.arange(0, SPLIT)
    ms = tl.load(part_ptr + (row * SPLIT + parts) * 2, volatile=True)
    ds = tl.load(part_ptr + (row * SPLIT + parts) * 2 + 1, volatile=True)
    m = tl.max(ms, 0)
    d = tl.sum(ds.to(tl.float64) * tl.exp(ms - m).to(tl.float64), 0)
    if part == 0:
        x_y = tl.load(xr + y).to(tl.float64)
        tl.store(loss_ptr + row, m.to(tl.float64) - x_y + tl.log(d))
    coef = (inv_n / d).to(tl.float32)
    dx = coef * tl.exp(x - m)
    dx = tl.where(c == y, dx - inv_n, dx)
    tl.store(gr + c, dx.to(g_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")


@triton.jit
def _ce_whole_row_kernel(x_ptr, g_ptr, t_ptr, loss_ptr, stride, n_cols, inv_n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xr = x_ptr + row * stride
    gr = g_ptr + row * stride
    y = tl.load(t_ptr + row).to(tl.int64)
    c = tl.arange(0, BLOCK)
    mask = c < n_cols
    x = tl.load(xr + c, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, 0)
    d = tl.sum(tl.exp(x - m), 0).to(tl.float64)
    x_y = tl.load(xr + y).to(tl.float64)
    tl.store(loss_ptr + row, m.to(tl.float64) - x_y + tl.log(d))
    dx = (inv_n / d).to(tl.float32) * tl.exp(x - m)
    dx = tl.where(c == y, dx - inv_n, dx)
    tl.store(gr + c, dx.to(g_ptr.dtype.element_ty), mask=mask)


# staggered kernel configurations on GPU: (BLOCK, num_warps, programs per SM)
STAGGERED = ((8192, 16, 1), (8192, 32, 1), (16384, 32, 1), (4096, 16, 2), (8192, 16, 2))


def p2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def reference(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x64 = x.double().requires_grad_(True)
    rows = torch.nn.functional.cross_entropy(x64, t, reduction="none")
    rows.mean().backward()
    return rows.detach(), x64.grad


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


def bench_ms(fn) -> float:
    if not GPU:
        fn()
        return float("nan")
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))


def compiled(kernel) -> set[str]:
    """Registers / spills of every compiled version of a kernel (GPU)."""
    out = set()
    for dev_cache in (getattr(kernel, "device_caches", None) or {}).values():
        for ck in dev_cache[0].values():
            if hasattr(ck, "_init_handles"):
                ck._init_handles()
            out.add(f"warps {ck.metadata.num_warps} regs {ck.n_regs} spills {ck.n_spills}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192 if GPU else 5)
    ap.add_argument("--vocab", type=int, default=128256 if GPU else 1031)
    ap.add_argument("--all", action="store_true", help="also the split-row and cluster variants")
    args = ap.parse_args()
    n, v = args.n, args.vocab
    x = (torch.randn(n, v, device=DEVICE) * 2).to(torch.bfloat16)
    t = torch.randint(0, v, (n,), device=DEVICE)
    ref_rows, ref_grad = reference(x, t)
    eager_rows = torch.nn.functional.cross_entropy(x.float(), t, reduction="none")
    xe = x.float().requires_grad_(True)
    torch.nn.functional.cross_entropy(xe, t).backward()
    print(f"CE {n}x{v} bf16 on {DEVICE}; floor (read + write) {2 * n * v * 2 / 3.0e12 * 1e3:.4f} ms")
    print(
        f"  eager fp32 errors: loss rows {rel(eager_rows, ref_rows):.2e}, "
        f"grad {rel(xe.grad.bfloat16(), ref_grad):.2e}"
    )
    g = torch.empty_like(x)
    loss = torch.empty(n, dtype=torch.float64, device=DEVICE)
    stats = ce_math.target_stats(t, None, -100, v)
    z = torch.empty_like(loss)

    def production():
        ce_mod.launch_cross_entropy(
            x, t, None, g, loss, z, stats, ignore_index=-100, mean=True, label_smoothing=0.0,
            lse_square_scale=0.0, softcap=None,
        )  # fmt: skip

    def production_with(**knobs):
        def run():
            old = {k: getattr(ce_mod, k) for k in knobs}
            for k, v in knobs.items():
                setattr(ce_mod, k, v)
            try:
                production()
            finally:
                for k, v in old.items():
                    setattr(ce_mod, k, v)

        return run

    variants = {
        "production (defaults: 16384/32, pass-1 prefetch)": production,
        "production, no prefetch": production_with(CE_PASS1_PREFETCH=False),
        "production, 32768/32": production_with(CE_MAX_BLOCK=32768),
        "production, 32768/32, no prefetch": production_with(CE_MAX_BLOCK=32768, CE_PASS1_PREFETCH=False),
    }
    shapes = ((32768, 32), (16384, 32), (16384, 16), (8192, 16)) if args.all else ((32768, 32), (16384, 32))
    for block, warps in shapes if GPU else ((256, 4),):
        for hints in (True, False) if args.all else (True,):

            def pf(block=block, warps=warps, hints=hints):
                _ce_prefetch_kernel[(n,)](
                    x, g, t, loss, x.stride(0), v, 1.0 / n, BLOCK=block,
                    P1="evict_last" if hints else "", P2="evict_first" if hints else "",
                    PS="evict_first" if hints else "", num_warps=warps,
                )  # fmt: skip

            variants[f"prefetch {block}/{warps}{' hints' if hints else ''}"] = pf
    if GPU:

        def pf_exit():
            _ce_prefetch_kernel[(n,)](
                x, g, t, loss, x.stride(0), v, 1.0 / n, BLOCK=32768, P1="evict_last", P2="evict_first",
                PS="evict_first", EARLY_RETURN=True, num_warps=32,
            )  # fmt: skip

        variants["prefetch 32768/32 hints, ignored-row early return"] = pf_exit
    for stages, prefetch in ((2, False), (3, False)) if GPU else ((2, False),):
        block, warps = (16384, 32) if GPU else (256, 4)

        def pf_stages(block=block, warps=warps, stages=stages, prefetch=prefetch):
            _ce_prefetch_kernel[(n,)](
                x, g, t, loss, x.stride(0), v, 1.0 / n, BLOCK=block, P1="evict_last", P2="evict_first",
                PS="evict_first", NUM_STAGES=stages, PREFETCH=prefetch, num_warps=warps,
            )  # fmt: skip

        name = (
            f"prefetch {block}/{warps} hints, pass 1 num_stages {stages}{'' if prefetch else ', no prefetch'}"
        )
        variants[name] = pf_stages
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count if GPU else 0
    stag = (
        [(b, w, pps, pf) for b, w, pps in STAGGERED for pf in (False, True)]
        if GPU
        else [(256, 4, 0, False), (256, 4, 0, True)]
    )
    for block, warps, pps, prefetch in stag:
        grid = min(n, n_sms * pps) if GPU else min(n, 3)

        # P programs of W warps resident per SM need <= 65536 / (P * W * 32) registers per thread
        # (8192/16 with the prefetch needs 79 uncapped, so only one would be resident)
        cap = {"maxnreg": 65536 // (pps * warps * 32)} if pps > 1 else {}

        def st(block=block, warps=warps, grid=grid, prefetch=prefetch, cap=cap):
            _ce_staggered_kernel[(grid,)](
                x, g, t, loss, x.stride(0), n, v, 1.0 / n, BLOCK=block, PREFETCH=prefetch, num_warps=warps,
                **cap,
            )  # fmt: skip

        per_sm = f"{pps}/SM, " if GPU else ""
        variants[f"staggered {block}/{warps}, {per_sm}{grid} progs{', prefetch' if prefetch else ''}"] = st
    if GPU and args.all:
        for split, warps in ((4, 32), (8, 16), (8, 32), (16, 8), (16, 16)):
            block = p2(-(-v // split))
            part = torch.empty(n * split * 2, dtype=torch.float32, device=DEVICE)
            count = torch.zeros(n, dtype=torch.int32, device=DEVICE)

            def sp(split=split, warps=warps, block=block, part=part, count=count):
                count.zero_()
                _ce_split_kernel[(n * split,)](
                    x, g, t, loss, part, count, x.stride(0), v, 1.0 / n, SPLIT=split, BLOCK=block,
                    num_warps=warps,
                )  # fmt: skip

            variants[f"split {split} x {block} cols/{warps} warps (+ count memset)"] = sp
        for ctas in (2, 4):

            def cl(ctas=ctas):
                _ce_whole_row_kernel[(n,)](
                    x, g, t, loss, x.stride(0), v, 1.0 / n, BLOCK=p2(v), num_warps=32, num_ctas=ctas
                )

            variants[f"whole row, cluster of {ctas} CTAs"] = cl
    seen: set[str] = set()
    for name, fn in variants.items():
        try:
            g.fill_(float("nan"))
            loss.fill_(float("nan"))
            fn()
            if GPU:
                torch.cuda.synchronize()
            e_rows, e_grad = rel(loss, ref_rows), rel(g, ref_grad)
            ms = bench_ms(fn)
            floor = 2 * n * v * 2 / 3.0e12 * 1e3
            new = set()
            if GPU:
                for k in (
                    ce_mod._cross_entropy_kernel,
                    _ce_prefetch_kernel,
                    _ce_split_kernel,
                    _ce_staggered_kernel,
                ):
                    new |= {f"{getattr(k, '__name__', 'kernel')}: {c}" for c in compiled(k)}
            regs = "; ".join(sorted(new - seen))
            seen |= new
            print(
                f"  {name:62s} {ms:.4f} ms ({100 * floor / ms:3.0f}%)  loss {e_rows:.2e} grad {e_grad:.2e}"
                + (f"  [{regs}]" if regs else "")
            )
        except Exception as e:  # noqa: BLE001
            print(f"  {name:62s} ERROR {type(e).__name__}: {str(e)[:400]}")
            traceback.print_exc(limit=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

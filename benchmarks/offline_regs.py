"""Compile kernels for the H100 (sm_90) on a machine without a GPU and print registers / stack (spills): the
norm backward kernels and the row-resident cross-entropy kernel (Gluon: the interpreter cannot run it).

    python benchmarks/offline_regs.py
    # the GPU machine's Triton (3.6) instead of this venv's, installed beside it once:
    pip install --no-deps --target /tmp/t36site triton==3.6.0
    PYTHONPATH=/tmp/t36site python benchmarks/offline_regs.py

Why: the CPU interpreter accepts code that the GPU compiler of another Triton version rejects (session 9: a
string default of a ``tl.constexpr`` argument compiled under the interpreter and Triton 3.9, and failed every
norm backward on the GPU machine's Triton 3.6), and registers/spills decide the wide-row norm settings
(``liger_core.ops._launch.NORM_BWD_WIDE_*``). This runs Triton's own compiler and ``ptxas`` (shipped in the
wheel) for sm_90 and reads the resource usage with ``cuobjdump``; nothing is launched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # the real compiler, even where the test environment sets it
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import ASTSource  # noqa: E402

import liger_core.ops  # noqa: E402,F401

rms = sys.modules["liger_core.ops.rms_norm"]
ln = sys.modules["liger_core.ops.layer_norm"]
CUOBJDUMP = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
FP32_POINTERS = {"rstd_ptr", "mean_ptr", "partials_ptr", "dw_partial_ptr"}


def jit_function(kernel):
    """The JITFunction under decorators (``fast_launch`` wraps it)."""
    while not hasattr(kernel, "arg_names"):
        kernel = kernel.fn
    return kernel


def resource_usage(compiled) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([str(CUOBJDUMP), "-res-usage", f.name], capture_output=True, text=True).stdout
    line = next(line for line in out.splitlines() if "REG:" in line)
    return " ".join(part for part in line.split() if part.split(":")[0] in ("REG", "STACK", "SHARED"))


def compile_norm_bwd(kernel, constexprs: dict, num_warps: int):
    fn = jit_function(kernel)
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*fp32" if name in FP32_POINTERS else "*bf16"
        else:
            signature[name] = "fp32" if name == "offset" else "i32"
    source = ASTSource(fn, signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def compile_ce_resident(n_cols: int, num_warps: int):
    """The row-resident cross-entropy kernel (Gluon) for bf16 rows of ``n_cols``, with the 16-divisibility
    that Triton's launch specialises on for aligned tensors and strides (the kernel needs it: see
    ``resident_supported``)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    res = sys.modules["liger_core.ops._cross_entropy_resident"]
    fn = jit_function(res._cross_entropy_resident_kernel)
    slots, reg_cols = res.resident_layout(n_cols)
    constexprs = dict(
        MEAN=True, HAS_SMOOTHING=True, HAS_GRAD_SCALE=False, COMPUTE_GRAD=True, SLOT=res.SLOT,
        NUM_SLOTS=slots, REG_COLS=reg_cols, NUM_WARPS=num_warps,
    )  # fmt: skip
    types = {"logits_ptr": "*bf16", "grad_ptr": "*bf16", "target_ptr": "*i64"}
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        if name.endswith("_ptr"):
            signature[name] = types.get(name, "*fp64")
        else:
            signature[name] = "fp32" if name.endswith(("_hi", "_lo")) else "i32"
        if name.endswith("_ptr") or name in ("logits_row_stride", "grad_row_stride", "n_cols"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = GluonASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def main() -> int:
    print(f"triton {triton.__version__}, sm_90, bf16 backward kernels (BLOCK_M 1)")
    failed = 0
    for name, kernel, extra in (
        ("rms_norm", rms._rms_norm_bwd_kernel, {}),
        ("layer_norm", ln._layer_norm_bwd_kernel, {"HAS_BIAS": True}),
    ):
        for block_n, warps, reload in (
            (16384, 32, False), (16384, 32, True), (16384, 16, True), (8192, 16, False), (8192, 16, True),
            (8192, 8, True), (4096, 8, False),
        ):  # fmt: skip
            constexprs = dict(
                BLOCK_M=1, BLOCK_N=block_n, SINGLE_PASS=True, PREFETCH=block_n <= 4096, PRECISE=False,
                RELOAD=reload, **extra,
            )  # fmt: skip
            label = f"{name:10s} {block_n:5d} cols {warps:2d} warps {'reload' if reload else 'held  '}"
            try:
                print(f"  {label}  {resource_usage(compile_norm_bwd(kernel, constexprs, warps))}", flush=True)
            except Exception as e:  # noqa: BLE001 - report every configuration
                failed += 1
                print(f"  {label}  ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
    print("cross-entropy, row-resident Gluon kernel (shared memory + registers), bf16")
    for n_cols, warps in ((128256, 8), (128256, 16), (32000, 8)):
        label = f"  {n_cols:6d} cols {warps:2d} warps"
        try:
            compiled = compile_ce_resident(n_cols, warps)
            print(f"{label}  {resource_usage(compiled)} (allocated {compiled.metadata.shared} B)", flush=True)
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"{label}  ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

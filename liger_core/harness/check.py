"""``liger-core check``: every kernel of this install against its float64 reference, on this machine.

For each op in ``liger_core.ops`` (ops not written yet are skipped with a note) and each dtype, forward
and every gradient are compared with the float64 reference of the same (already rounded) inputs, beside the
error of the PyTorch eager code the kernel replaces; an op passes when, for every output,
``err(kernel) <= 1.25 * err(eager) + floor(dtype)`` (the rule of the unit tests). On a GPU the shapes are
the benchmark's realistic ones and the table adds the kernel's fwd+bwd median time; on CPU the shapes are
small and odd, the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` is set here when no GPU is
present and triton is not imported yet), and nothing is timed. The exit code is 1 when any check fails.

The inputs, reference runs and error metric are those of the benchmark suite (``liger_core.harness``:
``registry`` and ``correctness``).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

import torch

from liger_core.harness.correctness import CaseRunner
from liger_core.harness.interpreter import prepare_triton, quiet_interpreter
from liger_core.harness.registry import ALL_OPS, OPS, PackageImportError, available

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LOSS_GRAD = 0.5  # a grad_output that is not 1, so a kernel that ignores it fails here


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="liger-core check",
        description="Check each kernel (forward and backward) against its float64 reference on this machine.",
    )
    p.add_argument(
        "--ops", nargs="+", default=list(ALL_OPS), metavar="OP", help="ops to check (default: all)"
    )
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPES))
    p.add_argument("--no-time", action="store_true", help="on a GPU, skip the timing column")
    args = p.parse_args(argv)
    unknown = [o for o in args.ops if o not in OPS]
    if unknown:
        p.error(f"unknown op(s) {unknown}; choose from {list(ALL_OPS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    with quiet_interpreter():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    note = prepare_triton(cuda=cuda)  # before anything imports triton
    if note:
        print(f"note: {note}")

    from liger_core.dispatch import triton_status

    status = triton_status()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda and status != "compiled":
        print(
            f"liger-core check: a CUDA GPU is present but Triton is {status}; "
            "unset TRITON_INTERPRET and retry"
        )
        return 2
    if not cuda and status != "interpreted":
        print(
            f"liger-core check: no CUDA GPU and Triton is {status}, so the kernels cannot run here "
            "(CPU tensors would take the reference path and the check would compare the reference with "
            "itself). Run with TRITON_INTERPRET=1 set before Python starts, with triton installed."
        )
        return 2
    where = (
        f"{torch.cuda.get_device_name(device)}, Triton compiled, realistic shapes"
        if cuda
        else "CPU, Triton interpreter, small odd shapes, untimed"
    )
    print(f"liger-core check on {where}; reference: float64; pass: err <= 1.25 x eager's err + dtype floor")

    rows: list[tuple] = []
    failed = broken = 0  # checks that failed; ops whose package failed to import
    for name in args.ops:
        spec = OPS[name]
        try:
            fn, ref = available("ops", name), available("reference", name)
        except PackageImportError as e:
            print(f"FAIL {name}: {e}")
            broken += 1
            continue
        if fn is None:
            print(f"skip {name}: liger_core.ops.{name} is not in this install yet")
            continue
        if ref is None:
            print(
                f"skip {name}: liger_core.reference.{name} is missing, so there is nothing to check against"
            )
            continue
        shape = spec.shapes["default" if cuda else "cpu"][0]
        for dname in args.dtypes:
            row, ok = check_one(spec, fn, shape, DTYPES[dname], device, timed=cuda and not args.no_time)
            rows.append(row)
            failed += not ok
            print_row(row, header=len(rows) == 1)
    print()
    if broken:
        print(f"{broken} op(s) could not be imported (see FAIL lines above)")
    if not rows:
        print("no op was checked")
        return 1
    print(f"{len(rows) - failed}/{len(rows)} checks passed" + (f", {failed} FAILED" if failed else ""))
    return 1 if failed or broken else 0


def check_one(
    spec, fn, shape: dict, dtype: torch.dtype, device: torch.device, timed: bool
) -> tuple[tuple, bool]:
    dname = str(dtype).replace("torch.", "")
    label = spec.label(shape)
    try:
        runner = CaseRunner(spec, shape, dtype, device, loss_grad=LOSS_GRAD)
        runner.compute_reference()
        if runner.ref is None:
            raise RuntimeError("not enough GPU memory for the float64 reference")
        runner.set_eager(runner.run_checked(runner.reference).errors)
        run = runner.run_checked(fn)
        err, eager_err, worst, ok = runner.verdict(run.errors)
        ms = _quick_time(run) if timed else None
        del run, runner
    except Exception as e:  # noqa: BLE001 - report the op as failed and go on with the others
        msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:200]
        return (spec.name, dname, label, "", math.nan, math.nan, "ERROR " + msg, None), False
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return (spec.name, dname, label, worst, err, eager_err, "pass" if ok else "FAIL", ms), ok


def print_row(row: tuple, header: bool) -> None:
    if header:
        head = (
            f"{'op':<27} {'dtype':<9} {'shape':<26} {'worst':<16} {'kernel err':>10} {'eager err':>10} "
            f"{'ratio':>6}  {'result':<6} {'f+b ms':>8}"
        )
        print(head)
        print("-" * len(head))
    op, dname, label, worst, err, eager_err, result, ms = row
    ratio = err / eager_err if eager_err and eager_err > 0 and math.isfinite(err) else math.nan
    ms_cell = f"{ms:8.3f}" if ms is not None else f"{'-':>8}"
    print(
        f"{op:<27} {dname:<9} {label:<26} {worst:<16} {err:10.2e} {eager_err:10.2e} {ratio:6.2f}  "
        f"{result:<6} {ms_cell}"
    )
    sys.stdout.flush()


def _quick_time(run) -> float:
    """The fwd+bwd median in ms, with the benchmark's quick timer (a GPU check only: the timing module and
    triton.testing are imported here, not by the CPU check)."""
    from liger_core.harness.timing import QUICK, time_step

    return time_step(run, "fwd+bwd", QUICK)[0]

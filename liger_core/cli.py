"""The ``liger-core`` command.

    liger-core env      versions, GPU, Triton status and which path CPU tensors take
    liger-core check    every kernel vs its float64 reference on this machine (table; exit 1 on a failure)
    liger-core demo     train a tiny model with and without the kernels (liger_core.demo)
    liger-core bench    the GPU benchmark suite (CSV + PNG under benchmarks/results/; needs a CUDA GPU)

``python -m liger_core.cli ...`` does the same without the console script. Heavy imports happen inside each
subcommand, so ``check`` can set ``TRITON_INTERPRET=1`` before triton is imported.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
from collections.abc import Sequence

COMMANDS = {
    "env": "print versions, the GPU and which path (Triton compiled / interpreted / reference) tensors take",
    "check": "check each kernel forward and backward against its float64 reference (table of errors)",
    "demo": "train a tiny model with and without the kernels and compare speed, memory and loss",
    "bench": "benchmark the kernels against torch eager, torch.compile, liger-kernel and CCE (needs a GPU)",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="liger-core",
        description="liger_core: exact, fast Triton kernels for LLM training.",
        epilog="\n".join(f"  {name:<7} {text}" for name, text in COMMANDS.items())
        + "\n\n`liger-core COMMAND --help` shows a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help=", ".join(COMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.command == "env":
        if ns.args:
            parser.error(f"env takes no arguments, got {ns.args}")
        return env()
    if ns.command == "check":
        from liger_core import check

        return check.main(ns.args)
    if ns.command == "bench":
        from liger_core import bench

        return bench.main(ns.args)
    return demo(ns.args)


def demo(argv: list[str]) -> int:
    try:
        module = importlib.import_module("liger_core.demo")
    except ModuleNotFoundError as e:
        if e.name != "liger_core.demo":
            raise
        print(
            "liger-core demo: liger_core.demo is not part of this install (no liger_core/demo.py)",
            file=sys.stderr,
        )
        return 2
    result = module.main(argv)
    return int(result or 0)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def env() -> int:
    """Report; changes nothing (TRITON_INTERPRET is reported as found)."""
    import torch

    import liger_core

    print(f"liger_core   {liger_core.__version__} ({os.path.dirname(liger_core.__file__)})")
    print(f"python       {platform.python_version()} ({sys.executable})")
    print(f"torch        {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})")
    print(f"triton       {_version('triton')}")
    print(f"transformers {_version('transformers')}")
    lk, cce = _version("liger-kernel"), _version("cut-cross-entropy")
    print(f"peers        liger-kernel {lk}, cut-cross-entropy {cce}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(
                f"GPU {i}        {p.name}: {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB, "
                f"compute capability {p.major}.{p.minor}"
            )
    else:
        print("GPU          no GPU (torch.cuda.is_available() is False)")

    from liger_core.dispatch import triton_status

    status = triton_status()
    interpret = os.environ.get("TRITON_INTERPRET", "")
    explain = {
        "compiled": "compiled (TRITON_INTERPRET unset: kernels are compiled for a GPU)",
        "interpreted": f"interpreted (TRITON_INTERPRET={interpret}: kernels run in Triton's interpreter)",
        "missing": "missing (triton failed to import)",
    }
    print(f"Triton       {explain[status]}")
    if status == "interpreted":
        cpu_path = "the Triton kernels, in Triton's interpreter (slow; for tests)"
        cuda_path = "refused: unset TRITON_INTERPRET to run on CUDA tensors"
    else:
        cpu_path = (
            "the pure-PyTorch reference path (set TRITON_INTERPRET=1 before Python starts for the kernels)"
        )
        cuda_path = "the compiled Triton kernels" if status == "compiled" else "unavailable (no triton)"
    print(f"CPU tensors  {cpu_path}")
    if torch.cuda.is_available():
        print(f"CUDA tensors {cuda_path}")

    from liger_core.bench import ALL_OPS

    try:
        ops = importlib.import_module("liger_core.ops")
    except Exception as e:  # noqa: BLE001 - a broken op file must not hide the rest of the report
        print(f"ops          liger_core.ops failed to import: {type(e).__name__}: {e}")
        return 1
    have = [o for o in ALL_OPS if hasattr(ops, o)]
    missing = [o for o in ALL_OPS if o not in have]
    print(
        f"ops          {', '.join(have) or 'none'}" + (f" (not yet: {', '.join(missing)})" if missing else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``liger-core`` command.

    liger-core env      versions, whether a GPU is present and usable, what the kernels run as here
    liger-core check    every kernel vs its float64 reference on this machine (table; exit 1 on a failure)
    liger-core demo     train a tiny model with and without the kernels, with progress (liger_core.demo)
    liger-core bench    the GPU benchmark suite (CSV + PNG under benchmarks/results/; needs a CUDA GPU;
                        --dry-run exercises it on CPU and writes into a temporary directory)
    liger-core --version

Without a command it prints its help, the commands listed, and exits with 2 (argparse's usage-error code).
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
    "demo": "train a tiny model with and without the kernels: loss curves (and speed, memory on a GPU)",
    "bench": "benchmark the kernels against torch eager, torch.compile, liger-kernel and CCE (needs a GPU)",
}


def build_parser() -> argparse.ArgumentParser:
    from liger_core import __version__

    parser = argparse.ArgumentParser(
        prog="liger-core",
        usage="liger-core [-h] [--version] COMMAND [ARGS...]",
        description="liger_core: exact, fast Triton kernels for LLM training.\n\ncommands:\n"
        + "\n".join(f"  {name:<7} {text}" for name, text in COMMANDS.items()),
        epilog="`liger-core COMMAND --help` shows a command's options. Start with `liger-core env`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"liger-core {__version__}")
    parser.add_argument(
        "command", nargs="?", choices=list(COMMANDS), metavar="COMMAND", help=", ".join(COMMANDS)
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code. With no command: the help (commands listed) on stderr, exit code 2,
    as argparse does for any other usage error."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help(sys.stderr)
        return 2
    if ns.command == "env":
        return env(ns.args)
    if ns.command == "check":
        from liger_core.harness import check

        return check.main(ns.args)
    if ns.command == "bench":
        from liger_core.harness import bench

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


def gpu_summary() -> tuple[str | None, str]:
    """(name of a usable CUDA GPU or None, a sentence saying what was found). A GPU counts as usable when a
    small tensor can be written and read back on it, not just when ``torch.cuda.is_available()``."""
    import torch

    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return None, "none: this torch is a CPU-only build (torch.version.cuda is None)"
        return None, f"none visible: torch is built for CUDA {torch.version.cuda}, but finds no GPU"
    try:
        torch.ones(1, device="cuda").add_(1).item()
    except Exception as e:  # noqa: BLE001 - any failure means the GPU cannot run work
        return None, f"present but not usable: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return torch.cuda.get_device_name(0), "usable"


def kernel_paths(status: str, gpu: str | None, interpret: str) -> list[tuple[str, str]]:
    """What ``Triton`` is in this process and what liger_core's ops run as, for CPU tensors and, when a GPU is
    usable, for CUDA tensors: (field, text) rows of ``liger-core env``.

    ``status`` is ``dispatch.triton_status()`` ("compiled": ``@triton.jit`` compiles, "interpreted":
    ``TRITON_INTERPRET`` was set before triton was imported, "missing"); ``gpu`` the usable GPU's name."""
    rows = []
    if status == "missing":
        rows.append(("Triton", "missing (triton failed to import): every op runs as PyTorch reference code"))
    elif status == "interpreted":
        rows.append(("Triton", f"interpreter (TRITON_INTERPRET={interpret}): kernels run in Python, on CPU"))
    elif gpu is not None:
        rows.append(("Triton", "compiles the kernels for the GPU (TRITON_INTERPRET unset)"))
    else:
        rows.append(("Triton", "installed, but there is no usable GPU to compile the kernels for"))

    if status == "interpreted":
        rows.append(("CPU tensors", "the Triton kernels, in Triton's interpreter (exact, slow: for tests)"))
    else:
        how = "set TRITON_INTERPRET=1 before Python starts for the real kernels, slowly"
        rows.append(
            (
                "CPU tensors",
                "PyTorch reference code, not the Triton kernels"
                + ("" if status == "missing" else f" ({how})"),
            )
        )
    if gpu is not None:
        cuda = {
            "compiled": f"the compiled Triton kernels on {gpu}",
            "interpreted": "refused: unset TRITON_INTERPRET to run the kernels on CUDA tensors",
            "missing": "PyTorch reference code (install triton for the kernels)",
        }[status]
        rows.append(("CUDA tensors", cuda))
    if gpu is not None and status == "compiled":
        summary = f"run as compiled Triton on {gpu}: speed and memory measured here are the kernels'"
    elif status == "interpreted":
        summary = "run as Triton in the interpreter: the kernels' results, not their speed or memory"
    else:
        summary = "run as PyTorch reference code: the kernels' results, not their speed or memory"
    rows.append(("kernels", summary))
    return rows


def env(argv: Sequence[str] = ()) -> int:
    """Report; changes nothing (TRITON_INTERPRET is reported as found)."""
    argparse.ArgumentParser(
        prog="liger-core env",
        description="Print versions, whether a GPU is present and usable, and what liger_core's kernels run "
        "as here (compiled Triton, Triton's interpreter, or PyTorch reference code). Changes nothing.",
    ).parse_args(list(argv))
    import torch

    import liger_core

    print(f"liger_core   {liger_core.__version__} ({os.path.dirname(liger_core.__file__)})")
    print(f"python       {platform.python_version()} ({sys.executable})")
    print(f"torch        {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})")
    print(f"triton       {_version('triton')}")
    print(f"transformers {_version('transformers')}")
    lk, cce = _version("liger-kernel"), _version("cut-cross-entropy")
    print(f"peers        liger-kernel {lk}, cut-cross-entropy {cce}")
    gpu, gpu_text = gpu_summary()
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(
                f"GPU {i}        {p.name}: {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB, "
                f"compute capability {p.major}.{p.minor}"
            )
        print(f"GPU usable   {gpu_text}")
    else:
        print(f"GPU          {gpu_text}")

    from liger_core.dispatch import triton_status

    for field, text in kernel_paths(triton_status(), gpu, os.environ.get("TRITON_INTERPRET", "")):
        print(f"{field:<12} {text}")

    from liger_core.harness.registry import ALL_OPS

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

"""Run an unchanged training script with `liger_core_hf.install()` active.

    liger-core-run train.py --use_liger_kernel --output_dir out ...
    liger-core-run -m my_package.train --use_liger_kernel ...
    python -m liger_core_hf.launch train.py ...          (same thing without the console script)
    accelerate launch -m liger_core_hf.launch train.py ...   (multi-GPU: the hook is installed in every rank;
    torchrun -m liger_core_hf.launch train.py ... works the same way)

The script sees the `sys.argv` it would see if run directly (`train.py --use_liger_kernel ...`) and runs as
`__main__`, in this process, so the hook is active for every Trainer it builds.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable, Sequence

from .patch import show_patch_logs

USAGE = """usage: {prog} SCRIPT.py [script arguments ...]
       {prog} -m MODULE [script arguments ...]

Runs a training script with liger_core serving TrainingArguments' use_liger_kernel / --use_liger_kernel
(and --liger_kernel_config '{{"rope": false}}'), without the third-party liger-kernel package."""


def run(
    argv: Sequence[str], install: Callable[[], None], prog: str = "liger-core-run", usage: str = USAGE
) -> None:
    """Install the hook, then run `argv` (`script.py args...` or `-m module args...`) as `__main__`."""
    argv = list(argv)
    show_patch_logs()
    if not argv or argv[0] in ("-h", "--help"):
        print(usage.format(prog=prog), file=sys.stderr if not argv else sys.stdout)
        raise SystemExit(2 if not argv else 0)
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit(f"{prog}: -m needs a module name\n" + usage.format(prog=prog))
        install()
        module, rest = argv[1], argv[2:]
        sys.argv = [module, *rest]  # run_module(alter_sys=True) replaces argv[0] with the module's file
        sys.path.insert(0, os.getcwd())  # like `python -m`
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script, rest = argv[0], argv[1:]
    if not os.path.isfile(script):
        raise SystemExit(f"{prog}: no such script: {script}\n" + usage.format(prog=prog))
    install()
    sys.argv = [script, *rest]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # like `python script.py`
    runpy.run_path(script, run_name="__main__")


def main(argv: Sequence[str] | None = None) -> None:
    from .patch import require_liger_core

    def install() -> None:
        try:  # before transformers is imported: a missing liger-core is reported at once, without a traceback
            require_liger_core()
        except ImportError as err:
            raise SystemExit(f"liger-core-run: {err}") from None
        from .hook import install as install_hook

        install_hook()

    run(sys.argv[1:] if argv is None else argv, install)


if __name__ == "__main__":
    main()

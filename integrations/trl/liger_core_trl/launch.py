"""`liger-core-trl`: TRL's training scripts (or any script) with liger_core serving `--use_liger_kernel`.

    liger-core-trl sft --model_name_or_path M --dataset_name D --output_dir OUT --use_liger_kernel ...
    liger-core-trl dpo|grpo|kto|rloo|reward ...       (TRL's other scripts, same arguments as `trl <name>`)
    liger-core-trl my_train.py ... / liger-core-trl -m my_package.train ...
    python -m liger_core_trl sft ...                  (same, without the console script)
    accelerate launch -m liger_core_trl sft ...       (several GPUs: every rank runs with the hook installed)

`trl sft` itself cannot be hooked (it starts `accelerate launch` on TRL's script in a new process); this
runs that same script, `trl.scripts.sft`, with the same arguments, in this process, after
`liger_core_trl.install()`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from liger_core_hf.launch import run

SCRIPTS = ("sft", "dpo", "grpo", "kto", "rloo", "reward")

USAGE = """usage: {prog} {{sft,dpo,grpo,kto,rloo,reward}} [arguments of that TRL script ...]
       {prog} SCRIPT.py [script arguments ...]
       {prog} -m MODULE [script arguments ...]

Runs TRL's training script (or yours) with liger_core serving --use_liger_kernel (and
--liger_kernel_config '{{"rope": false}}'), without the third-party liger-kernel package."""


def main(argv: Sequence[str] | None = None) -> None:
    from liger_core_hf.patch import require_liger_core

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SCRIPTS:
        argv = ["-m", f"trl.scripts.{argv[0]}", *argv[1:]]

    def install() -> None:
        try:
            require_liger_core()
        except ImportError as err:
            raise SystemExit(f"liger-core-trl: {err}") from None
        from .hook import install as install_hook

        install_hook()

    run(argv, install, prog="liger-core-trl", usage=USAGE)


if __name__ == "__main__":
    main()

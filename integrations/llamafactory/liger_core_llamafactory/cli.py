"""``liger-lmf``: ``llamafactory-cli`` with liger_core (see the package docstring). With the plugin installed,
plain ``llamafactory-cli`` does the same through the start-up hook (``import_hook``); ``liger-lmf`` is kept as
an alias that works without it (``LIGER_CORE_DISABLE_HOOK=1``, ``python -S``)."""

from __future__ import annotations

import sys

USAGE = """usage:
  liger-lmf train config.yaml [key=value ...]   training; enable_liger_kernel: true -> liger_core
  liger-lmf webui                               LLaMA Board with a "liger_core kernels" checkbox
  liger-lmf <command> ...                       any other llamafactory-cli command, unchanged
"""


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    from liger_core_llamafactory import import_hook
    from liger_core_llamafactory.compat import ensure_torchaudio_importable

    ensure_torchaudio_importable()
    import_hook.install(force=True)  # also where the start-up hook is off or its .pth was not run
    command = argv[0]
    if command == "train" and not any(a in ("-h", "--help") for a in argv[1:]):
        from liger_core_llamafactory.launch import train

        sys.exit(train(argv[1:]))
    if command == "webui":
        from liger_core_llamafactory.webui import run_web_ui

        run_web_ui()
        return
    from llamafactory.cli import main as llamafactory_main

    sys.argv = ["llamafactory-cli", *argv]
    llamafactory_main()

"""Axolotl plugin for liger_core: list ``liger_core_axolotl.LigerCorePlugin`` under ``plugins:`` and set
``use_liger_kernel: true`` (per-kernel keys ``liger_core_<flag>``, one per field of
``liger_core.patching.KernelFlags``, with ``liger_core_glu_activation`` for SwiGLU and GeGLU together; see
``args``; ``liger_core_strict: true`` stops the run when a kernel asked for cannot be applied). The start-up
hook the wheel installs (``import_hook``, ``preflight``) makes plain ``axolotl train`` stop before training on
a misspelled plugin module or key of this plugin, which Axolotl would otherwise skip;
``liger-core-axolotl check|train config.yaml`` runs the same checks first.
"""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy: Axolotl imports ``liger_core_axolotl.args`` to build its config class; torch is not needed yet.
    if name == "LigerCorePlugin":
        from liger_core_axolotl.plugin import LigerCorePlugin

        return LigerCorePlugin
    if name == "LigerCoreArgs":
        from liger_core_axolotl.args import LigerCoreArgs

        return LigerCoreArgs
    raise AttributeError(
        f"module 'liger_core_axolotl' has no attribute {name!r}; the Axolotl plugin to list under `plugins:` "
        "is liger_core_axolotl.LigerCorePlugin"
    )

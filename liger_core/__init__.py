"""liger_core: exact, fast Triton kernels for LLM training, and the patches that put them into HF models.

Public API (lazily imported: ``import liger_core`` does not import triton or transformers):
- ``liger_core.ops``: functional kernels (rms_norm, layer_norm, rope, swiglu, geglu, cross_entropy, ...)
- ``liger_core.modules``: nn.Module wrappers
- ``liger_core.apply_liger_kernel(model, **flags)``, ``liger_core.revert(model)`` (returns what it restored),
  ``liger_core.apply_liger_kernel_to_<model_type>(**flags)``, ``liger_core.revert_model_type(model_type)``,
  ``liger_core.AutoLigerKernelForCausalLM``
- ``liger_core.compat.liger_kernel``: Liger-Kernel 0.8.5's API (``transformers``, ``chunked_loss``)
- ``liger_core.supported_model_types()``, ``liger_core.model_coverage(model_type)``,
  ``liger_core.recipe_model_types()``
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_PATCHING_NAMES = {
    "apply_liger_kernel",
    "revert",
    "revert_model_type",
    "AutoLigerKernelForCausalLM",
    "supported_model_types",
    "recipe_model_types",
    "model_coverage",
}


def __getattr__(name: str):
    if name in ("ops", "modules", "losses", "patching", "reference", "dispatch", "compat"):
        return importlib.import_module(f"{__name__}.{name}")
    if name in _PATCHING_NAMES or name.startswith("apply_liger_kernel_to_"):
        patching = importlib.import_module(f"{__name__}.patching")
        return getattr(patching, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

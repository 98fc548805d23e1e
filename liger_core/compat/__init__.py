"""Migration layers: other libraries' public API, backed by liger_core.

- ``liger_core.compat.liger_kernel``: Liger-Kernel 0.8.5's ``liger_kernel.transformers`` (patch functions,
  modules, ``functional``) and ``liger_kernel.chunked_loss``; moving code over is one changed import.
"""

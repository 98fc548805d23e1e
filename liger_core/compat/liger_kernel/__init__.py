"""Liger-Kernel 0.8.5's public API, backed by liger_core.

Replace ``liger_kernel`` by ``liger_core.compat.liger_kernel`` in an import and the code runs on liger_core::

    from liger_core.compat.liger_kernel.transformers import apply_liger_kernel_to_llama
    from liger_core.compat.liger_kernel.chunked_loss import LigerFusedLinearDPOLoss

Names, parameters, defaults and return structures are Liger-Kernel's. What liger_core does not have raises
``NotImplementedError`` naming it (``docs/features.md`` lists each); an argument liger-kernel does not take
raises ``TypeError`` naming it. Nothing is imported until a submodule is used.
"""

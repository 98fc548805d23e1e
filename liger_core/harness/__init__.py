"""The correctness check and benchmark harness behind ``liger-core check`` and ``liger-core bench``.

One concern a module, from the bottom up:

- ``floors``: the fewest bytes (or FLOPs) each op must move, as a least time on an H100.
- ``peers``: liger-kernel, cut-cross-entropy and the Hugging Face eager code as providers (imported lazily).
- ``registry``: ``OPS``, each op's input builder, shapes, floor and peers.
- ``correctness``: ``CaseRunner``, one op at one shape against its float64 reference, every provider's
  error beside eager's (what ``liger-core check`` runs).
- ``interpreter``: Triton's interpreter for CPU runs.
- ``timing``: the benchmark's timers and memory measurement.
- ``providers``: the callable each benchmark provider runs.
- ``report`` (CSV, table) and ``plots`` (PNG, matplotlib).
- ``check`` and ``bench``: the two command lines.

``liger-core check`` imports ``check``, ``registry``, ``correctness`` and ``interpreter`` only: no timing and
no plotting code (``tests/test_cli.py`` checks it).
"""

"""Tuning knobs: process-wide switches between code paths that give the same results, read at call time.

Every knob defaults to what the library does in training; tests and benchmarks set one for a scope with
``override`` (restored on exit, also when the block raises)::

    from liger_core import tuning

    with tuning.override(ce_resident=False, use_headroom=False):
        loss = liger_core.ops.cross_entropy(logits, target)  # the looped CE kernel even on Hopper

``override`` takes the knob names in lower case and rejects unknown ones. The knobs are module globals, so an
override applies to every thread of the process while it is active.

Knobs:

- ``CE_RESIDENT``: 16-bit logits on Hopper with rows of up to ``_cross_entropy_resident.RESIDENT_MAX_COLS``
  columns run the Gluon kernel that keeps the row in shared memory and registers between the passes
  (``liger_core.ops._cross_entropy_resident``); off: the looped kernel (``liger_core.ops._ce_kernel``).
- ``USE_HEADROOM``: fused-linear loops and chunk sizes may use the memory headroom under the process's own
  earlier peak. Benchmarks of the op alone turn it off: a timing loop's leftover gradients would otherwise
  give the timed runs a faster loop than the one whose memory the one-shot measurement reports.
- ``HEADROOM_CHUNK_BYTES``: largest default chunk of logits taken from memory headroom
  (``_chunked_linear.choose_chunk_tokens``), and the chunk the fp32-accumulating token-major loop of
  ``fused_linear_cross_entropy`` needs beside its accumulators. Beyond ~1000-2000 tokens of a 128k vocabulary
  the GEMMs are as efficient as they get (H100: 1024 tokens 40.0 ms, 2048 39.2 ms).
- ``FAST_LAUNCH``: kernels decorated with ``ops._fastlaunch.fast_launch`` skip Triton's per-call argument
  binding where a compiled kernel is cached; off: Triton's own ``kernel[grid](...)`` launch.
- ``EAGER_VIA_CUSTOM_OPS``: eager calls go through the ``torch.library`` custom ops too (by default only
  torch.compile's tracing does; see ``dispatch.launcher``).
- ``FUSE_DOWN_PROJ``: patched GLU MLPs compute the activation and the down projection in one op
  (``ops.glu_down_proj``) where ``modules.mlp.fusable_down_proj`` allows it; off: activation, then the module.

``LOOP_COUNTS`` is not a knob: calls per loop of ``fused_linear_cross_entropy`` (benchmarks and tests read
which loop ran).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

CE_RESIDENT = True
USE_HEADROOM = True
HEADROOM_CHUNK_BYTES = 512 * 2**20
FAST_LAUNCH = True
EAGER_VIA_CUSTOM_OPS = False
FUSE_DOWN_PROJ = True

KNOBS = ("ce_resident", "use_headroom", "headroom_chunk_bytes", "fast_launch", "eager_via_custom_ops",
         "fuse_down_proj")  # fmt: skip

LOOP_COUNTS: collections.Counter = collections.Counter()


def current() -> dict:
    """Every knob's value now, keyed by its ``override`` name."""
    return {name: globals()[name.upper()] for name in KNOBS}


@contextlib.contextmanager
def override(**values) -> Iterator[None]:
    """Set knobs (lower-case names, see the module docstring) for the ``with`` block; the previous values come
    back on exit, also when the block raises. Nested overrides restore in order."""
    unknown = sorted(set(values) - set(KNOBS))
    if unknown:
        raise TypeError(f"unknown tuning knob(s) {unknown}; knobs: {list(KNOBS)}")
    module = globals()
    saved = {name: module[name.upper()] for name in values}
    try:
        for name, value in values.items():
            module[name.upper()] = value
        yield
    finally:
        for name, value in saved.items():
            module[name.upper()] = value

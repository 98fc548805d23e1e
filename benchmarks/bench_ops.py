"""GPU benchmark suite: liger_core's kernels beside torch eager, torch.compile, liger-kernel and
cut-cross-entropy. The logic lives in ``liger_core.harness`` (shared with ``liger-core bench`` and
``liger-core check``); this script only makes the checkout importable without installing it.

    python benchmarks/bench_ops.py                      # default set -> benchmarks/results/
    python benchmarks/bench_ops.py --ops rms_norm rope --quick
    python benchmarks/bench_ops.py --sweep --ops swiglu  # shape sweep
    python benchmarks/bench_ops.py --dry-run             # CPU: every provider once at tiny shapes, untimed
    python benchmarks/bench_ops.py --plot-from benchmarks/results/h100/ops.csv

On the GPU machine use benchmarks/run_gpu.sh (peer wheels, GPU tests, then this suite).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from liger_core.harness.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

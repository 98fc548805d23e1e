"""How often would a "no worse than eager" ratio test fail at random? Runs one test's computation on N fresh
inputs and prints, per gradient, the distribution of err(ours) / (1.25 x err(eager) + floor) (a test fails
above 1). CPU, Triton interpreter; the case is test_fused_linear_logprobs.py's entropy-gradient test
("scaled", fp32), with Gaussian or exact-logit (small dyadic) inputs.

    cd tests && TRITON_INTERPRET=1 python ../benchmarks/ratio_scan.py --seeds 60 [--exact]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path.cwd()), str(Path.cwd() / "ops")]  # run from tests/: helpers and the test module
from helpers import FLOOR, SLACK, leaf, rel_err  # noqa: E402
from test_fused_linear_logprobs import CASES, _inputs  # noqa: E402

from liger_core import reference  # noqa: E402
from liger_core.ops import fused_linear_logprobs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=60)
    parser.add_argument("--exact", action="store_true", help="exact-logit inputs (as the test now uses)")
    args = parser.parse_args()
    spec = CASES["scaled"]
    n, hidden_size, vocab = spec["shape"]
    for with_log_probs in (True, False):
        ratios: dict[str, list[float]] = {"dhidden": [], "dweight": [], "dbias": []}
        for _ in range(args.seeds):
            hidden, weight, bias, target = _inputs(
                "cpu", torch.float32, n, hidden_size, vocab, bias=True, exact=args.exact
            )
            g1, g2 = torch.randn(n), torch.randn(n)
            grads = []
            for kind in ("ours", "eager", "ref64"):
                dtype = torch.float64 if kind == "ref64" else torch.float32
                h, w, b = leaf(hidden, dtype), leaf(weight, dtype), leaf(bias, dtype)
                fn = fused_linear_logprobs if kind == "ours" else reference.fused_linear_logprobs
                extra = dict(chunk_size=4) if kind == "ours" else {}
                out = fn(h, w, target, b, outputs=("entropy",), **spec["opts"], **extra)
                objective = (out.entropy * g2.to(dtype)).sum()
                if with_log_probs:
                    objective = objective + (out.log_probs * g1.to(dtype)).sum()
                grads.append(torch.autograd.grad(objective, [h, w, b]))
            for name, ours, eager, ref in zip(ratios, *grads):
                bound = SLACK * rel_err(eager, ref) + FLOOR[torch.float32]
                ratios[name].append(rel_err(ours, ref) / bound)
        for name, values in ratios.items():
            values.sort()
            label = "logp+entropy" if with_log_probs else "entropy"
            print(
                f"{label:12s} {name:8s} median {values[len(values) // 2]:.3f}"
                f"  p95 {values[int(0.95 * len(values))]:.3f}  max {values[-1]:.3f}"
                f"  above 1: {sum(v > 1 for v in values)} of {len(values)}"
            )


if __name__ == "__main__":
    main()

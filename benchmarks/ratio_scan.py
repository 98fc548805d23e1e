"""How often would a "no worse than eager" ratio test fail at random? Runs one test's computation on N fresh
inputs and prints, per gradient, the distribution of err(ours) / (1.25 x err(eager) + floor) (a test fails
above 1). CPU, Triton interpreter; the case is test_fused_linear_logprobs.py's entropy-gradient test
("scaled", fp32), with Gaussian or exact-logit (small dyadic) inputs; or, with ``--grpo-batches``,
test_grpo.py's fused on-policy fp32 test (dr_grpo with bias, GRPO sequence-level) at those batch sizes.

    cd tests && TRITON_INTERPRET=1 python ../benchmarks/ratio_scan.py --seeds 60 [--exact]
    cd tests && TRITON_INTERPRET=1 python ../benchmarks/ratio_scan.py --seeds 300 --grpo-batches 3 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

# run from tests/: helpers and the test modules
sys.path[:0] = [str(Path.cwd()), str(Path.cwd() / "ops"), str(Path.cwd() / "losses")]
from helpers import FLOOR, SLACK, leaf, rel_err  # noqa: E402
from test_fused_linear_logprobs import CASES, _inputs  # noqa: E402

from liger_core import reference  # noqa: E402
from liger_core.ops import fused_linear_logprobs  # noqa: E402


def _print_ratios(label: str, ratios: dict[str, list[float]]) -> None:
    for name, values in ratios.items():
        values.sort()
        print(
            f"{label:12s} {name:18s} median {values[len(values) // 2]:.3f}"
            f"  p95 {values[int(0.95 * len(values))]:.3f}  max {values[-1]:.3f}"
            f"  above 1: {sum(v > 1 for v in values)} of {len(values)}"
        )


def grpo_scan(seeds: int, batches: list[int]) -> None:
    """test_grpo.test_fused_matches_float64 (on-policy, fp32), its gradient checks recorded, not asserted."""
    import test_grpo

    ratios: dict[str, list[float]] = {}

    def record(name, ours, eager, ref64):
        """err(ours) over the plain bound (1.25 x eager's + floor) and over the test's fp32 one (+ the
        output's own rounding)."""
        e_ours, e_eager = rel_err(ours, ref64), rel_err(eager, ref64)
        plain = SLACK * e_eager + FLOOR[ours.dtype]
        rounding = rel_err(ref64.to(ours.dtype), ref64)
        ratios.setdefault(f"{name} plain", []).append(e_ours / plain)
        ratios.setdefault(f"{name} +round", []).append(e_ours / (plain + rounding))

    test_grpo.assert_grad_no_worse = record
    for case in (("dr_grpo", "token", 0.0, True), ("grpo", "sequence", 0.0, False)):
        for batch in batches:
            test_grpo.FUSED_B = batch
            ratios.clear()
            for _ in range(seeds):
                test_grpo.test_fused_matches_float64(*case, False, torch.float32)
            _print_ratios(f"{case[0]} B={batch}", ratios)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=60)
    parser.add_argument("--exact", action="store_true", help="exact-logit inputs (as the test now uses)")
    parser.add_argument("--grpo-batches", type=int, nargs="*", help="scan test_grpo's fused test instead")
    args = parser.parse_args()
    if args.grpo_batches:
        grpo_scan(args.seeds, args.grpo_batches)
        return
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
        _print_ratios("logp+entropy" if with_log_probs else "entropy", ratios)


if __name__ == "__main__":
    main()

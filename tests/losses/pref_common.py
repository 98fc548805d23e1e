"""Shared pieces of the preference-loss tests: batches, the three ways (ours, eager, float64), TRL's oracle.

Ground truth: TRL 1.16's own loss code (tests/losses/trl_pref_oracle.py, run by the Python with TRL that
``trl_python`` finds) applied to the float64 reference per-token log-probs of the same (already rounded)
inputs; its gradient with respect to those log-probs is pulled back through the float64 reference op to
hidden and weight.
"Eager" is the same pipeline in the input dtype: the reference op (logits in that dtype, log-softmax in fp32)
and TRL's formula in fp32.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import SLACK, dyadic_linear_inputs, leaf, rel_err

from liger_core import reference
from liger_core.ops import fused_linear_logprobs
from liger_core.ops.fused_linear_logprobs import OUTPUTS

IGNORE = -100
TRL_PYTHON_ENV = "LIGER_TRL_PYTHON"
ORACLE = Path(__file__).with_name("trl_pref_oracle.py")
SCALAR_FLOOR = 4 * 2.0**-23  # 4 fp32 ulps: a scalar loss built from many fp32 log-probs (cancellation in
# chosen - rejected) can lose a few ulps where eager, on one random draw, happened to lose fewer (CI: 3.6e-7
# vs eager 5.5e-8 for SimPO at 2 ulps)


def batch(dtype, rows, t, h, v, *, prompt=2, empty_rows=(), bias=False):
    """hidden (rows, T, H), weight, bias, target (rows, T): ``prompt`` leading ignored positions, random
    right padding, and fully ignored rows ``empty_rows``.

    The values are random small dyadic numbers (hidden k/8, weight k/16 times a power of two, bias k/8):
    every logit is then exact in fp32 from any GEMM, chunked or not (and rounded once to bf16), so comparing
    with eager measures the kernels' and the formulas' arithmetic. With Gaussian inputs both errors were
    dominated by the roundings of two different GEMMs (the op's chunk rows vs eager's all rows), two draws
    whose ratio is noise: 1-3 % of runs above 1.25 in fp32 (CPU CI, several tests)."""
    hidden, weight, b = dyadic_linear_inputs(
        (rows, t), h, v, dtype, bias=bias, logit_std=6 / 2.7
    )  # std ~1.5-3
    target = torch.randint(0, v, (rows, t))
    target[:, :prompt] = IGNORE
    for row in range(rows):
        pad = int(torch.randint(0, t - prompt, ()))
        if pad:
            target[row, t - pad :] = IGNORE
    for row in empty_rows:
        target[row] = IGNORE
    return hidden, weight, b, target


class TokenLogprobs:
    """Per-token log-probs (with their graph to hidden/weight) of the float64 reference and of eager."""

    def __init__(self, hidden, weight, bias, target, **op_kwargs):
        self.target = target
        self.mask = target != IGNORE
        self.ref = self._run(hidden, weight, bias, target, torch.float64, op_kwargs)
        self.eager = self._run(hidden, weight, bias, target, hidden.dtype, op_kwargs)

    @staticmethod
    def _run(hidden, weight, bias, target, dtype, op_kwargs):
        leaves = [leaf(hidden, dtype), leaf(weight, dtype)] + (
            [leaf(bias, dtype)] if bias is not None else []
        )
        out = reference.fused_linear_logprobs(
            *leaves[:2], target, leaves[2] if bias is not None else None, outputs=OUTPUTS, **op_kwargs
        )
        return leaves, out

    def case(self, kind, **config):
        """A case for the oracle from the ``kind`` ("ref" or "eager") log-probs."""
        _, out = getattr(self, kind)
        dtype = torch.float64 if kind == "ref" else torch.float32
        stats = {name: getattr(out, name).detach() for name in OUTPUTS}
        stats = {k: (v if k == "is_top1" else v.to(dtype)) for k, v in stats.items()}
        return {**stats, "mask": self.mask, **config}

    def pull_back(self, kind, grad_log_probs):
        """d(loss)/d(hidden, weight[, bias]) from TRL's gradient with respect to the per-token log-probs."""
        leaves, out = getattr(self, kind)
        return torch.autograd.grad(
            out.log_probs, leaves, grad_log_probs.to(out.log_probs.dtype), retain_graph=True
        )


def trl_python() -> Path:
    """The Python that runs TRL's code: ``$LIGER_TRL_PYTHON`` (tests/run_all.sh sets it), else this Python if
    it can import TRL. Without either the calling test skips, naming the variable, except in CI (``CI`` set
    to true or 1), where it fails: there the TRL-parity tests must run."""
    value = os.environ.get(TRL_PYTHON_ENV, "")
    if value and os.access(value, os.X_OK) and Path(value).is_file():
        return Path(value)
    if value:
        problem = f"{TRL_PYTHON_ENV}={value} is not an executable file"
    elif importlib.util.find_spec("trl") is not None:
        return Path(sys.executable)
    else:
        problem = f"{TRL_PYTHON_ENV} is not set and trl is not importable (tests/run_all.sh sets it)"
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{problem}: CI must run the tests against TRL's code")
    pytest.skip(problem)


def run_oracle(cases: list[dict]) -> list[dict]:
    """TRL's loss, gradient with respect to log_probs and metrics for each case (see ``trl_python``)."""
    python = trl_python()
    with tempfile.TemporaryDirectory() as tmp:
        cases_path, results_path = Path(tmp, "cases.pt"), Path(tmp, "results.pt")
        torch.save(cases, cases_path)
        proc = subprocess.run(
            [str(python), str(ORACLE), str(cases_path), str(results_path)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, f"TRL oracle failed:\n{proc.stderr[-4000:]}"
        return torch.load(results_path)


def assert_scalar_no_worse(name, ours, eager, ref64):
    """A scalar's error is mostly its final rounding: at most SLACK x eager's plus a few fp32 ulps."""
    e_ours, e_eager = rel_err(ours, ref64), rel_err(eager, ref64)
    assert math.isfinite(e_ours), f"{name}: not finite"
    assert e_ours <= SLACK * e_eager + SCALAR_FLOOR, (
        f"{name}: rel. error {e_ours:.3e} vs eager's {e_eager:.3e}"
    )


def assert_metrics_match(ours: dict, trl: dict, *, skip=(), rtol=1e-4, atol=1e-5):
    """Every metric TRL logs (but ``skip``) is in ours with the same value."""
    for key, value in trl.items():
        if key in skip:
            continue
        assert key in ours, f"metric {key!r} missing (have {sorted(ours)})"
        got = float(ours[key])
        assert math.isfinite(got), f"metric {key}: {got}"
        assert abs(got - value) <= atol + rtol * abs(value), f"metric {key}: {got} vs TRL's {value}"


def freeze_token_logprobs(monkeypatch, module, hidden, weight, bias, target, **op_kwargs):
    """Run the fused op once and make ``module``'s loss functions reuse its outputs, ``log_probs`` a leaf:
    each loss configuration then costs no interpreted kernel, and its gradient with respect to the per-token
    log-probs can be compared with TRL's (the op's own backward is tested in tests/ops). Returns the leaf
    and the frozen outputs."""
    with torch.no_grad():
        out = fused_linear_logprobs(hidden, weight, target, bias, outputs=OUTPUTS, **op_kwargs)
    log_probs = out.log_probs.clone().requires_grad_(True)
    frozen = out._replace(log_probs=log_probs)
    monkeypatch.setattr(module, "token_logprobs", lambda *args, outputs=(), **kwargs: frozen)
    return log_probs, frozen


def own_logprob_cases(frozen, mask, configs):
    """Oracle cases of TRL's formula on the op's own per-token log-probs (``frozen``): per config, float64
    then fp32 (results ``2i`` and ``2i + 1``, as ``ref``/``eager`` elsewhere). Checks the formula's arithmetic
    alone: on each side's own log-probs, the two errors are two draws of log-prob roundings, amplified by a
    sensitive loss (discopop's 1/tau) into a ratio that is noise (CPU: 1.55e-6 vs 6.6e-7 in 1 run of 2)."""
    cases = []
    for config in configs:
        for dtype in (torch.float64, torch.float32):
            stats = {name: getattr(frozen, name).detach() for name in OUTPUTS}
            cast = {
                k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v)
                for k, v in {**stats, **config}.items()
            }
            cases.append({**cast, "mask": mask})
    return cases


def assert_token_grads_no_worse(name, grad, eager_grad, ref_grad, mask):
    """d(loss)/d(per-token log-probs) on the completion tokens (elsewhere the op gives no gradient) against
    TRL's float64 gradient. For sequence losses it is one value per sequence (a handful of fp32 numbers,
    broadcast over their tokens) whose error is mostly their final rounding, so, like a scalar loss, it may
    exceed SLACK x eager's error by a few fp32 ulps (SCALAR_FLOOR), no more."""
    zero = torch.zeros((), dtype=torch.float64)
    ours = grad * mask
    eager = torch.where(mask, eager_grad.to(torch.float32), zero.float())
    ref64 = torch.where(mask, ref_grad.to(torch.float64), zero)
    e_ours, e_eager = rel_err(ours, ref64), rel_err(eager, ref64)
    assert math.isfinite(e_ours), f"{name}: not finite"
    bound = SLACK * e_eager + SCALAR_FLOOR
    assert e_ours <= bound, f"{name}: rel. error {e_ours:.3e} vs eager's {e_eager:.3e}"

"""The correctness runner behind ``liger-core check`` (and each benchmark row's check): one op at one shape,
its float64 reference, each provider run on fresh copies of the inputs and its relative error beside eager's
error in the same dtype (the rule of the unit tests). Imports neither timing nor plotting code."""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable, Sequence

import torch

from liger_core.harness.registry import Case, OpSpec, available, random_tensor

# The accuracy rule of the unit tests (tests/helpers.py): err(kernel) <= SLACK * err(eager) + ERR_FLOOR[dtype]
SLACK = 1.25
ERR_FLOOR = {
    torch.float32: 0.1 * 2**-23,
    torch.float16: 0.1 * 2**-10,
    torch.bfloat16: 0.1 * 2**-7,
    torch.float64: 0.0,
}


# ------------------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------------------

_ERR_CHUNK = 1 << 26


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64 (absolute when ref is all zeros; inf for NaN/inf in x), in chunks
    so a 1e9-element gradient needs no float64 copy of itself."""
    x, ref = x.detach().reshape(-1), ref.detach().reshape(-1)
    if x.numel() != ref.numel():
        raise ValueError(f"output has {x.numel()} elements, the reference {ref.numel()}")
    num = den = 0.0
    for i in range(0, x.numel(), _ERR_CHUNK):
        xc = x[i : i + _ERR_CHUNK].to(torch.float64)
        rc = ref[i : i + _ERR_CHUNK].to(device=xc.device, dtype=torch.float64)
        if not bool(torch.isfinite(xc).all()):
            return math.inf
        num += float((xc - rc).square().sum())
        den += float(rc.square().sum())
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def within_budget(err: float, eager_err: float, dtype: torch.dtype) -> bool:
    return err <= SLACK * eager_err + ERR_FLOOR[dtype]


# ------------------------------------------------------------------------------------------------------------
# One op at one shape: pristine inputs, reference, per-provider check, timing, memory
# ------------------------------------------------------------------------------------------------------------


def as_tuple(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


_LOSS_OPS = ("cross_entropy", "fused_linear_cross_entropy", "kl_div", "jsd", "fused_linear_jsd")


def _output_names(spec: OpSpec, case: Case, n_out: int, ref_fn: Callable) -> list[str]:
    """Names for the forward outputs and the gradients, in the order the errors are listed."""
    import inspect

    if spec.name == "rope":
        fwd = ["q_embed", "k_embed"]
    elif n_out == 1:
        fwd = ["loss" if spec.name in _LOSS_OPS else "y"]
    else:
        fwd = [f"y{i}" for i in range(n_out)]
    params = list(inspect.signature(ref_fn).parameters)
    return fwd + [f"d{params[i]}" if i < len(params) else f"d(arg {i})" for i in case.diff]


@dataclasses.dataclass
class ProviderRun:
    """A provider after its checked run: its working copy of the inputs (reused for timing)."""

    fn: Callable
    args: tuple
    grads: list[torch.Tensor]
    diff_tensors: list[torch.Tensor]
    restore_pairs: list[
        tuple[torch.Tensor, torch.Tensor]
    ]  # (working tensor, pristine) written by the provider
    errors: list[float]


class CaseRunner:
    """Pristine inputs, reference and eager's errors for one (op, shape, dtype); runs providers on copies."""

    def __init__(
        self, spec: OpSpec, shape: dict, dtype: torch.dtype, device: torch.device, loss_grad: float = 1.0
    ):
        self.spec, self.shape, self.dtype, self.device, self.loss_grad = spec, shape, dtype, device, loss_grad
        self.case = spec.build(shape, dtype, device)
        self.reference = available("reference", spec.name)
        self.grads: list[torch.Tensor] | None = None  # pristine output gradients, in the inputs' dtype
        self.ref: list[torch.Tensor] | None = None
        self.ref_dtype: str = "none"
        self.eager_errors: list[float] | None = None
        self.names: list[str] = []

    # -- the reference ---------------------------------------------------------------------------------------
    def _ref_dtypes(self) -> list[torch.dtype]:
        """float64, unless it clearly cannot fit; then float32 (still far more precise than bf16/fp16)."""
        if self.device.type != "cuda":
            return [torch.float64]
        free, _ = torch.cuda.mem_get_info(self.device)
        need64 = 8 * self.spec.ref_elems(self.shape) * 1.25
        dtypes = [torch.float64] if need64 < 0.7 * free else []
        return dtypes + ([torch.float32] if self.dtype != torch.float32 else [])

    def _make_grads(self, outs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        grads = []
        for o in outs:
            if o.numel() == 1:
                grads.append(torch.full(o.shape, self.loss_grad, dtype=self.dtype, device=self.device))
            elif self.case.grad_layout is not None:
                grads.append(self.case.grad_layout(o.shape, self.dtype, self.device))
            else:
                grads.append(random_tensor(*o.shape, dtype=self.dtype, device=self.device))
        return grads

    def compute_reference(self) -> None:
        """The float64 reference of the same (already rounded) inputs: forward outputs and every gradient.
        Falls back to float32 when float64 runs out of memory; with no reference at all (``self.ref`` None)
        the outputs go unchecked but the providers are still timed."""
        if self.reference is None:
            raise RuntimeError(f"liger_core.reference.{self.spec.name} does not exist")
        for ref_dtype in self._ref_dtypes():
            try:
                args = self._copies(ref_dtype)
                outs = as_tuple(self.reference(*args))
                self._set_grads(outs)
                torch.autograd.backward(outs, [g.to(o.dtype) for g, o in zip(self.grads, outs)])
                self.ref = [o.detach() for o in outs] + [args[i].grad for i in self.case.diff]
                self.ref_dtype = str(ref_dtype).replace("torch.", "")
                return
            except torch.cuda.OutOfMemoryError:
                args = outs = None
                self.ref = None
                free_memory()
        with torch.no_grad():  # no reference fits: output shapes for the gradients only
            self._set_grads(as_tuple(self.reference(*self._copies())))

    def _set_grads(self, outs: Sequence[torch.Tensor]) -> None:
        self.grads = self._make_grads(outs)
        self.names = _output_names(self.spec, self.case, len(outs), self.reference)

    def _copies(self, dtype: torch.dtype | None = None) -> tuple:
        """Fresh copies of the pristine inputs (same layout), the differentiable ones requiring grad."""
        out = []
        for i, a in enumerate(self.case.args):
            if isinstance(a, torch.Tensor):
                if dtype is not None and a.is_floating_point() and a.dtype != dtype:
                    c = a.detach().to(dtype)
                else:
                    c = a.detach().clone()
                out.append(c.requires_grad_(i in self.case.diff))
            else:
                out.append(a)
        return tuple(out)

    # -- a provider ------------------------------------------------------------------------------------------
    def run_checked(self, fn: Callable) -> ProviderRun:
        """Run ``fn`` forward and backward once on fresh copies; errors of every output vs the reference;
        which inputs (or output gradients) it wrote into."""
        args = self._copies()
        outs = as_tuple(fn(*args))
        grads = [g.to(o.dtype).clone() for g, o in zip(self.grads, outs)]
        torch.autograd.backward(outs, grads)
        results = [o.detach() for o in outs] + [args[i].grad for i in self.case.diff]
        errors = []
        if self.ref is not None:
            for got, ref, name in zip(results, self.ref, self.names):
                if got is None:
                    raise RuntimeError(f"no gradient for {name}")
                errors.append(rel_err(got, ref))
        del outs, results
        written = []
        pristine_grads = [g.to(gr.dtype) for g, gr in zip(self.grads, grads)]
        for work, pristine in list(zip(args, self.case.args)) + list(zip(grads, pristine_grads)):
            if isinstance(work, torch.Tensor) and not torch.equal(work.detach(), pristine):
                written.append((work, pristine))
        diff_tensors = [args[i] for i in self.case.diff]
        for t in diff_tensors:
            t.grad = None
        if written:
            restore_inputs(written)
        return ProviderRun(fn, args, grads, diff_tensors, written, errors)

    def set_eager(self, errors: list[float]) -> None:
        self.eager_errors = errors

    def verdict(self, errors: list[float]) -> tuple[float, float, str, bool]:
        """(error, eager's error, output name) of the worst output (largest err / budget), and pass/fail."""
        if not errors or self.eager_errors is None:
            return math.nan, math.nan, "", True
        worst, worst_ratio, ok = 0, -1.0, True
        for i, (e, ee) in enumerate(zip(errors, self.eager_errors)):
            budget = SLACK * ee + ERR_FLOOR[self.dtype]
            ratio = e / budget if budget > 0 else (0.0 if e == 0 else math.inf)
            if not math.isfinite(e):
                ratio = math.inf
            ok &= within_budget(e, ee, self.dtype)
            if ratio > worst_ratio:
                worst, worst_ratio = i, ratio
        return errors[worst], self.eager_errors[worst], self.names[worst], ok


def restore_inputs(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for work, pristine in pairs:
            work.copy_(pristine)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

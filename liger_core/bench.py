"""Case registry, correctness check and GPU benchmark suite (``liger-core bench``, ``liger-core check``,
``benchmarks/bench_ops.py``): the logic lives here once, the scripts and the CLI only parse arguments.

For each op and shape it builds one set of realistic inputs, computes the float64 reference (forward and
every gradient), then for each provider (liger_core, torch eager = the HF/PyTorch code we replace,
torch.compile of that eager code, liger-kernel, cut-cross-entropy):

1. runs it once, forward and backward, on fresh copies of the inputs and compares every output with the
   float64 reference (relative error ``||out - ref|| / ||ref||``), beside eager's own error in the same dtype:
   ``ok`` when ``err <= 1.25 * eager_err + floor(dtype)`` (the rule of the unit tests), else ``WARN``;
   the run also tells whether the provider writes into its inputs (liger-kernel's CE writes the gradient
   into the logits, its SwiGLU writes da/db into a/b, its RMSNorm writes dx into dy, its RoPE rotates q/k
   in place);
2. times ``fwd`` (a training forward: inputs require grad, activations are saved) and ``fwd+bwd`` (forward
   then backward with a fixed gradient), median of many runs with the L2 cache flushed before each. Providers
   that leave their inputs untouched are timed by ``triton.testing.do_bench``; those that write into their
   inputs by the same loop (``_bench_restoring``) in batches of up to 8 runs, each run on its own copy of the
   written inputs, all restored from a pristine copy before the batch, outside the timed region, so every run
   sees real data (never a gradient of a gradient, never zeros) and the host runs ahead as in do_bench;
3. measures the peak extra memory of one run: ``max_memory_allocated`` minus what was allocated before
   (inputs and pristine copies excluded; outputs, saved activations and gradients included).

Each row also carries the floor: the fewest HBM bytes the op must move divided by 3.0 TB/s (H100), or for
the matmul losses the FLOPs divided by 800 TFLOP/s (measured bf16 GEMM rate), and ``pct_of_floor`` =
floor / time. The byte and FLOP counts are written next to each op below and in docs/performance.md.

A provider that fails (missing package, exception, OOM) gets a row with its error; the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

# ------------------------------------------------------------------------------------------------------------
# Constants
# ------------------------------------------------------------------------------------------------------------

HBM_BYTES_PER_S = 3.0e12  # H100 SXM: a large device-to-device copy moves ~3.0 TB/s (bytes read + written)
MATMUL_FLOPS_PER_S = 800e12  # H100 SXM: an 8192^3 bf16 GEMM runs at ~798 TFLOP/s on random data
MODES = ("fwd", "fwd+bwd")
PROVIDERS = ("torch", "liger_core", "torch.compile", "liger_kernel", "cce")
# Default set, most important first (a run cut off by its time limit keeps the rows written so far)
DEFAULT_OPS = (
    "rms_norm",
    "layer_norm",
    "swiglu",
    "rope",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "geglu",
)
ALL_OPS = DEFAULT_OPS + ("kl_div", "jsd", "fused_linear_jsd")
# The accuracy rule of the unit tests (tests/helpers.py): err(kernel) <= SLACK * err(eager) + ERR_FLOOR[dtype]
SLACK = 1.25
ERR_FLOOR = {
    torch.float32: 0.1 * 2**-23,
    torch.float16: 0.1 * 2**-10,
    torch.bfloat16: 0.1 * 2**-7,
    torch.float64: 0.0,
}
CSV_COLUMNS = (
    "gpu", "op", "shape", "dtype", "mode", "provider", "ms", "ms_p20", "ms_p80", "timer", "gpu_ms",
    "gpu_timer", "gpu_pct_of_floor", "peak_extra_gib",
    "floor_ms", "floor_basis", "pct_of_floor", "rel_err", "eager_rel_err", "ref_dtype", "check",
    "worst_output",
    "writes_inputs", "error",
)  # fmt: skip
GIB = 2**30


@contextlib.contextmanager
def quiet_interpreter() -> Iterator[None]:
    """Hide the numpy RuntimeWarnings that Triton's interpreter raises while it runs a kernel on CPU
    (divide by zero, invalid value, overflow): the interpreter evaluates every lane, also the masked-off lanes
    of a block and the side of a ``tl.where`` that is then discarded (``log(0)`` where a target is 0), and
    the checks feed +-inf and nan on purpose. A GPU raises nothing for any of it, and whether the results are
    right is what the check's table says. Other warnings still show."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
        yield


def prepare_triton(cuda: bool | None = None) -> str | None:
    """On a machine without a CUDA GPU, set ``TRITON_INTERPRET=1`` so the Triton kernels run in the
    interpreter on CPU tensors. Triton reads the variable when a kernel is decorated, so this only works
    before ``triton`` is imported; returns a sentence saying what was done (None if nothing was needed)."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return None
    if "triton" in sys.modules:
        return (
            "no CUDA GPU and triton is already imported without TRITON_INTERPRET=1: CPU tensors take the "
            "pure-PyTorch reference path, not the Triton kernels"
        )
    os.environ["TRITON_INTERPRET"] = "1"
    return "no CUDA GPU: set TRITON_INTERPRET=1, so the Triton kernels run in Triton's interpreter on CPU"


# ------------------------------------------------------------------------------------------------------------
# Floors: the fewest bytes (or FLOPs) each op must move, per mode. s = bytes per element of the inputs' dtype.
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Floor:
    seconds: float
    basis: str  # "hbm" (bytes / 3.0 TB/s) or "flops" (FLOPs / 800 TFLOP/s)
    formula: str

    @property
    def ms(self) -> float:
        return self.seconds * 1e3


def _hbm(n_bytes: float, formula: str) -> Floor:
    return Floor(n_bytes / HBM_BYTES_PER_S, "hbm", formula)


def _max_floor(n_bytes: float, flops: float, formula: str) -> Floor:
    by_bytes, by_flops = n_bytes / HBM_BYTES_PER_S, flops / MATMUL_FLOPS_PER_S
    if by_flops >= by_bytes:
        return Floor(by_flops, "flops", formula)
    return Floor(by_bytes, "hbm", formula)


def floor_norm(shape: dict, s: int, mode: str, n_params: int) -> Floor:
    """RMSNorm (n_params=1: w) / LayerNorm (n_params=2: w, b) over rows of N, M rows.
    fwd: read x, params; write y                      -> (2*M*N + p*N) * s
    bwd: read dy, x, params; write dx, dparams        -> (3*M*N + 2*p*N) * s
    (rstd/mean are recomputed from x or are M*4 bytes: not counted.)"""
    m, n, p = shape["M"], shape["N"], n_params
    fwd = (2 * m * n + p * n) * s
    if mode == "fwd":
        return _hbm(fwd, "(2MN + pN) s")
    return _hbm(fwd + (3 * m * n + 2 * p * n) * s, "(5MN + 3pN) s")


def floor_glu(shape: dict, s: int, mode: str) -> Floor:
    """SwiGLU / GeGLU on a, b of M x N.  fwd: read a, b; write y -> 3MN s.
    bwd: read dy, a, b; write da, db -> 5MN s.  fwd+bwd: 8MN s."""
    mn = shape["M"] * shape["N"]
    return _hbm(3 * mn * s, "3MN s") if mode == "fwd" else _hbm(8 * mn * s, "8MN s")


def floor_rope(shape: dict, s: int, mode: str) -> Floor:
    """RoPE, q (B,Hq,T,D), k (B,Hk,T,D), cos/sin (1,T,D) each: Q = B*Hq*T*D, K = B*Hk*T*D, C = T*D.
    fwd: read q, k, cos, sin; write q', k' -> (2Q + 2K + 2C) s.  bwd: the same with dq', dk' -> dq, dk."""
    q = shape["B"] * shape["Hq"] * shape["T"] * shape["D"]
    k = shape["B"] * shape["Hk"] * shape["T"] * shape["D"]
    c = shape["T"] * shape["D"]
    one = (2 * q + 2 * k + 2 * c) * s
    return _hbm(one, "(2Q + 2K + 2C) s") if mode == "fwd" else _hbm(2 * one, "(4Q + 4K + 4C) s")


def floor_ce(shape: dict, s: int, mode: str) -> Floor:
    """Cross-entropy on logits N x V (int64 targets).  fwd: read logits -> NV s + 8N.
    fwd+bwd: read logits, write dlogits -> 2NV s + 8N (a kernel that writes the gradient in the forward pass
    reaches this; the backward then only scales it when grad_output != 1)."""
    nv, n = shape["N"] * shape["V"], shape["N"]
    return _hbm(nv * s + 8 * n, "NV s + 8N") if mode == "fwd" else _hbm(2 * nv * s + 8 * n, "2NV s + 8N")


def floor_flce(shape: dict, s: int, mode: str) -> Floor:
    """Fused linear + cross-entropy, hidden BT x H, weight V x H: compute-bound.
    fwd: logits = h W^T -> 2 BT H V FLOPs.  fwd+bwd: + dh = dlogits W, dW = dlogits^T h -> 6 BT H V FLOPs.
    Bytes (read h, W once; write dh, dW) are far below: the floor is FLOPs / 800 TFLOP/s."""
    bt, h, v = shape["BT"], shape["H"], shape["V"]
    if mode == "fwd":
        return _max_floor((bt * h + v * h) * s + 8 * bt, 2 * bt * h * v, "2 BT H V / 800 TFLOP/s")
    return _max_floor(2 * (bt * h + v * h) * s + 8 * bt, 6 * bt * h * v, "6 BT H V / 800 TFLOP/s")


def floor_pair_loss(shape: dict, s: int, mode: str) -> Floor:
    """KL-div / JSD on two N x V inputs (gradient for the first only).  fwd: read both -> 2NV s.
    fwd+bwd: read both, write dinput -> 3NV s."""
    nv = shape["N"] * shape["V"]
    return _hbm(2 * nv * s, "2NV s") if mode == "fwd" else _hbm(3 * nv * s, "3NV s")


def floor_fljsd(shape: dict, s: int, mode: str) -> Floor:
    """Fused linear JSD, student h_s (BT,Hs) W_s (V,Hs), teacher h_t (BT,Ht) W_t (V,Ht); student grads.
    fwd: both logits -> 2 BT V (Hs + Ht) FLOPs.  fwd+bwd: + dh_s, dW_s -> 2 BT V (3 Hs + Ht) FLOPs."""
    bt, hs, ht, v = shape["BT"], shape["Hs"], shape["Ht"], shape["V"]
    n_bytes = (bt * hs + v * hs + bt * ht + v * ht) * s
    if mode == "fwd":
        return _max_floor(n_bytes, 2 * bt * v * (hs + ht), "2 BT V (Hs + Ht) / 800 TFLOP/s")
    return _max_floor(
        n_bytes + (bt * hs + v * hs) * s, 2 * bt * v * (3 * hs + ht), "2 BT V (3Hs + Ht) / 800 TFLOP/s"
    )


# ------------------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """Positional arguments of the functional op; ``diff``: indices of the arguments that get gradients;
    ``grad_layout``: builds a gradient for a non-scalar output of the given shape (default: contiguous)."""

    args: tuple
    diff: tuple[int, ...]
    grad_layout: Callable[[torch.Size, torch.dtype, torch.device], torch.Tensor] | None = None


_GENERATORS: dict[torch.device, torch.Generator] = {}


def _generator(device) -> torch.Generator:
    """The suite's own random generator per device, never the default one: a CUDA-graph capture that fails
    (a peer that syncs with the host) can leave the default CUDA generator in capture mode, after which every
    default-generator draw raises ("Offset increment outside graph capture")."""
    device = torch.device(device)
    if device not in _GENERATORS:
        _GENERATORS[device] = torch.Generator(device=device)
        _GENERATORS[device].manual_seed(0)
    return _GENERATORS[device]


def _randn(*shape: int, dtype: torch.dtype, device: torch.device, scale: float = 1.0, shift: float = 0.0):
    t = torch.randn(*shape, dtype=dtype, device=device, generator=_generator(device))
    if scale != 1.0:
        t.mul_(scale)
    if shift != 0.0:
        t.add_(shift)
    return t


def build_norm(shape: dict, dtype, device, bias: bool) -> Case:
    m, n = shape["M"], shape["N"]
    x = _randn(m, n, dtype=dtype, device=device)
    w = _randn(n, dtype=dtype, device=device, scale=0.1, shift=1.0)
    if bias:
        b = _randn(n, dtype=dtype, device=device, scale=0.1)
        return Case((x, w, b, 1e-5), (0, 1, 2))
    return Case((x, w, 1e-6), (0, 1))


def build_glu(shape: dict, dtype, device) -> Case:
    m, n = shape["M"], shape["N"]
    a = _randn(m, n, dtype=dtype, device=device, scale=2.0)
    b = _randn(m, n, dtype=dtype, device=device)
    return Case((a, b), (0, 1))


def _hf_layout(shape: torch.Size, dtype, device) -> torch.Tensor:
    """(B, H, T, D) view of a contiguous (B, T, H, D) buffer: the layout HF attention hands to RoPE."""
    b, h, t, d = shape
    return _randn(b, t, h, d, dtype=dtype, device=device).transpose(1, 2)


def build_rope(shape: dict, dtype, device) -> Case:
    b, t, hq, hk, d = shape["B"], shape["T"], shape["Hq"], shape["Hk"], shape["D"]
    q = _hf_layout(torch.Size((b, hq, t, d)), dtype, device)
    k = _hf_layout(torch.Size((b, hk, t, d)), dtype, device)
    # Llama's rotary tables: cat(freqs, freqs) with freqs = t * 10000^(-2i/D), rounded to the model dtype
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(t, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    return Case((q, k, emb.cos().to(dtype), emb.sin().to(dtype)), (0, 1), grad_layout=_hf_layout)


def build_ce(shape: dict, dtype, device) -> Case:
    n, v = shape["N"], shape["V"]
    logits = _randn(n, v, dtype=dtype, device=device, scale=2.0)
    target = torch.randint(0, v, (n,), device=device, generator=_generator(device))
    return Case((logits, target), (0,))


def build_flce(shape: dict, dtype, device) -> Case:
    bt, h, v = shape["BT"], shape["H"], shape["V"]
    hidden = _randn(bt, h, dtype=dtype, device=device)
    weight = _randn(v, h, dtype=dtype, device=device, scale=h**-0.5)  # logits ~ N(0, 1)
    target = torch.randint(0, v, (bt,), device=device, generator=_generator(device))
    return Case((hidden, weight, target), (0, 1))


def build_kl(shape: dict, dtype, device) -> Case:
    n, v = shape["N"], shape["V"]
    logp = torch.log_softmax(_randn(n, v, dtype=torch.float32, device=device), -1).to(dtype)
    p = torch.softmax(_randn(n, v, dtype=torch.float32, device=device), -1).to(dtype)
    return Case((logp, p), (0,))


def build_jsd(shape: dict, dtype, device) -> Case:
    n, v = shape["N"], shape["V"]
    student = torch.log_softmax(_randn(n, v, dtype=torch.float32, device=device), -1).to(dtype)
    teacher = torch.log_softmax(_randn(n, v, dtype=torch.float32, device=device), -1).to(dtype)
    return Case((student, teacher), (0,))


def build_fljsd(shape: dict, dtype, device) -> Case:
    bt, hs, ht, v = shape["BT"], shape["Hs"], shape["Ht"], shape["V"]
    return Case(
        (
            _randn(bt, hs, dtype=dtype, device=device),
            _randn(v, hs, dtype=dtype, device=device, scale=hs**-0.5),
            _randn(bt, ht, dtype=dtype, device=device),
            _randn(v, ht, dtype=dtype, device=device, scale=ht**-0.5),
        ),
        (0, 1),
    )


# ------------------------------------------------------------------------------------------------------------
# Peers (imported lazily; a missing package only skips that provider)
# ------------------------------------------------------------------------------------------------------------


def _liger_kernel(name: str, **kwargs) -> Callable:
    def call(*args):
        from liger_kernel.transformers import functional

        return getattr(functional, name)(*args, **kwargs)

    call.__name__ = f"liger_kernel.{name}"
    return call


def _cce_linear_cross_entropy(hidden, weight, target):
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy(hidden, weight, target)  # defaults: mean, ignore -100, filter_eps="high"


def _hf_cross_entropy(logits, target):
    """What HF's ForCausalLMLoss runs: upcast the logits to fp32, then torch's cross-entropy (mean, -100)."""
    return torch.nn.functional.cross_entropy(logits.float(), target, ignore_index=-100)


def _hf_linear_cross_entropy(hidden, weight, target):
    """HF's lm_head + ForCausalLMLoss: logits in the model dtype, upcast to fp32, cross-entropy."""
    return _hf_cross_entropy(torch.nn.functional.linear(hidden, weight), target)


PEER_PACKAGES = {
    "liger_kernel": ("liger_kernel", "liger-kernel"),
    "cce": ("cut_cross_entropy", "cut-cross-entropy"),
}


# ------------------------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------------------------

_SWEEP_TOKENS = (1024, 4093, 16384, 65536)  # 4093: a token count that is not a multiple of 16
_SWEEP_HIDDEN = (1024, 2048, 4096, 8192, 16384)
_SWEEP_VOCAB = (32000, 128256, 152064, 256000)
_MAX_SWEEP_ELEMS = 2**30  # per activation tensor (2 GiB in bf16)
_MAX_SWEEP_LOGITS = 2.2e9  # tokens x vocab


def _rows_sweep() -> tuple[dict, ...]:
    return tuple({"M": t, "N": h} for h in _SWEEP_HIDDEN for t in _SWEEP_TOKENS if t * h <= _MAX_SWEEP_ELEMS)


def _rope_sweep() -> tuple[dict, ...]:
    return tuple(
        {"B": 1, "T": t, "Hq": h // 128, "Hk": max(1, h // 512), "D": 128}
        for h in _SWEEP_HIDDEN
        for t in _SWEEP_TOKENS
        if t * h <= _MAX_SWEEP_ELEMS
    )


def _vocab_sweep(tokens: Sequence[int], **extra) -> tuple[dict, ...]:
    key = "BT" if extra else "N"
    return tuple(
        {key: n, "V": v, **extra} for v in _SWEEP_VOCAB for n in tokens if n * v <= _MAX_SWEEP_LOGITS
    )


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str  # the functional name in liger_core.ops and liger_core.reference
    title: str
    build: Callable[[dict, torch.dtype, torch.device], Case]
    label: Callable[[dict], str]
    floor: Callable[[dict, int, str], Floor]
    shapes: dict[str, tuple[dict, ...]]  # "default" (bench, GPU check), "sweep", "cpu" (check, dry run)
    ref_elems: Callable[[dict], int]  # elements alive at the peak of the reference forward + backward
    liger_kernel: Callable | None = None
    cce: Callable | None = None
    # the "torch" provider (and what torch.compile compiles) when it differs from liger_core.reference.<op>:
    # the HF code as models run it. Accuracy budgets always come from the reference in the inputs' dtype.
    eager: Callable | None = None
    ours_kwargs: dict = dataclasses.field(default_factory=dict)  # benchmark settings for liger_core


def _mn(s: dict) -> str:
    return f"{s['M']}x{s['N']}"


def _nv(s: dict) -> str:
    return f"{s['N']}x{s['V']}"


OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec(
            "rms_norm", "RMSNorm", lambda s, dt, dev: build_norm(s, dt, dev, bias=False), _mn,
            lambda s, b, m: floor_norm(s, b, m, 1),
            {"default": ({"M": 16384, "N": 4096},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 8 * s["M"] * s["N"],
            liger_kernel=_liger_kernel("liger_rms_norm"),  # in_place=True by default: dx written over dy
            ours_kwargs={"in_place": True},  # the same memory-saving setting as liger-kernel's default
        ),
        OpSpec(
            "layer_norm", "LayerNorm", lambda s, dt, dev: build_norm(s, dt, dev, bias=True), _mn,
            lambda s, b, m: floor_norm(s, b, m, 2),
            {"default": ({"M": 16384, "N": 4096},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 8 * s["M"] * s["N"],
            liger_kernel=_liger_kernel("liger_layer_norm"),
        ),
        OpSpec(
            "swiglu", "SwiGLU", build_glu, _mn, floor_glu,
            {"default": ({"M": 16384, "N": 14336},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 8 * s["M"] * s["N"],
            liger_kernel=_liger_kernel("liger_swiglu"),  # writes da, db over a, b in backward
            ours_kwargs={"inplace_backward": True},  # the same memory-saving setting (as our MLP modules use)
        ),
        OpSpec(
            "geglu", "GeGLU", build_glu, _mn, floor_glu,
            {"default": ({"M": 16384, "N": 14336},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 8 * s["M"] * s["N"],
            liger_kernel=_liger_kernel("liger_geglu"),  # tanh approximation, as ours by default
            ours_kwargs={"inplace_backward": True},  # as liger-kernel (da, db over a, b) and our MLP modules
        ),
        OpSpec(
            "rope", "RoPE", build_rope,
            lambda s: f"q{s['B']}x{s['Hq']}x{s['T']}x{s['D']} kv{s['Hk']}", floor_rope,
            {
                "default": ({"B": 4, "T": 4096, "Hq": 32, "Hk": 8, "D": 128},),
                "sweep": _rope_sweep(),
                "cpu": ({"B": 2, "T": 37, "Hq": 4, "Hk": 2, "D": 16},),
            },
            lambda s: 8 * s["B"] * s["T"] * (s["Hq"] + s["Hk"]) * s["D"],
            liger_kernel=_liger_kernel("liger_rope"),
        ),
        OpSpec(
            "cross_entropy", "CrossEntropy", build_ce, _nv, floor_ce,
            {
                "default": ({"N": 8192, "V": 128256},),
                "sweep": _vocab_sweep((4096, 8191, 16384)),
                "cpu": ({"N": 37, "V": 301},),
            },
            lambda s: 4 * s["N"] * s["V"],
            liger_kernel=_liger_kernel("liger_cross_entropy"),  # writes the gradient over the logits
            eager=_hf_cross_entropy,
            # the same memory-saving setting as liger-kernel (always in place); the default (a new gradient
            # buffer, logits untouched) costs one more logits-sized buffer
            ours_kwargs={"inplace_backward": True},
        ),
        OpSpec(
            "fused_linear_cross_entropy", "FusedLinearCE", build_flce,
            lambda s: f"BT{s['BT']} H{s['H']} V{s['V']}", floor_flce,
            {
                "default": ({"BT": 8192, "H": 4096, "V": 128256},),
                "sweep": _vocab_sweep((4096, 8191, 16384), H=4096),
                "cpu": ({"BT": 37, "H": 64, "V": 301},),
            },
            lambda s: 3 * s["BT"] * s["V"] + 2 * s["V"] * s["H"] + 2 * s["BT"] * s["H"],
            liger_kernel=_liger_kernel("liger_fused_linear_cross_entropy"),
            cce=_cce_linear_cross_entropy,
            eager=_hf_linear_cross_entropy,
        ),
        OpSpec(
            "kl_div", "KLDiv", build_kl, _nv, floor_pair_loss,
            {
                "default": ({"N": 8192, "V": 128256},),
                "sweep": _vocab_sweep((4096, 8191)),
                "cpu": ({"N": 37, "V": 301},),
            },
            lambda s: 6 * s["N"] * s["V"],
            liger_kernel=_liger_kernel("liger_kl_div", reduction="batchmean"),
        ),
        OpSpec(
            "jsd", "JSD", build_jsd, _nv, floor_pair_loss,
            {
                "default": ({"N": 8192, "V": 128256},),
                "sweep": _vocab_sweep((4096, 8191)),
                "cpu": ({"N": 37, "V": 301},),
            },
            lambda s: 6 * s["N"] * s["V"],
            liger_kernel=_liger_kernel("liger_jsd"),  # (student_logp, teacher_logp), beta 0.5
        ),
        OpSpec(
            "fused_linear_jsd", "FusedLinearJSD", build_fljsd,
            lambda s: f"BT{s['BT']} Hs{s['Hs']} Ht{s['Ht']} V{s['V']}", floor_fljsd,
            {
                "default": ({"BT": 8192, "Hs": 2048, "Ht": 4096, "V": 128256},),
                "sweep": _vocab_sweep((4096, 8191), Hs=2048, Ht=4096),
                "cpu": ({"BT": 37, "Hs": 48, "Ht": 64, "V": 301},),
            },
            lambda s: 6 * s["BT"] * s["V"] + 2 * s["V"] * (s["Hs"] + s["Ht"]),
            liger_kernel=_liger_kernel("liger_fused_linear_jsd"),
        ),
    )
}  # fmt: skip


class PackageImportError(RuntimeError):
    """``liger_core.ops`` or ``liger_core.reference`` failed to import (e.g. one op file is broken)."""


def available(module: str, name: str) -> Callable | None:
    """``liger_core.<module>.<name>`` if that op exists in this checkout (others are still being written);
    PackageImportError, naming the cause, when the package itself fails to import."""
    try:
        mod = importlib.import_module(f"liger_core.{module}")
    except Exception as e:  # noqa: BLE001 - reported by the caller; other providers still run
        raise PackageImportError(f"liger_core.{module} failed to import: {type(e).__name__}: {e}") from e
    return getattr(mod, name, None)


def peer_version(provider: str) -> str | None:
    module, dist = PEER_PACKAGES[provider]
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


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


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
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
                grads.append(_randn(*o.shape, dtype=self.dtype, device=self.device))
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
                outs = _as_tuple(self.reference(*args))
                self._set_grads(outs)
                torch.autograd.backward(outs, [g.to(o.dtype) for g, o in zip(self.grads, outs)])
                self.ref = [o.detach() for o in outs] + [args[i].grad for i in self.case.diff]
                self.ref_dtype = str(ref_dtype).replace("torch.", "")
                return
            except torch.cuda.OutOfMemoryError:
                args = outs = None
                self.ref = None
                _free_memory()
        with torch.no_grad():  # no reference fits: output shapes for the gradients only
            self._set_grads(_as_tuple(self.reference(*self._copies())))

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
        outs = _as_tuple(fn(*args))
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
            _restore(written)
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


def _restore(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for work, pristine in pairs:
            work.copy_(pristine)


def make_step(run: ProviderRun, mode: str) -> Callable[[], None]:
    fn, args, grads = run.fn, run.args, run.grads
    if mode == "fwd":

        def step():
            fn(*args)

    else:

        def step():
            torch.autograd.backward(_as_tuple(fn(*args)), grads)

    return step


@dataclasses.dataclass(frozen=True)
class Timing:
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    min_reps: int = 10
    max_reps: int = 2000


QUICK = Timing(warmup_ms=10.0, rep_ms=40.0, min_reps=5, max_reps=500)
_L2_FLUSH_BYTES = 256 * 2**20  # what triton.testing.do_bench zeroes between runs to flush the L2 cache


def _estimate_ms(step: Callable[[], None], restore: Callable[[], None] | None) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(3):
        if restore:
            restore()
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return max(sorted(times)[1], 1e-3)


def _replicas(run: ProviderRun, mode: str, count: int) -> list[tuple[Callable[[], None], list, list]]:
    """``count`` independent working copies of the inputs a provider writes into: (step, its restore pairs,
    its differentiable inputs) each; inputs it only reads are shared."""
    written = {id(work) for work, _ in run.restore_pairs}
    out = []
    for _ in range(count):
        fresh: dict[int, torch.Tensor] = {}

        def twin(t, fresh=fresh):
            if not isinstance(t, torch.Tensor) or id(t) not in written:
                return t
            c = t.detach().clone().requires_grad_(t.requires_grad)
            fresh[id(t)] = c
            return c

        args = tuple(twin(a) for a in run.args)
        grads = [twin(g) for g in run.grads]
        pairs = [(fresh[id(work)], pristine) for work, pristine in run.restore_pairs]
        diff = [fresh.get(id(t), t) for t in run.diff_tensors]
        replica = ProviderRun(run.fn, args, grads, diff, pairs, run.errors)
        out.append((make_step(replica, mode), pairs, diff))
    return out


def _replica_count(run: ProviderRun) -> int:
    """How many working copies of the written inputs fit in 30 % of free memory (at most 8)."""
    need = sum(work.numel() * work.element_size() for work, _ in run.restore_pairs)
    free, _ = torch.cuda.mem_get_info()
    return int(min(RESTORE_BATCH, (0.3 * free) // max(need, 1)))


RESTORE_BATCH = 8  # runs per batch of the restoring timer (each on its own copy of the written inputs)


def _bench_restoring(run: ProviderRun, mode: str, warmup_ms, rep_ms, max_reps, est_ms) -> list[float]:
    """triton.testing.do_bench's loop (L2 flush, one event pair per run, median) for a provider that writes
    into its inputs: runs go in batches of up to RESTORE_BATCH, each run on its own working copy of the
    written inputs, all restored from the pristine copy (and synchronized) before the batch, outside the timed
    region; each run starts with its differentiable inputs' gradients cleared, as do_bench's. Within a batch
    the host runs ahead of the GPU as in do_bench's loop; only a batch's first run starts from an idle GPU
    queue. (A restore copy queued right before each run would instead give every run a
    GPU head start that do_bench gives no host-bound provider; a synchronize before each run would make every
    run start from an idle queue, which do_bench does not either.)"""
    cache = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    replicas = _replicas(run, mode, max(1, _replica_count(run)))
    n_warmup = max(1, int(warmup_ms / est_ms))
    n_rep = min(max_reps, max(1, int(rep_ms / est_ms)))
    times: list[float] = []

    def batch(timed: bool) -> None:
        for _, pairs, diff in replicas:
            for t in diff:
                t.grad = None
            _restore(pairs)
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in replicas
        ]
        torch.cuda.synchronize()
        for (step, _, diff), (start, end) in zip(replicas, events):
            # as do_bench's grad_to_none before every run: the replicas share the inputs they do not write,
            # so a gradient left by the previous run would make this run add into it (a full-size add that
            # would be charged to the in-place RMSNorms, whose x is shared)
            for t in diff:
                t.grad = None
            cache.zero_()
            start.record()
            step()
            end.record()
        torch.cuda.synchronize()
        if timed:
            times.extend(s.elapsed_time(e) for s, e in events)

    for _ in range(-(-n_warmup // len(replicas))):
        batch(False)
    while len(times) < n_rep:
        batch(True)
    replicas.clear()
    t = torch.tensor(times[: max(n_rep, 1)], dtype=torch.float64)
    return [float(torch.quantile(t, q)) for q in (0.5, 0.2, 0.8)]


def time_step(run: ProviderRun, mode: str, timing: Timing) -> tuple[float, float, float, str]:
    """(median, p20, p80) in ms and the timer used."""
    import triton.testing

    step = make_step(run, mode)
    restore = (lambda: _restore(run.restore_pairs)) if run.restore_pairs else None
    # Time under the memory conditions of the peak-memory measurement: liger_core's fused linear CE sizes its
    # default chunk from the headroom under the process's peak, which the float64 reference or the gradients
    # left by the checked run would inflate (measured: 40 ms with their headroom vs 64 ms at 1.10 GiB).
    for t in run.diff_tensors:
        t.grad = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()  # warm (compilation happened in the checked run; this builds any mode-specific state)
    torch.cuda.synchronize()
    est = _estimate_ms(step, restore)
    rep = min(max(timing.rep_ms, timing.min_reps * est), timing.max_reps * est)
    warmup = max(timing.warmup_ms, est)
    if restore is None:
        q = triton.testing.do_bench(
            step, warmup=warmup, rep=rep, grad_to_none=run.diff_tensors, quantiles=[0.5, 0.2, 0.8]
        )
        timer = "do_bench"
    else:
        q = _bench_restoring(run, mode, warmup, rep, timing.max_reps, est)
        timer = "do_bench-batches+restore"
    for t in run.diff_tensors:
        t.grad = None
    return float(q[0]), float(q[1]), float(q[2]), timer


def _host_sync_in(step: Callable[[], None]) -> str | None:
    """Why ``step`` cannot be captured, found without capturing it: a host synchronisation (``.item()``, a
    device-to-host copy), raised by torch's sync debug mode; None when it ran without one. A failed capture
    is not harmless: it leaves allocations in the graph's private memory pool (the suite then ran out of
    memory several rows later) and the default CUDA generator in capture mode."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        return None
    except RuntimeError as e:
        return f"host sync: {_short_error(e)}"
    finally:
        torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.synchronize()


def time_graph(
    run: ProviderRun, mode: str, timing: Timing, check_host_sync: bool = True
) -> tuple[float, str]:
    """(median ms, timer) of the same step captured once in a CUDA graph and replayed by
    ``triton.testing.do_bench`` (L2 flushed between replays): the GPU's time alone, without the host's.
    Where the host needs longer per step than the GPU (small ops: Python, autograd and launches take
    0.2-0.7 ms per fwd+bwd on an H100 host, and that speed varies by 2x between hosts and processes), ``ms``
    measures the host; this column measures the kernels. Replays run on the same buffers: a provider that
    writes into its inputs sees its own previous outputs there (its time does not depend on the values);
    the inputs are restored afterwards. (nan, reason) where the step cannot be captured: found first by
    ``_host_sync_in`` when ``check_host_sync`` (peers; liger_core's losses sync only outside a capture)."""
    import triton.testing

    step = make_step(run, mode)
    graph = None
    if check_host_sync:
        why = _host_sync_in(step)
        _reset_inputs(run)
        if why is not None:
            return math.nan, f"not capturable: {why}"
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (allocator pools, lazy state)
            for _ in range(2):
                for t in run.diff_tensors:
                    t.grad = None
                step()
        torch.cuda.current_stream().wait_stream(side)
        for t in run.diff_tensors:
            t.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        ms = triton.testing.do_bench(
            graph.replay, warmup=timing.warmup_ms, rep=timing.rep_ms, return_mode="median"
        )
        return float(ms), "cuda-graph replay"
    except Exception as e:  # noqa: BLE001 - a step that cannot be captured keeps its other columns
        _end_generator_capture()
        return math.nan, f"not capturable: {_short_error(e)}"
    finally:
        del graph
        torch.cuda.synchronize()
        _reset_inputs(run)
        torch.cuda.empty_cache()


def _end_generator_capture() -> None:
    """After a failed capture: the default CUDA generator can stay in capture mode (the failed capture_end
    never ran its epilogue); an empty capture begins and ends one again, which should clear it. Best effort
    and not yet seen working (since ``_host_sync_in``, no capture has failed in a suite run); the suite draws
    its own inputs from ``_generator`` either way."""
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
        torch.randn(1, device="cuda")
    except Exception as e:  # noqa: BLE001
        print(f"  (default CUDA generator still unusable after a failed capture: {_short_error(e)})")


def _reset_inputs(run: ProviderRun) -> None:
    """Gradients dropped, written inputs restored from their pristine copies, garbage collected."""
    for t in run.diff_tensors:
        t.grad = None
    if run.restore_pairs:
        _restore(run.restore_pairs)
    gc.collect()


def peak_extra_bytes(run: ProviderRun, mode: str) -> int:
    """Peak memory of one run above what was allocated before it (inputs, pristine copies)."""
    step = make_step(run, mode)
    _reset_inputs(run)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    for t in run.diff_tensors:
        t.grad = None
    return peak


# ------------------------------------------------------------------------------------------------------------
# Providers
# ------------------------------------------------------------------------------------------------------------


def provider_fn(
    spec: OpSpec, provider: str, compile_backend: str = "inductor"
) -> tuple[Callable | None, str]:
    """The callable for a provider, or (None, why not)."""
    try:
        return _provider_fn(spec, provider, compile_backend)
    except PackageImportError as e:
        return None, str(e)


def _provider_fn(spec: OpSpec, provider: str, compile_backend: str) -> tuple[Callable | None, str]:
    if provider == "liger_core":
        fn = available("ops", spec.name)
        if fn is None:
            return None, f"liger_core.ops.{spec.name} not implemented yet"
        if spec.name == "fused_linear_cross_entropy":
            # The op alone at its default loop and memory: no loop or chunk from memory headroom, which the
            # harness's own allocations (do_bench's estimate loop keeps a second set of gradients) would give
            # the timed runs but not the one-shot memory measurement (a row would pair the one-chunk loop's
            # time with the two-pass loop's memory). benchmarks/e2e_llama1b.py
            # shows the headroom loops inside a training step.
            # (the module by name: liger_core.ops binds the function over the submodule's attribute)
            sys.modules["liger_core.ops.fused_linear_cross_entropy"].USE_HEADROOM = False
        if spec.ours_kwargs:
            kwargs = spec.ours_kwargs
            return (lambda *a: fn(*a, **kwargs)), ""
        return fn, ""
    if provider in ("torch", "torch.compile"):
        ref = spec.eager or available("reference", spec.name)
        if ref is None:
            return None, f"liger_core.reference.{spec.name} not implemented yet"
        if provider == "torch":
            return ref, ""
        import torch._dynamo

        torch._dynamo.reset()  # one compiled graph per (op, shape); no recompile limit across a sweep
        return torch.compile(ref, dynamic=False, backend=compile_backend), ""
    peer = spec.liger_kernel if provider == "liger_kernel" else spec.cce if provider == "cce" else None
    if peer is None:
        return None, "n/a"
    if peer_version(provider) is None:
        return None, f"{PEER_PACKAGES[provider][1]} not installed"
    return peer, ""


# ------------------------------------------------------------------------------------------------------------
# The suite
# ------------------------------------------------------------------------------------------------------------


def gpu_tag(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu-dryrun"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "_", name).strip("_")


class CsvSink:
    """Rows are appended and flushed one by one, so a run cut off by a time limit keeps what it measured."""

    def __init__(self, path: Path | None, append: bool = False):
        self.path, self.rows = path, []
        if path is not None and not (append and path.exists()):
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", newline="") as f:
                csv.writer(f).writerow(CSV_COLUMNS)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self.path is not None:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, CSV_COLUMNS).writerow({k: _fmt(row.get(k)) for k in CSV_COLUMNS})


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return str(v)


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _short_error(e: BaseException) -> str:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "OOM"
    msg = f"{type(e).__name__}: {e}".replace("\n", " ")
    return msg[:300]


def bench_case(
    spec: OpSpec,
    shape: dict,
    dtype: torch.dtype,
    device: torch.device,
    providers: Sequence[str],
    modes: Sequence[str],
    timing: Timing | None,
    sink: CsvSink,
    gpu: str,
    compile_backend: str,
    log: Callable[[str], None] = print,
) -> None:
    label = spec.label(shape)
    dname = str(dtype).replace("torch.", "")
    s = torch.empty((), dtype=dtype).element_size()
    floors = {m: spec.floor(shape, s, m) for m in modes}
    base = {"gpu": gpu, "op": spec.name, "shape": label, "dtype": dname}
    log(f"== {spec.title} {label} {dname}: floor " + ", ".join(f"{m} {floors[m].ms:.4g} ms" for m in modes))

    def emit(provider: str, mode: str, **fields) -> None:
        row = dict(
            base, mode=mode, provider=provider, floor_ms=floors[mode].ms, floor_basis=floors[mode].basis
        )
        row.update(fields)
        ms = row.get("ms")
        if ms:
            row["pct_of_floor"] = 100.0 * floors[mode].ms / ms
        gpu_ms = row.get("gpu_ms")
        if gpu_ms and not math.isnan(gpu_ms):
            row["gpu_pct_of_floor"] = 100.0 * floors[mode].ms / gpu_ms
        sink.add(row)

    try:
        runner = CaseRunner(spec, shape, dtype, device)
        runner.compute_reference()
    except Exception as e:  # noqa: BLE001 - a broken case must not stop the suite
        log(f"   inputs/reference failed: {_short_error(e)}")
        for p in providers:
            for m in modes:
                emit(p, m, error=f"reference: {_short_error(e)}", check="error")
        _free_memory()
        return
    if runner.ref is not None:
        try:  # the accuracy budget: the reference (the code we replace) in this dtype
            runner.set_eager(runner.run_checked(runner.reference).errors)
        except Exception as e:  # noqa: BLE001
            log(f"   eager reference run failed ({_short_error(e)}): outputs unchecked")
    _free_memory()

    for provider in providers:
        fn, why = provider_fn(spec, provider, compile_backend)
        if fn is None:
            if why != "n/a":
                log(f"   {provider:<14} skipped: {why}")
                for m in modes:
                    emit(provider, m, error=why, check="skipped")
            continue
        try:
            run = runner.run_checked(fn)
        except Exception as e:  # noqa: BLE001
            err = _short_error(e)
            log(f"   {provider:<14} failed its checked run: {err}")
            for m in modes:
                emit(provider, m, error=err, check="error")
            _free_memory()
            continue
        err, eager_err, worst, ok = runner.verdict(run.errors)
        if runner.ref is None or runner.eager_errors is None:
            check = "unchecked (reference or eager run did not fit)"
        else:
            check = "ok" if ok else ("FAIL" if provider == "liger_core" else "WARN")
        fields = dict(
            rel_err=err,
            eager_rel_err=eager_err,
            ref_dtype=runner.ref_dtype,
            check=check,
            worst_output=worst,
            writes_inputs=";".join(_written_names(runner, run)),
        )
        not_capturable = ""  # after one mode fails to capture, the others are not tried (see _host_sync_in)
        for mode in modes:
            row = dict(fields)
            try:
                if timing is not None:
                    ms, p20, p80, timer = time_step(run, mode, timing)
                    row.update(ms=ms, ms_p20=p20, ms_p80=p80, timer=timer)
                    row["peak_extra_gib"] = peak_extra_bytes(run, mode) / GIB
                    if not_capturable:
                        row["gpu_ms"], row["gpu_timer"] = math.nan, not_capturable
                    else:
                        row["gpu_ms"], row["gpu_timer"] = time_graph(
                            run, mode, timing, check_host_sync=provider != "liger_core"
                        )
                        if row["gpu_timer"].startswith("not capturable"):
                            not_capturable = row["gpu_timer"]
                else:
                    make_step(run, mode)()  # dry run: exercise the timed code path once, untimed
                    row["timer"] = "none (dry run)"
            except Exception as e:  # noqa: BLE001
                row["error"] = _short_error(e)
            emit(provider, mode, **row)
            log(_progress_line(provider, mode, row, floors[mode]))
        del run
        _free_memory()
    del runner
    _free_memory()


def _written_names(runner: CaseRunner, run: ProviderRun) -> list[str]:
    names = []
    for work, _ in run.restore_pairs:
        for i, a in enumerate(run.args):
            if a is work:
                names.append(f"arg{i}")
        for i, g in enumerate(run.grads):
            if g is work:
                names.append(f"grad_out{i}")
    return names


def _progress_line(provider: str, mode: str, row: dict, floor: Floor) -> str:
    parts = [f"   {provider:<14} {mode:<8}"]
    if row.get("ms") is not None:
        parts.append(
            f"{row['ms']:9.4f} ms  {row.get('peak_extra_gib', math.nan):7.3f} GiB  "
            f"{100 * floor.ms / row['ms']:5.1f}% of floor"
        )
    gpu_ms = _num(row.get("gpu_ms"))
    if gpu_ms is not None:
        parts.append(f"GPU {gpu_ms:.4f} ms ({100 * floor.ms / gpu_ms:5.1f}%)")
    elif row.get("gpu_timer"):
        parts.append(f"GPU time {row['gpu_timer'][:60]}")
    if row.get("check"):
        parts.append(
            f"check {row['check']} (err {row.get('rel_err', math.nan):.2e} vs eager "
            f"{row.get('eager_rel_err', math.nan):.2e} on {row.get('worst_output', '')})"
        )
    if row.get("error"):
        parts.append(f"ERROR {row['error']}")
    return "  ".join(parts)


def print_table(rows: Sequence[dict], log: Callable[[str], None] = print) -> None:
    """Short table: one line per (op, shape, provider); fwd and fwd+bwd side by side."""
    groups: dict[tuple, dict[str, dict[str, dict]]] = {}
    for r in rows:
        groups.setdefault((r["op"], r["shape"], r.get("dtype", "")), {}).setdefault(r["provider"], {})[
            r["mode"]
        ] = r
    head = (
        f"{'op':<14} {'shape':<26} {'provider':<14} {'fwd ms':>9} {'f+b ms':>9} {'f+b GiB':>8} {'%floor':>7}"
        f" {'f+b GPU':>9} {'%floor':>7}  check"
    )
    log(head)
    log("-" * len(head))
    for (op, shape, _dtype), by_provider in groups.items():
        floor_f = floor_fb = None
        for modes in by_provider.values():
            floor_f = floor_f or _num(modes.get("fwd", {}).get("floor_ms"))
            floor_fb = floor_fb or _num(modes.get("fwd+bwd", {}).get("floor_ms"))
        title = OPS[op].title if op in OPS else op
        log(f"{title:<14} {shape:<26} {'floor':<14} {_cell(floor_f)} {_cell(floor_fb)}")
        for provider, modes in by_provider.items():
            f, fb = modes.get("fwd", {}), modes.get("fwd+bwd", {})
            any_row = fb or f
            pct = _num(fb.get("pct_of_floor"))
            check = any_row.get("check") or ""
            err = fb.get("error") or f.get("error")
            mem = _num(fb.get("peak_extra_gib"))
            gpu = _num(fb.get("gpu_ms"))
            gpu_pct = 100 * floor_fb / gpu if gpu and floor_fb else None
            log(
                f"{'':<14} {'':<26} {provider:<14} {_cell(_num(f.get('ms')))} {_cell(_num(fb.get('ms')))} "
                f"{(f'{mem:8.3f}' if mem is not None else ' ' * 8)} {(f'{pct:6.1f}%' if pct else ' ' * 7)} "
                f"{_cell(gpu)} {(f'{gpu_pct:6.1f}%' if gpu_pct else ' ' * 7)}  "
                f"{check}{'  ' + err[:60] if err else ''}"
            )


def peer_wins(rows: Sequence[dict]) -> list[str]:
    """Cases where a peer (or eager/compiled torch) is faster than liger_core, or leaner in fwd+bwd memory.
    Each speed line also gives both GPU times (CUDA-graph replay) where measured, so a host-bound case
    (``ms`` far above the GPU time) is told apart from a slower kernel."""
    by_case: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by_case.setdefault((r["op"], r["shape"], r["mode"]), {})[r["provider"]] = r
    out = []
    for (op, shape, mode), by_p in by_case.items():
        ours = by_p.get("liger_core", {})
        ms, mem = _num(ours.get("ms")), _num(ours.get("peak_extra_gib"))
        if ms is None:
            continue
        for p, r in by_p.items():
            pms, pmem = _num(r.get("ms")), _num(r.get("peak_extra_gib"))
            if p == "liger_core" or pms is None:
                continue
            gpu, pgpu = _num(ours.get("gpu_ms")), _num(r.get("gpu_ms"))
            both_gpu = gpu is not None and pgpu is not None
            gpu_note = f"; GPU time {pgpu:.4g} vs {gpu:.4g} ms" if both_gpu else ""
            if pms < ms:
                out.append(
                    f"{op} {shape} {mode}: {p} {100 * (ms / pms - 1):.1f}% faster ({pms:.4g} vs {ms:.4g} ms"
                    f"{gpu_note})"
                )
            elif both_gpu and pgpu < gpu:
                out.append(
                    f"{op} {shape} {mode}: {p} {100 * (gpu / pgpu - 1):.1f}% faster in GPU time "
                    f"({pgpu:.4g} vs {gpu:.4g} ms; wall {pms:.4g} vs {ms:.4g})"
                )
            if mode == "fwd+bwd" and mem is not None and pmem is not None and pmem < mem - 1e-3:
                out.append(f"{op} {shape} {mode}: {p} leaner ({pmem:.3g} GiB vs {mem:.3g} GiB)")
    return out


def _num(v) -> float | None:
    if v is None or v == "":
        return None
    v = float(v)
    return None if math.isnan(v) else v


def _cell(v: float | None) -> str:
    return f"{v:9.4f}" if v is not None else " " * 9


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------------------------------
# Plots
# ------------------------------------------------------------------------------------------------------------

_COLORS = {"liger_core": "#d62728", "torch": "#7f7f7f", "torch.compile": "#1f77b4", "liger_kernel": "#ff7f0e",
           "cce": "#2ca02c"}  # fmt: skip


def plot_results(rows: Sequence[dict], out_dir: Path, prefix: str) -> list[Path]:
    """PNG plots: time per op grouped by provider (fwd and fwd+bwd), % of floor, and peak extra memory; for a
    sweep (several shapes per op), % of floor against shape per op. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    cases: dict[tuple[str, str], dict[str, dict[str, dict]]] = {}
    for r in rows:
        cases.setdefault((r["op"], r["shape"]), {}).setdefault(r["provider"], {})[r["mode"]] = r
    providers = [p for p in PROVIDERS if any(p in c for c in cases.values())]
    ops = list(dict.fromkeys(op for op, _ in cases))
    written = []
    width = 0.8 / max(1, len(providers))
    n_shapes = max((sum(1 for o, _ in cases if o == op) for op in ops), default=0)

    if not any(_num(r.get("ms")) is not None for r in rows):
        return written  # nothing was timed (a dry run's CSV): no plot rather than empty axes
    if n_shapes <= 1:
        # 1) time per op: one panel per op, groups = modes, bars = providers, floor as a dashed segment
        n = len(cases)
        cols = min(4, max(1, n))
        rows_n = max(1, math.ceil(n / cols))
        fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 3.6 * rows_n), squeeze=False)
        for ax, ((op, shape), by_p) in zip(axes.flat, cases.items()):
            for j, p in enumerate(providers):
                ys = [_num(by_p.get(p, {}).get(m, {}).get("ms")) for m in MODES]
                xs = [i + (j - (len(providers) - 1) / 2) * width for i in range(len(MODES))]
                ax.bar(xs, [y if y is not None else 0 for y in ys], width, label=p, color=_COLORS.get(p))
            for i, m in enumerate(MODES):
                fl = next((_num(r.get(m, {}).get("floor_ms")) for r in by_p.values() if m in r), None)
                if fl:
                    ax.hlines(fl, i - 0.45, i + 0.45, colors="k", linestyles="dashed", linewidth=1)
            ax.set_xticks(range(len(MODES)), MODES)
            ax.set_title(f"{OPS[op].title if op in OPS else op}\n{shape}", fontsize=9)
            ax.set_ylabel("ms (median)")
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7, framealpha=0.6)
        fig.suptitle(f"{prefix}: time per op (dashed: bandwidth/FLOP floor)")
        fig.tight_layout()
        written.append(_save(fig, out_dir / f"{prefix}_time.png"))

        # 2) % of floor and 3) peak extra memory, fwd+bwd, op on the x axis
        for key, ylabel, fname in (
            ("pct_of_floor", "% of floor (fwd+bwd)", "floor"),
            ("gpu_pct_of_floor", "% of floor, GPU time (CUDA-graph replay, fwd+bwd)", "gpu_floor"),
            ("peak_extra_gib", "peak extra memory, GiB (fwd+bwd)", "memory"),
        ):
            if not any(r.get(key) not in (None, "") for r in rows):
                continue  # e.g. a CSV from before the GPU-time column
            fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cases)), 4))
            for j, p in enumerate(providers):
                ys = [_num(by_p.get(p, {}).get("fwd+bwd", {}).get(key)) for by_p in cases.values()]
                xs = [i + (j - (len(providers) - 1) / 2) * width for i in range(len(cases))]
                ax.bar(xs, [y if y is not None else 0 for y in ys], width, label=p, color=_COLORS.get(p))
            if key.endswith("pct_of_floor"):
                ax.axhline(100, color="k", linestyle="dashed", linewidth=1)
            ax.set_xticks(range(len(cases)), [OPS[o].title if o in OPS else o for o, _ in cases], rotation=20)
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
            ax.set_title(prefix)
            fig.tight_layout()
            written.append(_save(fig, out_dir / f"{prefix}_{fname}.png"))
    else:
        # sweep: per op, against shape, one line per provider: % of floor, and time / liger_core's time
        def value(op, shape, p, key):
            r = cases[(op, shape)].get(p, {}).get("fwd+bwd", {})
            v = _num(r.get(key))
            if key in ("ms", "gpu_ms") and v is not None:
                ours = _num(cases[(op, shape)].get("liger_core", {}).get("fwd+bwd", {}).get(key))
                v = v / ours if ours else None
            return v if v is not None else math.nan

        for key, ylabel, line, fname in (
            ("pct_of_floor", "% of floor (fwd+bwd)", 100.0, "floor"),
            ("gpu_pct_of_floor", "% of floor, GPU time (CUDA-graph replay, fwd+bwd)", 100.0, "gpu_floor"),
            ("ms", "time / liger_core time (fwd+bwd; > 1: slower)", 1.0, "relative"),
            # the kernels alone: at small shapes ``ms`` is the host's time per call, not the GPU's
            (
                "gpu_ms",
                "GPU time / liger_core GPU time (fwd+bwd; > 1: slower)",
                1.0,
                "gpu_relative",
            ),
        ):
            # the ops that have this column (a merged sweep may hold rows measured before it existed)
            ops_k = [op for op in ops if any(r.get(key) not in (None, "") for r in rows if r["op"] == op)]
            if not ops_k:
                continue
            cols = min(3, len(ops_k))
            rows_n = math.ceil(len(ops_k) / cols)
            fig, axes = plt.subplots(rows_n, cols, figsize=(6.5 * cols, 4.2 * rows_n), squeeze=False)
            for ax, op in zip(axes.flat, ops_k):
                shapes = [sh for o, sh in cases if o == op]
                for p in providers:
                    ys = [value(op, sh, p, key) for sh in shapes]
                    ax.plot(range(len(shapes)), ys, "o-", label=p, color=_COLORS.get(p), markersize=3)
                ax.axhline(line, color="k", linestyle="dashed", linewidth=1)
                if key in ("ms", "gpu_ms"):
                    ax.set_yscale("log")
                ax.set_xticks(range(len(shapes)), shapes, rotation=60, fontsize=6, ha="right")
                ax.set_ylabel(ylabel)
                ax.set_title(OPS[op].title if op in OPS else op)
            for ax in list(axes.flat)[len(ops_k) :]:
                ax.axis("off")
            axes.flat[0].legend(fontsize=7, framealpha=0.6)
            fig.suptitle(f"{prefix}: {ylabel} per shape")
            fig.tight_layout()
            written.append(_save(fig, out_dir / f"{prefix}_{fname}.png"))
    plt.close("all")
    return written


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")  # legends placed outside the axes are kept whole
    return path


# ------------------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="liger-core bench",
        description="Benchmark liger_core's kernels beside torch eager, torch.compile, liger-kernel and "
        "cut-cross-entropy on this GPU: median ms (fwd, fwd+bwd), peak extra memory, % of the floor.",
    )
    p.add_argument(
        "--ops",
        nargs="+",
        default=list(DEFAULT_OPS),
        metavar="OP",
        help=f"ops to run, or 'all' (default: {' '.join(DEFAULT_OPS)}; all: {' '.join(ALL_OPS)})",
    )
    p.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=PROVIDERS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument(
        "--sweep",
        action="store_true",
        help="sweep shapes (hidden 1024..16384 x tokens 1k..64k incl. odd counts; vocab 32k..256k)",
    )
    p.add_argument(
        "--where",
        nargs="+",
        default=[],
        metavar="KEY=V[,V]",
        help="keep only the shapes whose KEY is one of the values, e.g. --sweep --where N=8192,16384 "
        "(norms/GLUs at those hidden sizes; shape keys: M, N for the row ops, B, T, Hq, Hk, D for rope, "
        "N/BT, V, H for the losses; a shape without the key is left out)",
    )
    p.add_argument("--quick", action="store_true", help="shorter timing (warmup 10 ms, rep 40 ms)")
    p.add_argument(
        "--out",
        default=None,
        help="directory for the CSV and PNG files (default: benchmarks/results; with --dry-run a new "
        "temporary directory, so a dry run writes nothing into the checkout)",
    )
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny shapes on CPU (Triton interpreter), every provider run once forward and backward "
        "and checked, nothing timed (so no plots): exercises this script without a GPU",
    )
    p.add_argument("--plot-from", metavar="CSV", help="only print the table and draw the plots of a CSV")
    # internal: a run whose CUDA context broke (a crashed kernel) continues in a fresh process with these
    p.add_argument("--append", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--resume-shape", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ops == ["all"]:
        args.ops = list(ALL_OPS)
    try:
        args.where = {k: set(v.split(",")) for k, v in (w.split("=", 1) for w in args.where)}
    except ValueError:
        p.error(f"--where takes KEY=V[,V] terms, got {args.where}")
    unknown = [o for o in args.ops if o not in OPS]
    if unknown:
        p.error(f"unknown op(s) {unknown}; choose from {list(ALL_OPS)} or 'all'")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    with quiet_interpreter():  # a dry run runs the kernels in Triton's interpreter: no numpy warnings noise
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = parse_args(argv)
    if args.out is None:
        args.out = (
            tempfile.mkdtemp(prefix="liger-core-bench-dry-run-") if args.dry_run else "benchmarks/results"
        )
    out_dir = Path(args.out)
    if args.plot_from:
        rows = read_csv(Path(args.plot_from))
        print_table(rows)
        _print_peer_wins(rows)
        if not args.no_plots:
            files = plot_results(rows, out_dir, Path(args.plot_from).stem)
            for f in files:
                print(f"wrote {f}")
            if not files:
                print(f"no plots: {args.plot_from} has no timings (a dry run's CSV)")
        return 0
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print(
            "liger-core bench: no CUDA GPU found (torch.cuda.is_available() is False); it needs one.\n"
            "To exercise the benchmark code on CPU without timing, use --dry-run.",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda") if cuda and not args.dry_run else torch.device("cpu")
    note = prepare_triton(cuda=device.type == "cuda")
    if note:
        print(f"note: {note}")
    dtype = getattr(torch, args.dtype)
    timing = None if device.type == "cpu" else (QUICK if args.quick else Timing())
    shapes_key = "cpu" if device.type == "cpu" else ("sweep" if args.sweep else "default")
    gpu = gpu_tag(device)
    prefix = f"{'sweep' if args.sweep else 'ops'}_{gpu}"
    csv_path = out_dir / f"{prefix}.csv"
    meta = environment_summary(device)
    meta.update(
        argv=list(sys.argv if argv is None else argv), shapes=shapes_key, started=time.strftime("%F %T")
    )
    print(json.dumps(meta))
    out_dir.mkdir(parents=True, exist_ok=True)
    sink = CsvSink(csv_path, append=args.append)
    compile_backend = "inductor" if device.type == "cuda" else "aot_eager"  # CPU dry run: no C++ codegen
    cases = [
        (name, i, shape)
        for name in args.ops
        for i, shape in enumerate(OPS[name].shapes[shapes_key])
        if not (name == args.ops[0] and i < args.resume_shape)
        and all(str(shape.get(k)) in values for k, values in args.where.items())
    ]
    if not cases:
        print(f"liger-core bench: no shape of {args.ops} matches --where {args.where}", file=sys.stderr)
        return 2
    t0 = time.time()
    child_rc = 0
    for k, (name, _, shape) in enumerate(cases):
        bench_case(
            OPS[name], shape, dtype, device, args.providers, args.modes, timing, sink, gpu, compile_backend
        )
        if k + 1 < len(cases) and process_broken(device):
            child_rc = continue_in_fresh_process(args, cases[k + 1 :])
            break
    if args.append:  # a continuation: the first process prints the table and draws the plots
        return child_rc
    meta["seconds"] = round(time.time() - t0, 1)
    (out_dir / f"{prefix}_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    rows = read_csv(csv_path)  # every row, also those a continuation process wrote
    print()
    print_table(rows)
    _print_peer_wins(rows)
    print(f"\nwrote {csv_path} ({len(rows)} rows) in {meta['seconds']} s")
    if timing is None:
        print("no plots: a dry run times nothing (the CSV has the correctness checks)")
    elif not args.no_plots:
        try:
            for f in plot_results(rows, out_dir, prefix):
                print(f"wrote {f}")
        except Exception as e:  # noqa: BLE001 - plots are a convenience; the CSV is the result
            print(f"plots failed: {_short_error(e)}")
            traceback.print_exc()
    ours_bad = [
        f"{r['op']} {r['shape']} {r['mode']}: {r.get('error') or r.get('check')}"
        for r in rows
        if r["provider"] == "liger_core"
        and r.get("check") != "skipped"
        and (r.get("error") or r.get("check") == "FAIL")
    ]
    if ours_bad:  # the run is complete, but say loudly that our own kernels did not all run correctly
        print(f"\nliger_core failed in {len(ours_bad)} row(s):")
        for line in ours_bad:
            print(f"  {line}")
        return 1
    return child_rc


def process_broken(device: torch.device) -> bool:
    """True when this process can no longer use the GPU: a kernel crashed (illegal address, device-side
    assert) and CUDA's error is sticky, so every later case would fail too."""
    if device.type != "cuda":
        return False
    try:
        torch.ones(1, device=device).add_(1).item()
        torch.cuda.synchronize()
        return False
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return True


def continue_in_fresh_process(args: argparse.Namespace, rest: Sequence[tuple[str, int, dict]]) -> int:
    """Run the remaining cases in a new Python process that appends to the same CSV."""
    ops = list(dict.fromkeys(name for name, _, _ in rest))
    argv = ["--ops", *ops, "--resume-shape", str(rest[0][1]), "--append", "--no-plots"]
    argv += ["--providers", *args.providers, "--modes", *args.modes, "--dtype", args.dtype, "--out", args.out]
    if args.where:
        argv += ["--where", *(f"{k}={','.join(sorted(v))}" for k, v in args.where.items())]
    argv += [
        flag
        for flag, on in (("--sweep", args.sweep), ("--quick", args.quick), ("--dry-run", args.dry_run))
        if on
    ]
    print(
        f"\nthis process can no longer use the GPU (a kernel crashed): the remaining {len(rest)} case(s) "
        f"continue in a fresh process: liger-core bench {' '.join(argv)}\n",
        flush=True,
    )
    env = dict(os.environ)  # the package's own root first, in case it was found through sys.path only
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return subprocess.call([sys.executable, "-m", "liger_core.cli", "bench", *argv], env=env)


def _print_peer_wins(rows: Sequence[dict]) -> None:
    wins = peer_wins(rows)
    print(f"\nwhere a peer beats liger_core: {len(wins) or 'nowhere'}")
    for line in wins:
        print(f"  {line}")


def environment_summary(device: torch.device) -> dict:
    from liger_core.dispatch import triton_status

    info = {
        "torch": torch.__version__,
        "triton": _dist_version("triton"),
        "liger_kernel": peer_version("liger_kernel"),
        "cut_cross_entropy": peer_version("cce"),
        "triton_status": triton_status(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    return info


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())

"""The op registry shared by ``liger-core check`` and ``liger-core bench``: for each op its realistic input
builder, shapes (default, sweep, CPU), floor, peer adapters and the eager code it replaces (``OPS``)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence

import torch

from liger_core.harness.floors import (
    Floor,
    floor_ce,
    floor_flce,
    floor_fljsd,
    floor_fna,
    floor_fused_add_norm,
    floor_glu,
    floor_mta,
    floor_norm,
    floor_pair_loss,
    floor_rope,
    floor_rowwise,
    floor_softmax,
    floor_sparsemax,
    floor_unary,
)
from liger_core.harness.peers import (
    cce_linear_cross_entropy,
    hf_cross_entropy,
    hf_linear_cross_entropy,
    liger_kernel_fn,
    liger_kernel_group_norm,
    liger_kernel_scaled_cross_entropy,
)

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
ALL_OPS = DEFAULT_OPS + (
    "kl_div",
    "jsd",
    "fused_linear_jsd",
    "relu_squared",
    "tvd",
    "softmax",
    "sparsemax",
    "fused_linear_scaled_cross_entropy",
    "fused_add_rms_norm",
    "rms_norm_no_weight",
    "poly_norm",
    "dyt",
    "group_norm",
    "modulated_rms_norm",
    "multi_token_attention",
    "fused_neighborhood_attention",
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


def random_tensor(
    *shape: int, dtype: torch.dtype, device: torch.device, scale: float = 1.0, shift: float = 0.0
):
    t = torch.randn(*shape, dtype=dtype, device=device, generator=_generator(device))
    if scale != 1.0:
        t.mul_(scale)
    if shift != 0.0:
        t.add_(shift)
    return t


def build_norm(shape: dict, dtype, device, bias: bool) -> Case:
    m, n = shape["M"], shape["N"]
    x = random_tensor(m, n, dtype=dtype, device=device)
    w = random_tensor(n, dtype=dtype, device=device, scale=0.1, shift=1.0)
    if bias:
        b = random_tensor(n, dtype=dtype, device=device, scale=0.1)
        return Case((x, w, b, 1e-5), (0, 1, 2))
    return Case((x, w, 1e-6), (0, 1))


def build_fused_add_norm(shape: dict, dtype, device) -> Case:
    m, n = shape["M"], shape["N"]
    x = random_tensor(m, n, dtype=dtype, device=device)
    residual = random_tensor(m, n, dtype=dtype, device=device, scale=4.0)
    w = random_tensor(n, dtype=dtype, device=device, scale=0.1, shift=1.0)
    return Case((x, residual, w, 1e-6), (0, 1, 2))


def build_rows(shape: dict, dtype, device) -> Case:
    return Case((random_tensor(shape["M"], shape["N"], dtype=dtype, device=device), 1e-6), (0,))


def build_poly_norm(shape: dict, dtype, device) -> Case:
    x = random_tensor(shape["M"], shape["N"], dtype=dtype, device=device)
    w = random_tensor(3, dtype=dtype, device=device, scale=0.1, shift=1.0 / 3.0)
    # a 0-dim bias, as liger-kernel's module
    b = random_tensor(1, dtype=dtype, device=device, scale=0.1, shift=1.0).reshape(())
    return Case((x, w, b, 1e-6), (0, 1, 2))


def build_dyt(shape: dict, dtype, device) -> Case:
    n = shape["N"]
    x = random_tensor(shape["M"], n, dtype=dtype, device=device)
    alpha = random_tensor(1, dtype=dtype, device=device, scale=0.05, shift=0.5)
    gamma = random_tensor(n, dtype=dtype, device=device, scale=0.1, shift=1.0)
    beta = random_tensor(n, dtype=dtype, device=device, scale=0.1)
    return Case((x, alpha, gamma, beta), (0, 1, 2, 3))


def build_group_norm(shape: dict, dtype, device) -> Case:
    """(M, N) rows as (batch, channels, positions) = (M // 64, N, 64): images / sequences with N channels."""
    m, n = shape["M"], shape["N"]
    x = random_tensor(max(1, m // 64), n, 64, dtype=dtype, device=device)
    w = random_tensor(n, dtype=dtype, device=device, scale=0.1, shift=1.0)
    b = random_tensor(n, dtype=dtype, device=device, scale=0.1)
    return Case((x, 32, w, b, 1e-5), (0, 2, 3))


def build_modulated_norm(shape: dict, dtype, device) -> Case:
    """Rows of N with a weight, and AdaLN scale and shift per block of 256 rows (one sample of a DiT)."""
    m, n = shape["M"], shape["N"]
    blocks = m // 256 if m >= 256 and m % 256 == 0 else 1
    x = random_tensor(m, n, dtype=dtype, device=device)
    w = random_tensor(n, dtype=dtype, device=device, scale=0.1, shift=1.0)
    scale = random_tensor(blocks, n, dtype=dtype, device=device, scale=0.1)
    shift = random_tensor(blocks, n, dtype=dtype, device=device, scale=0.1)
    return Case((x, w, scale, shift, 1e-6), (0, 1, 2, 3))


def build_glu(shape: dict, dtype, device) -> Case:
    m, n = shape["M"], shape["N"]
    a = random_tensor(m, n, dtype=dtype, device=device, scale=2.0)
    b = random_tensor(m, n, dtype=dtype, device=device)
    return Case((a, b), (0, 1))


def build_unary(shape: dict, dtype, device) -> Case:
    x = random_tensor(shape["M"], shape["N"], dtype=dtype, device=device, scale=2.0)
    return Case((x,), (0,))


def _hf_layout(shape: torch.Size, dtype, device) -> torch.Tensor:
    """(B, H, T, D) view of a contiguous (B, T, H, D) buffer: the layout HF attention hands to RoPE."""
    b, h, t, d = shape
    return random_tensor(b, t, h, d, dtype=dtype, device=device).transpose(1, 2)


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
    logits = random_tensor(n, v, dtype=dtype, device=device, scale=2.0)
    target = torch.randint(0, v, (n,), device=device, generator=_generator(device))
    return Case((logits, target), (0,))


def build_flce(shape: dict, dtype, device) -> Case:
    bt, h, v = shape["BT"], shape["H"], shape["V"]
    hidden = random_tensor(bt, h, dtype=dtype, device=device)
    weight = random_tensor(v, h, dtype=dtype, device=device, scale=h**-0.5)  # logits ~ N(0, 1)
    target = torch.randint(0, v, (bt,), device=device, generator=_generator(device))
    return Case((hidden, weight, target), (0, 1))


def build_kl(shape: dict, dtype, device) -> Case:
    n, v = shape["N"], shape["V"]
    logp = torch.log_softmax(random_tensor(n, v, dtype=torch.float32, device=device), -1).to(dtype)
    p = torch.softmax(random_tensor(n, v, dtype=torch.float32, device=device), -1).to(dtype)
    return Case((logp, p), (0,))


def build_jsd(shape: dict, dtype, device) -> Case:
    n, v = shape["N"], shape["V"]
    student = torch.log_softmax(random_tensor(n, v, dtype=torch.float32, device=device), -1).to(dtype)
    teacher = torch.log_softmax(random_tensor(n, v, dtype=torch.float32, device=device), -1).to(dtype)
    return Case((student, teacher), (0,))


def build_tvd(shape: dict, dtype, device) -> Case:
    n, v = shape["N"], shape["V"]
    p = torch.softmax(random_tensor(n, v, dtype=torch.float32, device=device), -1).to(dtype)
    q = torch.softmax(random_tensor(n, v, dtype=torch.float32, device=device), -1).to(dtype)
    return Case((p, q), (0,))  # the gradient liger-kernel gives (p only)


def build_mta(shape: dict, dtype, device) -> Case:
    """Scores (B, C, L, L) of C heads, a C -> C mixing convolution of K x K with "same" padding."""
    b, c, n, k = shape["B"], shape["C"], shape["L"], shape["K"]
    scores = random_tensor(b, c, n, n, dtype=dtype, device=device, scale=2.0)
    weight = random_tensor(c, c, k, k, dtype=dtype, device=device, scale=(c * k * k) ** -0.5)
    bias = random_tensor(c, dtype=dtype, device=device, scale=0.1)
    return Case((scores, weight, bias, 1, k // 2), (0, 1, 2))


def build_fna(shape: dict, dtype, device) -> Case:
    b, h, n, d = shape["B"], shape["H"], shape["L"], shape["D"]
    q, k, v = (random_tensor(b, h, n, d, dtype=dtype, device=device) for _ in range(3))
    return Case((q, k, v, shape["K"], 1), (0, 1, 2))


def build_fljsd(shape: dict, dtype, device) -> Case:
    bt, hs, ht, v = shape["BT"], shape["Hs"], shape["Ht"], shape["V"]
    return Case(
        (
            random_tensor(bt, hs, dtype=dtype, device=device),
            random_tensor(v, hs, dtype=dtype, device=device, scale=hs**-0.5),
            random_tensor(bt, ht, dtype=dtype, device=device),
            random_tensor(v, ht, dtype=dtype, device=device, scale=ht**-0.5),
        ),
        (0, 1),
    )


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
            liger_kernel=liger_kernel_fn("liger_rms_norm"),  # in_place=True by default: dx written over dy
            ours_kwargs={"in_place": True},  # the same memory-saving setting as liger-kernel's default
        ),
        OpSpec(
            "layer_norm", "LayerNorm", lambda s, dt, dev: build_norm(s, dt, dev, bias=True), _mn,
            lambda s, b, m: floor_norm(s, b, m, 2),
            {"default": ({"M": 16384, "N": 4096},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 8 * s["M"] * s["N"],
            liger_kernel=liger_kernel_fn("liger_layer_norm"),
        ),
        OpSpec(
            "swiglu", "SwiGLU", build_glu, _mn, floor_glu,
            {"default": ({"M": 16384, "N": 14336},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 8 * s["M"] * s["N"],
            liger_kernel=liger_kernel_fn("liger_swiglu"),  # writes da, db over a, b in backward
            ours_kwargs={"inplace_backward": True},  # the same memory-saving setting (as our MLP modules use)
        ),
        OpSpec(
            "geglu", "GeGLU", build_glu, _mn, floor_glu,
            {"default": ({"M": 16384, "N": 14336},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 8 * s["M"] * s["N"],
            liger_kernel=liger_kernel_fn("liger_geglu"),  # tanh approximation, as ours by default
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
            liger_kernel=liger_kernel_fn("liger_rope"),
        ),
        OpSpec(
            "cross_entropy", "CrossEntropy", build_ce, _nv, floor_ce,
            {
                "default": ({"N": 8192, "V": 128256},),
                "sweep": _vocab_sweep((4096, 8191, 16384)),
                "cpu": ({"N": 37, "V": 301},),
            },
            lambda s: 4 * s["N"] * s["V"],
            liger_kernel=liger_kernel_fn("liger_cross_entropy"),  # writes the gradient over the logits
            eager=hf_cross_entropy,
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
            liger_kernel=liger_kernel_fn("liger_fused_linear_cross_entropy"),
            cce=cce_linear_cross_entropy,
            eager=hf_linear_cross_entropy,
        ),
        OpSpec(
            "kl_div", "KLDiv", build_kl, _nv, floor_pair_loss,
            {
                "default": ({"N": 8192, "V": 128256},),
                "sweep": _vocab_sweep((4096, 8191)),
                "cpu": ({"N": 37, "V": 301},),
            },
            lambda s: 6 * s["N"] * s["V"],
            liger_kernel=liger_kernel_fn("liger_kl_div", reduction="batchmean"),
        ),
        OpSpec(
            "jsd", "JSD", build_jsd, _nv, floor_pair_loss,
            {
                "default": ({"N": 8192, "V": 128256},),
                "sweep": _vocab_sweep((4096, 8191)),
                "cpu": ({"N": 37, "V": 301},),
            },
            lambda s: 6 * s["N"] * s["V"],
            liger_kernel=liger_kernel_fn("liger_jsd"),  # (student_logp, teacher_logp), beta 0.5
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
            liger_kernel=liger_kernel_fn("liger_fused_linear_jsd"),
        ),
        OpSpec(
            "relu_squared", "ReLUSquared", build_unary, _mn, floor_unary,
            {"default": ({"M": 16384, "N": 14336},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 6 * s["M"] * s["N"],
            liger_kernel=liger_kernel_fn("liger_relu_squared"),
        ),
        OpSpec(
            "tvd", "TVD", build_tvd, _nv, floor_pair_loss,
            {
                "default": ({"N": 8192, "V": 128256},),
                "sweep": _vocab_sweep((4096, 8191)),
                "cpu": ({"N": 37, "V": 301},),
            },
            lambda s: 6 * s["N"] * s["V"],
            liger_kernel=liger_kernel_fn("liger_tvd", reduction="batchmean"),  # its functional default: mean
        ),
        OpSpec(
            "softmax", "Softmax", build_unary, _mn, floor_softmax,
            {"default": ({"M": 16384, "N": 4096},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 6 * s["M"] * s["N"],
            liger_kernel=liger_kernel_fn("liger_softmax"),  # the last dimension, as ours by default
        ),
        OpSpec(
            "sparsemax", "Sparsemax", build_unary, _mn, floor_sparsemax,
            {"default": ({"M": 16384, "N": 4096},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 8 * s["M"] * s["N"],
            liger_kernel=liger_kernel_fn("liger_sparsemax"),  # dim=-1, as ours by default
        ),
        OpSpec(
            "fused_linear_scaled_cross_entropy", "FusedLinearScaledCE", build_flce,
            lambda s: f"BT{s['BT']} H{s['H']} V{s['V']}", floor_flce,
            {
                "default": ({"BT": 8192, "H": 4096, "V": 128256},),
                "sweep": _vocab_sweep((4096, 8191, 16384), H=4096),
                "cpu": ({"BT": 37, "H": 64, "V": 301},),
            },
            lambda s: 3 * s["BT"] * s["V"] + 2 * s["V"] * s["H"] + 2 * s["BT"] * s["H"],
            liger_kernel=liger_kernel_scaled_cross_entropy,  # per-token nll, temperature 1
        ),
        OpSpec(
            "fused_add_rms_norm", "FusedAddRMSNorm", build_fused_add_norm, _mn, floor_fused_add_norm,
            {"default": ({"M": 16384, "N": 4096},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 12 * s["M"] * s["N"],
            # in_place=True by default: dx written over dy
            liger_kernel=liger_kernel_fn("liger_fused_add_rms_norm"),
        ),
        OpSpec(
            "rms_norm_no_weight", "RMSNorm (no weight)", build_rows, _mn, floor_rowwise,
            {"default": ({"M": 16384, "N": 4096},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 6 * s["M"] * s["N"],
        ),
        OpSpec(
            "poly_norm", "PolyNorm", build_poly_norm, _mn, floor_rowwise,
            {"default": ({"M": 16384, "N": 4096},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 16 * s["M"] * s["N"],
            liger_kernel=liger_kernel_fn("liger_poly_norm"),  # in_place=True by default: dx written over dy
        ),
        OpSpec(
            "dyt", "DyT", build_dyt, _mn, floor_rowwise,
            {"default": ({"M": 16384, "N": 4096},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 8 * s["M"] * s["N"],
            liger_kernel=liger_kernel_fn("liger_dyt"),
        ),
        OpSpec(
            "group_norm", "GroupNorm", build_group_norm, lambda s: f"{max(1, s['M'] // 64)}x{s['N']}x64",
            floor_rowwise,
            {"default": ({"M": 16384, "N": 4096},), "sweep": _rows_sweep(), "cpu": ({"M": 128, "N": 96},)},
            lambda s: 8 * s["M"] * s["N"],
            liger_kernel=liger_kernel_group_norm,
        ),
        OpSpec(
            "modulated_rms_norm", "ModulatedRMSNorm", build_modulated_norm, _mn,
            lambda s, b, m: floor_norm(s, b, m, 1),
            {"default": ({"M": 16384, "N": 4096},), "sweep": _rows_sweep(), "cpu": ({"M": 37, "N": 123},)},
            lambda s: 10 * s["M"] * s["N"],
            # in_place=True by default: dx written over dy
            liger_kernel=liger_kernel_fn("liger_modulated_rms_norm"),
        ),
        OpSpec(
            "multi_token_attention", "MultiTokenAttention", build_mta,
            lambda s: f"{s['B']}x{s['C']}x{s['L']}^2 k{s['K']}", floor_mta,
            {
                "default": ({"B": 2, "C": 16, "L": 2048, "K": 5},),
                "sweep": tuple({"B": 1, "C": 16, "L": n, "K": 5} for n in (1024, 2047, 4096)),
                "cpu": ({"B": 2, "C": 3, "L": 13, "K": 3},),
            },
            lambda s: 8 * s["B"] * s["C"] * s["L"] ** 2,
            # (scores, weight, bias, stride, padding): the same positional order
            liger_kernel=liger_kernel_fn("liger_multi_token_attention"),
        ),
        OpSpec(
            "fused_neighborhood_attention", "NeighborhoodAttention", build_fna,
            lambda s: f"{s['B']}x{s['H']}x{s['L']}x{s['D']} k{s['K']}", floor_fna,
            {
                "default": ({"B": 2, "H": 16, "L": 2048, "D": 64, "K": 7},),
                "sweep": tuple({"B": 1, "H": 16, "L": n, "D": 64, "K": 7} for n in (1024, 2047, 4096)),
                "cpu": ({"B": 2, "H": 3, "L": 37, "D": 16, "K": 7},),
            },
            lambda s: 6 * s["B"] * s["H"] * s["L"] ** 2 + 8 * s["B"] * s["H"] * s["L"] * s["D"],
            # (query, key, value, kernel_size, dilation): the same positional order
            liger_kernel=liger_kernel_fn("liger_fused_neighborhood_attention"),
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

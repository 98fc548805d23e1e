"""Floors: the fewest HBM bytes (or FLOPs) each op must move per mode, turned into the least time it can take
on an H100 (``Floor.ms``); each benchmark row reports its time as a percentage of its floor."""

from __future__ import annotations

import dataclasses

HBM_BYTES_PER_S = 3.0e12  # H100 SXM: a large device-to-device copy moves ~3.0 TB/s (bytes read + written)
MATMUL_FLOPS_PER_S = 800e12  # H100 SXM: an 8192^3 bf16 GEMM runs at ~798 TFLOP/s on random data


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


def floor_unary(shape: dict, s: int, mode: str) -> Floor:
    """An elementwise op on x of M x N.  fwd: read x; write y -> 2MN s.  bwd: read dy, x; write dx -> 3MN s.
    fwd+bwd: 5MN s."""
    mn = shape["M"] * shape["N"]
    return _hbm(2 * mn * s, "2MN s") if mode == "fwd" else _hbm(5 * mn * s, "5MN s")


def floor_softmax(shape: dict, s: int, mode: str) -> Floor:
    """Row softmax on x of M x N, backward from the saved output y.  fwd: read x; write y -> 2MN s.
    bwd: read dy, y; write dx -> 3MN s.  fwd+bwd: 5MN s (the second read of a row hits the cache)."""
    return floor_unary(shape, s, mode)


def floor_sparsemax(shape: dict, s: int, mode: str) -> Floor:
    """Sparsemax on x of M x N, which sorts each row (a sorted copy: write and read it once more).
    fwd: read x; write sorted x; read it; write y -> 4MN s.  bwd: read dy, x; write dx -> 3MN s.  fwd+bwd:
    7MN s."""
    mn = shape["M"] * shape["N"]
    return _hbm(4 * mn * s, "4MN s") if mode == "fwd" else _hbm(7 * mn * s, "7MN s")


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


def floor_fused_add_norm(shape: dict, s: int, mode: str) -> Floor:
    """Residual add + RMSNorm over rows of N, M rows (w: N).
    fwd: read x, residual, w; write y, s                -> (4*M*N + N) * s
    bwd: read dy, ds, s, w; write dx (one tensor), dw    -> (4*M*N + 2*N) * s"""
    m, n = shape["M"], shape["N"]
    fwd = (4 * m * n + n) * s
    if mode == "fwd":
        return _hbm(fwd, "(4MN + N) s")
    return _hbm(fwd + (4 * m * n + 2 * n) * s, "(8MN + 3N) s")


def floor_rowwise(shape: dict, s: int, mode: str) -> Floor:
    """An elementwise-sized op over M x N with O(N) or O(1) parameters (RMSNorm without weight, PolyNorm,
    DyT, GroupNorm over (M, N) as (N, C)): fwd reads x, writes y -> 2MN s; bwd reads dy, x, writes dx -> 3MN s
    (parameters and their gradients not counted)."""
    mn = shape["M"] * shape["N"]
    return _hbm(2 * mn * s, "2MN s") if mode == "fwd" else _hbm(5 * mn * s, "5MN s")


def floor_mta(shape: dict, s: int, mode: str) -> Floor:
    """Multi-token attention on scores (B, C, L, L), N = B C L^2 elements, a C x C x K x K convolution.
    fwd: read scores, write out -> 2N s; conv 2 N C K^2 FLOPs.  fwd+bwd: + read dout, write dscores (the
    probabilities re-read once) -> 5N s; conv and its two gradients 6 N C K^2 FLOPs."""
    n = shape["B"] * shape["C"] * shape["L"] ** 2
    flops = 2 * n * shape["C"] * shape["K"] ** 2
    if mode == "fwd":
        return _max_floor(2 * n * s, flops, "max(2N s, 2 N C K^2 FLOPs)")
    return _max_floor(5 * n * s, 3 * flops, "max(5N s, 6 N C K^2 FLOPs)")


def floor_fna(shape: dict, s: int, mode: str) -> Floor:
    """Neighborhood attention on q, k, v (B, H, L, D), Q = B H L D elements, a window of K keys per query.
    fwd: read q, k, v, write o -> 4Q s; 4 Q K FLOPs (scores and P V inside the window only).
    fwd+bwd: + read do, o; write dq, dk, dv -> 9Q s; 10 Q K FLOPs."""
    q = shape["B"] * shape["H"] * shape["L"] * shape["D"]
    if mode == "fwd":
        return _max_floor(4 * q * s, 4 * q * shape["K"], "max(4Q s, 4 Q K FLOPs)")
    return _max_floor(9 * q * s, 10 * q * shape["K"], "max(9Q s, 10 Q K FLOPs)")

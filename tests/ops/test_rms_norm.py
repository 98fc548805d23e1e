import pytest
import torch
from helpers import (
    INF,
    NAN,
    assert_no_worse_than_eager,
    assert_same_nonfinite,
    devices,
    leaf,
    noncontiguous,
    strided,
    with_values_at_random,
)

import liger_core.ops._launch as launch
from liger_core import reference, tuning
from liger_core.dispatch import use_triton
from liger_core.ops import rms_norm

# CPU: small odd shapes with >= ~20 rows (a row's rstd error is shared by the whole row, so a tensor of 2 rows
# has 2 independent error samples: too few for a stable error ratio). CUDA: realistic sizes.
SHAPES = {"cpu": [(3, 7, 123), (37, 257), (23, 1031)], "cuda": [(4096, 4096), (16384, 4096), (3001, 5120)]}
# (casting_mode, offset): HF Llama, HF Gemma, naive, and llama rounding with an offset
MODES = [("llama", 0.0), ("gemma", 1.0), ("none", 0.0), ("llama", 0.5)]
EPS = 1e-6


def _make_x(shape, dtype, device, layout="contiguous", scale=2.0):
    x = (torch.randn(shape, dtype=torch.float64, device=device) * scale).to(dtype)
    return noncontiguous(x) if layout == "noncontiguous" else x


def _make_w(n, dtype, device, offset):
    # around 1 in total: gemma-style weights (offset 1) are small, llama-style ones near 1
    base = 0.0 if offset else 1.0
    return (base + 0.2 * torch.randn(n, dtype=torch.float64, device=device)).to(dtype)


def _check_against_float64(x, w, mode, offset, in_place=False):
    """Forward, dx and dw of the kernel vs the float64 reference, no worse than eager (the reference in the
    inputs' own dtypes, i.e. the HF code). Returns the kernel's (y, dx, dw)."""
    x, w = leaf(x), leaf(w)
    x_e, w_e = leaf(x), leaf(w)
    x_r, w_r = leaf(x, torch.float64), leaf(w, torch.float64)

    y = rms_norm(x, w, EPS, offset, mode, in_place)
    y_e = reference.rms_norm(x_e, w_e, EPS, offset, mode)
    y_r = reference.rms_norm(x_r, w_r, EPS, offset, mode)
    assert y.dtype == y_e.dtype and y.shape == x.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)

    dy = torch.randn(y.shape, dtype=torch.float64, device=y.device).to(y.dtype)
    dy_e = dy.clone()  # in_place=True overwrites the gradient it is given
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    dx_e, dw_e = torch.autograd.grad(y_e, (x_e, w_e), dy_e)
    dx_r, dw_r = torch.autograd.grad(y_r, (x_r, w_r), dy_e.double())
    assert dx.dtype == x.dtype and dw.dtype == w.dtype
    assert_no_worse_than_eager("dx", dx, dx_e, dx_r)
    assert_no_worse_than_eager("dw", dw, dw_e, dw_r)
    return y, dx, dw


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode,offset", MODES)
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
def test_rms_norm_matches_float64(device, dtype, mode, offset, layout, poison_empty):
    for shape in SHAPES[device]:
        x = _make_x(shape, dtype, device, layout)
        _check_against_float64(x, _make_w(shape[-1], dtype, device, offset), mode, offset)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                             (torch.float32, torch.bfloat16)])  # fmt: skip
@pytest.mark.parametrize("mode,offset", MODES[:3])
def test_rms_norm_weight_of_another_dtype(device, x_dtype, w_dtype, mode, offset, poison_empty):
    """HF models may keep fp32 weights with bf16 activations: output dtype and rounding follow HF."""
    shape = SHAPES[device][-1]
    y, _, _ = _check_against_float64(
        _make_x(shape, x_dtype, device), _make_w(shape[-1], w_dtype, device, offset), mode, offset
    )
    expected = x_dtype if mode == "gemma" else torch.promote_types(x_dtype, w_dtype)
    assert y.dtype == expected


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode,offset", MODES[:3])
def test_rms_norm_extreme_values(device, dtype, mode, offset):
    shape = SHAPES[device][1]
    x = _make_x(shape, dtype, device)
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), device=device)[: flat.numel() // 50]
    flat[idx] = torch.where(torch.rand(idx.numel(), device=device) < 0.5, -1e4, 1e4).to(dtype)
    x[0] = 1e4  # a whole row at the extreme
    x[1] = -1e4
    y, dx, dw = _check_against_float64(x, _make_w(shape[-1], dtype, device, offset), mode, offset)
    assert torch.isfinite(y).all() and torch.isfinite(dx).all() and torch.isfinite(dw).all()


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_in_place_backward(device, dtype):
    """in_place=True writes dx over the incoming gradient: same gradients, one buffer fewer."""
    shape = SHAPES[device][0]
    x = leaf(_make_x(shape, dtype, device))
    w = leaf(_make_w(shape[-1], dtype, device, 0.0))
    dy = torch.randn(shape, device=device).to(dtype)
    dy_copy = dy.clone()
    dy_copy_before = dy.clone()
    dx_ip, dw_ip = torch.autograd.grad(rms_norm(x, w, in_place=True), (x, w), dy)
    dx, dw = torch.autograd.grad(rms_norm(x, w), (x, w), dy_copy)
    assert torch.equal(dx_ip, dx) and torch.equal(dw_ip, dw)
    assert torch.equal(dy_copy, dy_copy_before)  # out of place (the default): the gradient is left alone
    if not use_triton(x):  # the pure-PyTorch path (CPU without the interpreter) has no in-place backward
        return
    assert dx_ip.data_ptr() == dy.data_ptr() and torch.equal(dy, dx)  # the gradient buffer was reused
    # into a leaf's .grad without a copy (AccumulateGrad copies a gradient object something else holds; on
    # the H100 that copy took the fwd+bwd from 0.247 to 0.335 ms)
    x.grad = None
    rms_norm(x, w, in_place=True).backward(dy_copy)
    assert x.grad.data_ptr() == dy_copy.data_ptr() and torch.equal(x.grad, dx)


HALF_DTYPE_PAIRS = [
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float16),
]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("x_dtype,w_dtype", HALF_DTYPE_PAIRS)
@pytest.mark.parametrize("mode,offset", MODES[:2])
def test_rms_norm_rounds_like_hf(device, x_dtype, w_dtype, mode, offset):
    """The reference is HF's code bit for bit, and the kernel rounds at the same points: with half-precision
    inputs its output differs from HF's only where a last-bit difference of the fp32 rstd flips a rounding."""
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    shape = SHAPES[device][-1]
    n = shape[-1]
    module = (LlamaRMSNorm if mode == "llama" else GemmaRMSNorm)(n, eps=EPS).to(device=device, dtype=w_dtype)
    with torch.no_grad():
        module.weight.copy_(_make_w(n, w_dtype, device, offset))
        x = _make_x(shape, x_dtype, device, scale=3.0)
        y_hf = module(x)
        y_ref = reference.rms_norm(x, module.weight, EPS, offset, mode)
        y = rms_norm(x, module.weight, EPS, offset, mode)
    assert torch.equal(y_ref, y_hf)
    assert y.dtype == y_hf.dtype
    assert (y != y_hf).float().mean().item() < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode,offset", MODES[:2])
def test_rms_norm_long_rows_loop_over_column_chunks(dtype, mode, offset, tune):
    """Rows wider than the fused limit loop over column chunks; shrink the limits so small rows take it."""
    for name in ("NORM_FUSED_MAX_COLS", "NORM_BWD_FUSED_MAX_COLS", "NORM_CHUNK_COLS"):
        tune(**{name.lower(): 128})
    shape = (21, 301)  # three chunks, the last one partial
    assert (
        not launch.norm_settings(301).single_pass and not launch.norm_settings(301, backward=True).single_pass
    )
    _check_against_float64(
        _make_x(shape, dtype, "cpu"), _make_w(shape[-1], dtype, "cpu", offset), mode, offset
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode,offset", MODES[:2])
@pytest.mark.parametrize("shape", [(23, 301), (3, 7, 1031)])
def test_rms_norm_wide_rows_reload_after_reduction(dtype, mode, offset, shape, tune, poison_empty):
    """The wide-row backward (w, dy, x re-loaded after the row's reduction) gives the same bits as the one
    holding them; the tile size is lowered so small rows take that path."""
    x = _make_x(shape, dtype, "cpu")
    w = _make_w(shape[-1], dtype, "cpu", offset)
    tune(norm_tile_elements=256)  # one row per tile: the wide-row backward
    padded = launch.next_power_of_2(shape[-1])
    tune(norm_bwd_wide_rms_norm={padded: (16, False)})
    assert not launch.norm_settings(shape[-1], backward=True).reload
    seed = int(torch.randint(0, 2**31 - 1, ()))  # the same fresh dy for both runs
    torch.manual_seed(seed)
    _, dx_held, dw_held = _check_against_float64(x, w, mode, offset)
    tune(norm_bwd_wide_rms_norm={padded: (16, True)})
    assert launch.norm_settings(shape[-1], backward=True).reload
    torch.manual_seed(seed)
    _, dx, dw = _check_against_float64(x, w, mode, offset)
    assert torch.equal(dx, dx_held) and torch.equal(dw, dw_held)


def test_rms_norm_hidden_size_above_fused_limit(poison_empty):
    n = 2 * tuning.NORM_FUSED_MAX_COLS + 11
    x = _make_x((3, n), torch.bfloat16, "cpu")
    _check_against_float64(x, _make_w(n, torch.bfloat16, "cpu", 0.0), "llama", 0.0)


@pytest.mark.parametrize("in_place", [False, True])
def test_rms_norm_broadcast_grad_and_frozen_weight(in_place):
    """A gradient broadcast along the rows (row stride 0: read through strides, never written in place) or
    fully (y.sum(): copied), and a frozen weight (LoRA): dx still right."""
    x = leaf(_make_x((3, 7, 123), torch.bfloat16, "cpu"))
    w = _make_w(123, torch.bfloat16, "cpu", 0.0)
    x_e, x_r = leaf(x), leaf(x, torch.float64)
    v = torch.randn(123).to(torch.bfloat16)
    v_before = v.clone()
    for dy in (v.expand(x.shape), torch.ones((), dtype=torch.bfloat16).expand(x.shape)):
        (dx,) = torch.autograd.grad(rms_norm(x, w, in_place=in_place), x, dy)
        (dx_e,) = torch.autograd.grad(reference.rms_norm(x_e, w, EPS), x_e, dy)
        (dx_r,) = torch.autograd.grad(reference.rms_norm(x_r, w.double(), EPS), x_r, dy.double())
        assert_no_worse_than_eager("dx", dx, dx_e, dx_r)
    assert torch.equal(v, v_before)  # the broadcast gradient's storage was not written over


def test_rms_norm_empty_rows():
    x = leaf(torch.randn(0, 5, 64))
    w = leaf(torch.randn(64))
    y = rms_norm(x, w)
    assert y.shape == x.shape
    dx, dw = torch.autograd.grad(y, (x, w), torch.randn_like(y))
    assert dx.shape == x.shape and torch.equal(dw, torch.zeros_like(w))


def test_rms_norm_custom_ops_pass_opcheck():
    import importlib

    mod = importlib.import_module("liger_core.ops.rms_norm")
    x = torch.randn(5, 33)
    w = torch.randn(33)
    for mode in ("llama", "gemma"):
        torch.library.opcheck(mod._rms_norm_fwd, (x, w, EPS, 0.5, mode))
    _, rstd = mod._rms_norm_fwd(x, w, EPS, 0.0, "llama")
    torch.library.opcheck(mod._rms_norm_bwd, (torch.randn(5, 33), x, w, rstd, 0.0))
    torch.library.opcheck(mod._rms_norm_bwd_inplace, (torch.randn(5, 33), x, w, rstd, 0.0))


def test_rms_norm_bad_input():
    x = torch.randn(4, 8)
    w = torch.randn(8)
    with pytest.raises(TypeError, match="x"):
        rms_norm(x.long(), w)
    with pytest.raises(TypeError, match="x"):
        rms_norm([1.0], w)
    with pytest.raises(TypeError, match="w"):
        rms_norm(x, w.double())
    with pytest.raises(ValueError, match="w"):
        rms_norm(x, torch.randn(9))
    with pytest.raises(ValueError, match="w"):
        rms_norm(x, torch.randn(2, 8))
    with pytest.raises(ValueError, match="w"):
        rms_norm(x, torch.randn(8, device="meta"))
    with pytest.raises(ValueError, match="casting_mode"):
        rms_norm(x, w, casting_mode="float")
    with pytest.raises(ValueError, match="x"):
        rms_norm(torch.randn(4, 0), torch.randn(0))


@pytest.mark.parametrize("n_partials", [7, 513, 2112])
@pytest.mark.parametrize("stacked", [False, True])
def test_sum_partials_one_and_two_launches(n_partials, stacked):
    """dW/dB partial rows summed in one launch, or (more than PARTIALS_SPLIT_ABOVE rows) in groups and then
    the group sums; the last group partial; against a float64 sum, rounded once to bf16."""
    import sys

    rms_module = sys.modules["liger_core.ops.rms_norm"]
    shape = (2, n_partials, 77) if stacked else (n_partials, 77)
    partials = torch.randn(shape, dtype=torch.float64).float()
    got = rms_module.sum_partials(partials, torch.bfloat16)
    want = partials.double().sum(dim=-2)
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    # the fp32 sum of n_partials terms errs by at most (n - 1) * 2^-24 * sum|terms| (large where the terms
    # cancel), then one bf16 rounding (2^-8 relative) of that fp32 value
    accumulation = (n_partials - 1) * 2**-24 * partials.double().abs().sum(dim=-2)
    bound = accumulation + (want.abs() + accumulation) * 2**-8
    assert ((got.double() - want).abs() <= bound).all()


# ----------------------------------------------------------------------------------------------------------
# Any strides, non-finite values and empty inputs, on every path: the Triton kernels (interpreter on CPU, or
# the GPU) and the pure-PyTorch reference path.
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
@pytest.mark.parametrize("mode,offset", MODES[:2])
def test_rms_norm_strided_arguments(path_device, dtype, how, mode, offset):
    """x, w and the incoming gradient non-contiguous: y, dx and dw no worse than eager on the same views, and
    the gradients reach the strided tensors in their shapes."""
    device = path_device
    shape = SHAPES[device][0]
    x = strided(_make_x(shape, dtype, device), how).requires_grad_()
    w = strided(_make_w(shape[-1], dtype, device, offset), how).requires_grad_()
    x_e, w_e = strided(x.detach(), how).requires_grad_(), strided(w.detach(), how).requires_grad_()
    x_r, w_r = leaf(x, torch.float64), leaf(w, torch.float64)

    y = rms_norm(x, w, EPS, offset, mode)
    y_e = reference.rms_norm(x_e, w_e, EPS, offset, mode)
    y_r = reference.rms_norm(x_r, w_r, EPS, offset, mode)
    assert y.dtype == y_e.dtype and y.shape == x.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)

    dy = strided(torch.randn(shape, dtype=torch.float64, device=device).to(y.dtype), how)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    dx_e, dw_e = torch.autograd.grad(y_e, (x_e, w_e), dy)
    dx_r, dw_r = torch.autograd.grad(y_r, (x_r, w_r), dy.double())
    assert dx.shape == x.shape and dw.shape == w.shape
    assert_no_worse_than_eager("dx", dx, dx_e, dx_r)
    assert_no_worse_than_eager("dw", dw, dw_e, dw_r)


# bf16 as fp32 (same exponent range); fp16 differs in "none" mode: eager's fp16 x**2 overflows from |x| > 256
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "target,values", [("x", [INF, -INF, NAN]), ("w", [INF]), ("w", [-INF]), ("w", [NAN])]
)
@pytest.mark.parametrize("mode,offset", MODES[:3])
def test_rms_norm_nonfinite_inputs_follow_eager(path_device, dtype, target, values, mode, offset):
    """+-inf and NaN in x (a row each) or in w: y, dx and dw are NaN / +-inf where HF's eager code gives them
    (x * rstd with rstd = 0 for a row holding inf, ...), and exact elsewhere."""
    device = path_device
    shape = SHAPES[device][0]
    x, w = _make_x(shape, dtype, device), _make_w(shape[-1], dtype, device, offset)
    if target == "x":
        x = with_values_at_random(x, values)
    else:
        w = with_values_at_random(w, values)
    x_e, w_e = leaf(x), leaf(w)
    x_r, w_r = leaf(x, torch.float64), leaf(w, torch.float64)
    x, w = leaf(x), leaf(w)
    y = rms_norm(x, w, EPS, offset, mode)
    y_e = reference.rms_norm(x_e, w_e, EPS, offset, mode)
    y_r = reference.rms_norm(x_r, w_r, EPS, offset, mode)
    assert_same_nonfinite("y", y, y_e, y_r)
    assert not torch.isfinite(y_e).all()  # the case does reach the output

    dy = torch.randn(shape, dtype=torch.float64, device=device).to(dtype)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    dx_e, dw_e = torch.autograd.grad(y_e, (x_e, w_e), dy)
    dx_r, dw_r = torch.autograd.grad(y_r, (x_r, w_r), dy.double())
    assert_same_nonfinite("dx", dx, dx_e, dx_r)
    assert_same_nonfinite("dw", dw, dw_e, dw_r)


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("shape", [(0, 45), (0, 5, 45)])
@pytest.mark.parametrize("mode,offset", MODES[:2])
def test_rms_norm_empty_rows_like_eager(path_device, x_dtype, w_dtype, shape, mode, offset):
    """0 rows: the same (empty) y and dx, and the same all-zero dw, with HF's dtypes, on every path."""
    device = path_device
    x = leaf(torch.randn(shape, device=device).to(x_dtype))
    w = leaf(_make_w(shape[-1], w_dtype, device, offset))
    x_e, w_e = leaf(x), leaf(w)
    y = rms_norm(x, w, EPS, offset, mode)
    y_e = reference.rms_norm(x_e, w_e, EPS, offset, mode)
    assert y.dtype == y_e.dtype and y.shape == y_e.shape == x.shape
    dy = torch.randn(y.shape, device=device).to(y.dtype)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    dx_e, dw_e = torch.autograd.grad(y_e, (x_e, w_e), dy)
    for g, g_e in ((dx, dx_e), (dw, dw_e)):
        assert g.dtype == g_e.dtype and torch.equal(g, g_e)
    assert dw.shape == w.shape and not dw.any()


# grouped rows (Qwen4-Exp's RMSNorm): (shape, group_size); odd group sizes and group counts
GROUPED_SHAPES = [((3, 7, 96), 32), ((37, 5 * 41), 41), ((23, 3 * 67), 67)]


def _grouped_check(x, w, mode, offset, group_size):
    """y, dx, dw of the grouped op vs the float64 grouped reference (x as (..., groups, group_size)), no
    worse than the reference in the inputs' dtypes."""
    x, w = leaf(x), leaf(w)
    x_e, w_e = leaf(x), leaf(w)
    x_r, w_r = leaf(x, torch.float64), leaf(w, torch.float64)
    y = rms_norm(x, w, EPS, offset, mode, group_size=group_size)
    y_e = reference.rms_norm(x_e, w_e, EPS, offset, mode, group_size=group_size)
    y_r = reference.rms_norm(x_r, w_r, EPS, offset, mode, group_size=group_size)
    assert y.dtype == y_e.dtype and y.shape == x.shape
    dy = torch.randn(y.shape, dtype=torch.float64, device=y.device).to(y.dtype)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    dx_e, dw_e = torch.autograd.grad(y_e, (x_e, w_e), dy)
    dx_r, dw_r = torch.autograd.grad(y_r, (x_r, w_r), dy.double())
    for name, ours, eager, ref in (("y", y, y_e, y_r), ("dx", dx, dx_e, dx_r), ("dw", dw, dw_e, dw_r)):
        assert_same_nonfinite(name, ours, eager, ref)
    return y, dx, dw


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode,offset", MODES[:3])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
@pytest.mark.parametrize("values", [[], [1e4, -1e4, 1e4], [INF], [-INF, NAN]])
def test_rms_norm_grouped_matches_float64(path_device, dtype, mode, offset, layout, values):
    """Each group of ``group_size`` features has its own rstd and the weight is indexed by the feature's
    position in the row: y, dx and dw match the float64 reference no worse than eager, non-finite values
    (confined to their group) where eager has them."""
    for shape, group_size in GROUPED_SHAPES:
        x = with_values_at_random(_make_x(shape, dtype, path_device), values)
        x = noncontiguous(x) if layout == "noncontiguous" else x
        y, _, _ = _grouped_check(x, _make_w(shape[-1], dtype, path_device, offset), mode, offset, group_size)
        if values and not all(abs(v) == 1e4 for v in values):
            # one non-finite element spoils its group, not the whole row
            assert not torch.isfinite(y).all() and torch.isfinite(y).view(-1, group_size).all(-1).any()


def test_rms_norm_grouped_is_per_group_rms_norm():
    """The grouped op is the plain op on each group with the weight's slice; group_size = row is plain."""
    x, w = _make_x((5, 3 * 19), torch.float32, "cpu"), _make_w(3 * 19, torch.float32, "cpu", 1.0)
    y = rms_norm(x, w, EPS, 1.0, "gemma", group_size=19)
    for s in range(0, 57, 19):
        assert torch.equal(y[:, s : s + 19], rms_norm(x[:, s : s + 19], w[s : s + 19], EPS, 1.0, "gemma"))
    assert torch.equal(rms_norm(x, w, group_size=57), rms_norm(x, w))


def test_rms_norm_grouped_empty_rows_and_bad_group_size():
    x, w = leaf(torch.randn(0, 5, 48)), leaf(_make_w(48, torch.float32, "cpu", 0.0))
    y = rms_norm(x, w, group_size=16)
    dx, dw = torch.autograd.grad(y, (x, w), torch.ones_like(y))
    assert y.shape == x.shape and dx.shape == x.shape and torch.equal(dw, torch.zeros_like(dw))
    for bad in (5, 0, -16, 96):
        with pytest.raises(ValueError, match="group_size"):
            rms_norm(x, w, group_size=bad)

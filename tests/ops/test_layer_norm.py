import importlib
import math

import pytest
import torch
import torch.nn.functional as F
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
from liger_core.ops import layer_norm

# >= ~20 rows per CPU shape: a row's (mean, rstd) error is shared by its whole row (see test_rms_norm)
SHAPES = {"cpu": [(3, 7, 123), (37, 257), (23, 1031)], "cuda": [(4096, 4096), (16384, 4096), (3001, 5120)]}
EPS = 1e-5
# the module itself (liger_core.ops binds the name `layer_norm` to the function)
layer_norm_module = importlib.import_module("liger_core.ops.layer_norm")


def _make_x(shape, dtype, device, layout="contiguous", constant_rows=True):
    """Rows with a nonzero mean, plus (optionally) constant rows: variance 0, where an inexact mean would turn
    rounding noise into O(1) outputs."""
    x = torch.randn(shape, dtype=torch.float64, device=device) * 2 + 3
    if constant_rows:
        rows = x.view(-1, shape[-1])
        rows[0] = 7.3
        rows[-1] = -1234.567
    x = x.to(dtype)
    return noncontiguous(x) if layout == "noncontiguous" else x


def _make_params(n, dtype, device, bias=True):
    w = (1 + 0.2 * torch.randn(n, dtype=torch.float64, device=device)).to(dtype)
    b = (0.5 * torch.randn(n, dtype=torch.float64, device=device)).to(dtype) if bias else None
    return w, b


def _check_against_float64(x, w, b):
    """y, dx, dw (db) of the kernel vs the float64 reference, no worse than F.layer_norm in the same dtype."""
    params = [w] if b is None else [w, b]
    ours = [leaf(t) for t in (x, *params)]
    eager = [leaf(t) for t in (x, *params)]
    ref = [leaf(t, torch.float64) for t in (x, *params)]

    def run(tensors, fn):
        return fn(tensors[0], tensors[1], tensors[2] if b is not None else None, EPS)

    y, y_e, y_r = run(ours, layer_norm), run(eager, reference.layer_norm), run(ref, reference.layer_norm)
    assert y.dtype == x.dtype == y_e.dtype and y.shape == x.shape
    assert_no_worse_than_eager("y", y, y_e, y_r)

    dy = torch.randn(y.shape, dtype=torch.float64, device=y.device).to(y.dtype)
    grads = torch.autograd.grad(y, ours, dy)
    grads_e = torch.autograd.grad(y_e, eager, dy)
    grads_r = torch.autograd.grad(y_r, ref, dy.double())
    for name, g, g_e, g_r, t in zip(("dx", "dw", "db"), grads, grads_e, grads_r, ours):
        assert g.dtype == t.dtype
        assert_no_worse_than_eager(name, g, g_e, g_r)
    return (y, *grads)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
def test_layer_norm_matches_float64(device, dtype, bias, layout, poison_empty):
    for shape in SHAPES[device]:
        w, b = _make_params(shape[-1], dtype, device, bias)
        _check_against_float64(_make_x(shape, dtype, device, layout), w, b)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_norm_fp32_params_with_half_input(device, dtype, poison_empty):
    """Mixed precision as PyTorch allows it: fp32 weight and bias, bf16/fp16 activations and output."""
    shape = SHAPES[device][-1]
    w, b = _make_params(shape[-1], torch.float32, device)
    _check_against_float64(_make_x(shape, dtype, device), w, b)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_extreme_values(device, dtype):
    shape = SHAPES[device][1]
    x = _make_x(shape, dtype, device, constant_rows=False)
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), device=device)[: flat.numel() // 50]
    flat[idx] = torch.where(torch.rand(idx.numel(), device=device) < 0.5, -1e4, 1e4).to(dtype)
    x[0] = 1e4  # constant at the extreme: variance 0 around a mean of 1e4
    x[1, ::2] = -1e4  # bimodal row
    x[1, 1::2] = 1e4
    w, b = _make_params(shape[-1], dtype, device)
    y, *grads = _check_against_float64(x, w, b)
    assert torch.isfinite(y).all() and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_long_rows_loop_over_column_chunks(dtype, bias, tune):
    """Rows wider than the fused limit loop over column chunks; shrink the limits so small rows take it."""
    for name in ("NORM_FUSED_MAX_COLS", "NORM_BWD_FUSED_MAX_COLS", "NORM_CHUNK_COLS"):
        tune(**{name.lower(): 128})
    shape = (21, 301)  # three chunks, the last one partial
    assert not launch.norm_settings(301).single_pass
    assert not launch.norm_settings(301, backward=True).single_pass
    w, b = _make_params(shape[-1], dtype, "cpu", bias)
    _check_against_float64(_make_x(shape, dtype, "cpu"), w, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(23, 301), (3, 7, 1031)])
def test_layer_norm_wide_rows_reload_after_reduction(dtype, bias, shape, tune, poison_empty):
    """The wide-row backward (w, dy, x re-loaded after the row's reductions) gives the same bits as the one
    holding them; the tile size is lowered so small rows take that path."""
    x = _make_x(shape, dtype, "cpu")
    w, b = _make_params(shape[-1], dtype, "cpu", bias)
    tune(norm_tile_elements=256)  # one row per tile: the wide-row backward
    padded = launch.next_power_of_2(shape[-1])
    tune(norm_bwd_wide_layer_norm={padded: (16, False)})
    assert not launch.norm_settings(shape[-1], backward=True, layer_norm=True).reload
    seed = int(torch.randint(0, 2**31 - 1, ()))  # the same fresh dy for both runs
    torch.manual_seed(seed)
    _, *held = _check_against_float64(x, w, b)
    tune(norm_bwd_wide_layer_norm={padded: (16, True)})
    assert launch.norm_settings(shape[-1], backward=True, layer_norm=True).reload
    torch.manual_seed(seed)
    _, *grads = _check_against_float64(x, w, b)
    assert all(torch.equal(g, h) for g, h in zip(grads, held, strict=True))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
def test_layer_norm_rowwise_backward(device, dtype, bias, layout, monkeypatch, tune, poison_empty):
    """The 1-D row-at-a-time backward (16-bit rows of NORM_BWD_ROWWISE_LAYER_NORM's widths; here the test
    widths are added to it) against float64 and eager; fp32 rows keep the 2-D kernel (fp64 partials)."""
    shapes = SHAPES[device] if device == "cpu" else [(4093, 8192), (65, 8000)]
    widths = {launch.next_power_of_2(shape[-1]) for shape in shapes}
    tune(norm_bwd_rowwise_layer_norm=tuple(widths))
    calls = []
    row_kernel = layer_norm_module._layer_norm_bwd_row_kernel

    class Spy:
        def __getitem__(self, grid):
            calls.append(grid)
            return row_kernel[grid]

    monkeypatch.setattr(layer_norm_module, "_layer_norm_bwd_row_kernel", Spy())
    for shape in shapes:
        w, b = _make_params(shape[-1], dtype, device, bias)
        _check_against_float64(_make_x(shape, dtype, device, layout), w, b)
    assert len(calls) == (0 if dtype == torch.float32 else len(shapes))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("prefetch", [True, False])
def test_layer_norm_tile_sum_backward(device, dtype, bias, prefetch, monkeypatch, tune, poison_empty):
    """dW/dB summed per tile into one accumulator row (NORM_BWD_TILE_SUM_LAYER_NORM, here every test width),
    several programs per SM, with and without the prefetch, against float64 and eager."""
    shapes = SHAPES[device] if device == "cpu" else [(4093, 1024), (65, 1000), (16383, 2048)]
    widths = tuple(launch.next_power_of_2(shape[-1]) for shape in shapes)
    tune(norm_bwd_tile_sum_layer_norm=widths)
    tune(norm_bwd_tile_sum_programs_per_sm=3)
    tune(norm_bwd_tile_sum_prefetch=prefetch)
    calls = []
    kernel = layer_norm_module._layer_norm_bwd_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch_kernel(*args, **kwargs):
                calls.append(kwargs["TILE_SUM"])
                return kernel[grid](*args, **kwargs)

            return launch_kernel

    monkeypatch.setattr(layer_norm_module, "_layer_norm_bwd_kernel", Spy())
    for shape in shapes:
        w, b = _make_params(shape[-1], dtype, device, bias)
        _check_against_float64(_make_x(shape, dtype, device, "noncontiguous"), w, b)
    single_pass = [launch.next_power_of_2(s[-1]) <= tuning.NORM_BWD_FUSED_MAX_COLS for s in shapes]
    assert calls == single_pass  # every single-pass backward took the tile-sum path


def test_layer_norm_hidden_size_above_fused_limit(poison_empty):
    n = 2 * tuning.NORM_FUSED_MAX_COLS + 11
    w, b = _make_params(n, torch.bfloat16, "cpu")
    _check_against_float64(_make_x((3, n), torch.bfloat16, "cpu"), w, b)


def test_layer_norm_broadcast_grad_and_frozen_params():
    """A gradient broadcast along the rows (row stride 0) or fully (y.sum()), frozen w and b (LoRA)."""
    x = leaf(_make_x((3, 7, 123), torch.bfloat16, "cpu"))
    w, b = _make_params(123, torch.bfloat16, "cpu")
    x_e, x_r = leaf(x), leaf(x, torch.float64)
    v = torch.randn(123).to(torch.bfloat16)
    for dy in (v.expand(x.shape), torch.ones((), dtype=torch.bfloat16).expand(x.shape)):
        (dx,) = torch.autograd.grad(layer_norm(x, w, b), x, dy)
        (dx_e,) = torch.autograd.grad(reference.layer_norm(x_e, w, b, EPS), x_e, dy)
        (dx_r,) = torch.autograd.grad(
            reference.layer_norm(x_r, w.double(), b.double(), EPS), x_r, dy.double()
        )
        assert_no_worse_than_eager("dx", dx, dx_e, dx_r)


def test_layer_norm_empty_rows():
    x, w, b = leaf(torch.randn(0, 64)), leaf(torch.randn(64)), leaf(torch.randn(64))
    y = layer_norm(x, w, b)
    assert y.shape == x.shape
    dx, dw, db = torch.autograd.grad(y, (x, w, b), torch.randn_like(y))
    assert dx.shape == x.shape and not dw.any() and not db.any()


def test_layer_norm_custom_ops_pass_opcheck():
    mod = importlib.import_module("liger_core.ops.layer_norm")
    x, w, b = torch.randn(5, 33), torch.randn(33), torch.randn(33)
    torch.library.opcheck(mod._layer_norm_fwd, (x, w, b, EPS))
    torch.library.opcheck(mod._layer_norm_fwd, (x, w, None, EPS))
    _, mean, rstd = mod._layer_norm_fwd(x, w, b, EPS)
    for has_bias in (True, False):
        torch.library.opcheck(mod._layer_norm_bwd, (torch.randn(5, 33), x, w, mean, rstd, has_bias))


def test_layer_norm_bad_input():
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    with pytest.raises(TypeError, match="x"):
        layer_norm(x.long(), w, b)
    with pytest.raises(TypeError, match="x"):
        layer_norm("x", w, b)
    with pytest.raises(TypeError, match="w"):
        layer_norm(x, w.bfloat16(), b.bfloat16())  # fp32 input with half weights: PyTorch refuses it too
    with pytest.raises(TypeError, match="b"):
        layer_norm(x, w, b.double())
    with pytest.raises(TypeError, match="b"):
        layer_norm(x.bfloat16(), w, b.bfloat16())  # b must have w's dtype
    with pytest.raises(ValueError, match="w"):
        layer_norm(x, torch.randn(9), b)
    with pytest.raises(ValueError, match="b"):
        layer_norm(x, w, torch.randn(9))
    with pytest.raises(ValueError, match="w"):
        layer_norm(x, torch.randn(8, device="meta"), b)
    with pytest.raises(ValueError, match="b"):
        layer_norm(x, w, torch.randn(8, device="meta"))
    with pytest.raises(ValueError, match="x"):
        layer_norm(torch.randn(4, 0), torch.randn(0), torch.randn(0))


# ----------------------------------------------------------------------------------------------------------
# Any strides, non-finite values and empty inputs, on every path: the Triton kernels (interpreter on CPU, or
# the GPU) and the pure-PyTorch reference path.
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["step2", "transposed"])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_strided_arguments(path_device, dtype, how, bias):
    """x, w, b and the incoming gradient non-contiguous: y, dx, dw and db no worse than eager on the same
    views, and the gradients reach the strided tensors in their shapes."""
    device = path_device
    shape = SHAPES[device][0]
    w, b = _make_params(shape[-1], dtype, device, bias)
    tensors = [_make_x(shape, dtype, device), w] + ([b] if bias else [])
    ours = [strided(t, how).requires_grad_() for t in tensors]
    eager = [strided(t.detach(), how).requires_grad_() for t in ours]
    ref = [leaf(t, torch.float64) for t in ours]

    def run(fn, tensors):
        return fn(tensors[0], tensors[1], tensors[2] if bias else None, EPS)

    y, y_e, y_r = run(layer_norm, ours), run(reference.layer_norm, eager), run(reference.layer_norm, ref)
    assert y.dtype == y_e.dtype and y.shape == ours[0].shape
    assert_no_worse_than_eager("y", y, y_e, y_r)

    dy = strided(torch.randn(shape, dtype=torch.float64, device=device).to(dtype), how)
    grads = torch.autograd.grad(y, ours, dy)
    grads_e = torch.autograd.grad(y_e, eager, dy)
    grads_r = torch.autograd.grad(y_r, ref, dy.double())
    for name, g, g_e, g_r, t in zip(("dx", "dw", "db"), grads, grads_e, grads_r, ours):
        assert g.shape == t.shape
        assert_no_worse_than_eager(name, g, g_e, g_r)


NONFINITE_CASES = [
    (target, values, bias)
    for target, values in [("x", [INF, -INF, NAN]), ("w", [INF]), ("w", [-INF]), ("w", [NAN])]
    for bias in (True, False)
] + [("b", [INF, -INF], True), ("b", [NAN], True)]


# bf16 as fp32: the kernel and PyTorch's LayerNorm both compute in fp32 and round once
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target,values,bias", NONFINITE_CASES)
def test_layer_norm_nonfinite_inputs_follow_eager(path_device, dtype, target, values, bias):
    """+-inf and NaN in x (a row each), w or b: y, dx, dw and db are NaN / +-inf where F.layer_norm gives them
    (a row holding inf has an infinite mean and a NaN variance, ...), and exact elsewhere."""
    device = path_device
    shape = SHAPES[device][0]
    w, b = _make_params(shape[-1], dtype, device, bias)
    tensors = {"x": _make_x(shape, dtype, device, constant_rows=False), "w": w, "b": b}
    tensors[target] = with_values_at_random(tensors[target], values)
    tensors = [tensors["x"], tensors["w"]] + ([tensors["b"]] if bias else [])
    ours, eager, ref = (
        [leaf(t) for t in tensors],
        [leaf(t) for t in tensors],
        [leaf(t, torch.float64) for t in tensors],
    )

    def run(fn, tensors):
        return fn(tensors[0], tensors[1], tensors[2] if bias else None, EPS)

    y, y_e, y_r = run(layer_norm, ours), run(reference.layer_norm, eager), run(reference.layer_norm, ref)
    assert_same_nonfinite("y", y, y_e, y_r)
    assert not torch.isfinite(y_e).all()  # the case does reach the output

    dy = torch.randn(shape, dtype=torch.float64, device=device).to(dtype)
    grads = torch.autograd.grad(y, ours, dy)
    grads_e = torch.autograd.grad(y_e, eager, dy)
    grads_r = torch.autograd.grad(y_r, ref, dy.double())
    for name, g, g_e, g_r in zip(("dx", "dw", "db"), grads, grads_e, grads_r):
        if name == "dx" and target == "w" and not math.isnan(values[0]):
            # an infinite weight makes both of a row's sums (of dy * w and dy * w * xhat) infinite; whether an
            # element of dx is then inf or inf - inf = NaN depends on how they are combined (PyTorch's CPU
            # kernel folds the mean into them): every element is non-finite on both sides
            assert not torch.isfinite(g).any() and not torch.isfinite(g_e).any()
            continue
        assert_same_nonfinite(name, g, g_e, g_r)


@pytest.mark.parametrize(
    "dtype,param_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32)]
)
@pytest.mark.parametrize("shape", [(0, 45), (0, 5, 45)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_empty_rows_like_eager(path_device, dtype, param_dtype, shape, bias):
    """0 rows: the same (empty) y and dx, and the same all-zero dw and db, with PyTorch's dtypes, on every
    path."""
    device = path_device
    w, b = _make_params(shape[-1], param_dtype, device, bias)
    tensors = [torch.randn(shape, device=device).to(dtype), w] + ([b] if bias else [])
    ours, eager = [leaf(t) for t in tensors], [leaf(t) for t in tensors]
    y = layer_norm(ours[0], ours[1], ours[2] if bias else None, EPS)
    y_e = F.layer_norm(eager[0], (shape[-1],), eager[1], eager[2] if bias else None, EPS)
    assert y.dtype == y_e.dtype and y.shape == y_e.shape == ours[0].shape
    dy = torch.randn(y.shape, device=device).to(y.dtype)
    for g, g_e in zip(torch.autograd.grad(y, ours, dy), torch.autograd.grad(y_e, eager, dy)):
        assert g.dtype == g_e.dtype and torch.equal(g, g_e)


# grouped rows (a per-head LayerNorm over the heads' concatenation): (shape, group_size)
GROUPED_SHAPES = [((3, 7, 96), 32), ((37, 5 * 41), 41), ((23, 3 * 67), 67)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
@pytest.mark.parametrize("values", [[], [1e4, -1e4, 1e4], [INF], [-INF, NAN]])
def test_layer_norm_grouped_matches_float64(path_device, dtype, bias, layout, values):
    """Each group of ``group_size`` features has its own mean and rstd, w and b indexed by the feature's
    position in the row: y, dx, dw and db match the float64 grouped reference no worse than the reference
    in the inputs' dtypes, non-finite values (confined to their group) where it has them."""
    for shape, group_size in GROUPED_SHAPES:
        x = with_values_at_random(_make_x(shape, dtype, path_device, constant_rows=not values), values)
        x = noncontiguous(x) if layout == "noncontiguous" else x
        w, b = _make_params(shape[-1], dtype, path_device, bias)
        tensors = [x, w] + ([b] if bias else [])
        ours, eager = [leaf(t) for t in tensors], [leaf(t) for t in tensors]
        ref = [leaf(t, torch.float64) for t in tensors]

        def run(fn, ts, group_size=group_size):
            return fn(ts[0], ts[1], ts[2] if bias else None, EPS, group_size=group_size)

        y, y_e, y_r = run(layer_norm, ours), run(reference.layer_norm, eager), run(reference.layer_norm, ref)
        assert y.dtype == y_e.dtype == x.dtype and y.shape == x.shape
        assert_same_nonfinite("y", y, y_e, y_r)
        if values and not all(abs(v) == 1e4 for v in values):
            assert not torch.isfinite(y).all() and torch.isfinite(y).view(-1, group_size).all(-1).any()
        dy = torch.randn(y.shape, dtype=torch.float64, device=path_device).to(dtype)
        grads = torch.autograd.grad(y, ours, dy)
        grads_e = torch.autograd.grad(y_e, eager, dy)
        grads_r = torch.autograd.grad(y_r, ref, dy.double())
        for name, g, g_e, g_r in zip(("dx", "dw", "db"), grads, grads_e, grads_r):
            assert_same_nonfinite(name, g, g_e, g_r)


def test_layer_norm_grouped_is_per_group_layer_norm():
    x = _make_x((5, 3 * 19), torch.float32, "cpu")
    w, b = _make_params(3 * 19, torch.float32, "cpu")
    y = layer_norm(x, w, b, EPS, group_size=19)
    for s in range(0, 57, 19):
        assert torch.equal(y[:, s : s + 19], layer_norm(x[:, s : s + 19], w[s : s + 19], b[s : s + 19], EPS))
    assert torch.equal(layer_norm(x, w, b, group_size=57), layer_norm(x, w, b))
    with pytest.raises(ValueError, match="group_size"):
        layer_norm(x, w, b, group_size=5)

"""Device dispatch and argument checks shared by every op (the base layer: imports torch and ``tuning`` only).

Which path an op takes:
- CUDA tensors: the Triton kernels.
- CPU tensors with ``TRITON_INTERPRET=1`` set *before* ``triton`` was imported: the same Triton kernels, run
  by Triton's interpreter (slow; this is how CI tests the real kernels).
- CPU tensors otherwise (or no Triton at all): the pure-PyTorch reference path in ``liger_core.reference``,
  with one warning per process.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable

import torch

from liger_core import tuning

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int64, torch.int32)


_STATUS: str | None = None  # cached in a plain global: torch.compile reads it as a constant when tracing ops


def triton_status() -> str:
    global _STATUS
    if _STATUS is None:
        _STATUS = _probe_triton()
    return _STATUS


def _probe_triton() -> str:
    """'compiled', 'interpreted' or 'missing': what ``@triton.jit`` does in this process.

    Triton decides at decoration time (from ``TRITON_INTERPRET``), so we ask a probe kernel rather than the
    environment, which may have changed since.
    """
    try:
        import triton
    except Exception:  # noqa: BLE001 - any import failure means "no Triton"
        return "missing"

    @triton.jit
    def _probe():
        pass

    if type(_probe).__name__ != "InterpretedFunction":
        return "compiled"
    _round_bf16_to_nearest_in_interpreter()
    return "interpreted"


def _round_bf16_to_nearest_in_interpreter() -> None:
    """Make the Triton interpreter round fp32 -> bf16 to nearest-even, as the GPU's cvt.rn.bf16.f32 does.

    Triton's interpreter (3.x) converts fp32 to bf16 by truncating the mantissa, which doubles the rounding
    error of every bf16 output on CPU and would make the CPU accuracy tests (kernel error <= eager error)
    measure an interpreter artefact instead of our kernels. Only the fp32 <-> bf16 casts are replaced; the
    conversion is done by torch, which rounds to nearest-even like the hardware.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_liger_core_rne", False):
        return
    original_cast, original_fp_to_fp = builder.cast_impl, builder.create_fp_to_fp

    def _rne(src, dst_type):
        data = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(torch.bfloat16)
        return interpreter.TensorHandle(data.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return _rne(src, dst_type)
        return original_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return _rne(src, dst_type)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    builder.cast_impl = cast_impl
    builder.create_fp_to_fp = create_fp_to_fp
    builder._liger_core_rne = True


_warned_reference = False


def use_triton(t: torch.Tensor) -> bool:
    """True when the op on tensor ``t`` should launch Triton kernels, False for the reference path."""
    global _warned_reference
    status = _STATUS if _STATUS is not None else triton_status()
    if t.device.type == "cuda":
        if status == "missing":
            raise RuntimeError("liger_core: CUDA tensors need the `triton` package, which failed to import")
        if status == "interpreted":
            raise RuntimeError(
                "liger_core: TRITON_INTERPRET=1 is set, so Triton kernels run only on CPU tensors; "
                "unset it to run on CUDA"
            )
        return True
    if t.device.type == "cpu" and status == "interpreted":
        return True
    if not _warned_reference and not torch.compiler.is_compiling():
        _warned_reference = True
        warnings.warn(
            f"liger_core: tensors on {t.device.type!r} run the pure-PyTorch reference path "
            "(set TRITON_INTERPRET=1 before importing triton to run the Triton kernels on CPU)",
            stacklevel=3,
        )
    return False


def launcher(op: Callable, impl: Callable) -> Callable:
    """The kernel launcher an autograd Function should call: the ``torch.library`` custom op ``op`` while
    torch.compile traces (the graph gets an opaque op with a fake implementation, no graph break), else its
    plain Python implementation ``impl``. In eager mode the custom-op dispatcher adds tens of microseconds of
    host time per call, as much as a whole kernel at typical shapes."""
    return op if tuning.EAGER_VIA_CUSTOM_OPS or torch.compiler.is_compiling() else impl


# ----------------------------------------------------------------------------------------------------------
# Argument checks: every public op validates its inputs with these, so bad input fails with a message that
# names the argument instead of producing a silent wrong answer or a device-side crash.
# ----------------------------------------------------------------------------------------------------------


def check_tensor(
    name: str,
    t: object,
    *,
    dtypes: Iterable[torch.dtype] | None = FLOAT_DTYPES,
    ndim: int | None = None,
    min_ndim: int | None = None,
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in tuple(dtypes):
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {t.dtype}; expected one of: {allowed}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions, got shape {tuple(t.shape)}")
    return t


def check_same_device(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            raise ValueError(
                f"{name} is on {t.device} but {ref_name} is on {ref.device}; move them to one device"
            )


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...], what: str = "") -> None:
    if tuple(t.shape) != tuple(expected):
        extra = f" ({what})" if what else ""
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(expected)}{extra}")


def check_choice(name: str, value: object, choices: Iterable[object]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {choices}")


def check_dim(dim: object, ndim: int) -> int:
    """``dim`` as a non-negative index into a tensor of ``ndim`` dimensions (a 0-dim tensor takes dim 0 or
    -1, as in torch)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    size = max(ndim, 1)
    if not -size <= dim < size:
        raise ValueError(f"dim={dim} is out of range for a tensor of {ndim} dimensions")
    return dim % size

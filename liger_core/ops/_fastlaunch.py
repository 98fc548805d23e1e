"""A cheaper launch path for ``@triton.jit`` kernels: ``kernel[grid](...)`` with the compiled kernel cached.

Why: at real training shapes the norm, RoPE and GLU kernels take 0.1-0.3 ms, and Triton's generic launch
(``JITFunction.run``: bind and specialise every argument, build and hash a string cache key, check globals,
then launch) costs tens of microseconds of host time per launch on a busy host (~55 µs for a bare launch
measured on an H100 host). A forward + backward issues 2-6 launches, so the GPU waits
for the host. ``FastKernel`` keeps Triton's own first call (which compiles and returns the compiled kernel)
and afterwards launches that compiled kernel directly, keyed by exactly what Triton specialises on:

- tensors: dtype and whether ``data_ptr()`` is 16-byte aligned;
- ints: whether the value is 1, whether it is divisible by 16, and whether it fits in int32;
- floats, bools, None and constexpr keyword values: type (and value for bools / constexprs);
- the device index.

This partition is at least as fine as Triton's, so a cached kernel is only reused for arguments Triton would
have compiled identically. Anything unusual (interpreter mode, a launch hook such as a profiler's, a kernel
whose compile is still pending, keyword runtime arguments) takes Triton's normal path.
"""

from __future__ import annotations

import torch
import triton

from liger_core import tuning

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _runtime_knobs():
    try:
        from triton import knobs  # triton >= 3.4

        return knobs.runtime
    except ImportError:  # pragma: no cover - older triton: no direct launch
        return None


_KNOBS = _runtime_knobs()


def _hooks_active() -> bool:
    """A launch hook (a profiler's, e.g. proton) wants to see launches: then Triton's path is taken. Triton
    >= 3.5 keeps the hooks in ``HookChain`` objects that are never None, empty unless something registered."""
    for hook in (_KNOBS.launch_enter_hook, _KNOBS.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _specialisation_key(args: tuple) -> tuple[tuple, torch.device | None]:
    """(key, device of the first tensor): per argument what Triton specialises on, flattened into one tuple
    (one pass, no per-argument calls: this runs on every launch). TypeError for an argument of another kind
    (tuples, dtypes as runtime arguments...): Triton's own path then."""
    key: list = []
    add = key.append
    device = None
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if device is None:
                device = arg.device
            add(arg.dtype)
            add(arg.data_ptr() & 15 == 0)
        elif isinstance(arg, bool):
            add(("b", arg))
        elif isinstance(arg, int):
            add((arg == 1, arg % 16 == 0, _INT32_MIN <= arg <= _INT32_MAX))
        elif isinstance(arg, float):
            add("f")
        elif arg is None:
            add(None)
        else:
            raise TypeError
    return tuple(key), device


class FastKernel:
    """Wraps a ``triton.jit`` function; ``FastKernel(fn)[grid](*runtime_args, **constexprs_and_options)``
    launches like ``fn[grid](...)``. Runtime arguments must be positional, in the kernel's order."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self._cache: dict[tuple, tuple] = {}
        # the interpreter's function has no compile caches: it always takes Triton's own path
        self._interpreted = not hasattr(fn, "device_caches")
        if self._interpreted:
            return
        names = list(fn.arg_names)
        constexpr_idx = set(fn.constexprs)
        self._names = names
        self._runtime_names = [n for i, n in enumerate(names) if i not in constexpr_idx]
        self._defaults = {
            name: p.default for name, p in fn.signature.parameters.items() if p.default is not p.empty
        }

    def __getattr__(self, name: str):  # everything else (``.fn``, caches...) is the wrapped JITFunction's
        return getattr(self.fn, name)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            return self._launch(grid, args, kwargs)

        return launch

    def _launch(self, grid, args: tuple, kwargs: dict):
        if (
            not tuning.FAST_LAUNCH
            or self._interpreted
            or _KNOBS is None
            or _hooks_active()
            or len(args) != len(self._runtime_names)
        ):
            return self.fn[grid](*args, **kwargs)
        try:
            arg_key, device = _specialisation_key(args)
        except TypeError:
            return self.fn[grid](*args, **kwargs)
        if device is None or device.type != "cuda":
            return self.fn[grid](*args, **kwargs)
        key = (device.index, arg_key, tuple(kwargs.items()))
        entry = self._cache.get(key)
        if entry is None:
            kernel = self.fn[grid](*args, **kwargs)
            if kernel is None or hasattr(kernel, "result") or getattr(kernel, "function", None) is None:
                return kernel  # compile pending or not inspectable: stay on Triton's path this time
            names = set(kwargs)
            # the kernel's full argument list (runtime and constexpr, in signature order) is what its
            # launcher takes; build a recipe once: position in args, or a keyword / default value
            positions = iter(range(len(args)))
            recipe = []
            for name in self._names:
                if name in names:
                    recipe.append((False, kwargs[name]))
                elif name in self._runtime_names:
                    recipe.append((True, next(positions)))
                else:
                    recipe.append((False, self._defaults[name]))
            # the usual signature (runtime arguments first, then constexprs) needs no recipe per launch:
            # the full list is ``args + tail``
            n = len(args)
            prefix = all(recipe[i] == (True, i) for i in range(n))
            tail = tuple(v for _, v in recipe[n:]) if prefix else None
            self._cache[key] = (kernel, tuple(recipe), tail)
            return kernel
        kernel, recipe, tail = entry
        full = args + tail if tail is not None else [args[v] if is_pos else v for is_pos, v in recipe]
        g0 = grid[0]
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        stream = torch._C._cuda_getCurrentRawStream(device.index)
        kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None, *full)
        return kernel


def fast_launch(fn) -> FastKernel:
    """Decorator, above ``@triton.jit``: launches through ``FastKernel``."""
    if not isinstance(fn, (triton.runtime.JITFunction,)) and not hasattr(fn, "arg_names"):
        raise TypeError("fast_launch wraps a @triton.jit function")
    return FastKernel(fn)

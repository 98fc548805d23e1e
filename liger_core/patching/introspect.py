"""Looking inside forwards that decorators, partials and bound methods wrap, and rebuilding them.

Patching decides from a forward's own code which globals it calls (``apply_rotary_pos_emb``,
``self.loss_function``). transformers wraps many forwards in decorators (``deprecate_kwarg`` renaming
``past_key_values`` to ``cache``, ``can_return_tuple``, ...): the function on the class is then the
decorator's wrapper, whose code and globals are the decorator's. ``innermost`` follows the chain
(``__wrapped__`` as ``functools.wraps`` sets it, ``functools.partial.func``, a bound method's ``__func__``)
to the function the model's author wrote.

``rewrap`` rebuilds the chain around a replacement of that innermost function, so a patched copy keeps
every decorator's behaviour. A wrapper made by ``functools.wraps`` holds the function it wraps in a closure
cell; the rebuilt wrapper is the same code with that one cell pointing at the rebuilt inner layer. A wrapper
that does not hold its inner function that way cannot be rebuilt, and ``rewrap`` raises ``RewrapError``
(the caller reports the module as not patched, with the reason).
"""

from __future__ import annotations

import functools
import types
from typing import Any

_MAX_DEPTH = 32  # a decorator chain deeper than this is a cycle


class RewrapError(ValueError):
    """A decorator chain that cannot be rebuilt around a replacement function."""


def _inner(fn: Any) -> Any:
    """One layer down, or None at the bottom."""
    if isinstance(fn, (staticmethod, classmethod)):
        return fn.__func__
    if isinstance(fn, types.MethodType):
        return fn.__func__
    if isinstance(fn, functools.partial):
        return fn.func
    return getattr(fn, "__wrapped__", None)


def innermost(fn: Any) -> Any:
    """The function at the bottom of ``fn``'s wrapper chain (``fn`` itself when nothing wraps it)."""
    for _ in range(_MAX_DEPTH):
        inner = _inner(fn)
        if inner is None:
            return fn
        fn = inner
    raise RewrapError(f"{fn!r}: wrapper chain deeper than {_MAX_DEPTH}")


def innermost_function(fn: Any) -> types.FunctionType | None:
    """``innermost(fn)`` if it is a plain Python function (one with code and globals), else None."""
    try:
        inner = innermost(fn)
    except RewrapError:
        return None
    return inner if isinstance(inner, types.FunctionType) else None


def calls_global(fn: Any, name: str) -> bool:
    """True if the function ``fn`` wraps (at the bottom of its chain) looks up the global ``name``."""
    inner = innermost_function(fn)
    return inner is not None and name in inner.__code__.co_names


def _copy_function(fn: types.FunctionType, closure: tuple | None) -> types.FunctionType:
    new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__dict__.update(fn.__dict__)
    return new


def rewrap(fn: Any, replacement: types.FunctionType) -> Any:
    """``fn``'s wrapper chain rebuilt around ``replacement`` in place of ``innermost(fn)``."""
    return _rewrap(fn, replacement, 0)


def _rewrap(fn: Any, replacement: types.FunctionType, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise RewrapError(f"wrapper chain deeper than {_MAX_DEPTH}")
    inner = _inner(fn)
    if inner is None:
        return replacement
    new_inner = _rewrap(inner, replacement, depth + 1)
    if isinstance(fn, staticmethod):
        return staticmethod(new_inner)
    if isinstance(fn, classmethod):
        return classmethod(new_inner)
    if isinstance(fn, types.MethodType):
        return types.MethodType(new_inner, fn.__self__)
    if isinstance(fn, functools.partial):
        return functools.partial(new_inner, *fn.args, **fn.keywords)
    if not isinstance(fn, types.FunctionType):
        raise RewrapError(f"{type(fn).__name__} wrapper around {getattr(inner, '__qualname__', inner)!r}")
    cells = fn.__closure__ or ()
    holding = [i for i, cell in enumerate(cells) if _cell_holds(cell, inner)]
    if len(holding) != 1:
        raise RewrapError(
            f"decorator {fn.__qualname__} ({fn.__module__}) does not hold the function it wraps in one "
            "closure cell"
        )
    closure = tuple(types.CellType(new_inner) if i in holding else cell for i, cell in enumerate(cells))
    new = _copy_function(fn, closure)
    new.__wrapped__ = new_inner
    return new


def _cell_holds(cell: types.CellType, value: Any) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def with_global(fn: types.FunctionType, name: str, replacement: Any) -> types.FunctionType:
    """A copy of the plain function ``fn`` that sees ``replacement`` for the global ``name``.

    The copy's globals are a copy of ``fn``'s module dict taken now, with the one name replaced. Without
    ``__name__`` in them the copy is not mistaken for the module's own namespace: torch.compile (dynamo) looks
    a function's globals up through ``sys.modules[__name__]`` when it has one, and would then trace (and guard
    on) the module's function instead of the replacement.
    """
    new_globals = dict(fn.__globals__)
    new_globals[name] = replacement
    new_globals.pop("__name__", None)
    new = types.FunctionType(fn.__code__, new_globals, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__dict__.update(fn.__dict__)
    return new

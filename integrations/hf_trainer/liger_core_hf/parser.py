"""`HfArgumentParser` (and subclasses such as TRL's `TrlParser`): what the plugin changes in argument parsing.

- `--liger_kernel_config '{"rope": false}'` parses as a JSON object (transformers declares the field as
  `dict[str, bool] | None`, which argparse rejects as "invalid dict value").
- A misspelled liger option (`--use_liger_kernal`, `--liger_kernel_conf`, or any unknown option with "liger"
  in its name) is an error that names it and the option meant, on the command line and in `parse_dict`
  (JSON/YAML files), even where the script keeps unknown arguments for later
  (`return_remaining_strings=True`, as TRL's CLI does before `accelerate launch`).

Only `transformers.hf_argparser` is imported here (not `transformers.trainer`), so a script that parses its
arguments before importing the Trainer keeps that order.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable
from typing import Any

from transformers import HfArgumentParser

from .config import kernel_config_argument

LIGER_OPTIONS = ("use_liger_kernel", "liger_kernel_config")

# (class, method name) -> the class's own method before wrapping, or None when it inherited it
_originals: dict[tuple[type, str], Callable[..., Any] | None] = {}


def _liger_names(parser: Any) -> list[str]:
    names = {a.dest for a in getattr(parser, "_actions", ()) if "liger" in a.dest}
    return sorted(names | set(LIGER_OPTIONS))


def misspelled_liger_key(name: str, known: Iterable[str], dashes: str = "") -> str | None:
    """The message for `name` (an option or config key the parser did not take) if it looks like a liger
    option: "... did you mean ...?" when one of `known` is close, else the list of liger options. None when
    `name` does not look like one. `dashes` prefixes the names in the message ("--" for options)."""
    key = name.lstrip("-").split("=", 1)[0].replace("-", "_")
    if not key:
        return None
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    if close:
        return f"unknown argument {dashes}{key}: did you mean {dashes}{close[0]}?"
    if "liger" in key.lower():
        return f"unknown argument {dashes}{key}: the liger options are {', '.join(dashes + k for k in known)}"
    return None


def _check_remaining(parser: Any, remaining: Iterable[str]) -> None:
    known = _liger_names(parser)
    for token in remaining:
        if isinstance(token, str) and token.startswith("-"):
            message = misspelled_liger_key(token, known, dashes="--")
            if message is not None:
                parser.error(message)


def _init(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        for action in self._actions:
            if action.dest == "liger_kernel_config":
                action.type = kernel_config_argument

    return __init__


def _parse_known_args(cls: type, own: Callable[..., Any] | None) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if own is not None:
            return own(self, *args, **kwargs)
        return super(cls, self).parse_known_args(*args, **kwargs)

    @functools.wraps(own if own is not None else cls.parse_known_args)
    def parse_known_args(self: Any, *args: Any, **kwargs: Any) -> Any:
        namespace, remaining = call(self, *args, **kwargs)
        _check_remaining(self, remaining)
        return namespace, remaining

    return parse_known_args


def _parse_dict(cls: type, own: Callable[..., Any] | None) -> Callable[..., Any]:
    original = own if own is not None else cls.parse_dict

    @functools.wraps(original)
    def parse_dict(self: Any, args: dict[str, Any], *rest: Any, **kwargs: Any) -> Any:
        dests = {a.dest for a in self._actions}
        known = _liger_names(self)
        for key in args:
            if key not in dests:
                message = misspelled_liger_key(str(key), known)
                if message is not None:
                    raise ValueError(f"HfArgumentParser: {message}")
        if own is not None:
            return own(self, args, *rest, **kwargs)
        return super(cls, self).parse_dict(args, *rest, **kwargs)

    return parse_dict


_Maker = Callable[[type, Callable[..., Any] | None], Callable[..., Any]]


def _wrap(cls: type, name: str, make: _Maker) -> None:
    if (cls, name) in _originals:
        return
    own = cls.__dict__.get(name)
    _originals[(cls, name)] = own
    setattr(cls, name, make(cls, own))


def accept_json_kernel_config(parser_class: type = HfArgumentParser) -> None:
    """Make every `parser_class(...)` built from now on parse `--liger_kernel_config` as JSON and reject
    misspelled liger options: transformers' HfArgumentParser (and its subclasses), or a copy of it such as
    TRL's (`trl.scripts._hf_argparser`, the base of TrlParser). Idempotent; undone by `uninstall()`."""
    _wrap(parser_class, "__init__", lambda cls, own: _init(own))
    _wrap(parser_class, "parse_known_args", _parse_known_args)
    if hasattr(parser_class, "parse_dict"):
        _wrap(parser_class, "parse_dict", _parse_dict)


def restore_methods(originals: dict[tuple[type, str], Callable[..., Any] | None]) -> None:
    """Put back, and forget, every method in ``originals`` ((class, name) -> the class's own method before it
    was wrapped, or None when the class inherited it and the wrapper is deleted)."""
    while originals:
        (cls, name), original = originals.popitem()
        if original is None:
            delattr(cls, name)
        else:
            setattr(cls, name, original)


def uninstall() -> None:
    restore_methods(_originals)


def is_installed() -> bool:
    return bool(_originals)

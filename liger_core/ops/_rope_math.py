"""RoPE's host-side layout and table pieces (``liger_core.ops.rope``'s module doc gives the math): the layout
keywords as one int through the custom ops and as the kernel's constexprs, and the check whether a (cos, sin)
table pair repeats its first half bitwise (then the kernel reads one half).
"""

from __future__ import annotations

import weakref

import torch

# The layout flags, one int through the custom ops (bits of ``layout``)
PAIRS_IN, PAIRS_OUT, PAIR_TABLES, FREQ_TABLES, NEGATE_SIN, ROTARY_LAST = (1 << i for i in range(6))
TABLES = ("halves", "pairs", "freqs")  # the table layouts ``rope`` takes


def layout_bits(
    interleaved: bool, deinterleave: bool, tables: str, negate_sin: bool, rotary_last: bool
) -> int:
    """The layout keywords of ``rope`` as one int (what the custom ops take)."""
    return (
        (PAIRS_IN if interleaved else 0)
        | (PAIRS_OUT if interleaved and not deinterleave else 0)
        | (PAIR_TABLES if tables == "pairs" else 0)
        | (FREQ_TABLES if tables == "freqs" else 0)
        | (NEGATE_SIN if negate_sin else 0)
        | (ROTARY_LAST if rotary_last else 0)
    )


def layout_constexprs(layout: int, halves_equal: bool) -> dict:
    """The kernel's layout constexprs of ``layout`` (``HALVES_EQUAL``: the second table halves unread)."""
    return dict(
        # interleaved pairs read the first half of cat(freqs, freqs) tables; freqs tables are that half
        HALVES_EQUAL=halves_equal
        or bool(layout & FREQ_TABLES)
        or bool(layout & PAIRS_IN and not layout & PAIR_TABLES),
        PAIRS_IN=bool(layout & PAIRS_IN),
        PAIRS_OUT=bool(layout & PAIRS_OUT),
        PAIR_TABLES=bool(layout & PAIR_TABLES),
        NEGATE_SIN=bool(layout & NEGATE_SIN),
        ROTARY_LAST=bool(layout & ROTARY_LAST),
    )


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size -> integer view


class TableHalves:
    """Whether a (cos, sin) pair repeats its first half bitwise (HF's ``cat(freqs, freqs)``; 0.0 and -0.0 or
    NaNs differ): checked on the device when the pair is first seen, read on the host once that is done."""

    __slots__ = ("cos_ref", "sin_ref", "versions", "equal", "host_flag", "event")

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, versions: tuple[int, int]) -> None:
        self.cos_ref, self.sin_ref, self.versions = weakref.ref(cos), weakref.ref(sin), versions
        half = cos.shape[-1] // 2
        with torch.no_grad():
            bits = _BITS[cos.element_size()]
            c, s = cos.detach().view(bits), sin.detach().view(bits)
            equal = torch.logical_and(
                (c[..., :half] == c[..., half:]).all(), (s[..., :half] == s[..., half:]).all()
            )
        self.equal: bool | None = None
        self.host_flag = self.event = None
        if cos.is_cuda:  # the answer comes back asynchronously: no sync
            self.host_flag = torch.empty((), dtype=torch.bool, pin_memory=True)
            self.host_flag.copy_(equal, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.equal = bool(equal)

    def matches(self, cos: torch.Tensor, sin: torch.Tensor, versions: tuple[int, int]) -> bool:
        return self.cos_ref() is cos and self.sin_ref() is sin and self.versions == versions

    def known_equal(self) -> bool:
        """True once the check is done and found equal halves; False before (the kernel reads both)."""
        if self.equal is None and self.event is not None and not torch.cuda.is_current_stream_capturing():
            if self.event.query():
                self.equal = bool(self.host_flag)
                self.host_flag = self.event = None
        return bool(self.equal)


# (id(cos), id(sin)) -> the pair's check; entries are validated by identity and version on every lookup
_TABLE_CHECKS: dict[tuple[int, int], TableHalves] = {}
_MAX_TABLE_CHECKS = 64  # live table pairs remembered (HF: one per forward); the cache starts over beyond this


def check_table_halves(cos: torch.Tensor, sin: torch.Tensor) -> TableHalves | None:
    """The cached check of this (cos, sin) pair, started now if new. None (both halves are always read) under
    torch.compile, for inference-mode tables (no version counter) and inside a CUDA-graph capture."""
    if torch.compiler.is_compiling() or cos.is_inference() or sin.is_inference():
        return None
    key = (id(cos), id(sin))
    versions = (cos._version, sin._version)
    check = _TABLE_CHECKS.get(key)
    if check is not None and check.matches(cos, sin, versions):
        return check
    if cos.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    if len(_TABLE_CHECKS) >= _MAX_TABLE_CHECKS:
        _TABLE_CHECKS.clear()
    check = _TABLE_CHECKS[key] = TableHalves(cos, sin, versions)
    return check

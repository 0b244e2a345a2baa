"""The race detector's memory of a buffer: which accesses each of its byte ranges still needs.

A buffer's bytes are cut into ranges that every access so far either covered whole or missed:
each range keeps the accesses that a later access could still race on it. An access that is
ordered after a past one stands for it on the bytes they share, if it writes or the past one
only read: whatever would race the past access there races this one too (an op issued later
cannot be ordered before it). A read cannot stand for a write, since a later read would race
only the write. So a range keeps a few accesses (its latest write and the reads since, one per
stream or host), however often it is touched.

An access visits only the ranges it overlaps, found by bisection, and ranges that end up with
the same accesses are joined again. A tensor touched whole is one range whatever its size, so
what one access costs does not grow with its bytes.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import Any, NamedTuple

HISTORY = 4096
"""Accesses one range remembers, at most (the oldest are forgotten first): a bound for a
pathological trace, far above the few a range keeps (see the module's docstring)."""


class Access(NamedTuple):
    """One access as the detector remembers it. ``source`` is what names its op in a finding:
    ``(seq, stream, kind, step, site, origin)``."""

    thread: str  # the stream, or the host
    epoch: int  # its place in its thread's order
    lo: int  # the bytes it touched, [lo, hi) of the buffer
    hi: int
    write: bool
    source: tuple[Any, ...]


class Race(NamedTuple):
    """A past access that conflicts with a new one and is not ordered before it."""

    past: Access
    start: int  # the first byte of the buffer where the two meet


class Shadow:
    """The ranges of one buffer, sorted and disjoint: ``starts[i]``, ``ends[i]`` and the
    accesses ``pasts[i]`` (a tuple, shared by the pieces of a range that is cut)."""

    __slots__ = ("starts", "ends", "pasts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.pasts: list[tuple[Access, ...]] = []

    def remembered(self) -> int:
        """How many accesses the ranges hold between them (one held by several counts once)."""
        return len({id(past) for held in self.pasts for past in held})

    def access(self, now: Access, clock: Callable[[str, int], int], prune: bool,
               races: dict[str, Race]) -> None:
        """Take ``now`` on its bytes; into ``races``, for each other thread, the latest of its
        accesses that conflict with ``now`` and that ``clock`` (now's vector clock) does not
        order before it. Without ``prune``, no past access is forgotten (for tests)."""
        lo, hi = now.lo, now.hi
        starts, ends, pasts = self.starts, self.ends, self.pasts
        first = bisect_right(ends, lo)  # the first range that ends after lo
        last = first
        count = len(starts)
        alone = (now,)
        cut = _Cut([], [], [])
        at = lo
        while last < count and starts[last] < hi:
            a, b, held = starts[last], ends[last], pasts[last]
            if a > at:  # bytes no access had touched
                cut.put(at, a, alone)
            elif a < lo:  # the range's part before this access keeps its past
                cut.put(a, lo, held)
                a = lo
            cut.put(a, min(b, hi), _meet(held, now, a, clock, prune, races))
            if b > hi:  # and its part after
                cut.put(hi, b, held)
            at = b
            last += 1
        if at < hi:
            cut.put(at, hi, alone)
        starts[first:last] = cut.starts
        ends[first:last] = cut.ends
        pasts[first:last] = cut.pasts


class _Cut(NamedTuple):
    """The ranges that replace those an access overlapped."""

    starts: list[int]
    ends: list[int]
    pasts: list[tuple[Access, ...]]

    def put(self, start: int, end: int, held: tuple[Access, ...]) -> None:
        """Add a range; one that follows a range with the very same accesses joins it."""
        if self.pasts and self.ends[-1] == start and _same(self.pasts[-1], held):
            self.ends[-1] = end
        else:
            self.starts.append(start)
            self.ends.append(end)
            self.pasts.append(held)


def _meet(held: tuple[Access, ...], now: Access, start: int, clock: Callable[[str, int], int],
          prune: bool, races: dict[str, Race]) -> tuple[Access, ...]:
    """The accesses a range keeps once ``now`` has touched it, noting the races on the way."""
    thread, write = now.thread, now.write
    kept: list[Access] | None = None  # a new list only once one is dropped
    for i, past in enumerate(held):
        p_thread = past.thread
        ordered = p_thread == thread or past.epoch <= clock(p_thread, 0)
        if not ordered and (write or past.write):
            seen = races.get(p_thread)
            if seen is None or seen.past.epoch < past.epoch:
                races[p_thread] = Race(past, start)
        if prune and ordered and (write or not past.write):
            if kept is None:
                kept = list(held[:i])
        elif kept is not None:
            kept.append(past)
    if kept is None:
        if len(held) >= HISTORY:
            return (*held[len(held) - HISTORY + 1:], now)
        return (*held, now)
    if not kept:
        return (now,)
    kept.append(now)
    return tuple(kept[-HISTORY:])


def _same(x: tuple[Access, ...], y: tuple[Access, ...]) -> bool:
    """Whether two ranges' accesses are the very same ones (so the ranges can be one)."""
    if x is y:
        return True
    if len(x) != len(y) or x[-1] is not y[-1]:
        return False
    return all(p is q for p, q in zip(x, y))

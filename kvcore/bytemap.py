"""Who owns which bytes: disjoint ranges of one address space, each with a value.

One model for every map of byte ownership in gpurace: the pages and pinned blocks a scenario's
world hands out, the owners a race finding names, the allocations a watched program made, the
blocks a kernel's bare pointer may lie in. Each keeps its own policy (whether a new owner cuts
an old one or replaces it whole, what a free of unknown bytes means); the map only keeps the
ranges disjoint and sorted, so that every lookup is a bisection however many ranges there are.

    spans = ByteMap()
    spans.put(0, 4096, "lease 1")       # [0, 4096) owned by "lease 1"
    spans.cut(1024, 2048)               # -> [Span(1024, 2048, "lease 1")]; two pieces stay
    spans.at(100)                       # -> Span(0, 1024, "lease 1")
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any, NamedTuple


class Span(NamedTuple):
    """Bytes ``[lo, hi)`` and who (or what) holds them."""

    lo: int
    hi: int
    value: Any


class ByteMap:
    """Disjoint ranges ``[lo, hi)`` with a value each, sorted by start."""

    def __init__(self) -> None:
        # Parallel lists: the starts alone are what bisect searches.
        self._los: list[int] = []
        self._spans: list[Span] = []

    def __len__(self) -> int:
        return len(self._spans)

    def __iter__(self) -> Iterator[Span]:
        return iter(list(self._spans))

    def _window(self, lo: int, hi: int) -> tuple[int, int]:
        """The index range of the spans that overlap ``[lo, hi)``."""
        first = bisect.bisect_right(self._los, lo) - 1
        if first < 0 or self._spans[first].hi <= lo:
            first += 1
        end = bisect.bisect_left(self._los, hi, lo=first)
        return first, end

    def overlapping(self, lo: int, hi: int) -> list[Span]:
        """The spans that share a byte with ``[lo, hi)``, whole."""
        if lo >= hi:
            return []
        first, end = self._window(lo, hi)
        return self._spans[first:end]

    def at(self, address: int) -> Span | None:
        """The span holding byte ``address``."""
        i = bisect.bisect_right(self._los, address) - 1
        if i >= 0 and address < self._spans[i].hi:
            return self._spans[i]
        return None

    def starting_at(self, lo: int) -> Span | None:
        """The span that starts exactly at ``lo``."""
        i = bisect.bisect_left(self._los, lo)
        return self._spans[i] if i < len(self._los) and self._los[i] == lo else None

    def cut(self, lo: int, hi: int) -> list[Span]:
        """Free ``[lo, hi)``: the parts of spans it held, clipped to it, in order. What a span
        held outside it stays with the span's value."""
        if lo >= hi:
            return []
        first, end = self._window(lo, hi)
        if first == end:
            return []
        removed: list[Span] = []
        kept: list[Span] = []
        for span in self._spans[first:end]:
            if span.lo < lo:
                kept.append(Span(span.lo, lo, span.value))
            removed.append(Span(max(span.lo, lo), min(span.hi, hi), span.value))
            if hi < span.hi:
                kept.append(Span(hi, span.hi, span.value))
        self._replace(first, end, kept)
        return removed

    def remove(self, lo: int, hi: int) -> list[Span]:
        """Drop every span that overlaps ``[lo, hi)``, whole; those spans, in order."""
        if lo >= hi:
            return []
        first, end = self._window(lo, hi)
        removed = self._spans[first:end]
        self._replace(first, end, [])
        return removed

    def put(self, lo: int, hi: int, value: Any, *, whole: bool = False) -> list[Span]:
        """Give ``[lo, hi)`` to ``value``. The spans there before lose those bytes (``whole``:
        lose all of theirs, as a block carved anew over an old one); what they lost, in order."""
        if lo >= hi:
            return []
        removed = self.remove(lo, hi) if whole else self.cut(lo, hi)
        i = bisect.bisect_left(self._los, lo)
        self._los.insert(i, lo)
        self._spans.insert(i, Span(lo, hi, value))
        return removed

    def pop(self, lo: int) -> Span | None:
        """Drop the span that starts exactly at ``lo``; it, or None where none starts there."""
        i = bisect.bisect_left(self._los, lo)
        if i < len(self._los) and self._los[i] == lo:
            del self._los[i]
            return self._spans.pop(i)
        return None

    def _replace(self, first: int, end: int, spans: list[Span]) -> None:
        self._spans[first:end] = spans
        self._los[first:end] = [span.lo for span in spans]

"""Free runs: a sorted, coalesced list of free [start, start + length) ranges of integers."""

from __future__ import annotations

import bisect


class FreeRuns:
    """Free slots as sorted, coalesced runs. Allocation takes the lowest slots first, so a slot
    released and taken again comes back at the same index (the seed's release test relies on
    this, as real allocators' free lists behave)."""

    def __init__(self, total: int) -> None:
        self._starts: list[int] = [0] if total else []
        self._lengths: list[int] = [total] if total else []
        self.free = total

    @property
    def runs(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._lengths))

    def take(self, count: int) -> list[int]:
        """The ``count`` lowest free slots, removed from the free runs. The caller checks that
        ``count <= free``."""
        taken: list[int] = []
        while len(taken) < count:
            start, length = self._starts[0], self._lengths[0]
            n = min(length, count - len(taken))
            taken.extend(range(start, start + n))
            if n == length:
                del self._starts[0], self._lengths[0]
            else:
                self._starts[0], self._lengths[0] = start + n, length - n
        self.free -= count
        return taken

    def take_contiguous(self, count: int, align: int = 1) -> int | None:
        """The start of the lowest run of ``count`` free slots starting at a multiple of
        ``align``, removed from the free runs; None when there is none."""
        for i, (start, length) in enumerate(zip(self._starts, self._lengths)):
            first = -(-start // align) * align
            if first + count <= start + length:
                self._remove(i, first, count)
                return first
        return None

    def _remove(self, i: int, first: int, count: int) -> None:
        start, length = self._starts[i], self._lengths[i]
        pieces = [(start, first - start), (first + count, start + length - first - count)]
        kept = [(s, n) for s, n in pieces if n > 0]
        self._starts[i:i + 1] = [s for s, _ in kept]
        self._lengths[i:i + 1] = [n for _, n in kept]
        self.free -= count

    def give(self, start: int, length: int = 1) -> None:
        """Return ``[start, start + length)``, merging it with its neighbours."""
        i = bisect.bisect_left(self._starts, start)
        if (i < len(self._starts) and self._starts[i] < start + length) or (
            i > 0 and self._starts[i - 1] + self._lengths[i - 1] > start
        ):
            raise ValueError(f"slots [{start}, {start + length}) are already free")
        self.free += length
        if i > 0 and self._starts[i - 1] + self._lengths[i - 1] == start:
            i -= 1
            self._lengths[i] += length
        else:
            self._starts.insert(i, start)
            self._lengths.insert(i, length)
        if i + 1 < len(self._starts) and self._starts[i] + self._lengths[i] == self._starts[i + 1]:
            self._lengths[i] += self._lengths.pop(i + 1)
            self._starts.pop(i + 1)

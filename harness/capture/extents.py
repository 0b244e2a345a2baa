"""Bytes: what a strided view spans, whether two accesses share a byte, and which live block
an address lies in.

Nothing here needs CuPy or NumPy: a view is its first address, shape, strides and item size,
and an access is a :class:`~harness.capture.events.Span`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, NamedTuple

from harness.capture.events import Span
from kvcore.bytemap import ByteMap


class Extent(NamedTuple):
    """The lowest address a view touches and the address just past its last byte."""

    start: int
    end: int


def extent(ptr: int, shape: Iterable[int], strides: Iterable[int],
           itemsize: int) -> Extent | None:
    """The lowest address and the end of the bytes a strided view touches (negative strides
    included), or None for an empty view."""
    lo = hi = ptr
    for n, stride in zip(shape, strides):
        if n == 0:
            return None
        step = (n - 1) * stride
        if step < 0:
            lo += step
        else:
            hi += step
    return Extent(lo, hi + itemsize)


def extent_span(space: str, ptr: int, shape: Iterable[int], strides: Iterable[int],
                itemsize: int) -> Span | None:
    """A view's extent as one access in ``space``, or None for an empty view."""
    found = extent(ptr, shape, strides, itemsize)
    return None if found is None else Span(space, found.start, found.end - found.start)


def overlaps(a: Span, b: Span) -> bool:
    """Whether two accesses share a byte."""
    return (a.space == b.space and a.address < b.address + b.nbytes
            and b.address < a.address + a.nbytes)


def covered(access: Span, by: Iterable[Span]) -> bool:
    return any(overlaps(access, other) for other in by)


class Block(NamedTuple):
    """A live block of one space: where it starts, its size, the stream it was made on."""

    start: int
    nbytes: int
    stream: int | None


class AllocationMap:
    """The live blocks of one space, by start address: which block an address a kernel was
    handed as a bare integer lies in, and which stream a freed block belonged to. A block
    handed out over bytes still held replaces the old block whole (a free not reported)."""

    def __init__(self) -> None:
        self._blocks = ByteMap()
        self._lock = threading.Lock()  # the pools report from any of the program's threads

    def add(self, ptr: int, nbytes: int, stream: int | None = None) -> None:
        with self._lock:
            # An empty block holds one byte in the map, so that its free still finds it.
            self._blocks.put(ptr, ptr + max(nbytes, 1), Block(ptr, nbytes, stream), whole=True)

    def remove(self, ptr: int) -> Block | None:
        """Forget the block at ``ptr``; the block, or None if it was not known."""
        with self._lock:
            span = self._blocks.pop(ptr)
        return span.value if span is not None else None

    def find(self, address: int) -> Block | None:
        """The live block holding ``address``."""
        with self._lock:
            span = self._blocks.at(address)
        if span is None or address >= span.value.start + span.value.nbytes:
            return None
        return span.value

    def __len__(self) -> int:
        return len(self._blocks)


def is_basic_index(key: Any) -> bool:
    """Whether ``a[key]`` is a view (ints, slices, ``...``, ``None``): then ``a[key] = v``
    writes only the view's bytes; any other key may write anywhere in ``a``."""
    parts = key if isinstance(key, tuple) else (key,)
    return all(p is None or p is Ellipsis or isinstance(p, slice)
               or (isinstance(p, int) and not isinstance(p, bool)) for p in parts)

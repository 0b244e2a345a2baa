"""HostKVArena: pinned host memory for KV pages, and views that log every host access."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcore.context import DeviceContext
from kvcore.device.handles import Buffer, Event
from kvcore.errors import GeometryError
from kvcore.freeruns import FreeRuns
from kvcore.geometry import HostKVPageLayout

_GRANULE = 256  # host allocations start on 256-byte boundaries, like the device's planes


@dataclass(frozen=True)
class HostKVAllocation:
    """``pages`` pages of ``layout`` at byte ``offset`` of a HostKVArena."""

    offset: int
    pages: int
    layout: HostKVPageLayout

    @property
    def nbytes(self) -> int:
        return self.pages * self.layout.page_stride


class HostKVArena:
    """A pinned host buffer that allocations of whole pages are carved from: a small recycling
    pinned pool. A freed allocation's bytes go back to the free list and the next allocation
    that fits gets them again, lowest first, as a caching host allocator hands out a block.

    Host code reaches the bytes only through views, so every CPU read and write of pinned memory
    is an op-log record: a host write while an async copy from the same bytes is pending is a race
    the detector must see, whichever allocation the bytes belong to now.
    """

    def __init__(self, context: DeviceContext, capacity: int,
                 layouts: tuple[HostKVPageLayout, ...] | list[HostKVPageLayout] = (),
                 *, name: str = "host-kv-arena") -> None:
        self.device = context.device
        self.layouts = tuple(layouts)
        self.buffer: Buffer = self.device.alloc_host(capacity, name=name)
        self._free = FreeRuns(capacity // _GRANULE)
        self._live: set[int] = set()  # offsets of allocations not freed yet
        self._deferred: list[tuple[HostKVAllocation, tuple[Event, ...]]] = []

    @property
    def capacity(self) -> int:
        return self.buffer.nbytes

    def allocate(self, layout: HostKVPageLayout, pages: int,
                 *, name: str | None = None) -> HostKVAllocation | None:
        """Room for ``pages`` pages of ``layout``, or None when the arena has no such run free.
        ``name`` is how race findings will call the bytes while this allocation holds them."""
        if self.layouts and layout not in self.layouts:
            raise GeometryError("this layout was not declared when the HostKVArena was made")
        if pages <= 0:
            raise GeometryError(f"allocate at least one page, not {pages}")
        self.reclaim()
        granules = -(-pages * layout.page_stride // _GRANULE)
        start = self._free.take_contiguous(granules)
        if start is None:
            return None
        allocation = HostKVAllocation(start * _GRANULE, pages, layout)
        self._live.add(allocation.offset)
        if name is not None:
            self.device.label(self.buffer, [(allocation.offset, allocation.nbytes)], name)
        return allocation

    def free(self, allocation: HostKVAllocation, *, after: tuple[Event, ...] = ()) -> None:
        """Give the allocation back. With ``after`` (events recorded behind the copies that use
        it), its bytes are handed out again only once a query sees every one of them complete,
        as PyTorch's CachingHostAllocator does; without, at once: the next allocation may get
        the bytes while a copy from them is still in flight."""
        if allocation.offset not in self._live:
            raise GeometryError(f"the allocation at byte {allocation.offset} of "
                                f"{self.buffer.name} is not allocated (freed twice?)")
        self._live.discard(allocation.offset)
        self.device.unlabel(self.buffer, [(allocation.offset, allocation.nbytes)])
        if after:
            self._deferred.append((allocation, tuple(after)))
        else:
            self._give(allocation)

    def _give(self, allocation: HostKVAllocation) -> None:
        self._free.give(allocation.offset // _GRANULE, -(-allocation.nbytes // _GRANULE))

    def reclaim(self) -> None:
        """Hand back the deferred frees whose events a query now sees complete (allocate does
        this itself; call it to settle the arena once the device is idle)."""
        if not self._deferred:
            return
        waiting = []
        for allocation, events in self._deferred:
            if all(self.device.query_event(event) for event in events):
                self._give(allocation)
            else:
                waiting.append((allocation, events))
        self._deferred = waiting

    def state_key(self) -> tuple[object, ...]:
        """What the arena hands out next depends on (see DeviceKVPagePool.state_key)."""
        return (tuple(self._free.runs), tuple(sorted(self._live)),
                tuple((a.offset, tuple(e.id for e in events)) for a, events in self._deferred))

    def view(self, allocation: HostKVAllocation) -> HostKVAllocationView:
        """A read-only view of the allocation."""
        return HostKVAllocationView(self, allocation, writable=False)

    def writable_view(self, allocation: HostKVAllocation) -> HostKVAllocationView:
        return HostKVAllocationView(self, allocation, writable=True)


class HostKVAllocationView:
    """Page-wise access to a HostKVAllocation; every access is a logged host op."""

    def __init__(self, arena: HostKVArena, allocation: HostKVAllocation, *, writable: bool):
        self.arena = arena
        self.allocation = allocation
        self.writable = writable

    @property
    def layout(self) -> HostKVPageLayout:
        return self.allocation.layout

    @property
    def pages(self) -> int:
        return self.allocation.pages

    @property
    def buffer(self) -> Buffer:
        return self.arena.buffer

    def page_offset(self, page: int) -> int:
        """Byte offset of ``page`` of this allocation within the arena's buffer."""
        if not 0 <= page < self.pages:
            raise GeometryError(f"page {page} is outside this allocation of {self.pages} pages")
        return self.allocation.offset + page * self.layout.page_stride

    def _writable(self) -> None:
        if not self.writable:
            raise GeometryError("this view is read-only; use HostKVArena.writable_view")

    def fill(self, value: int, page: int | None = None) -> None:
        """Set every byte of one page (or all pages) to ``value``: a CPU memset."""
        self._writable()
        first, count = (0, self.pages) if page is None else (page, 1)
        self.arena.device.host_fill(self.buffer, self.page_offset(first),
                                    count * self.layout.page_stride, value)

    def write(self, data: bytes | np.ndarray, page: int = 0, offset: int = 0) -> None:
        """Write ``data`` starting ``offset`` bytes into ``page``."""
        self._writable()
        raw = np.frombuffer(bytes(data), np.uint8) if isinstance(data, (bytes, bytearray)) \
            else np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        at = self.page_offset(page) + offset
        if at + raw.size > self.allocation.offset + self.allocation.nbytes:
            raise GeometryError(f"{raw.size} bytes at page {page}+{offset} overrun the allocation")
        self.arena.device.host_write(self.buffer, at, raw)

    def read(self, page: int | None = None) -> np.ndarray:
        """A copy of one page (or all pages) as the host sees it now."""
        first, count = (0, self.pages) if page is None else (page, 1)
        return self.arena.device.host_read(self.buffer, self.page_offset(first),
                                           count * self.layout.page_stride)

    def payload(self, page: int) -> np.ndarray:
        """The page's plane payloads, concatenated, without the alignment padding."""
        raw = self.read(page)
        return np.concatenate([raw[s] for s in self.layout.payload_slices()])


def page_payload_equal(a: HostKVAllocationView, page_a: int,
                       b: HostKVAllocationView, page_b: int) -> bool:
    """Whether two host pages hold the same payload (padding ignored), as the seed's test asks."""
    return bool(np.array_equal(a.payload(page_a), b.payload(page_b)))

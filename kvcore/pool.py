"""DeviceKVPagePool: fixed-size KV pages carved from a device arena, leased with generations.

A page's generation changes every time it is released, so a handle kept past its lease is
refused (StaleHandleError) instead of silently writing someone else's page. The pool remembers
which streams used each page; with the release fence on (the default, and the fix), release
records an event on each of them and the next user of the page waits for those events before
touching it. ``Defects(release_fence=False)`` skips that: the page is reusable at once, with the
old owner's copies possibly still in flight.

A pool made with ``allocator="caching"`` is a caching allocator instead (see
kvcore.streamcache): a lease is allocated on a stream, its freed pages go back to that stream's
list and its next allocation takes them at once, and only the streams named by
:meth:`DeviceKVPagePool.record_stream` are waited for, by events queried before the pages are
handed out again. Nothing else orders another stream's use of a page before its reuse.

A pool made with ``poison=BYTE`` fills each released page with that byte as soon as its own
ordering allows (see ``_poison``), so a stale reader sees poison rather than plausible data.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvcore.context import DeviceArena, DeviceContext
from kvcore.device.handles import Buffer, Event, Stream
from kvcore.device.kernels import GENERATION_BYTES, Gather, Scatter
from kvcore.errors import DeviceUsageError, GeometryError, PoolExhaustedError, StaleHandleError
from kvcore.freeruns import FreeRuns
from kvcore.geometry import KVPageGeometry
from kvcore.host import HostKVAllocationView
from kvcore.streamcache import StreamFreeLists

STAGING_BYTES = 64 << 20
"""Largest staging buffer a stream gets for scattered copies; bigger transfers go in pieces."""

SMALL_BATCH = 16
"""Up to this many pages, per-page bookkeeping runs as a plain loop; beyond, as numpy."""

DIRECT_RUN_LIMIT = 4
"""Up to this many runs a transfer issues one (2-D) copy per run; beyond, it stages the pages
through one contiguous copy and moves them with one scatter/gather kernel. One copy per
scattered page reached only ~0.32 of a contiguous copy's rate on the H200 here."""

ALLOCATORS = ("fenced", "caching")
"""How a pool orders a page's reuse: ``fenced`` records an event on every stream that used the
page and makes its next user wait for them; ``caching`` is a caching allocator's per-stream free
lists, with ``record_stream`` (see kvcore.streamcache)."""


@dataclass(frozen=True)
class DeviceKVPageHandle:
    """Names one physical page at one generation: what tables and copies refer to."""

    index: int
    generation: int


@dataclass(frozen=True)
class PageRun:
    """``count`` pages at device indices ``first, first + step, ...`` that sit at consecutive
    host pages from ``host_page``: one copy (a 2-D copy when ``step > 1``)."""

    host_page: int
    first: int
    step: int
    count: int


def plan_runs(indices: Sequence[int] | np.ndarray,
              limit: int | None = None) -> list[PageRun] | None:
    """Group page indices (in host order) into arithmetic runs, each movable by one copy:
    greedily, a run continues while the step between indices stays the same positive number.
    Returns None as soon as there would be more than ``limit`` runs (then staging wins)."""
    n = len(indices)
    if n <= SMALL_BATCH:
        return _plan_few([int(i) for i in indices], limit)
    idx = np.asarray(indices, dtype=np.int64)
    steps = np.diff(idx)
    # The last position of each stretch of equal steps: a run that starts inside a stretch
    # extends to its end, so the loop below takes one step per run, not per page.
    ends = np.append(np.flatnonzero(steps[1:] != steps[:-1]), n - 2)
    runs: list[PageRun] = []
    i = 0
    while i < n:
        if limit is not None and len(runs) >= limit:
            return None
        if i == n - 1 or steps[i] <= 0:
            runs.append(PageRun(i, int(idx[i]), 1, 1))
            i += 1
            continue
        last = int(ends[np.searchsorted(ends, i)])
        runs.append(PageRun(i, int(idx[i]), int(steps[i]), last - i + 2))
        i = last + 2
    return runs


def _plan_few(idx: list[int], limit: int | None) -> list[PageRun] | None:
    """plan_runs for a handful of pages, as a plain loop (cheaper than numpy at this size)."""
    runs: list[PageRun] = []
    i, n = 0, len(idx)
    while i < n:
        if limit is not None and len(runs) >= limit:
            return None
        step = idx[i + 1] - idx[i] if i + 1 < n else 0
        count = 1
        if step > 0:
            while i + count < n and idx[i + count] == idx[i] + count * step:
                count += 1
        runs.append(PageRun(i, idx[i], step if count > 1 else 1, count))
        i += count
    return runs


class DeviceKVPageLease:
    """Ownership of one page until :meth:`release`."""

    __slots__ = ("pool", "handle", "_released")

    def __init__(self, pool: DeviceKVPagePool, handle: DeviceKVPageHandle) -> None:
        self.pool = pool
        self.handle = handle
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Give the page back to the pool; the handle is stale from now on."""
        self.pool.release(self)

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"DeviceKVPageLease(page={self.handle.index}, gen={self.handle.generation}, {state})"


class DeviceKVPageReservation:
    """A promise of ``remaining`` pages, not yet materialized: admission control for a request
    before its pages are needed."""

    def __init__(self, pool: DeviceKVPagePool, pages: int) -> None:
        self.pool = pool
        self.remaining = pages

    def cancel(self) -> None:
        """Give back the pages not materialized yet."""
        self.pool._reserved -= self.remaining
        self.remaining = 0


class DeviceKVPagePool:
    """The paged KV page pool under test (see the module docstring)."""

    def __init__(self, context: DeviceContext, geometry: KVPageGeometry, pages: int,
                 *, arena: DeviceArena | None = None, poison: int | None = None,
                 allocator: str = "fenced") -> None:
        if pages <= 0:
            raise GeometryError(f"a pool needs at least one page, not {pages}")
        if allocator not in ALLOCATORS:
            raise GeometryError(f"a pool's allocator is one of {', '.join(ALLOCATORS)}, not "
                                f"{allocator!r}")
        self.allocator = allocator
        self.caching = allocator == "caching"
        self.context = context
        self.device = context.device
        self.defects = self.device.defects
        self.geometry = geometry
        self.page_stride = geometry.page_stride
        self.pages = pages
        self.arena = arena or DeviceArena(context, pages * self.page_stride)
        if self.arena.capacity < pages * self.page_stride:
            raise GeometryError(
                f"{pages} pages of {self.page_stride} bytes need {pages * self.page_stride} "
                f"bytes; the arena has {self.arena.capacity}"
            )
        self.device.oplog.describe_pages(self.arena.buffer.id, self.page_stride)
        self._free = FreeRuns(pages)
        self._reserved = 0
        # Per-page state in arrays, so a transfer of thousands of pages checks and marks them
        # in a few numpy operations instead of a Python loop (that loop alone took as long as
        # the copy of 4096 64 KiB pages on the H200).
        # int32, as the mirror has them: a release writes its pages' slice as it is.
        self._generation = np.zeros(pages, np.int32)
        self._leased = np.zeros(pages, np.bool_)
        self._users = np.zeros(pages, np.uint64)  # bit k: stream self._streams[k] used it
        self._fenced = np.zeros(pages, np.bool_)
        self._fences: dict[int, tuple[Event, ...]] = {}
        # The caching allocator's: freed pages by stream, the stream each lease was allocated
        # on (by id; -1: none), and the streams record_stream named for each page (bits).
        self._cache = StreamFreeLists()
        self._home = np.full(pages, -1, np.int64)
        self._recorded = np.zeros(pages, np.uint64)
        self._home_streams: dict[int, Stream] = {}
        self._event_refs: dict[int, int] = {}  # fence event id -> pages still to wait on it
        # Fence events free to record again, a heap by id: the lowest is taken first, so the
        # same releases take the same events whatever order their waits were issued in.
        self._idle_events: list[tuple[int, Event]] = []
        self._streams: list[Stream] = []
        self._stream_bits: dict[int, np.uint64] = {}
        self._staging: dict[int, Buffer] = {}
        self._layout_seen: object = None  # the last host layout found to match the geometry
        self._events = 0
        if poison is not None and not 0 <= poison <= 255:
            raise GeometryError(f"the poison is one byte, 0-255, not {poison}")
        self.poison = poison
        self._poison_stream: Stream | None = None
        # The generation mirror the table reader checks entries against. It is checking state,
        # not state under test, hence the "oracle" role.
        self.generations: Buffer = self.device.alloc_host(
            pages * GENERATION_BYTES, name="page-generations", role="oracle")

    # ---- leasing -------------------------------------------------------------------------------
    @property
    def buffer(self) -> Buffer:
        return self.arena.buffer

    @property
    def free_pages(self) -> int:
        """Pages neither leased nor reserved (a caching pool's cached pages count: an
        allocation gets them, waiting if it must)."""
        return self._free.free + self._cache.cached - self._reserved

    @property
    def free_runs(self) -> list[tuple[int, int]]:
        return self._free.runs

    def reserve(self, pages: int) -> DeviceKVPageReservation:
        """Set ``pages`` pages aside for a later :meth:`materialize`."""
        self._check_room(pages)
        self._reserved += pages
        return DeviceKVPageReservation(self, pages)

    def materialize(self, pages: int | DeviceKVPageReservation,
                    count: int | None = None, *, name: str | None = None,
                    stream: Stream | None = None) -> list[DeviceKVPageLease]:
        """Lease pages: ``materialize(n)`` takes n free pages, ``materialize(reservation[, n])``
        turns (n of) a reservation into pages. The lowest free pages come first. ``name`` (a
        lease's name in a scenario) is how race findings will call these pages. ``stream``:
        the stream a caching pool allocates on (default: the context's stream); its own
        freed pages come first."""
        if stream is not None and not self.caching:
            raise DeviceUsageError("a fenced pool's pages belong to no stream; allocate on a "
                                   "stream with allocator='caching'")
        stream = stream or self.context.stream
        if isinstance(pages, DeviceKVPageReservation):
            n = pages.remaining if count is None else count
            if n > pages.remaining:
                raise PoolExhaustedError(f"the reservation holds {pages.remaining} pages, not {n}")
            pages.remaining -= n
            self._reserved -= n
        else:
            n = pages
            self._check_room(n)
        taken = self._cached_take(n, stream) if self.caching else self._free.take(n)
        if n <= SMALL_BATCH:
            leased = self._leased
            for i in taken:
                leased[i] = True
        else:
            self._leased[taken] = True
        if self.device.oplog.active and taken:
            self.device.label(self.buffer, self._byte_runs(sorted(taken)), name or "lease",
                              stream=stream.name if self.caching else None)
        generation = self._generation
        return [DeviceKVPageLease(self, DeviceKVPageHandle(i, int(generation[i]))) for i in taken]

    def _cached_take(self, n: int, stream: Stream) -> list[int]:
        """A caching pool's ``n`` pages for ``stream``, as PyTorch's allocator finds a block:
        the gated pages whose events a query now sees complete are let go; the stream's own
        freed pages come first, then pages never cached; when those are short, the host waits
        for every gating event and the device to be idle (a cudaFree does) and every cached
        page is free again. The caller checked there is room."""
        sid = stream.id
        self._home_streams[sid] = stream
        self._let_go(self._cache.reclaim(self.device.query_event))
        taken = self._cache.take(sid, n)
        if len(taken) < n:
            taken += self._free.take(min(n - len(taken), self._free.free))
        if len(taken) < n:
            for event in self._cache.gated_events():
                self.device.synchronize_event(event)
            self.context.synchronize()
            pages, gated = self._cache.drop_all()
            self._let_go(gated, poison=False)  # the device is idle: nobody could read stale
            for page in pages:
                self._free.give(page)
            taken += self._free.take(n - len(taken))
        home = self._home
        for i in taken:
            home[i] = sid
        return taken

    def _let_go(self, pages: list[tuple[int, tuple[Event, ...]]], poison: bool = True) -> None:
        """Gated pages handed out again: their events are free to record again once no page
        waits on them, and a poisoning pool poisons them now, on their stream (which takes
        them next)."""
        for _, events in pages:
            for event in events:
                self._unref(event)
        if poison and self.poison is not None and pages:
            self._poison_on_home([page for page, _ in pages])

    def _poison_on_home(self, indices: list[int]) -> None:
        by_stream: dict[int, list[int]] = {}
        for i in indices:
            by_stream.setdefault(int(self._home[i]), []).append(i)
        for sid, group in by_stream.items():
            self._memset_pages(np.sort(np.asarray(group, np.int64)), self.poison or 0,
                               self._home_streams[sid])

    def record_stream(self, handles: Sequence[DeviceKVPageHandle], stream: Stream) -> None:
        """Tell a caching pool that ``stream`` uses these pages: their release records an
        event on it, and the pages are handed out again only once a query sees it complete
        (``Tensor.record_stream``). The stream they were allocated on needs none."""
        if not self.caching:
            raise DeviceUsageError("record_stream is a caching pool's: a fenced pool already "
                                   "waits for every stream that used a page")
        for handle in handles:
            self.check(handle)
        bit = self._stream_bit(stream)
        for handle in handles:
            if self._home[handle.index] != stream.id:
                self._recorded[handle.index] |= bit

    def _check_room(self, pages: int) -> None:
        if pages < 0:
            raise PoolExhaustedError(f"cannot take {pages} pages")
        if pages > self.free_pages:
            raise PoolExhaustedError(
                f"asked for {pages} pages; {self.free_pages} of {self.pages} are free "
                f"({self._reserved} reserved)"
            )

    def release(self, leases: DeviceKVPageLease | Iterable[DeviceKVPageLease], *,
                idle: bool = False) -> None:
        """Release one lease or many; many at once share one fence event per stream. ``idle``:
        the caller has synchronized the device since the pages' last use, so every use has
        completed and no fence is recorded (a poisoning pool fences anyway: its poison is
        ordered by the fence)."""
        batch = [leases] if isinstance(leases, DeviceKVPageLease) else list(leases)
        if not batch:
            return  # nothing to give back (no fence to record either)
        handles = []
        for lease in batch:
            if lease._released:
                raise StaleHandleError(f"page {lease.handle.index} lease was already released")
            self.check(lease.handle)
            handles.append(lease.handle)
        self._release(handles, fence=not idle or self.poison is not None)
        for lease in batch:
            lease._released = True

    def _release(self, handles: Sequence[DeviceKVPageHandle], fence: bool = True) -> None:
        indices = [h.index for h in handles]
        if self.caching:
            self._cache_pages(indices, gate=fence)
        else:
            masks = [int(self._users[i]) for i in indices] if len(indices) <= SMALL_BATCH \
                else self._users[np.asarray(indices, np.int64)].tolist()
            if self.defects.release_fence and fence:
                self._fence(indices, masks)
            if self.poison is not None:
                self._poison(indices, masks)
            users, give = self._users, self._free.give
            for i in indices:
                users[i] = 0
                give(i)
        leased = self._leased
        for i in indices:
            leased[i] = False
        # The one thing a release does that differs every time: a device program issuing it
        # again counts the generations again (see Device.reissued), and stores them anew.
        self.device.reissued(self._next_generation, indices)
        lo, hi = min(indices), max(indices) + 1
        self.device.host_write(self.generations, lo * GENERATION_BYTES,
                               self._generation[lo:hi], live=True)
        if self.device.oplog.active:
            self.device.unlabel(self.buffer, self._byte_runs(sorted(indices)))

    def _cache_pages(self, indices: list[int], gate: bool = True) -> None:
        """A caching pool's release: one event recorded on each stream record_stream named for
        these pages, each page back on its stream's list, kept back by its streams' events
        (poisoned at once on its stream when nothing keeps it back). ``gate=False``: the
        device is idle, nothing needs keeping back."""
        recorded = self._recorded
        masks = [int(recorded[i]) if gate else 0 for i in indices]
        free = []
        for i, carried in zip(indices, self._record_on(masks)):
            recorded[i] = 0
            self._cache.give(int(self._home[i]), i, carried)
            if not carried:
                free.append(i)
        if self.poison is not None and free:
            self._poison_on_home(free)

    def _next_generation(self, indices: list[int]) -> None:
        """The released pages' next generation (the caller stores it in the mirror the table
        reader checks against)."""
        generation = self._generation
        for i in indices:
            generation[i] += 1

    def state_key(self) -> tuple[object, ...]:
        """Everything the pool's decisions depend on but the generations: two moments with the
        same key lease the same pages, fence them the same way and issue the same device
        calls (so a device program captured at one is right at the other)."""
        return (tuple(self._free.runs), self._reserved, self._leased.tobytes(),
                self._users.tobytes(), self._fenced.tobytes(),
                tuple(sorted((i, tuple(e.id for e in fence))
                             for i, fence in self._fences.items())),
                tuple(sorted(self._event_refs.items())),
                tuple(sorted(i for i, _ in self._idle_events)),
                tuple(s.id for s in self._streams), tuple(sorted(self._staging)),
                self._cache.state_key(), self._home.tobytes(), self._recorded.tobytes())

    def byte_runs(self, handles: Sequence[DeviceKVPageHandle]) -> list[tuple[int, int]]:
        """Where these pages' bytes lie in the pool's buffer: (offset, nbytes) runs, one per
        run of adjacent pages, in the handles' order (what a kernel of the caller's own is
        given, one span a run)."""
        for handle in handles:
            self.check(handle)
        return self._byte_runs([h.index for h in handles])

    def _byte_runs(self, indices: Sequence[int]) -> list[tuple[int, int]]:
        """Sorted page indices as (offset, nbytes) runs of consecutive pages."""
        runs: list[tuple[int, int]] = []
        stride = self.page_stride
        for i in indices:
            if runs and runs[-1][0] + runs[-1][1] == i * stride:
                runs[-1] = (runs[-1][0], runs[-1][1] + stride)
            else:
                runs.append((i * stride, stride))
        return runs

    def _fence(self, indices: list[int], masks: list[int]) -> None:
        """Record one event on each stream that used any of these pages, and make each page
        carry the events of its own users: whoever gets the page next waits for them."""
        fences, fenced = self._fences, self._fenced
        for index, carried in zip(indices, self._record_on(masks)):
            if carried:
                fences[index] = carried + fences.get(index, ())
                fenced[index] = True

    def _record_on(self, masks: list[int]) -> list[tuple[Event, ...]]:
        """Record one event on each stream any of ``masks`` names (a page's streams, as bits of
        self._streams), and give each page the events of its own streams, counted as held by
        it until :meth:`_unref`."""
        union = 0
        for mask in masks:
            union |= mask
        if not union:
            return [()] * len(masks)
        events: dict[int, Event] = {}
        streams, record = self._streams, self.device.record_event
        rest = union
        while rest:  # the set bits only: a page's users are a few of the pool's streams
            low = rest & -rest
            rest ^= low
            event = self._take_event()
            record(event, streams[low.bit_length() - 1])
            events[low] = event
        by_mask: dict[int, tuple[Event, ...]] = {0: ()}
        refs, out = self._event_refs, []
        for mask in masks:
            carried = by_mask.get(mask)
            if carried is None:
                carried = by_mask[mask] = tuple(e for low, e in events.items() if mask & low)
            for event in carried:
                refs[event.id] = refs.get(event.id, 0) + 1
            out.append(carried)
        return out

    def _unref(self, event: Event) -> None:
        """A page no longer waits on ``event``: once none does, it may be recorded again."""
        refs = self._event_refs
        refs[event.id] -= 1
        if not refs[event.id]:
            del refs[event.id]
            heapq.heappush(self._idle_events, (event.id, event))

    def _poison(self, indices: list[int], masks: list[int]) -> None:
        """Fill released pages with the poison byte as soon as the pool's own ordering allows,
        so a stale reader sees poison instead of plausible data.

        With the release fence, the poison runs on a stream of its own that waits for every
        earlier user of the pages, and the next user waits for the poison: a correct pool never
        shows it. Without the fence, the pool's only ordering is stream order (a stream-unaware
        allocator assumes each page lives on one stream): pages that one stream used are
        poisoned on that stream, behind its work; pages used from several streams, whose
        reuse nothing orders, are poisoned at once on the poison stream, over whatever of the
        old owner is still in flight."""
        if self.defects.release_fence:
            stream = self._own_poison_stream()
            fenced = [i for i in indices if self._fenced[i]]
            if fenced:
                self._wait_fences(fenced, stream)
            self._memset_pages(np.sort(np.asarray(indices, np.int64)), self.poison or 0, stream)
            self._fence(indices, [int(self._stream_bit(stream))] * len(indices))
            return
        by_stream: dict[int, list[int]] = {}
        for index, mask in zip(indices, masks):
            single = mask and not mask & (mask - 1)
            key = mask.bit_length() - 1 if single else -1
            by_stream.setdefault(key, []).append(index)
        for key, group in by_stream.items():
            stream = self._streams[key] if key >= 0 else self._own_poison_stream()
            self._memset_pages(np.sort(np.asarray(group, np.int64)), self.poison or 0, stream)

    def _own_poison_stream(self) -> Stream:
        if self._poison_stream is None:
            self._poison_stream = self.device.create_stream("(poison)")
        return self._poison_stream

    def _take_event(self) -> Event:
        """A fence event: a recycled one when there is one. An event may be recorded again
        once every wait on its last record has been issued: CUDA waits on the record current
        when cudaStreamWaitEvent is called, not on later ones."""
        if self._idle_events:
            return heapq.heappop(self._idle_events)[1]
        self._events += 1
        return self.device.create_event(f"release-fence-{self._events}")

    def check(self, handle: DeviceKVPageHandle) -> None:
        """Raise StaleHandleError unless ``handle`` names a leased page at its generation."""
        if not 0 <= handle.index < self.pages:
            raise StaleHandleError(f"page {handle.index} is not in this pool of {self.pages}")
        if not self._leased[handle.index] or \
                int(self._generation[handle.index]) != handle.generation:
            raise StaleHandleError(
                f"page {handle.index} generation {handle.generation} is stale (now generation "
                f"{self._generation[handle.index]}, "
                f"{'leased again' if self._leased[handle.index] else 'free'})"
            )

    def generation(self, index: int) -> int:
        return int(self._generation[index])

    def page_offset(self, handle: DeviceKVPageHandle) -> int:
        self.check(handle)
        return handle.index * self.page_stride

    # ---- stream ordering -----------------------------------------------------------------------
    def use(self, handles: Sequence[DeviceKVPageHandle], stream: Stream) -> None:
        """Before a kernel of the caller's own touches these pages on ``stream``: what the
        pool does before each of its own ops on pages (the stream waits for the pages'
        release fences, and is a user whose work the next release fences)."""
        self._use(handles, stream)

    def _use(self, handles: Sequence[DeviceKVPageHandle],
             stream: Stream) -> list[int] | np.ndarray:
        """Before ``stream`` touches these pages: validate them, make the stream wait for their
        release fences (once each), and remember the stream as a user for the next release.
        Returns the page indices: a list for a few pages, where a plain loop beats numpy's
        per-call cost (it sits inside every race window), an array for many."""
        # A caching pool orders nothing here: what its allocator knows of a page's users is
        # the stream it was allocated on and what record_stream said.
        bit = np.uint64(0) if self.caching else self._stream_bit(stream)
        if len(handles) <= SMALL_BATCH:
            return self._use_few(handles, stream, bit)
        n = len(handles)
        idx = np.fromiter((h.index for h in handles), np.int64, n)
        gen = np.fromiter((h.generation for h in handles), np.int64, n)
        if idx.min() < 0 or idx.max() >= self.pages or not self._leased[idx].all() \
                or (self._generation[idx] != gen).any():
            for handle in handles:
                self.check(handle)  # raises, naming the first bad handle
        fenced = idx[self._fenced[idx]]
        if len(fenced):
            self._wait_fences(fenced.tolist(), stream)
        self._users[idx] |= bit
        return idx

    def _use_few(self, handles: Sequence[DeviceKVPageHandle], stream: Stream,
                 bit: np.uint64) -> list[int]:
        leased, generation, fenced, users = self._leased, self._generation, self._fenced, \
            self._users
        indices = []
        waiting = []
        for handle in handles:
            i = handle.index
            if not 0 <= i < self.pages or not leased[i] or generation[i] != handle.generation:
                self.check(handle)
            if fenced[i]:
                waiting.append(i)
            users[i] |= bit
            indices.append(i)
        if waiting:
            self._wait_fences(waiting, stream)
        return indices

    def _wait_fences(self, indices: list[int], stream: Stream) -> None:
        waited: set[int] = set()
        for index in indices:
            for event in self._fences.pop(index, ()):
                if event.id not in waited:
                    self.device.wait_event(stream, event)
                    waited.add(event.id)
                self._unref(event)
            self._fenced[index] = False

    def _stream_bit(self, stream: Stream) -> np.uint64:
        bit = self._stream_bits.get(stream.id)
        if bit is None:
            if len(self._streams) == 64:
                raise PoolExhaustedError("a pool tracks at most 64 streams")
            bit = np.uint64(1) << np.uint64(len(self._streams))
            self._streams.append(stream)
            self._stream_bits[stream.id] = bit
        return bit

    # ---- transfers -----------------------------------------------------------------------------
    def copy_from_host(self, host: HostKVAllocationView,
                       handles: Sequence[DeviceKVPageHandle], stream: Stream,
                       *, host_page: int = 0) -> None:
        """Copy host pages ``host_page...`` into the pages ``handles``, on ``stream``."""
        self._transfer(host, handles, stream, host_page, to_device=True)

    def copy_to_host(self, handles: Sequence[DeviceKVPageHandle], host: HostKVAllocationView,
                     stream: Stream, *, host_page: int = 0) -> None:
        """Copy the pages ``handles`` into host pages ``host_page...``, on ``stream``."""
        self._transfer(host, handles, stream, host_page, to_device=False)

    def _transfer(self, host: HostKVAllocationView, handles: Sequence[DeviceKVPageHandle],
                  stream: Stream, host_page: int, *, to_device: bool) -> None:
        allocation = host.allocation
        layout = allocation.layout
        if layout is not self._layout_seen:
            if layout.page_stride != self.page_stride or \
                    layout.plane_offsets != self.geometry.plane_offsets:
                raise GeometryError("the host layout does not match the pool's page geometry; "
                                    "plan it with plan_host_kv_page_layout(pool.geometry)")
            self._layout_seen = layout
        if host_page < 0 or host_page + len(handles) > allocation.pages:
            raise GeometryError(f"{len(handles)} pages from host page {host_page} overrun the "
                                f"host allocation of {allocation.pages} pages")
        indices = self._use(handles, stream)
        # One page is one run (the usual case inside a race window): no planning for it.
        runs = [PageRun(0, int(indices[0]), 1, 1)] if len(indices) == 1 else \
            plan_runs(indices, limit=DIRECT_RUN_LIMIT)
        if runs is None:
            self._staged(host, host_page, np.asarray(indices, np.int64), stream, to_device)
        else:
            for run in runs:
                self._copy_run(host, host_page, run, stream, to_device)

    def _copy_run(self, host: HostKVAllocationView, host_page: int, run: PageRun,
                  stream: Stream, to_device: bool) -> None:
        dev, stride = self.buffer, self.page_stride
        h_off = host.page_offset(host_page + run.host_page)
        d_off = run.first * stride
        if run.step == 1:
            n = run.count * stride
            if to_device:
                self.device.copy(dev, d_off, host.buffer, h_off, n, stream)
            else:
                self.device.copy(host.buffer, h_off, dev, d_off, n, stream)
        elif to_device:
            self.device.copy_2d(dev, d_off, run.step * stride, host.buffer, h_off, stride,
                                stride, run.count, stream)
        else:
            self.device.copy_2d(host.buffer, h_off, stride, dev, d_off, run.step * stride,
                                stride, run.count, stream)

    def _staged(self, host: HostKVAllocationView, host_page: int, indices: np.ndarray,
                stream: Stream, to_device: bool) -> None:
        """Scattered pages: one contiguous copy through a staging buffer and one scatter (or
        gather) kernel per staging-sized piece, all on ``stream`` so the staging buffer's reuse
        is ordered."""
        stride = self.page_stride
        staging = self._staging_for(stream, len(indices) * stride)
        per_piece = staging.nbytes // stride
        for lo in range(0, len(indices), per_piece):
            part = indices[lo:lo + per_piece]
            offsets = part * stride
            h_off = host.page_offset(host_page + lo)
            n = len(part) * stride
            if to_device:
                self.device.copy(staging, 0, host.buffer, h_off, n, stream)
                self.device.launch(Scatter(staging, 0, self.buffer, offsets, stride), stream)
            else:
                self.device.launch(Gather(self.buffer, offsets, staging, 0, stride), stream)
                self.device.copy(host.buffer, h_off, staging, 0, n, stream)

    def _staging_for(self, stream: Stream, nbytes: int) -> Buffer:
        want = max(self.page_stride, min(nbytes, STAGING_BYTES) // self.page_stride
                   * self.page_stride)
        have = self._staging.get(stream.id)
        if have is None or have.nbytes < want:
            # A larger buffer replaces the old one only after the stream is done with it.
            if have is not None:
                self.device.synchronize_stream(stream)
            have = self.device.alloc(want, name=f"staging-{stream.name}")
            self._staging[stream.id] = have
        return have

    def copy_page(self, src: DeviceKVPageHandle, dst: DeviceKVPageHandle,
                  stream: Stream) -> None:
        """Copy one page's bytes to another page, on ``stream`` (copy-on-write of a tail)."""
        self._use((src, dst), stream)
        self.device.copy(self.buffer, dst.index * self.page_stride, self.buffer,
                         src.index * self.page_stride, self.page_stride, stream)

    def zero_pages(self, handles: Sequence[DeviceKVPageHandle], stream: Stream) -> None:
        """Set the pages to zero on ``stream``; one memset per contiguous run."""
        self._memset_pages(np.sort(np.asarray(self._use(handles, stream), np.int64)), 0, stream)

    def _memset_pages(self, indices: np.ndarray, value: int, stream: Stream) -> None:
        """Set whole pages (sorted indices) to ``value`` on ``stream``, a memset per run."""
        for run in plan_runs(indices) or ():
            if run.step == 1:
                self.device.memset(self.buffer, run.first * self.page_stride,
                                   run.count * self.page_stride, value, stream)
            else:
                for k in range(run.count):
                    self.device.memset(self.buffer, (run.first + k * run.step) * self.page_stride,
                                       self.page_stride, value, stream)

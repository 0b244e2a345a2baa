"""The caching allocator's per-stream free lists, for a pool in ``allocator="caching"`` mode.

PyTorch's CUDA caching allocator (and CUB's, for a block's own stream) keeps a freed block for
the stream it was allocated on and hands it to that stream's next allocation at once: stream
order puts the new owner's work behind the old owner's, on that stream. Work the old owner
issued on another stream is not ordered so; ``record_stream`` tells the allocator of that
stream, which then records an event on it when the block is freed and keeps the block back
until a query sees the event complete. A block that another stream used without
``record_stream`` is handed out while that stream may still read or write it: the bug.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from kvcore.device.handles import Event


class StreamFreeLists:
    """Freed pages by the stream they were allocated on: ready ones (lowest first), and gated
    ones, each with the events recorded when it was freed, kept back until they complete."""

    def __init__(self) -> None:
        self._ready: dict[int, list[int]] = {}  # stream id -> sorted page indices
        self._gated: list[tuple[int, int, tuple[Event, ...]]] = []  # (stream id, page, events)

    @property
    def cached(self) -> int:
        """Pages held for some stream, ready or gated."""
        return sum(len(pages) for pages in self._ready.values()) + len(self._gated)

    def give(self, stream_id: int, page: int, events: tuple[Event, ...]) -> None:
        """A freed page of a lease allocated on ``stream_id``; with ``events``, kept back until
        a query sees every one complete."""
        if events:
            self._gated.append((stream_id, page, events))
        else:
            bisect.insort(self._ready.setdefault(stream_id, []), page)

    def reclaim(self, query: Callable[[Event], bool]) -> list[tuple[int, tuple[Event, ...]]]:
        """Make ready the gated pages whose events ``query`` sees complete (each event queried
        once, in the order the pages were freed); returns the pages and events let go."""
        if not self._gated:
            return []
        seen: dict[int, bool] = {}
        waiting, freed = [], []
        for stream_id, page, events in self._gated:
            done = True
            for event in events:
                if event.id not in seen:
                    seen[event.id] = query(event)
                done = done and seen[event.id]
            if done:
                bisect.insort(self._ready.setdefault(stream_id, []), page)
                freed.append((page, events))
            else:
                waiting.append((stream_id, page, events))
        self._gated = waiting
        return freed

    def gated_events(self) -> list[Event]:
        """The events that keep pages back, in the order the pages were freed, once each."""
        out: dict[int, Event] = {}
        for _, _, events in self._gated:
            for event in events:
                out.setdefault(event.id, event)
        return list(out.values())

    def take(self, stream_id: int, n: int) -> list[int]:
        """Up to ``n`` ready pages of ``stream_id``'s list, lowest first."""
        ready = self._ready.get(stream_id, [])
        taken, ready[:] = ready[:n], ready[n:]
        return taken

    def drop_all(self) -> tuple[list[int], list[tuple[int, tuple[Event, ...]]]]:
        """Every cached page, ready and gated, handed back (after the caller synchronized the
        device: what the allocator does when a stream's allocation finds nothing cached for
        it and no fresh memory); returns the pages and the gated ones' events."""
        pages = [page for ready in self._ready.values() for page in ready]
        gated = [(page, events) for _, page, events in self._gated]
        self._ready, self._gated = {}, []
        return pages + [page for page, _ in gated], gated

    def state_key(self) -> tuple[object, ...]:
        return (tuple(sorted((sid, tuple(p)) for sid, p in self._ready.items() if p)),
                tuple((sid, page, tuple(e.id for e in events))
                      for sid, page, events in self._gated))

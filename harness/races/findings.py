"""What the race detector finds and whom it names: the two ops of a race (:class:`OpRef`), a
race with its missing edge in words (:class:`Finding`), and who owned which bytes when
(:class:`Owners`), so a finding names the tensor, lease or buffer that held them, and the next
owner of memory given back and handed out again.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, NamedTuple

from harness.races.kinds import COLLECTIVE, FUNCTIONAL_COLLECTIVE
from harness.results.outcome import is_site, step_shape
from kvcore.bytemap import ByteMap
from kvcore.device import OpRecord
from kvcore.device.oplog import Segment, Template

HOST = "host"
"""The host's thread of the detector's clocks (every other thread is a stream, by name)."""

DEVICE_MEMORY = "device memory"
PINNED_MEMORY = "pinned host memory"
CAPTURED_MEMORY = frozenset({DEVICE_MEMORY, PINNED_MEMORY})
"""The buffers of a watched program's memory (harness.capture.translate): a finding names the
tensor that held the bytes, and the memory after it."""

class OpRef(NamedTuple):
    """One side of a finding: which op, where it came from, what bytes it touched. (A named
    tuple: one is built for every access that races.) ``origin`` is the scenario line that
    issued it (``file:line:col``), ``site`` the Python line."""

    seq: int
    stream: str
    kind: str
    step: str | None
    site: str | None
    write: bool
    offset: int
    length: int
    origin: str | None = None

    @property
    def who(self) -> str:
        side = "the host" if self.stream == HOST else self.stream
        verb = "write" if self.write else "read"
        at = "" if not self.step else f" at {self.step}" if is_site(self.step) else \
            f" at step {self.step}"
        return f"{side}'s {verb} ({self.kind}{at})"

    @property
    def at(self) -> str:
        """The op as a place: its step, or its sequence number."""
        return self.step or f"op {self.seq}"

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "stream": self.stream, "kind": self.kind, "step": self.step,
                "site": self.site, "origin": self.origin,
                "access": "write" if self.write else "read",
                "bytes": [self.offset, self.offset + self.length]}


@dataclass(frozen=True)
class Owner:
    """Who held some bytes of a buffer, from one op to another: a lease, a pinned buffer, a
    table row (``name`` says which, in the scenario's words)."""

    lo: int
    hi: int
    name: str
    since: int  # seq of the alloc (0: held when the trace began)
    until: int | None = None  # seq of the free
    freed_at: str | None = None  # the step that gave the bytes back
    stream: str | None = None  # the stream a caching allocator handed the bytes out on


class _Held(NamedTuple):
    """What a live owner's bytes hold in the byte map (its range is the map's)."""

    name: str
    since: int
    stream: str | None


class Owners:
    """Every owner each buffer's bytes have had, so a finding can name the bytes as the
    scenario does, and say "reuse" only when bytes really were given back and handed out.

    A buffer's live owners are a :class:`ByteMap` (an alloc frees what it overlaps), so an
    alloc or a free finds what it overlaps by bisection: a long trial's thousands of leases
    cost no more each than its first. Owners that gave their bytes back are only looked
    through when a finding names its bytes."""

    def __init__(self) -> None:
        self._live: dict[int, ByteMap] = defaultdict(ByteMap)
        self._past: dict[int, list[Owner]] = defaultdict(list)
        self._snapshot: tuple[tuple[int, int, int, str], ...] | None = None

    def alloc(self, buffer: int, lo: int, hi: int, name: str, seq: int,
              stream: str | None = None) -> None:
        self.free(buffer, lo, hi, seq, None)
        self._snapshot = None
        self._live[buffer].put(lo, hi, _Held(name, seq, stream))

    def free(self, buffer: int, lo: int, hi: int, seq: int, step: str | None) -> None:
        live = self._live.get(buffer)
        if not live or lo >= hi:
            return
        self._snapshot = None
        past = self._past[buffer]
        # What stays outside [lo, hi) stays with its owner; the rest is the owner's past.
        for span in live.cut(lo, hi):
            held = span.value
            past.append(Owner(span.lo, span.hi, held.name, held.since, seq, step, held.stream))

    def at(self, buffer: int, offset: int, seq: int) -> Owner | None:
        """Who held byte ``offset`` of ``buffer`` when op ``seq`` ran."""
        live = self._live.get(buffer)
        span = live.at(offset) if live else None
        if span is not None and span.value.since <= seq:
            held = span.value
            return Owner(span.lo, span.hi, held.name, held.since, stream=held.stream)
        for owner in reversed(self._past.get(buffer, [])):
            if owner.lo <= offset < owner.hi and owner.since <= seq < owner.until:  # type: ignore
                return owner
        return None

    def apply(self, kind: str, detail: dict[str, Any], seq: int, step: str | None) -> None:
        """An ``alloc`` or ``free`` record: bytes handed to an owner, or given back."""
        buf, off, length = detail["range"]
        if kind == "alloc":
            self.alloc(buf, off, off + length, detail["name"], seq, detail.get("stream"))
        else:
            self.free(buf, off, off + length, seq, step)

    def replay(self, records: list[OpRecord | Segment]) -> None:
        """The ownership changes among ``records``, and nothing else of them: of a segment,
        only its alloc and free templates are read (its records are not built)."""
        for r in records:
            if type(r) is Segment:
                templates = r.templates
                for k in _owner_places(templates):
                    t = templates[k]
                    self.apply(t.kind, t.detail or {}, r.first_seq + k, t.step)
            elif r.kind in _OWNER_KINDS and r.stream == HOST:
                self.apply(r.kind, r.detail or {}, r.seq, r.step)

    def snapshot(self) -> tuple[tuple[int, int, int, str], ...]:
        """Who owns what now: the start of a trial, which its findings' names depend on (not
        since when: every owner at a trial's start came before all of its ops)."""
        if self._snapshot is None:  # kept until an owner changes: most trials change none
            self._snapshot = tuple((buf, span.lo, span.hi, span.value.name)
                                   for buf, live in self._live.items() for span in live)
        return self._snapshot

    def forget_past(self) -> None:
        """Drop the owners that gave their bytes back: no access of a past trial is left to
        name (a GPU's world lives for thousands of trials)."""
        if self._past:
            self._past.clear()


@dataclass
class Finding:
    """Two unordered conflicting accesses, and the edge that is missing.

    ``buffer`` is kvcore's buffer; ``owner`` who held the bytes at the second access (a lease,
    a pinned buffer of the scenario), ``first_owner`` at the first when that was someone else
    (``reused``: the first owner gave the bytes back and they were handed out again).
    ``event_note`` explains a wait that was meant to order the two and did not."""

    buffer: str
    space: str
    page: int | None
    first: OpRef
    second: OpRef
    count: int = 1
    owner: str | None = None
    first_owner: str | None = None
    reused: bool = False
    freed_at: str | None = None
    event_note: str | None = None
    legacy_note: str | None = None
    legacy_first: bool = False  # the first side ran on the legacy default stream
    allocated_on: str | None = None  # the stream a caching allocator gave the first owner on

    @property
    def key(self) -> tuple[Any, ...]:
        """What makes two findings the same race: the buffer and both ops' stream, kind and
        step, with numbers in steps ignored (request 1 and request 2 race the same way)."""
        return (self.buffer, self.first.stream, self.first.kind,
                step_shape(self.first.step), self.second.stream, self.second.kind,
                step_shape(self.second.step))

    @property
    def where(self) -> str:
        """The bytes, as the scenario calls them."""
        pinned = self.owner is not None and self.owner.startswith("buffer ")
        if pinned:
            place = f"pinned {self.owner}"
        elif self.owner is not None and self.buffer in CAPTURED_MEMORY:
            # A watched program's bytes: the tensor is the place, its memory the detail.
            place = f"{self.owner} ({self.buffer})"
        else:
            place = ("pinned buffer " if self.space == "host" else "") + self.buffer + (
                f" page {self.page}" if self.page is not None else "")
        notes = [self.owner] if self.owner and not pinned and \
            self.buffer not in CAPTURED_MEMORY else []
        if self.reused:
            freed = "" if not self.freed_at else f" at {self.freed_at}" \
                if is_site(self.freed_at) else f" at step {self.freed_at}"
            notes.append(f"{self.first_owner} gave it back{freed} and it was handed out again"
                         if self.first_owner != self.owner else
                         f"given back{freed} and handed out again")
        return place + (f" ({'; '.join(notes)})" if notes else "")

    @functools.cached_property
    def missing(self) -> str:
        """The missing edge, in words, with the fix that fits the race (worked out once)."""
        a, b = self.first, self.second
        head = f"nothing orders {a.who} before {b.who} on {self.where}"
        if self.event_note:
            return f"{head}: {self.event_note}"
        follower = "the host" if b.stream == HOST else b.stream
        if a.kind.startswith(FUNCTIONAL_COLLECTIVE) and not self.reused:
            # A functional collective's Work is its result's: only wait_tensor orders it.
            return (f"{head}; wait for the result of "
                    f"{a.kind[len(FUNCTIONAL_COLLECTIVE):]} at {a.at} "
                    "(torch.ops._c10d_functional.wait_tensor, which an AsyncCollectiveTensor "
                    f"calls at its first use) before {b.at}: the collective runs on its "
                    f"process group's stream, which {follower} follows only from that wait")
        if a.kind.startswith(COLLECTIVE) and not self.reused:
            # The collective's own stream: only the program's wait on its work orders it.
            return (f"{head}; call wait() on the work that {a.kind[len(COLLECTIVE):]} at "
                    f"{a.at} returned (async_op=True; in a coalescing manager, the manager's) "
                    f"before {b.at}, or issue it without async_op: the collective runs on "
                    f"its process group's stream, which {follower} follows only from that "
                    "wait")
        if a.stream != HOST and b.stream != HOST and self.reused and \
                self.allocated_on not in (None, a.stream):
            # A caching allocator orders a freed block's reuse by the stream it handed the
            # block out on, and by the streams record_stream named: this one it was not told.
            freed = " before its release" + (
                "" if not self.freed_at else f" at {self.freed_at}" if is_site(self.freed_at)
                else f" at step {self.freed_at}")
            return (f"{head}; the caching allocator handed {self.first_owner} out on "
                    f"{self.allocated_on} and gave its bytes to {self.allocated_on}'s next "
                    f"allocation at once: record it on {a.stream} (record_stream){freed}, so "
                    f"that its bytes are handed out again only once {a.stream}'s work queued "
                    f"by then is done, or allocate it on {a.stream} instead (or make "
                    f"{self.allocated_on} wait for an event recorded on {a.stream} after "
                    f"{a.at} before the release)")
        if a.stream != HOST and b.stream != HOST:
            reuse = f" before {b.at} reuses the bytes" if self.reused else f" before {b.at}"
            if self.reused and self.page is not None:
                reuse += " (what a release with a fence does: kvcore's release_fence)"
            note = f" ({self.legacy_note})" if self.legacy_note else ""
            copy, other = (a, b) if self.legacy_first else (b, a)
            if self.legacy_note and copy.kind.startswith("copy") and not self.reused:
                # What engines do (PyTorch's own copies, #210's fix, HIP libraries' memcpy
                # on the handle's stream): the copy goes on the other side's stream, where
                # stream order covers it.
                role = "reads what it wrote" if copy is a else "wrote what it reads"
                return (f"{head}; issue the copy at {copy.at} on {other.stream}, the stream "
                        f"that {role}, instead of the legacy default stream (or record an "
                        f"event on {a.stream} after {a.at} and make {b.stream} wait on it "
                        f"before {b.at}){note}")
            return (f"{head}; record an event on {a.stream} after {a.at} and make {b.stream} "
                    f"wait on it{reuse}{note}")
        if b.stream == HOST and b.write and self.reused:
            return (f"{head}; {self.first_owner} was given back while {a.stream}'s "
                    f"{'copy' if a.kind.startswith('copy') else a.kind} still used it: give "
                    f"it back only after an event recorded on {a.stream} after {a.at} has "
                    "completed (host_free after: the event, as a caching host allocator "
                    "does), or synchronize before giving it back")
        if b.stream == HOST and b.write and not a.write:
            reader = "copy" if a.kind.startswith("copy") else "kernel"
            return (f"{head}; synchronize on the {reader}'s event (record one on {a.stream} "
                    f"after {a.at}) before the host rewrites the buffer at {b.at}, or write "
                    "into a fresh buffer")
        if b.stream == HOST and b.write:
            return (f"{head}; synchronize on an event recorded on {a.stream} after {a.at} "
                    f"before the host writes the buffer at {b.at}")
        if b.stream == HOST:
            return (f"{head}; synchronize on an event recorded on {a.stream} after {a.at} (or "
                    f"synchronize {a.stream}) before the host reads the buffer at {b.at}")
        return (f"{head}; the host's access must come after {b.stream}'s op is issued, or "
                f"{b.stream} must wait for it")

    def to_json(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "space": self.space, "page": self.page,
                "owner": self.owner, "first_owner": self.first_owner, "reused": self.reused,
                "first": self.first.to_json(), "second": self.second.to_json(),
                "missing": self.missing, "count": self.count}


_OWNER_KINDS = frozenset({"alloc", "free"})
_PLACES: dict[int, tuple[tuple[Any, ...], tuple[int, ...]]] = {}
_PLACES_MAX = 4096


def _owner_places(templates: tuple[Template, ...]) -> tuple[int, ...]:
    """Where a segment's templates hand out or give back bytes (the host's alloc and free),
    by the templates' identity: a piece of a program recurs trial after trial. The templates
    are held with their places, so no other tuple takes their id meanwhile."""
    known = _PLACES.get(id(templates))
    if known is None or known[0] is not templates:
        places = tuple(k for k, t in enumerate(templates)
                       if t.kind in _OWNER_KINDS and t.stream == HOST)
        if len(_PLACES) >= _PLACES_MAX:
            _PLACES.clear()
        known = _PLACES[id(templates)] = (templates, places)
    return known[1]

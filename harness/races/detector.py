"""The race detector: conflicting accesses that nothing orders, found from the op log alone.

Happens-before with vector clocks, one for the host and one per stream. The edges:
- program order: each stream runs its ops in issue order, and the host's actions are ordered;
- issue: an op is ordered after everything the host did before issuing it;
- event record / stream wait on the event (the state recorded when the wait was issued);
- stream, event and device synchronize: the host is ordered after what it waited for;
- the legacy stream's implicit barriers: an op on the legacy stream waits for everything issued
  before it to blocking streams, and an op on a blocking stream waits for the legacy stream.
  Non-blocking streams get no such edge (that is ninfer #210);
- synchronous copies (``Device.copy_sync``, cudaMemcpy) are a legacy-stream copy plus a host
  wait, so they get both edges above; from pageable memory (``copy_from_pageable``) there is no
  host wait, since the call may return before the DMA from CUDA's staging buffer lands.

Every access is a byte range of a device buffer or a pinned host buffer, the host's own reads and
writes included. History is kept per byte range, not per lease, so a page released and
materialized again keeps its past: the old owner's in-flight write still conflicts with the new
owner's. Two accesses conflict when their bytes overlap, at least one writes, and neither is
ordered before the other. Of the accesses one thread (a stream, the host) made that conflict
with an access and are not ordered before it, only the latest is reported: the edge that orders
it orders all the rest. The history of a buffer is stored in blocks (its pages, or 64 KiB),
grown in whole pages so that no buffer has more than ``HISTORY_MAX_BLOCKS``: the work of one
access is bounded whatever size a trace declares.

The detector works online (an op-log observer, during every trial) and offline over a recorded
trace (``gpurace check``); both feed it the same JSON-shaped op records. Online it keeps the
records and analyses them when the findings are read, after the trial: a reissued device
program's come as segments, unbuilt, and a trial whose records have the shape of one it analysed
before gets that trial's findings, renumbered, without building them.
"""

from __future__ import annotations

import bisect
import functools
import operator
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from harness.limits import HISTORY_MAX_BLOCKS
from harness.results.outcome import is_site, step_shape
from kvcore.device import Device, OpRecord
from kvcore.device.oplog import OpLog, Segment, expanded

HOST = "host"
HISTORY = 4096
"""Accesses remembered per block of a buffer (the oldest are forgotten first)."""
BLOCK = 1 << 16
"""Bytes per history block of a buffer that is not carved into pages (of a small buffer: a large
one's blocks grow, see :func:`history_block`)."""


def history_block(nbytes: int, page_bytes: int) -> int:
    """Bytes per history block of a buffer: a page (or BLOCK), or as many whole pages as keep
    the buffer within HISTORY_MAX_BLOCKS blocks."""
    base = page_bytes or BLOCK
    need = -(-nbytes // HISTORY_MAX_BLOCKS)
    return base if need <= base else -(-need // base) * base


DEVICE_MEMORY = "device memory"
PINNED_MEMORY = "pinned host memory"
CAPTURED_MEMORY = frozenset({DEVICE_MEMORY, PINNED_MEMORY})
"""The buffers of a watched program's memory (harness.capture.translate): a finding names the
tensor that held the bytes, and the memory after it."""
WAITS_KEPT = 64
"""Waits remembered per stream (and records per event), to explain a wait that missed."""


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


@dataclass
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


def _lo(owner: Owner) -> int:
    return owner.lo


class _Owners:
    """Every owner each buffer's bytes have had, so a finding can name the bytes as the
    scenario does, and say "reuse" only when bytes really were given back and handed out.

    A buffer's live owners hold disjoint ranges (an alloc frees what it overlaps), kept sorted,
    so an alloc or a free finds what it overlaps by bisection: a long trial's thousands of
    leases cost no more each than its first. Owners that gave their bytes back are only
    looked through when a finding names its bytes."""

    def __init__(self) -> None:
        self._live: dict[int, list[Owner]] = defaultdict(list)  # sorted by lo
        self._past: dict[int, list[Owner]] = defaultdict(list)
        self._snapshot: tuple[tuple[int, int, int, str], ...] | None = None

    def alloc(self, buffer: int, lo: int, hi: int, name: str, seq: int,
              stream: str | None = None) -> None:
        self.free(buffer, lo, hi, seq, None)
        self._snapshot = None
        live = self._live[buffer]
        owner = Owner(lo, hi, name, seq, stream=stream)
        live.insert(bisect.bisect_right(live, lo, key=_lo), owner)

    def free(self, buffer: int, lo: int, hi: int, seq: int, step: str | None) -> None:
        live = self._live.get(buffer)
        if not live or lo >= hi:
            return
        self._snapshot = None
        # The first live owner that may overlap [lo, hi): the last starting at or before lo.
        first = max(0, bisect.bisect_right(live, lo, key=_lo) - 1)
        end = first
        while end < len(live) and live[end].lo < hi:
            end += 1
        kept: list[Owner] = []
        for owner in live[first:end]:
            if not (owner.lo < hi and lo < owner.hi):
                kept.append(owner)
                continue
            # The part outside [lo, hi) stays with the owner, as a piece of its own.
            for a, b in ((owner.lo, lo), (hi, owner.hi)):
                if a < b:
                    kept.append(Owner(a, b, owner.name, owner.since, stream=owner.stream))
            owner.lo, owner.hi = max(owner.lo, lo), min(owner.hi, hi)
            owner.until, owner.freed_at = seq, step
            self._past[buffer].append(owner)
        kept.sort(key=_lo)
        live[first:end] = kept

    def at(self, buffer: int, offset: int, seq: int) -> Owner | None:
        """Who held byte ``offset`` of ``buffer`` when op ``seq`` ran."""
        live = self._live.get(buffer, [])
        i = bisect.bisect_right(live, offset, key=_lo) - 1
        if i >= 0 and live[i].lo <= offset < live[i].hi and live[i].since <= seq:
            return live[i]
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
                    self.apply(t[1], t[8] or {}, r.first_seq + k, t[7])
            elif r.kind in _OWNER_KINDS and r.stream == HOST:
                self.apply(r.kind, r.detail or {}, r.seq, r.step)

    def snapshot(self) -> tuple[tuple[int, int, int, str], ...]:
        """Who owns what now: the start of a trial, which its findings' names depend on (not
        since when: every owner at a trial's start came before all of its ops)."""
        if self._snapshot is None:  # kept until an owner changes: most trials change none
            self._snapshot = tuple((buf, o.lo, o.hi, o.name) for buf, live in self._live.items()
                                   for o in live)
        return self._snapshot

    def forget_past(self) -> None:
        """Drop the owners that gave their bytes back: no access of a past trial is left to
        name (a GPU's world lives for thousands of trials)."""
        if self._past:
            self._past.clear()


class _Record(NamedTuple):
    seq: int
    stream: str
    step: str | None
    clock: dict[str, int]


class _Wait(NamedTuple):
    seq: int
    event: str
    step: str | None
    used: _Record | None  # the event's latest record when it waited: the one a wait uses
    done: bool  # False: a host query that saw "not ready"


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


@dataclass
class _Buffer:
    name: str
    space: str
    role: str
    page_bytes: int
    block: int  # bytes per history block (history_block)


@dataclass
class _Stream:
    blocking: bool
    legacy: bool


class RaceDetector:
    """Feed it op records (``observe`` for OpRecords, ``observe_json`` for trace records);
    ``findings`` lists the races, folded by the pair of ops that raced."""

    def __init__(self, *, prune: bool = True, remember: bool = True) -> None:
        self._device: Device | None = None
        self.prune = prune
        self.remember = remember  # reuse a remembered trial's analysis (see _analyse)
        self._owners = _Owners()
        self._buffers: dict[int, _Buffer] = {}
        self._streams: dict[str, _Stream] = {}
        self._pending: list[OpRecord | Segment] = []
        self._unapplied: list[OpRecord | Segment] = []
        self._settled = False
        self._memo = _Memo()
        # What the memo's analyses knew of buffers and streams (see _declarations), and
        # whether a device attached since the memo was last checked against it.
        self._memo_of: tuple[Any, ...] | None = None
        self._memo_check = False
        self._folded: dict[tuple[Any, ...], Finding] = {}
        self._racing: set[int] = set()
        self.reset()

    def reset(self) -> None:
        """Forget the trial: it ends with the device idle, so no ordering carries over. Who
        owns which bytes does (a world's buffers outlive its trials)."""
        # Records of the last trial whose ownership changes were not applied (its findings
        # came from a remembered trial, or nobody asked for them): the owners carry over.
        if self._unapplied:
            if not self._settled:
                self._owners.replay(self._unapplied)
            self._unapplied = []
        if self._pending:
            self._owners.replay(self._pending)
            self._pending.clear()  # the list the op log appends to
        self._settled = False
        self._fresh = True  # nothing analysed since the reset: a remembered trial may apply
        if self._folded:
            self._folded = {}
        if self._racing:
            self._racing = set()  # ops that raced some earlier op
        self._racing_moved: tuple[set[int], int] | None = None  # a remembered trial's, moved
        self._moved: _Moved | None = None  # and its findings (see _folded_now)
        self._owners.forget_past()
        # The analysis's own state is made anew when an op is analysed (_clear): a trial
        # whose findings are remembered never needs it.
        self._stale = True

    def _clear(self) -> None:
        self._stale = False
        self._clock: dict[str, dict[str, int]] = defaultdict(dict)
        self._events: dict[str, dict[str, int]] = {}
        # (buffer, block) -> accesses: (thread, epoch, lo, hi, write, source) tuples
        self._history: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
        self._reported: set[tuple[int, int]] = set()
        self._waits: dict[str, list[_Wait]] = defaultdict(list)
        self._records: dict[str, list[_Record]] = defaultdict(list)
        # seq of a launched graph's node -> (the graph, the streams it was captured from and
        # launched on, the stream that captured the node, its step)
        self._launched: dict[int, tuple[str, str, str, str, str]] = {}

    # ---- what the detector knows of buffers, streams and owners --------------------------------
    def attach(self, device: Device) -> None:
        """Watch ``device``'s op log, from now on. The records are kept as they come and
        analysed when the findings are asked for: after the trial, off its race windows."""
        self._device = device
        device.record_call_sites = True
        self._owners = _Owners()  # a new device numbers its ops from 1 again
        self._pending.clear()
        self._unapplied, self._settled = [], False
        # Its buffers and streams are another device's: the memo holds only if they are
        # declared as the last device's were (a simulated device is new every trial, built
        # as the last one was), which the next analysis finds out once they are all declared.
        self._memo_check = True
        self._buffers, self._streams = {}, {}
        self.learn(device)
        for label in device.oplog.labels.live():
            self.owner(label.buffer, label.offset, label.length, label.name)
        # No call of ours per op, and a reissued program's records left unbuilt (segments)
        # unless they are analysed: a remembered trial's findings need only a few of them.
        device.oplog.subscribe(self._pending.append, segments=self._pending.append)

    def learn(self, device: Device) -> None:
        log = device.oplog
        self._streams = {}  # by name, as the log has them now (a stream may have been renamed)
        for info in log.buffers.values():
            self.buffer(info.id, info.name, info.space, info.role, log.page_bytes.get(info.id, 0),
                        info.nbytes)
        for s in log.streams.values():
            self.stream(s.name, s.blocking, s.legacy)

    def buffer(self, id: int, name: str, space: str, role: str, page_bytes: int = 0,
               nbytes: int = 0) -> None:
        self._buffers[id] = _Buffer(name, space, role, page_bytes,
                                    history_block(nbytes, page_bytes))

    def stream(self, name: str, blocking: bool, legacy: bool) -> None:
        self._streams[name] = _Stream(blocking, legacy)

    def owner(self, buffer: int, offset: int, length: int, name: str) -> None:
        """Bytes that already had an owner when the ops began (a trace's label records)."""
        self._owners.alloc(buffer, offset, offset + length, name, 0)

    # ---- the edges -----------------------------------------------------------------------------
    def observe(self, record: OpRecord) -> None:
        """Take one record of the watched device (analysed when the findings are read)."""
        self._pending.append(record)

    def _analyse(self) -> None:
        """Run the happens-before analysis over the records taken since it last ran. A trial
        whose records match a remembered one's in everything the analysis reads (not their
        numbers or times) gets that trial's findings, renumbered, without the analysis: on a
        GPU the same ops repeat trial after trial."""
        records = self._pending[:]
        self._pending.clear()
        if not records:
            return
        if self._fresh and self.remember:
            self._fresh = False
            if self._memo_check and self._device is not None:
                self._memo_check = False
                declared = _declarations(self._device.oplog)
                if declared != self._memo_of:
                    self._memo, self._memo_of = _Memo(), declared
            hit = self._memo.find(records, self._owners)
            if hit is not None:
                self._moved, self._racing_moved = hit[0], hit[1]
                self._unapplied = records  # their ownership changes: at the next reset,
                # unless the remembered trial gave back every byte it handed out (a trial of a
                # GPU's world does): then they change nothing.
                self._settled = hit[2]
                return
            start = self._owners.snapshot()
            entries, records = records, expanded(records)
            for record in records:
                self._one(record)
            self._memo.keep(entries, records, self.findings_now, self._racing, start,
                            self._owners.snapshot() == start)
            return
        if self._unapplied:
            # More records after a remembered trial's findings: analyse the whole trial.
            records = self._unapplied + records
            self._unapplied, self._folded, self._racing = [], {}, set()
            self._racing_moved = self._moved = None
            self._settled = False
        for record in expanded(records):
            self._one(record)

    def _one(self, record: OpRecord) -> None:
        if record.stream != HOST and record.stream not in self._streams:
            self.learn(self._device)  # a stream made since the last look
        self._op(record.seq, record.stream, record.kind, record.step, record.detail or {},
                 record.reads, record.writes, record.records, record.waits, record.syncs)

    def observe_json(self, op: dict[str, Any]) -> None:
        self._op(int(op["seq"]), str(op["stream"]), str(op["kind"]), op.get("step"),
                 op.get("detail") or {}, [tuple(r) for r in op.get("reads", [])],
                 [tuple(w) for w in op.get("writes", [])], op.get("records"), op.get("waits"),
                 op.get("syncs"))

    def _tick(self, thread: str) -> dict[str, int]:
        vc = self._clock[thread]
        vc[thread] = vc.get(thread, 0) + 1
        return vc

    def _op(self, seq: int, stream: str, kind: str, step: str | None, detail: dict[str, Any],
            reads: Iterable[tuple[int, int, int]], writes: Iterable[tuple[int, int, int]],
            records: str | None, waits: str | None, syncs: str | None) -> None:
        if self._stale:
            self._clear()
        if stream == HOST:
            if kind in _OWNER_KINDS:
                self._owners.apply(kind, detail, seq, step)
                return
            vc = self._tick(HOST)
            if kind == "sync_stream" and syncs is not None:
                _join(vc, self._clock[syncs])
            elif kind in ("sync_event", "event_query") and waits is not None:
                # A query that saw "done" orders the host after the record, as a synchronize
                # does; one that saw "not ready" orders nothing.
                done = kind == "sync_event" or bool(detail.get("done"))
                if done:
                    _join(vc, self._events.get(waits, {}))
                self._remember_wait(HOST, seq, waits, step, done)
            elif kind == "sync_device":
                for name in list(self._clock):
                    _join(vc, self._clock[name])
        else:
            vc = self._tick(stream)
            _join(vc, self._clock[HOST])  # issued by the host after all it did before
            info = self._streams.get(stream)
            if info is not None and info.legacy:
                for name, other in self._streams.items():
                    if other.blocking and not other.legacy:
                        _join(vc, self._clock[name])
            elif info is not None and info.blocking:
                for name, other in self._streams.items():
                    if other.legacy:
                        _join(vc, self._clock[name])
            if kind == "event_record" and records is not None:
                snapshot = self._events[records] = dict(vc)  # never changed after this
                kept = self._records[records]
                kept.append(_Record(seq, stream, step, snapshot))
                if len(kept) > WAITS_KEPT:
                    del kept[0]
            elif kind == "event_wait" and waits is not None:
                _join(vc, self._events.get(waits, {}))
                self._remember_wait(stream, seq, waits, step, True)
        if not reads and not writes:
            return
        # Who did it, once per op; an OpRef is built only for the accesses that race.
        graph = detail.get("graph")
        if graph is not None:  # a node of a launched CUDA graph: the step that captured it
            kind = f"{kind}, graph {graph}'s {detail.get('node')},"
            self._launched[seq] = (str(graph), str(detail.get("captured_on")),
                                   str(detail.get("launched_on")), str(detail.get("branch")),
                                   str(detail.get("node")))
        source = (seq, stream, kind, step, detail.get("site"), detail.get("origin"))
        epoch = vc[stream]
        for buf, off, length in reads:
            self._access(source, epoch, vc, buf, off, length, False)
        for buf, off, length in writes:
            self._access(source, epoch, vc, buf, off, length, True)

    def _remember_wait(self, thread: str, seq: int, event: str, step: str | None,
                       done: bool) -> None:
        kept = self._waits[thread]
        records = self._records.get(event)
        kept.append(_Wait(seq, event, step, records[-1] if records else None, done))
        if len(kept) > WAITS_KEPT:
            del kept[0]

    def _access(self, source: tuple[Any, ...], epoch: int, vc: dict[str, int], buf: int,
                off: int, length: int, write: bool) -> None:
        info = self._buffers.get(buf)
        if info is None and self._device is not None:
            self.learn(self._device)  # a buffer made since the last look
            info = self._buffers.get(buf)
        if info is None or info.role != "data" or length <= 0:
            return  # oracle buffers (the generation mirror) are checking state, not under test
        thread = source[1]
        lo, hi = off, off + length
        block = info.block
        # Of the unordered conflicting accesses of each other thread, only its latest is
        # reported: ordering this access after it orders it after all that thread did before
        # (program order), so the others add no edge to find and no fix to make.
        latest: dict[str, tuple[Any, ...]] = {}
        for b in range(lo // block, (hi - 1) // block + 1):
            key = (buf, b)
            history = self._history.get(key, ())
            kept = []
            for past in history:
                p_thread, p_epoch, p_lo, p_hi, p_write, _ = past
                ordered = p_thread == thread or p_epoch <= vc.get(p_thread, 0)
                if not ordered and p_lo < hi and lo < p_hi and (write or p_write):
                    seen = latest.get(p_thread)
                    if seen is None or seen[1] < p_epoch:
                        latest[p_thread] = past
                # An access ordered after a past one and covering its bytes stands for it from
                # now on, if it is a write or the past one was a read: whatever would race the
                # past access races this one too (an op issued later cannot be ordered before
                # it). A read cannot stand for a write: a later read would race only the write.
                if not (self.prune and ordered and (write or not p_write)
                        and lo <= p_lo and p_hi <= hi):
                    kept.append(past)
            kept.append((thread, epoch, lo, hi, write, source))
            if len(kept) > HISTORY:
                del kept[: len(kept) - HISTORY]
            self._history[key] = kept
        for past in latest.values():
            self._report(buf, info, info.page_bytes, past, (thread, epoch, lo, hi, write, source))

    # ---- findings ------------------------------------------------------------------------------
    def _report(self, buf: int, info: _Buffer, page_bytes: int, past: tuple[Any, ...],
                now: tuple[Any, ...]) -> None:
        first, second = _ref(past), _ref(now)
        pair = (first.seq, second.seq)
        self._racing.add(second.seq)
        if pair in self._reported:
            return  # the same two ops met again in another block
        self._reported.add(pair)
        start = max(past[2], now[2])
        page = start // page_bytes if page_bytes else None
        finding = Finding(info.name, info.space, page, first, second)
        folded = self._folded.get(finding.key)
        if folded is not None:
            folded.count += 1
            return
        self._name_bytes(finding, buf, start)
        finding.event_note = self._in_graph(first, second) \
            or self._explain_wait(past[0], past[1], first, second) \
            or self._wrong_stream(past[0], past[1], first, second) \
            or self._graph_stream(first, second)
        finding.legacy_note = self._legacy_note(first.stream, second.stream)
        legacy = self._streams.get(first.stream)
        finding.legacy_first = bool(finding.legacy_note and legacy is not None and legacy.legacy)
        self._folded[finding.key] = finding

    def _name_bytes(self, finding: Finding, buf: int, offset: int) -> None:
        before = self._owners.at(buf, offset, finding.first.seq)
        now = self._owners.at(buf, offset, finding.second.seq)
        finding.owner = now.name if now else None
        if before is not None and before is not now:
            finding.first_owner = before.name
            finding.reused = before.until is not None and before.until <= finding.second.seq
            finding.freed_at = before.freed_at
            finding.allocated_on = before.stream

    def _explain_wait(self, thread: str, epoch: int, first: OpRef, second: OpRef) -> str | None:
        """Why a wait of the second side did not order it after the first, when it meant to:
        the record that covers the first op came after the wait (a stale record), or the event
        was recorded again before the wait (an overwritten record), or the host's query of it
        saw "not ready" and went on."""
        for wait in reversed(self._waits.get(second.stream, ())):
            if wait.seq > second.seq:
                continue
            records = self._records.get(wait.event, [])
            covering = [r for r in records if r.clock.get(thread, 0) >= epoch]
            waited = "synchronize" if second.stream == HOST else "wait"
            at = wait.step or f"op {wait.seq}"
            if not covering:
                used = wait.used
                if used is not None and wait.done and used.stream == first.stream \
                        and used.seq < first.seq:
                    # Recorded on the right stream, but before the op it was meant to cover.
                    return (f"the {waited} at {at} used event {wait.event}'s record at "
                            f"{used.step or f'op {used.seq}'}, issued before {first.at}, so it "
                            f"covers nothing of it: record event {wait.event} after {first.at}")
                if used is None and wait.done and not records and first.stream != HOST:
                    # Never recorded when it was waited on: CUDA takes such an event as done.
                    return (f"the {waited} at {at} was on event {wait.event}, which had no "
                            f"record yet (an event never recorded counts as complete), so it "
                            f"covered nothing: record event {wait.event} on {first.stream} "
                            f"after {first.at}, before the {waited}")
                continue
            later = [r for r in covering if r.seq > wait.seq]
            if not wait.done:
                return (f"the host's query of event {wait.event} at {at} saw it not ready, and "
                        f"the host went on without waiting; synchronize on {wait.event} (or "
                        f"poll it until done) before {second.at}")
            if later:
                r = later[0]
                return (f"the {waited} at {at} used an earlier record of event {wait.event}; "
                        f"the record that covers {first.at} came after it (at "
                        f"{r.step or f'op {r.seq}'}): {waited} on {wait.event} only once that "
                        f"record is issued, or record it before the {waited}")
            used, mine = wait.used, covering[-1]
            if used is not None and used.seq > mine.seq:
                return (f"event {wait.event} was recorded again at {used.step or used.seq} on "
                        f"{used.stream} before the {waited} at {at}, and a {waited} uses only "
                        f"the latest record, so it did not cover the one at "
                        f"{mine.step or mine.seq} that covers {first.at}; record one event per "
                        f"stream and {waited} on each")
        return None

    def _wrong_stream(self, thread: str, epoch: int, first: OpRef, second: OpRef
                      ) -> str | None:
        """A wait that covers the first op, issued before the second on another stream than
        the second's (the gradient written on one stream, the reduce's wait made by the
        default stream while the reduce runs on its own)."""
        if second.stream == HOST:
            return None
        for stream, waits in self._waits.items():
            if stream in (second.stream, first.stream, HOST):
                continue
            for wait in waits:
                used = wait.used
                if wait.done and wait.seq < second.seq and used is not None \
                        and used.clock.get(thread, 0) >= epoch:
                    return (f"{stream} waited on event {wait.event} at "
                            f"{wait.step or f'op {wait.seq}'}, which covers {first.at}, but "
                            f"{second.at} runs on {second.stream}, which did not wait: make "
                            f"{second.stream} wait on {wait.event} before {second.at} (or "
                            f"issue {second.at} on {stream})")
        return None

    def _in_graph(self, first: OpRef, second: OpRef) -> str | None:
        """Two nodes of one launched graph, on branches its capture left unordered: the edge
        goes inside the capture, between the steps that captured them."""
        a, b = self._launched.get(first.seq), self._launched.get(second.seq)
        # One launch: the same graph on the same stream (launches there are in order, so two
        # of them never race).
        if a is None or b is None or a[0] != b[0] or a[2] != b[2]:
            return None
        return (f"both are nodes of graph {a[0]}, whose capture orders {a[3]}'s {a[4]} and "
                f"{b[3]}'s {b[4]} by no edge: record an event on {a[3]} after {a[4]} and make "
                f"{b[3]} wait on it before {b[4]}, inside the capture")

    def _graph_stream(self, first: OpRef, second: OpRef) -> str | None:
        """A side that is a node of a graph launched on another stream than the one it was
        captured from, the other side outside the graph: what orders the node is the launching
        stream (ordering by the capture stream, as if the graph ran there, is a bug of its
        own)."""
        for ref, other in ((first, second), (second, first)):
            launched = self._launched.get(ref.seq)
            # Two nodes of launched graphs race as their branches do, wherever launched.
            if launched is not None and launched[1] != launched[2] \
                    and other.seq not in self._launched:
                graph, captured, on = launched[:3]
                return (f"graph {graph} was captured from {captured} but launched on "
                        f"{on}: a graph's nodes run on the stream it is launched on, "
                        f"so {on}'s order covers them (or an event recorded on "
                        f"{on} after {ref.at}), not {captured}'s")
        return None

    def _legacy_note(self, first: str, second: str) -> str | None:
        a, b = self._streams.get(first), self._streams.get(second)
        if a is None or b is None or (a.legacy == b.legacy):
            return None
        other = second if a.legacy else first
        if (b if a.legacy else a).blocking:
            return None
        return (f"{other} is a non-blocking stream: it and the legacy stream do not wait for "
                "each other")

    @property
    def findings(self) -> list[Finding]:
        if self._pending:
            self._analyse()
        return list(self._folded_now().values())

    @property
    def findings_now(self) -> list[Finding]:
        """The findings of the records analysed so far."""
        return list(self._folded_now().values())

    def findings_json(self) -> list[dict[str, Any]]:
        """:attr:`findings`, each as its ``to_json()``: a remembered trial's made from its
        own JSON, no finding built (what a worker sends of every trial)."""
        if self._pending:
            self._analyse()
        moved = self._moved
        if moved is not None:
            found = moved[0].json_moved(moved[1], moved[2])
            if found is not None:
                return found
        return [finding.to_json() for finding in self.findings]

    def moved_by(self) -> tuple[object, int] | None:
        """When this trial's findings are a remembered trial's with nothing changed but the
        numbers of their ops, moved on by the same count (its ops were all in segments, and
        the words name them by their steps): that remembered trial, and the count. A worker
        that sent findings of the same remembered trial sends only how far they moved on
        (see :func:`shifted`)."""
        if self._pending:
            self._analyse()
        moved = self._moved
        if moved is None or not moved[0].by_shift():
            return None
        return moved[0], moved[1]

    def _folded_now(self) -> dict[tuple[Any, ...], Finding]:
        """The findings by key, a remembered trial's built for this one when first read."""
        moved = self._moved
        if moved is not None:
            self._folded, self._moved = moved[0].moved(moved[1], moved[2]), None
        return self._folded

    @property
    def racing(self) -> set[int]:
        """The sequence numbers of the ops that raced some earlier op."""
        self._analyse()
        if self._racing_moved is not None:  # a remembered trial's, numbered for this one
            racing, by = self._racing_moved
            self._racing, self._racing_moved = {seq + by for seq in racing}, None
        return self._racing


_OWNER_KINDS = frozenset({"alloc", "free"})
_PLACES: dict[int, tuple[tuple[Any, ...], tuple[int, ...]]] = {}
_PLACES_MAX = 4096


def _owner_places(templates: tuple[tuple[Any, ...], ...]) -> tuple[int, ...]:
    """Where a segment's templates hand out or give back bytes (the host's alloc and free),
    by the templates' identity: a piece of a program recurs trial after trial. The templates
    are held with their places, so no other tuple takes their id meanwhile."""
    known = _PLACES.get(id(templates))
    if known is None or known[0] is not templates:
        places = tuple(k for k, t in enumerate(templates)
                       if t[1] in _OWNER_KINDS and t[0] == HOST)
        if len(_PLACES) >= _PLACES_MAX:
            _PLACES.clear()
        known = _PLACES[id(templates)] = (templates, places)
    return known[1]
_EVENT_KINDS = frozenset({"event_record", "event_wait", "sync_event", "event_query"})

_shape_of = operator.itemgetter(1, 2, 3, 4, 5, 6, 7, 8)
"""What the analysis reads of every record: stream, kind, reads, writes, records, waits, syncs
and step (not its number, its times, or its detail, read only of the kinds below)."""
_DETAIL_KINDS = _OWNER_KINDS | {"event_query"}


def _shape(entries: list[OpRecord | Segment]) -> tuple[list[Any], list[Any]]:
    """What the analysis of ``entries`` depends on, for comparison with a remembered trial's
    (this runs every trial). A record stands as what the analysis reads of it, and its detail
    for the kinds whose detail it reads; a segment as its templates (the same run of the same
    program gives the same tuple, compared by identity; the analysis reads no detail of the
    records whose value was live, memsets)."""
    if type(entries[0]) is not Segment and Segment not in map(type, entries):
        return (list(map(_shape_of, entries)),
                [r.detail for r in entries if r.kind in _DETAIL_KINDS])  # type: ignore
    shape: list[Any] = []
    details: list[Any] = []
    for e in entries:
        if type(e) is Segment:
            shape.append(e[0])
        else:
            shape.append(_shape_of(e))
            if e.kind in _DETAIL_KINDS:  # type: ignore[union-attr]
                details.append(e.detail)  # type: ignore[union-attr]
    return shape, details


def _declarations(log: OpLog) -> tuple[Any, ...]:
    """Every buffer and stream an op log has declared, with the buffers' page strides: what an
    analysis knows of a device besides its records."""
    return (tuple(log.buffers.values()), tuple(log.streams.values()),
            tuple(log.page_bytes.items()))


def _span(entries: list[OpRecord | Segment]) -> tuple[int, int]:
    """The numbers of the first op of ``entries`` and of the one after the last (ops are
    numbered in order: they were numbered one after another when the span is their count)."""
    first, last = entries[0], entries[-1]
    lo = first[1] if type(first) is Segment else first[0]
    hi = last[1] + len(last[0]) if type(last) is Segment else last[0] + 1
    return lo, hi  # type: ignore[return-value]


def _places(entries: list[OpRecord | Segment]) -> list[int | None]:
    """Per op of ``entries``, the index of its record among them, or None for an op of a
    segment (whose detail is its template's, the same in every trial of the same shape)."""
    out: list[int | None] = []
    for k, e in enumerate(entries):
        if type(e) is Segment:
            out.extend([None] * len(e[0]))
        else:
            out.append(k)
    return out


@dataclass(slots=True)
class _Remembered:
    shape: tuple[list[Any], list[Any]]
    first_seq: int
    count: int  # ops
    # Per finding: its key, its fields, and how to move each of its ops to another trial
    # (_plan).
    findings: list[tuple[tuple[Any, ...], dict[str, Any], tuple[Any, ...], tuple[Any, ...]]]
    racing: set[int]
    owners: tuple[Any, ...]  # who owned what when the trial began
    neutral: bool  # and owned it again when it ended
    run: tuple[int, ...] | None  # its pieces' identities, when it was segments alone
    # Its findings' JSON, and how to move each one's ops (_plan; see json_moved); False: it
    # cannot be moved as JSON (the words of its missing edge name ops by their numbers).
    json: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any], tuple[Any, ...],
                     tuple[Any, ...]]] | bool | None = None
    shifts: bool | None = None  # see by_shift; None until asked

    def moved(self, shift: int, entries: list[OpRecord | Segment]
              ) -> dict[tuple[Any, ...], Finding]:
        """Its findings, by key, for a trial of its shape whose ops are numbered ``shift``
        on from its own, of ``entries``."""
        folded = {}
        for key, fields, a, b in self.findings:  # a loop: a comprehension costs a call
            # A copy with its ops moved: dataclasses.replace and OpRef._replace cost several
            # times as much, and this runs for every finding of every trial.
            copy = folded[key] = _new_finding(Finding)
            copy.__dict__ = fields.copy()
            copy.first = _new_ref(OpRef, (a[0] + shift,) + a[1]) if a[2] is None else \
                _moved_ref(a, entries)
            copy.second = _new_ref(OpRef, (b[0] + shift,) + b[1]) if b[2] is None else \
                _moved_ref(b, entries)
        return folded

    def json_moved(self, shift: int, entries: list[OpRecord | Segment]
                   ) -> list[dict[str, Any]] | None:
        """Its findings' JSON for the trial of ``entries``, numbered ``shift`` on from its
        own, from its own JSON, made once (None where they must be built: see :attr:`json`):
        a worker sends every bad trial's findings, and a trial of the same shape has the same
        but for numbers (and, of an op that was a record, its Python line and scenario line)."""
        known = self.json
        if known is None:
            if all("missing" in fields for _, fields, _, _ in self.findings):
                known = self.json = [(j, j["first"], j["second"], a, b) for (_, _, a, b), j in zip(
                    self.findings, (f.to_json() for f in self.moved(0, entries).values()))]
            else:
                known = self.json = False
        if known is False:
            return None
        out = []
        for whole, first, second, a, b in known:  # type: ignore[union-attr]
            one = whole.copy()  # copies all the way down: no trial's JSON is another's
            one["first"] = _moved_json(first, a, shift, entries)
            one["second"] = _moved_json(second, b, shift, entries)
            out.append(one)
        return out

    def by_shift(self) -> bool:
        """Whether its findings' JSON, moved to another trial of its shape, differs from its
        own only in its ops' numbers, each moved on by the same count: it has findings, the
        words of each name ops by their steps, and every op lay in a segment (an op that was
        a record takes that trial's Python and scenario lines)."""
        known = self.shifts
        if known is None:
            known = self.shifts = bool(self.findings) and all(
                "missing" in fields and a[2] is None and b[2] is None
                for _, fields, a, b in self.findings)
        return known


def shifted(findings: list[dict[str, Any]], by: int) -> list[dict[str, Any]]:
    """Findings' JSON with both ops of each numbered ``by`` on: a remembered trial's findings
    for a later trial of its shape (see :meth:`RaceDetector.moved_by`), as the parent of a
    worker makes them from the last it was sent in full."""
    out = []
    for whole in findings:  # a loop: a comprehension costs a call
        one = whole.copy()
        first, second = whole["first"], whole["second"]
        one["first"], one["second"] = _seq_moved(first, by), _seq_moved(second, by)
        out.append(one)
    return out


def _seq_moved(side: dict[str, Any], by: int) -> dict[str, Any]:
    """One side of a finding's JSON, its op numbered ``by`` on (a copy all the way down)."""
    return {**side, "seq": side["seq"] + by, "bytes": side["bytes"][:]}


_Moved = tuple[_Remembered, int, list[Any]]
"""A remembered trial's findings for another trial, not yet built: what it was, how far the
other's ops are numbered on from its own, the other's records."""


class _Memo:
    """The last few trials' analyses, by the shape of their records. A trial of the same shape
    gets the same findings with its own op numbers: the analysis reads nothing else, but for
    the owners' names (compared when there are findings) and op numbers written into a note
    (such a trial is not remembered)."""

    SIZE = 8

    def __init__(self) -> None:
        self._kept: list[_Remembered] = []  # the most recent first
        # The kept trials that were segments alone, by their templates' identities (they hold
        # them): a reissued trial comes as the same pieces, cut where the host blocked.
        self._by_run: dict[tuple[int, ...], _Remembered] = {}
        self._last: _Remembered | None = None  # the last of them a trial was found to be
        self.hits = 0

    def find(self, entries: list[OpRecord | Segment], owners: _Owners
             ) -> tuple[dict[tuple[Any, ...], Finding], tuple[set[int], int], bool] | None:
        """A remembered trial's findings for the trial of ``entries`` (by key, renumbered),
        its racing ops (and what moves their numbers to this trial's), and whether the trial
        leaves the owners as they were."""
        last = self._last  # most often the trial before: looked at first, with no key made
        if last is not None and _same_pieces(last.shape[0], entries):
            hit = self._hit(last, entries, owners)
            if hit is not None:
                return hit
        run = _run_key(entries)
        if run is not None:
            # A reissued trial: segments, whose templates are a kept trial's shape itself.
            kept = self._by_run.get(run)
            if kept is not None and _same_pieces(kept.shape[0], entries):
                hit = self._hit(kept, entries, owners)
                if hit is not None:
                    self._last = kept
                    return hit
        shape = _shape(entries)
        for kept in self._kept:
            if kept.shape == shape:
                hit = self._hit(kept, entries, owners)
                if hit is not None:
                    if kept is not self._kept[0]:  # the most recently used are kept longest
                        self._kept.remove(kept)
                        self._kept.insert(0, kept)
                    return hit
        return None

    def _hit(self, kept: _Remembered, entries: list[OpRecord | Segment], owners: _Owners
             ) -> tuple[_Moved, tuple[set[int], int], bool] | None:
        """``kept``'s findings for the trial of ``entries``, of the same shape (as what moves
        them to it: built only when read), unless they would name other owners or the
        trial's ops are not numbered one after another."""
        same_owners = (kept.findings or kept.neutral) and kept.owners == owners.snapshot()
        if kept.findings and not same_owners:
            return None  # its findings would name other owners
        first, end = _span(entries)
        if end - first != kept.count:
            return None
        self.hits += 1
        shift = first - kept.first_seq
        # The ownership changes leave the owners as they were only from the same start.
        return (kept, shift, entries), (kept.racing, shift), bool(kept.neutral and same_owners)

    def keep(self, entries: list[OpRecord | Segment], records: list[OpRecord],
             findings: list[Finding], racing: set[int], owners: tuple[Any, ...],
             neutral: bool) -> None:
        """Remember the analysis of the trial of ``entries`` (``records`` expanded)."""
        first, end = _span(entries)
        count = len(records)
        if end - first != count or any(f.event_note for f in findings) and any(
                r.step is None for r in records if r.kind in _EVENT_KINDS):
            return  # a note may name an op by its number
        places = _places(entries)
        plans = [(f.key, _fields(f), _plan(f.first, first, places),
                  _plan(f.second, first, places)) for f in findings]
        run = _run_key(entries)
        kept = _Remembered(_shape(entries), first, count, plans, set(racing), owners, neutral,
                           run)
        self._kept.insert(0, kept)
        for old in self._kept[self.SIZE:]:
            if old.run is not None and self._by_run.get(old.run) is old:
                del self._by_run[old.run]
            if self._last is old:
                self._last = None
        del self._kept[self.SIZE:]
        if run is not None:
            self._by_run[run] = kept


def _run_key(entries: list[OpRecord | Segment]) -> tuple[int, ...] | None:
    """The identities of the templates of ``entries``, when they are all segments (else None):
    a memo's key that costs no look at the templates themselves."""
    run = []
    for e in entries:
        if type(e) is not Segment:
            return None
        run.append(id(e[0]))
    return tuple(run)


def _same_pieces(shape: list[Any], entries: list[OpRecord | Segment]) -> bool:
    """Whether a kept trial's shape is the templates of ``entries`` themselves, all segments
    (a record's first field is its number, never a piece; the key's identities could be
    another's, reused, only if the kept trial did not hold them)."""
    if len(shape) != len(entries):
        return False
    for piece, entry in zip(shape, entries):
        if piece is not entry[0]:
            return False
    return True


def _fields(finding: Finding) -> dict[str, Any]:
    """A copy of a finding's fields, for the findings of later trials of the same shape (a
    copy: analysing later records of the trial may count more of it). Its missing edge in
    words goes with them when the words name both ops by their steps (not by number)."""
    fields = dict(finding.__dict__)
    if finding.first.step and finding.second.step:
        fields["missing"] = finding.missing
    else:
        fields.pop("missing", None)
    return fields


def _plan(ref: OpRef, first_seq: int, places: list[int | None]) -> tuple[Any, ...]:
    """How to move ``ref`` (of a trial whose first op was ``first_seq``) to another trial of
    the same shape: its number and the rest of it, and where its record lies among the
    entries (None: in a segment, so the rest stands as it is)."""
    return ref.seq, tuple(ref)[1:], places[ref.seq - first_seq]


def _moved_json(side: dict[str, Any], plan: tuple[Any, ...], shift: int,
                entries: list[OpRecord | Segment]) -> dict[str, Any]:
    """One side of a remembered finding's JSON, moved as :func:`_moved_ref` moves its op."""
    _, _, at = plan
    if at is None:  # its JSON was made for the remembered trial: its number is plan[0]
        return _seq_moved(side, shift)
    record = entries[at]
    detail = record.detail or {}  # type: ignore[union-attr]
    return {**side, "seq": record[0], "site": detail.get("site"),
            "origin": detail.get("origin"), "bytes": side["bytes"][:]}


def _moved_ref(plan: tuple[Any, ...], entries: list[OpRecord | Segment]) -> OpRef:
    """An op of a remembered finding, at the place of a record of ``entries``."""
    _, rest, at = plan
    record = entries[at]
    detail = record.detail or {}  # type: ignore[union-attr]
    return _new_ref(OpRef, (record[0], rest[0], rest[1], rest[2], detail.get("site"), rest[4],
                            rest[5], rest[6], detail.get("origin")))


_new_finding = object.__new__
_new_ref = tuple.__new__


def _ref(access: tuple[Any, ...]) -> OpRef:
    """The OpRef of a history entry (thread, epoch, lo, hi, write, source)."""
    _, _, lo, hi, write, (seq, stream, kind, step, site, origin) = access
    return OpRef(seq, stream, kind, step, site, write, lo, hi - lo, origin)


def _join(into: dict[str, int], other: dict[str, int]) -> None:
    for thread, value in other.items():
        if into.get(thread, 0) < value:
            into[thread] = value


def check_trace(records: Iterable[dict[str, Any]]) -> RaceDetector:
    """Run the detector over a trace's records (header, buffer, stream and op lines)."""
    detector = RaceDetector()
    for record in records:
        kind = record.get("type")
        if kind == "buffer":
            detector.buffer(int(record["id"]), str(record["name"]), str(record["space"]),
                            str(record.get("role", "data")), int(record.get("page_bytes", 0)),
                            int(record["nbytes"]))
        elif kind == "stream":
            detector.stream(str(record["name"]), bool(record["blocking"]),
                            bool(record["legacy"]))
        elif kind == "label":
            detector.owner(int(record["buffer"]), int(record["offset"]),
                           int(record["length"]), str(record["name"]))
        elif kind == "op":
            detector.observe_json(record)
    return detector



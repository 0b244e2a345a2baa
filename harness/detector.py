"""The race detector: conflicting accesses that nothing orders, found from the op log alone.

Happens-before with vector clocks, one for the host and one per stream. The edges:
- program order: each stream runs its ops in issue order, and the host's actions are ordered;
- issue: an op is ordered after everything the host did before issuing it;
- event record / stream wait on the event (the state recorded when the wait was issued);
- stream, event and device synchronize: the host is ordered after what it waited for;
- the legacy stream's implicit barriers: an op on the legacy stream waits for everything issued
  before it to blocking streams, and an op on a blocking stream waits for the legacy stream.
  Non-blocking streams get no such edge (that is ninfer #210).

Every access is a byte range of a device buffer or a pinned host buffer, the host's own reads and
writes included. History is kept per byte range, not per lease, so a page released and
materialized again keeps its past: the old owner's in-flight write still conflicts with the new
owner's. Two accesses conflict when their bytes overlap, at least one writes, and neither is
ordered before the other.

The detector works online (an op-log observer, during every trial) and offline over a recorded
trace (``gpurace check``); both feed it the same JSON-shaped op records.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from harness.outcome import step_shape
from kvcore.device import Device, OpRecord

HOST = "host"
HISTORY = 4096
"""Accesses remembered per block of a buffer (the oldest are forgotten first)."""
BLOCK = 1 << 16
"""Bytes per history block of a buffer that is not carved into pages."""


class OpRef(NamedTuple):
    """One side of a finding: which op, where it came from, what bytes it touched. (A named
    tuple: one is built for every access the detector sees.)"""

    seq: int
    stream: str
    kind: str
    step: str | None
    site: str | None
    write: bool
    offset: int
    length: int

    @property
    def who(self) -> str:
        side = "the host" if self.stream == HOST else self.stream
        verb = "write" if self.write else "read"
        at = f" at step {self.step}" if self.step else ""
        return f"{side}'s {verb} ({self.kind}{at})"

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "stream": self.stream, "kind": self.kind, "step": self.step,
                "site": self.site, "access": "write" if self.write else "read",
                "bytes": [self.offset, self.offset + self.length]}


@dataclass
class Finding:
    """Two unordered conflicting accesses, and the edge that is missing."""

    buffer: str
    space: str
    page: int | None
    first: OpRef
    second: OpRef
    count: int = 1

    @property
    def key(self) -> tuple[Any, ...]:
        """What makes two findings the same race: the buffer and both ops' stream, kind and
        step, with numbers in steps ignored (request 1 and request 2 race the same way)."""
        return (self.buffer, self.first.stream, self.first.kind,
                step_shape(self.first.step), self.second.stream, self.second.kind,
                step_shape(self.second.step))

    @property
    def missing(self) -> str:
        """The missing edge, in words, with the fix."""
        a, b = self.first, self.second
        where = f"{self.buffer}" + (f" page {self.page}" if self.page is not None else "")
        head = f"nothing orders {a.who} before {b.who} on {where}"
        at_a = f" after {a.step}" if a.step else ""
        before_b = f" before {b.step}" if b.step else ""
        if a.stream != HOST and b.stream != HOST:
            if self.page is not None:
                before_b = f" before reusing the page{' at ' + b.step if b.step else ''}"
            return (f"{head}; record an event on {a.stream}{at_a} and make {b.stream} wait on "
                    f"it{before_b}")
        if b.stream == HOST:
            return (f"{head}; synchronize {a.stream} (or an event recorded{at_a}) before the "
                    f"host touches these bytes")
        return (f"{head}; the host's access must come after {b.stream}'s op is issued, or "
                f"{b.stream} must wait for it")

    def to_json(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "space": self.space, "page": self.page,
                "first": self.first.to_json(), "second": self.second.to_json(),
                "missing": self.missing, "count": self.count}


@dataclass
class _Access:
    thread: str
    epoch: int
    lo: int
    hi: int
    ref: OpRef


@dataclass
class _Buffer:
    name: str
    space: str
    role: str
    page_bytes: int


@dataclass
class _Stream:
    blocking: bool
    legacy: bool


class RaceDetector:
    """Feed it op records (``observe`` for OpRecords, ``observe_json`` for trace records);
    ``findings`` lists the races, folded by the pair of ops that raced."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything: a trial ends with the device idle, so nothing carries over."""
        self._clock: dict[str, dict[str, int]] = defaultdict(dict)
        self._events: dict[str, dict[str, int]] = {}
        self._history: dict[tuple[int, int], list[_Access]] = defaultdict(list)
        self._buffers: dict[int, _Buffer] = {}
        self._streams: dict[str, _Stream] = {}
        self._folded: dict[tuple[Any, ...], Finding] = {}
        self._reported: set[tuple[int, int]] = set()

    # ---- what the detector knows of buffers and streams ----------------------------------------
    def attach(self, device: Device) -> None:
        """Watch ``device``'s op log, from now on."""
        self._device = device
        device.record_call_sites = True
        device.oplog.subscribe(self.observe)

    def learn(self, device: Device) -> None:
        log = device.oplog
        for info in log.buffers.values():
            self.buffer(info.id, info.name, info.space, info.role, log.page_bytes.get(info.id, 0))
        for s in log.streams.values():
            self.stream(s.name, s.blocking, s.legacy)

    def buffer(self, id: int, name: str, space: str, role: str, page_bytes: int = 0) -> None:
        self._buffers[id] = _Buffer(name, space, role, page_bytes)

    def stream(self, name: str, blocking: bool, legacy: bool) -> None:
        self._streams[name] = _Stream(blocking, legacy)

    # ---- the edges -----------------------------------------------------------------------------
    def observe(self, record: OpRecord) -> None:
        buffers = self._buffers
        if (record.stream != HOST and record.stream not in self._streams) or not all(
                a[0] in buffers for a in record.reads) or not all(
                a[0] in buffers for a in record.writes):
            self.learn(self._device)  # streams and buffers made since the last look
        self._op(record.seq, record.stream, record.kind, record.step,
                 record.detail.get("site") if record.detail else None,
                 record.reads, record.writes, record.records, record.waits, record.syncs)

    def observe_json(self, op: dict[str, Any]) -> None:
        detail = op.get("detail") or {}
        self._op(int(op["seq"]), str(op["stream"]), str(op["kind"]), op.get("step"),
                 detail.get("site"), [tuple(r) for r in op.get("reads", [])],
                 [tuple(w) for w in op.get("writes", [])], op.get("records"), op.get("waits"),
                 op.get("syncs"))

    def _tick(self, thread: str) -> dict[str, int]:
        vc = self._clock[thread]
        vc[thread] = vc.get(thread, 0) + 1
        return vc

    def _op(self, seq: int, stream: str, kind: str, step: str | None, site: str | None,
            reads: Iterable[tuple[int, int, int]], writes: Iterable[tuple[int, int, int]],
            records: str | None, waits: str | None, syncs: str | None) -> None:
        if stream == HOST:
            vc = self._tick(HOST)
            if kind == "sync_stream" and syncs is not None:
                _join(vc, self._clock[syncs])
            elif kind == "sync_event" and waits is not None:
                _join(vc, self._events.get(waits, {}))
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
                self._events[records] = dict(vc)
            elif kind == "event_wait" and waits is not None:
                _join(vc, self._events.get(waits, {}))
        epoch = vc[stream]
        for buf, off, length in reads:
            self._access(stream, epoch, vc, buf, off, length, False, seq, kind, step, site)
        for buf, off, length in writes:
            self._access(stream, epoch, vc, buf, off, length, True, seq, kind, step, site)

    def _access(self, thread: str, epoch: int, vc: dict[str, int], buf: int, off: int,
                length: int, write: bool, seq: int, kind: str, step: str | None,
                site: str | None) -> None:
        info = self._buffers.get(buf)
        if info is None or info.role != "data" or length <= 0:
            return  # oracle buffers (the generation mirror) are checking state, not under test
        lo, hi = off, off + length
        block = info.page_bytes or BLOCK
        ref = OpRef(seq, thread, kind, step, site, write, off, length)
        for b in range(lo // block, (hi - 1) // block + 1):
            history = self._history[(buf, b)]
            for past in history:
                if past.lo < hi and lo < past.hi and (write or past.ref.write) \
                        and past.thread != thread and past.epoch > vc.get(past.thread, 0):
                    self._report(info, block if info.page_bytes else 0, past, ref, lo, hi)
            history.append(_Access(thread, epoch, lo, hi, ref))
            if len(history) > HISTORY:
                del history[: len(history) - HISTORY]

    def _report(self, info: _Buffer, page_bytes: int, past: _Access, ref: OpRef, lo: int,
                hi: int) -> None:
        pair = (past.ref.seq, ref.seq)
        if pair in self._reported:
            return  # the same two ops met again in another block
        self._reported.add(pair)
        start = max(lo, past.lo)
        page = start // page_bytes if page_bytes else None
        finding = Finding(info.name, info.space, page, past.ref, ref)
        folded = self._folded.get(finding.key)
        if folded is None:
            self._folded[finding.key] = finding
        else:
            folded.count += 1

    @property
    def findings(self) -> list[Finding]:
        return list(self._folded.values())


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
                            str(record.get("role", "data")), int(record.get("page_bytes", 0)))
        elif kind == "stream":
            detector.stream(str(record["name"]), bool(record["blocking"]),
                            bool(record["legacy"]))
        elif kind == "op":
            detector.observe_json(record)
    return detector



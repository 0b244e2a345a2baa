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

    def __init__(self, *, prune: bool = True) -> None:
        self._device: Device | None = None
        self.prune = prune
        self.reset()

    def reset(self) -> None:
        """Forget everything: a trial ends with the device idle, so nothing carries over."""
        self._clock: dict[str, dict[str, int]] = defaultdict(dict)
        self._events: dict[str, dict[str, int]] = {}
        # (buffer, block) -> accesses: (thread, epoch, lo, hi, write, source) tuples
        self._history: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
        self._buffers: dict[int, _Buffer] = {}
        self._streams: dict[str, _Stream] = {}
        self._folded: dict[tuple[Any, ...], Finding] = {}
        self._reported: set[tuple[int, int]] = set()
        self.racing: set[int] = set()  # ops that raced some earlier op

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
        if record.stream != HOST and record.stream not in self._streams:
            self.learn(self._device)  # a stream made since the last look
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
        if not reads and not writes:
            return
        # Who did it, once per op; an OpRef is built only for the accesses that race.
        source = (seq, stream, kind, step, site)
        epoch = vc[stream]
        for buf, off, length in reads:
            self._access(source, epoch, vc, buf, off, length, False)
        for buf, off, length in writes:
            self._access(source, epoch, vc, buf, off, length, True)

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
        block = info.page_bytes or BLOCK
        for b in range(lo // block, (hi - 1) // block + 1):
            key = (buf, b)
            history = self._history.get(key, ())
            kept = []
            for past in history:
                p_thread, p_epoch, p_lo, p_hi, p_write, _ = past
                ordered = p_thread == thread or p_epoch <= vc.get(p_thread, 0)
                if not ordered and p_lo < hi and lo < p_hi and (write or p_write):
                    self._report(info, block if info.page_bytes else 0, past,
                                 (thread, epoch, lo, hi, write, source))
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

    def _report(self, info: _Buffer, page_bytes: int, past: tuple[Any, ...],
                now: tuple[Any, ...]) -> None:
        first, second = _ref(past), _ref(now)
        pair = (first.seq, second.seq)
        self.racing.add(second.seq)
        if pair in self._reported:
            return  # the same two ops met again in another block
        self._reported.add(pair)
        start = max(past[2], now[2])
        page = start // page_bytes if page_bytes else None
        finding = Finding(info.name, info.space, page, first, second)
        folded = self._folded.get(finding.key)
        if folded is None:
            self._folded[finding.key] = finding
        else:
            folded.count += 1

    @property
    def findings(self) -> list[Finding]:
        return list(self._folded.values())


def _ref(access: tuple[Any, ...]) -> OpRef:
    """The OpRef of a history entry (thread, epoch, lo, hi, write, source)."""
    _, _, lo, hi, write, (seq, stream, kind, step, site) = access
    return OpRef(seq, stream, kind, step, site, write, lo, hi - lo)


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



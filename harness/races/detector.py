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
it orders all the rest. What a buffer's bytes remember is :mod:`harness.races.shadow`'s: ranges
of the accesses a later one could still race, found by bisection, so that the work of one access
does not grow with its bytes or the buffer's size.

The detector works online (an op-log observer, during every trial) and offline over a recorded
trace (``gpurace check``); both feed it the same JSON-shaped op records. Online it keeps the
records and analyses them when the findings are read, after the trial: a reissued device
program's come as segments, unbuilt, and a trial whose records have the shape of one it analysed
before gets that trial's findings, renumbered, without building them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from harness.races.findings import _OWNER_KINDS, HOST, Finding, OpRef, Owners
from harness.races.memo import Memo, _declarations, _Moved
from harness.races.shadow import Access, Race, Shadow
from kvcore.device import Device, OpRecord
from kvcore.device.oplog import Segment, expanded

WAITS_KEPT = 64
"""Waits remembered per stream (and records per event), to explain a wait that missed."""


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

    def __init__(self, *, prune: bool = True, remember: bool = True,
                 keep_racing: bool = True) -> None:
        self._device: Device | None = None
        self.prune = prune
        self.remember = remember  # reuse a remembered trial's analysis (see _analyse)
        # Which ops raced (racing): a trial's are few, and its memo keeps them; a watched
        # run of hours, one trial that races at every step, needs only its findings.
        self.keep_racing = keep_racing or remember
        self._owners = Owners()
        self._buffers: dict[int, _Buffer] = {}
        self._streams: dict[str, _Stream] = {}
        self._pending: list[OpRecord | Segment] = []
        self._unapplied: list[OpRecord | Segment] = []
        self._settled = False
        self._memo = Memo()
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
        self._shadows: dict[int, Shadow] = {}  # by buffer: who touched which bytes
        # The last host wait after which nothing before could race what came after: a trace
        # may begin anew there (harness.capture.analysis) and still hold every race to come.
        self.quiet_seq = 0
        # The ops already reported racing the op being analysed (a pair meets again on other
        # bytes of the same op: one finding). Only that op's: a long run keeps no more.
        self._reporting = 0
        self._reported: set[int] = set()
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
        self._owners = Owners()  # a new device numbers its ops from 1 again
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
            self.buffer(info.id, info.name, info.space, info.role, log.page_bytes.get(info.id, 0))
        for s in log.streams.values():
            self.stream(s.name, s.blocking, s.legacy)

    def buffer(self, id: int, name: str, space: str, role: str, page_bytes: int = 0) -> None:
        """Declare a buffer (``page_bytes``: its pages' size, to say a finding's page)."""
        self._buffers[id] = _Buffer(name, space, role, page_bytes)

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
                    self._memo, self._memo_of = Memo(), declared
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
            if kind.startswith("sync_") and self._host_has_all(vc):
                # Nothing done so far can race what is to come (every op is issued after
                # the host's clock): who held freed bytes need not be named any more, and no
                # past access is worth keeping. Kept, a long watched run would hold every
                # free it made and every range its tensors were ever touched in.
                self._owners.forget_past()
                self._shadows.clear()
                self.quiet_seq = seq
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

    def _host_has_all(self, host: dict[str, int]) -> bool:
        """Whether the host's clock is past every stream's own: all they did is done."""
        return all(host.get(name, 0) >= clock.get(name, 0)
                   for name, clock in self._clock.items() if name != HOST)

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
        shadow = self._shadows.get(buf)
        if shadow is None:
            shadow = self._shadows[buf] = Shadow()
        # Of the unordered conflicting accesses of each other thread, only its latest is
        # reported: ordering this access after it orders it after all that thread did before
        # (program order), so the others add no edge to find and no fix to make.
        races: dict[str, Race] = {}
        now = Access(source[1], epoch, off, off + length, write, source)
        shadow.access(now, vc.get, self.prune, races)
        for race in races.values():
            self._report(buf, info, race, now)

    # ---- findings ------------------------------------------------------------------------------
    def _report(self, buf: int, info: _Buffer, race: Race, now: Access) -> None:
        past, start = race
        first, second = _ref(past), _ref(now)
        if self.keep_racing:
            self._racing.add(second.seq)
        if second.seq != self._reporting:
            self._reporting, self._reported = second.seq, set()
        elif first.seq in self._reported:
            return  # the same two ops met again on other bytes
        self._reported.add(first.seq)
        page = start // info.page_bytes if info.page_bytes else None
        finding = Finding(info.name, info.space, page, first, second)
        folded = self._folded.get(finding.key)
        if folded is not None:
            folded.count += 1
            return
        self._name_bytes(finding, buf, start)
        finding.event_note = self._in_graph(first, second) \
            or self._explain_wait(past.thread, past.epoch, first, second) \
            or self._wrong_stream(past.thread, past.epoch, first, second) \
            or self._graph_stream(first, second)
        finding.legacy_note = self._legacy_note(first.stream, second.stream)
        legacy = self._streams.get(first.stream)
        finding.legacy_first = bool(finding.legacy_note and legacy is not None and legacy.legacy)
        self._folded[finding.key] = finding

    def _name_bytes(self, finding: Finding, buf: int, offset: int) -> None:
        before = self._owners.at(buf, offset, finding.first.seq)
        now = self._owners.at(buf, offset, finding.second.seq)
        finding.owner = now.name if now else None
        if before is not None and before != now:
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

    def _folded_now(self) -> dict[tuple[Any, ...], Finding]:
        """The findings by key, a remembered trial's built for this one when first read."""
        moved = self._moved
        if moved is not None:
            self._folded, self._moved = moved[0].moved(moved[1], moved[2]), None
        return self._folded

    @property
    def racing(self) -> set[int]:
        """The sequence numbers of the ops that raced some earlier op (none kept unless
        ``keep_racing``)."""
        self._analyse()
        if self._racing_moved is not None:  # a remembered trial's, numbered for this one
            racing, by = self._racing_moved
            self._racing, self._racing_moved = {seq + by for seq in racing}, None
        return self._racing



def _ref(access: Access) -> OpRef:
    """The OpRef of a remembered access."""
    seq, stream, kind, step, site, origin = access.source
    return OpRef(seq, stream, kind, step, site, access.write, access.lo,
                 access.hi - access.lo, origin)


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
        elif kind == "label":
            detector.owner(int(record["buffer"]), int(record["offset"]),
                           int(record["length"]), str(record["name"]))
        elif kind == "op":
            detector.observe_json(record)
    return detector



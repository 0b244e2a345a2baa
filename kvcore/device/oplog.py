"""The op log: one record per device-visible action, and the observers that read them.

Every consumer of device activity (the race detector, the trace recorder, the flight recorder,
the timeline) subscribes here instead of hooking the device itself, so they all see the same
stream of records in the same order.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from kvcore.bytemap import ByteMap

HOST = "host"
"""The pseudo-stream name of actions the host performs itself (pinned writes, reads, waits)."""

HOST_KINDS = frozenset({"host_write", "host_read", "sync_device", "sync_stream", "sync_event",
                        "event_query", "alloc", "free"})
"""The kinds of record the host issues (stream ``HOST``). ``event_query`` carries ``detail.done``
(what the query saw); ``alloc`` and ``free`` say that a byte range (``detail.range``) was handed
to an owner (``detail.name``: a lease, a pinned buffer) or given back: they touch no bytes."""

STREAM_KINDS = frozenset({"event_record", "event_wait", "memset"} | {
    f"{copy}_{src}to{dst}" for copy in ("copy", "copy2d") for src in "hd" for dst in "hd"})
"""The kinds of record a stream runs, besides ``kernel:NAME``: copies are named by direction
(``copy_htod``: pinned host to device; ``copy2d_`` for the strided ones)."""

KERNEL_PREFIX = "kernel:"


KERNEL_NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"
"""A kernel's name in its kind: an identifier, or a scenario step's id (``next-forward``)."""
_KERNEL_NAME = re.compile(KERNEL_NAME_PATTERN)


def is_stream_kind(kind: str) -> bool:
    """Whether a stream can run an op of ``kind`` (a known kind, or a kernel launch)."""
    return kind in STREAM_KINDS or (kind.startswith(KERNEL_PREFIX) and _KERNEL_NAME.fullmatch(
        kind[len(KERNEL_PREFIX):]) is not None)


class Access(NamedTuple):
    """A byte range of one buffer: the unit of reads and writes in the op log. (A named tuple,
    not a dataclass: one is built per range of every op while anyone listens.)"""

    buffer: int
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length

    def overlaps(self, other: Access) -> bool:
        return (
            self.buffer == other.buffer
            and self.offset < other.end
            and other.offset < self.end
        )


@dataclass(frozen=True, slots=True)
class BufferInfo:
    """What the op log knows of a buffer: its id, name, where it lives and what it is for.

    ``role`` is ``data`` for memory under test, ``oracle`` for checking state that is not part of
    the system under test (the page-generation mirror the table reader consults), which a race
    detector should not judge.
    """

    id: int
    name: str
    space: str  # "device" | "host"
    nbytes: int
    role: str = "data"


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What the op log knows of a stream: enough for a happens-before analysis. The legacy
    stream synchronizes implicitly with blocking streams, and with nothing else; a priority
    orders nothing (it is kept for the record)."""

    name: str
    blocking: bool
    legacy: bool
    priority: int = 0


class Label(NamedTuple):
    """Bytes [offset, offset + length) of a buffer belong to ``name`` now. A named tuple:
    each trial's trace and race detector begin with the owners, made and compared anew."""

    buffer: int
    offset: int
    length: int
    name: str


class Labels:
    """Who owns which bytes now: the pages of each lease, each pinned block of a scenario's
    buffers. Kept across trials (a world's buffers outlive them), so a trace can start with the
    owners that were already there."""

    def __init__(self) -> None:
        self._by_buffer: dict[int, ByteMap] = {}
        # How many times the owners changed: a reader that took them at a count has them
        # still while the count is the same (a reissued trial changes none).
        self.changes = 0
        self._live: tuple[int, tuple[Label, ...]] = (0, ())  # live() at that count

    def alloc(self, buffer: int, offset: int, length: int, name: str) -> None:
        self.changes += 1
        spans = self._by_buffer.get(buffer)
        if spans is None:
            spans = self._by_buffer[buffer] = ByteMap()
        spans.put(offset, offset + length, name)

    def free(self, buffer: int, offset: int, length: int) -> str | None:
        """Forget the owners of these bytes; returns the first one's name."""
        self.changes += 1
        spans = self._by_buffer.get(buffer)
        cut = spans.cut(offset, offset + length) if spans is not None else []
        return cut[0].value if cut else None

    def live(self) -> tuple[Label, ...]:
        """The owners now: the same tuple while they do not change, as each trial's trace
        and race detector begin with them and a reissued trial changes none."""
        if self._live[0] != self.changes:
            self._live = (self.changes, tuple(
                Label(buffer, span.lo, span.hi - span.lo, span.value)
                for buffer, spans in self._by_buffer.items() for span in spans))
        return self._live[1]


class OpRecord(NamedTuple):
    """One device-visible action (an immutable named tuple: cheap to build for every op).

    ``stream`` is the issuing stream's name, or ``HOST`` for an action of the host itself.
    ``t_issue_ns`` is the host clock when it was issued; ``t_start_ns``/``t_end_ns`` are when it
    ran on the device, known on the simulated device only. ``waits`` lists the events a
    ``wait_event`` or host ``sync_event`` waits on, ``records`` the event an ``event_record``
    records; ``syncs`` names the stream a ``sync_stream`` waited for.
    """

    seq: int
    stream: str
    kind: str
    reads: tuple[Access, ...] = ()
    writes: tuple[Access, ...] = ()
    records: str | None = None
    waits: str | None = None
    syncs: str | None = None
    step: str | None = None
    t_issue_ns: int | None = None
    t_start_ns: int | None = None
    t_end_ns: int | None = None
    detail: dict[str, object] | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"seq": self.seq, "stream": self.stream, "kind": self.kind}
        if self.reads:
            out["reads"] = [[a.buffer, a.offset, a.length] for a in self.reads]
        if self.writes:
            out["writes"] = [[a.buffer, a.offset, a.length] for a in self.writes]
        for key in ("records", "waits", "syncs", "step", "t_issue_ns", "t_start_ns", "t_end_ns"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.detail:
            out["detail"] = self.detail
        return out


Observer = Callable[[OpRecord], None]


_new = tuple.__new__  # builds a named tuple without its Python-level __new__


class Template(NamedTuple):
    """An op record as a device program holds it, not numbered nor stamped yet: the record's
    fields but ``seq`` and the times, then whether the backend times the action (``timed``)
    and the :class:`~kvcore.device.program.Live` value it took (``live``), if any. Built once
    per captured record; a reissue reads it for every op, so it stays a named tuple."""

    stream: str
    kind: str
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    records: str | None
    waits: str | None
    syncs: str | None
    step: str | None
    detail: dict[str, object]
    timed: bool
    live: object | None  # a kvcore.device.program.Live (that module builds on this one)


class Segment(NamedTuple):
    """Records of a reissued device program, not yet built: one per template, numbered from
    ``first_seq`` (see ``Device.reissue``). An observer that subscribed for segments gets
    these instead of the records, and builds them (:meth:`records`) only if it reads them.
    They carry one time, ``t_issue_ns``: the host's clock when the device handed the segment
    over, its last op issued. A program is never issued with ``--timeline``, and an observer
    that wants each op's issue time subscribes for records. ``values``: what the templates
    that take a live value (``Template.live``) set, in order. The same piece of the same
    program comes as the same ``templates`` tuple."""

    templates: tuple[Template, ...]
    first_seq: int
    values: tuple[int, ...] = ()
    t_issue_ns: int | None = None

    def records(self) -> list[OpRecord]:
        # Unpacked rather than read field by field: a detector may build every record.
        values, out = iter(self.values), []
        for seq, t in enumerate(self.templates, self.first_seq):
            stream, kind, reads, writes, records, waits, syncs, step, detail, _, live = t
            if live is not None:
                detail = live_detail(t, next(values))
            out.append(_new(OpRecord, (seq, stream, kind, reads, writes, records, waits, syncs,
                                       step, None, None, None, detail)))
        return out


def live_detail(template: Template, value: int) -> dict[str, object]:
    """The detail of a record whose template took a live value: ``value`` as it was set."""
    return {**template.detail, "value": value}


def expanded(entries: list[OpRecord | Segment]) -> list[OpRecord]:
    """Records and segments, as records in order."""
    if not any(type(e) is Segment for e in entries):
        return entries  # type: ignore[return-value]
    out: list[OpRecord] = []
    for entry in entries:
        if type(entry) is Segment:
            out.extend(entry.records())
        else:
            out.append(entry)  # type: ignore[arg-type]
    return out


class OpLog:
    """Fan-out of op records to observers.

    Devices ask :attr:`active` before building a record, so the log costs one attribute read per
    action when nobody listens.
    """

    def __init__(self) -> None:
        # Read by devices directly (one call per observer per op, no fan-out call between).
        self.observers: list[Observer] = []
        # What each observer takes instead of a reissued program's records (None: it wants
        # the records), and those of them all, when every observer takes segments.
        self._segment_takers: list[Callable[[Segment], None] | None] = []
        self.segment_observers: list[Callable[[Segment], None]] = []
        self.segmented = False
        self.buffers: dict[int, BufferInfo] = {}
        self.streams: dict[str, StreamInfo] = {}
        self.page_bytes: dict[int, int] = {}  # buffer id -> page stride, for paged buffers
        # How many times the buffers, streams or page strides changed: a reader that has
        # declared them at a count has all of them while the count is the same.
        self.declared = 0
        self.labels = Labels()
        self.seq = 0  # the last record's number
        self.active = False
        self.step: str | None = None
        # Where the current step was written (``file:line:col`` of a scenario), for findings.
        self.origin: str | None = None
        self.thread: str | None = None  # the scenario's host thread running the step, if any
        self.blocking_hooks: list[Callable[[], None]] = []
        self.times_observers: list[Callable[[list[tuple[int, int, int]]], None]] = []

    def subscribe(self, observer: Observer,
                  segments: Callable[[Segment], None] | None = None) -> Callable[[], None]:
        """Send every later record to ``observer``; returns a function that unsubscribes it.
        ``segments``: where a reissued program's records go instead, unbuilt, as long as every
        observer takes them so (then nobody needs them built)."""
        self.observers.append(observer)
        self._segment_takers.append(segments)
        self._observers_changed()

        def unsubscribe() -> None:
            if observer in self.observers:
                del self._segment_takers[self.observers.index(observer)]
                self.observers.remove(observer)
            self._observers_changed()

        return unsubscribe

    def _observers_changed(self) -> None:
        self.active = bool(self.observers)
        takers = self._segment_takers
        self.segmented = self.active and None not in takers
        self.segment_observers = list(takers) if self.segmented else []  # type: ignore

    def before_blocking(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` just before the host blocks on the device (every synchronize): the
        moment a flight recorder must have its records on disk, since a hung kernel or a fault
        is found there and the process may never come back."""
        self.blocking_hooks.append(hook)

    def on_times(self, observer: Callable[[list[tuple[int, int, int]]], None]) -> None:
        """Call ``observer`` with the device times of ops measured after they were logged
        (``(seq, t_start_ns, t_end_ns)``, see ``Device.settle_times``)."""
        self.times_observers.append(observer)

    def announce_stream(self, info: StreamInfo) -> None:
        self.streams[info.name] = info
        self.declared += 1

    def describe_pages(self, buffer: int, page_bytes: int) -> None:
        """Say that ``buffer`` is carved into pages of ``page_bytes``, so findings can name the
        page an access touched."""
        self.page_bytes[buffer] = page_bytes
        self.declared += 1

    def announce_buffer(self, info: BufferInfo) -> None:
        """Register a buffer, so observers can name the buffers that records refer to."""
        self.buffers[info.id] = info
        self.declared += 1

    @contextlib.contextmanager
    def in_step(self, step: str | None) -> Iterator[None]:
        """Attribute every record issued inside the block to scenario step ``step``."""
        previous, self.step = self.step, step
        try:
            yield
        finally:
            self.step = previous


class OpRecorder:
    """The simplest observer: keeps every record in memory, in order."""

    def __init__(self, log: OpLog) -> None:
        self.records: list[OpRecord] = []
        self.buffers = log.buffers
        self._unsubscribe = log.subscribe(self.records.append)

    def close(self) -> None:
        self._unsubscribe()

"""From a watched program's capture events to the op records the detector and traces read.

A program names memory by address; the op log names it by buffer and offset. The translator
cuts each memory space into fixed windows of :data:`WINDOW` bytes, one op-log buffer a window,
so a byte keeps one name for the whole run: a block the caching allocator gives back and hands
out again is the same bytes, with the old owner's history (an in-flight read of the old owner
still conflicts with the new owner's write, which is what a missing ``record_stream`` breaks).
Owners are the program's tensors and arrays, named as it made them.

A CUDA graph's capture runs nothing: what is issued on the capturing stream between
``graph_begin`` and ``graph_end`` (and on the streams that waited for its events, as a capture
forks) is the graph's body, kept in order with the event records and waits that fork and join
its branches. Each ``graph_replay`` issues that body: the capturing stream's part on the replay
stream, each forked stream's part on a branch stream of the replay stream's own, with the
captured records and waits between them, as CUDA turns them into the graph's edges. So the
body's reads and writes race with the program's other streams like any op's, and the graph's
branches with each other where no edge orders them. Frees during a capture are left out: the
graph's private pool keeps those blocks for the graph's replays.

The allocator's deferred reuse is said in edges, as it happens: when a block recorded on other
streams (``record_stream``) is freed, the allocator records an event on each of them, and hands
the bytes out again only once those events completed, which it found by querying them. So the
free becomes an event record on each recorded stream, and the next allocation over those bytes
a host wait on each, before the new owner exists.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from harness.capture import events as E
from harness.races.findings import DEVICE_MEMORY, PINNED_MEMORY
from harness.races.kinds import GRAPH_BRANCH
from kvcore.bytemap import ByteMap
from kvcore.device.oplog import HOST, Access, BufferInfo, Label, OpRecord, StreamInfo

WINDOW = 1 << 32
"""Bytes of one op-log buffer of a captured memory space (a program's allocations are placed
by its allocator anywhere in a 48-bit address space; a window is the unit the op log names)."""

_SPACE = {E.DEVICE: "device", E.HOST: "host"}
_IDENT = re.compile(r"[^A-Za-z0-9_]")


def kernel_kind(name: str) -> str:
    """The op-log kind of a kernel: ``kernel:`` and the name as an identifier."""
    ident = _IDENT.sub("_", name) or "kernel"
    return "kernel:" + (ident if not ident[0].isdigit() else "_" + ident)


class _Node(NamedTuple):
    """An op of a graph's body, on the stream that captured it."""

    sid: int
    kind: str
    reads: list[list[Any]]
    writes: list[list[Any]]
    meta: dict[str, Any] | None


class _Edge(NamedTuple):
    """An event recorded (``record``) or waited for inside a capture: a fork or join of the
    graph's branches."""

    record: bool
    eid: Any
    sid: int
    site: str | None


@dataclass
class _Graph:
    """A CUDA graph the program captured: the stream its capture began on, its body in
    order, where it was made, and how often it was replayed."""

    origin: int
    site: str | None
    body: list[_Node | _Edge] = field(default_factory=list)
    streams: set[int] = field(default_factory=set)  # the streams its capture took in
    replays: int = 0


@dataclass
class _Alloc:
    space: str
    lo: int
    hi: int
    name: str
    pending: list[str] = field(default_factory=list)  # events a reuse must wait for


class Translator:
    """Turns capture events into op records, in order, for ``emit``; announces each buffer
    (window) and stream to ``buffer``/``stream`` before the first record that names it.

    ``notes`` collects what the sources said they could not see, and what the translator
    could not place (a free of memory never seen allocated is dropped, and counted)."""

    def __init__(self, emit: Callable[[OpRecord], None],
                 buffer: Callable[[BufferInfo], None],
                 stream: Callable[[StreamInfo], None]) -> None:
        self._emit = emit
        self._announce_buffer = buffer
        self._announce_stream = stream
        self.seq = 0
        self.hello: dict[str, Any] = {}
        self.exit: dict[str, Any] | None = None
        self.notes: list[str] = []
        self.delays: list[dict[str, Any]] = []  # what amplification queued, delay by delay
        self.stats: dict[str, dict[str, Any]] = {}  # per source: what the capture cost
        self.ops = 0  # stream and host accesses translated (not allocations, not edges)
        self._buffers: dict[tuple[str, int], int] = {}
        self._streams: dict[int, str] = {}
        self._stream_names = _Names(HOST)
        self._events: dict[Any, str] = {}
        self._event_names = _Names()
        self._event_bases: dict[Any, str] = {}  # what each event's name was made from
        # Events made again and not recorded since: the never-recorded name a wait takes.
        self._unrecorded: dict[Any, str | None] = {}
        # Live allocations per space, sorted by start address.
        self._live: dict[str, ByteMap] = {E.DEVICE: ByteMap(), E.HOST: ByteMap()}
        # Bytes given back with events to wait for before they are handed out again.
        self._deferred: list[_Alloc] = []
        self._unknown_frees = 0
        self._graphs: dict[Any, _Graph] = {}
        self._capturing: dict[int, _Graph] = {}  # stream -> the graph it is capturing into
        self._captured_events: dict[Any, _Graph] = {}  # events recorded inside a capture
        self._handlers: dict[str, Callable[..., None]] = {
            "hello": self._hello, "stream": self._stream, "alloc": self._alloc,
            "free": self._free, "op": self._op, "event": self._event, "record": self._record,
            "wait": self._wait, "sync_event": self._sync_event, "query": self._query,
            "sync_stream": self._sync_stream, "sync_device": self._sync_device,
            "note": self._note, "exit": self._exit, "source": self._source,
            "delays": self._delays, "stats": self._stats, "graph_begin": self._graph_begin,
            "graph_end": self._graph_end, "graph_replay": self._graph_replay,
        }

    # ---- the events --------------------------------------------------------------------------
    def feed(self, events: Iterable[list[Any]]) -> None:
        for event in events:
            handler = self._handlers.get(event[0]) if event else None
            if handler is not None:  # an event of a newer source: not ours to read
                handler(*event[1:])

    def _hello(self, info: dict[str, Any]) -> None:
        self.hello = dict(info)

    def _source(self, name: str, version: str) -> None:
        self.hello.setdefault("sources", {})[str(name)] = str(version)

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(str(text))

    def _delays(self, delays: list[dict[str, Any]], failures: list[str] | None = None) -> None:
        self.delays = [dict(d) for d in delays]
        for why in failures or ():
            self._note(f"a delay could not be queued: {why}")

    def _stats(self, info: dict[str, Any]) -> None:
        self.stats[str(info.get("source", "?"))] = dict(info)

    def _exit(self, info: dict[str, Any]) -> None:
        self.exit = dict(info)

    def _stream(self, sid: int, meta: dict[str, Any] | None = None) -> None:
        meta = meta or {}
        if sid in self._streams:
            return
        legacy = bool(meta.get("legacy", sid == E.LEGACY_STREAM))
        blocking = bool(meta.get("blocking", sid == E.PER_THREAD_STREAM))
        # The default streams are named alike whichever source saw them first.
        default = legacy or sid == E.PER_THREAD_STREAM
        base = (None if default else meta.get("name")) or _stream_name(sid, legacy,
                                                                       meta.get("site"))
        name = self._streams[sid] = self._stream_names.unique(base)
        self._announce_stream(StreamInfo(name, blocking=blocking and not legacy, legacy=legacy,
                                         priority=int(meta.get("priority", 0))))

    def _stream_of(self, sid: int) -> str:
        if sid not in self._streams:
            self._stream(sid)
        return self._streams[sid]

    def _event(self, eid: Any, meta: dict[str, Any] | None = None) -> None:
        meta = meta or {}
        # Said as "event NAME" by the findings: "event made at serve.py:9", "event #2".
        base = meta.get("name") or (f"made at {meta['site']}" if meta.get("site")
                                    else f"#{len(self._events) + 1}")
        if eid in self._events and self._event_bases.get(eid) == base:
            # CUDA handed back a destroyed event's handle, made at the same line (wait_stream
            # makes an event at every call): the name goes on, so that what is kept of
            # events does not grow with a long run; until it is recorded, a wait on it has a
            # name of its own with no record, as CUDA takes an event never recorded.
            self._unrecorded[eid] = None
            return
        self._unrecorded.pop(eid, None)
        self._events[eid] = self._event_names.unique(base)
        self._event_bases[eid] = base

    def _waited(self, eid: Any) -> str:
        """The name a wait on event ``eid`` waits for: its own, or, for an event made again
        and not recorded since, one that was never recorded."""
        if eid not in self._unrecorded:
            return self._event_of(eid)
        name = self._unrecorded[eid]
        if name is None:
            name = self._unrecorded[eid] = self._event_names.unique(self._event_bases[eid])
        return name

    def _event_of(self, eid: Any) -> str:
        if eid not in self._events:
            self._event(eid)
        return self._events[eid]

    # ---- memory ------------------------------------------------------------------------------
    def _accesses(self, spans: Iterable[list[Any]]) -> tuple[Access, ...]:
        out: list[Access] = []
        for span in spans or ():
            space, addr, nbytes = span[0], int(span[1]), int(span[2])
            if nbytes <= 0 or space not in _SPACE:
                continue
            while nbytes > 0:  # a span across a window's end is one access in each
                window, offset = divmod(addr, WINDOW)
                length = min(nbytes, WINDOW - offset)
                out.append(Access(self._buffer(space, window), offset, length))
                addr += length
                nbytes -= length
        return tuple(out)

    def _buffer(self, space: str, window: int) -> int:
        key = (space, window)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = len(self._buffers) + 1
            where = DEVICE_MEMORY if space == E.DEVICE else PINNED_MEMORY
            self._announce_buffer(BufferInfo(buf, where, _SPACE[space], WINDOW))
        return buf

    def _alloc(self, space: str, addr: int, nbytes: int,
               meta: dict[str, Any] | None = None) -> None:
        meta = meta or {}
        addr, nbytes = int(addr), int(nbytes)
        if space not in _SPACE or nbytes <= 0:
            return
        lo, hi = addr, addr + nbytes
        # The allocator hands out bytes given back under recorded streams only once their
        # events completed: it queried them, and the host is ordered after them from here.
        for gone in [d for d in self._deferred if d.space == space and d.lo < hi and lo < d.hi]:
            self._deferred.remove(gone)
            for event in gone.pending:
                self._record_op(HOST, "sync_event", waits=event, step=meta.get("site"),
                                detail={"site": meta.get("site"),
                                        "why": "the allocator waited for the streams the "
                                               "block was recorded on before reusing it"})
        name = _owner_name(meta)
        # An allocation over bytes still held replaces their owner whole (a pool's block
        # carved anew, or a free the sources did not see).
        self._live[space].put(lo, hi, _Alloc(space, lo, hi, name), whole=True)
        # PyTorch's caching allocator orders a block's reuse by the stream it allocated the
        # block on (and record_stream's): the finding of a reuse race names it. (CuPy's pool
        # has no record_stream to offer, so its blocks say no stream.)
        sid = meta.get("stream")
        stream = self._stream_of(sid) if sid is not None and space == E.DEVICE and \
            meta.get("source") == "torch" else None
        for access in self._accesses([[space, lo, nbytes]]):
            detail = {"range": [access.buffer, access.offset, access.length], "name": name,
                      "site": meta.get("site")}
            if stream is not None:
                detail["stream"] = stream
            self._record_op(HOST, "alloc", step=meta.get("site"), detail=detail)

    def owners(self) -> Iterator[Label]:
        """The memory handed out and not given back, now, by buffer (window) and name."""
        for space, live in self._live.items():
            for span in live:
                for access in self._accesses([[space, span.lo, span.hi - span.lo]]):
                    yield Label(access.buffer, access.offset, access.length, span.value.name)

    def _free(self, space: str, addr: int, meta: dict[str, Any] | None = None) -> None:
        if self._capturing:
            return  # the graph's pool keeps the block for its replays
        meta = meta or {}
        addr = int(addr)
        live = self._live.get(space)
        span = live.pop(addr) if live is not None else None
        if span is None:
            self._unknown_frees += 1  # memory the sources never saw handed out
            return
        gone: _Alloc = span.value
        site = meta.get("site")
        for sid in meta.get("streams") or ():
            # record_stream: the allocator records an event on each stream that used the
            # block, and reuses the bytes once they all completed.
            event = f"of the allocator for {gone.name} on {self._stream_of(sid)}"
            self._record_op(self._stream_of(sid), "event_record", records=event, step=site,
                            detail={"site": site})
            gone.pending.append(event)
        if gone.pending:
            self._deferred.append(gone)
        for access in self._accesses([[space, gone.lo, gone.hi - gone.lo]]):
            self._record_op(HOST, "free", step=site,
                            detail={"range": [access.buffer, access.offset, access.length],
                                    "name": gone.name, "site": site})

    # ---- ops and edges -----------------------------------------------------------------------
    def _op(self, sid: int | None, kind: str, reads: list[list[Any]], writes: list[list[Any]],
            meta: dict[str, Any] | None = None) -> None:
        graph = self._capturing.get(sid) if sid is not None else None
        if graph is not None and sid is not None:
            graph.body.append(_Node(sid, kind, reads, writes, meta))
            return
        meta = meta or {}
        site = meta.get("site")
        detail = {"site": site}
        for key in ("op", "thread", "source", "tensors"):
            if meta.get(key) is not None:
                detail[key] = meta[key]
        if sid is None:
            kind = kind if kind in ("host_read", "host_write") else (
                "host_write" if writes else "host_read")
            stream = HOST
        else:
            stream = self._stream_of(sid)
            if not (kind.startswith("copy") or kind == "memset"
                    or kind.startswith("kernel:")):
                kind = kernel_kind(kind)
        self.ops += 1
        t = meta.get("t")
        self._record_op(stream, kind, reads=self._accesses(reads),
                        writes=self._accesses(writes), step=site, detail=detail,
                        t_issue_ns=t if isinstance(t, int) else None)
        if sid is not None and meta.get("sync"):
            self._record_op(HOST, "sync_stream", syncs=stream, step=site, detail={"site": site})

    def _record(self, eid: Any, sid: int, site: str | None = None) -> None:
        graph = self._capturing.get(sid)
        if graph is not None:  # a node of the graph: orders only its own branches
            self._captured_events[eid] = graph
            graph.body.append(_Edge(True, eid, sid, site))
            return
        self._captured_events.pop(eid, None)
        self._unrecorded.pop(eid, None)
        self._record_op(self._stream_of(sid), "event_record", records=self._event_of(eid),
                        step=site, detail={"site": site})

    def _wait(self, eid: Any, sid: int, site: str | None = None) -> None:
        graph = self._captured_events.get(eid)
        if graph is not None:
            if sid not in self._capturing:  # a stream forked off a capture joins the graph
                self._capture_on(sid, graph)
            graph.body.append(_Edge(False, eid, sid, site))
            return
        self._record_op(self._stream_of(sid), "event_wait", waits=self._waited(eid),
                        step=site, detail={"site": site})

    # ---- CUDA graphs -------------------------------------------------------------------------
    def _graph_begin(self, gid: Any, sid: int, site: str | None = None) -> None:
        graph = self._graphs[gid] = _Graph(sid, site)  # a graph captured anew is a new body
        self._capture_on(sid, graph)

    def _capture_on(self, sid: int, graph: _Graph) -> None:
        self._stream_of(sid)
        graph.streams.add(sid)
        self._capturing[sid] = graph

    def _graph_end(self, gid: Any, site: str | None = None) -> None:
        graph = self._graphs.get(gid)
        if graph is None:
            return
        for sid in graph.streams:
            if self._capturing.get(sid) is graph:
                del self._capturing[sid]
        self._captured_events = {e: g for e, g in self._captured_events.items()
                                 if g is not graph}

    def _graph_replay(self, gid: Any, sid: int, site: str | None = None,
                      t: int | None = None) -> None:
        graph = self._graphs.get(gid)
        if graph is None:
            self._note("a CUDA graph was replayed whose capture no source saw (captured "
                       "before the watch began): its kernels were not checked")
            return
        graph.replays += 1
        # The body as it stands: a replay into a capture still going on (the same graph's,
        # as no real program can issue) must not replay what it adds.
        for item in tuple(graph.body):
            on = self._branch(graph, item.sid, sid)
            if isinstance(item, _Node):
                meta = item.meta if t is None else {**(item.meta or {}), "t": t}
                self._op(on, item.kind, item.reads, item.writes, meta)
                continue
            event = ("graph edge", id(graph), item.eid)  # the graph's own, not the program's
            if event not in self._events:
                self._event(event, {"name": f"{self._event_of(item.eid)} in the graph"})
            if item.record:
                self._record(event, on, item.site)
            else:
                self._wait(event, on, item.site)

    def _branch(self, graph: _Graph, captured: int, replay: int) -> Any:
        """The stream a replay runs a captured stream's part on: the replay stream for the
        stream the capture began on, a branch stream of the replay stream's for each other."""
        if captured == graph.origin:
            return replay
        key = ("graph branch", replay, captured)
        if key not in self._streams:
            self._stream(key, {"name": self._stream_of(replay) + GRAPH_BRANCH
                                       + self._stream_of(captured)})
        return key

    def _sync_event(self, eid: Any, site: str | None = None) -> None:
        self._record_op(HOST, "sync_event", waits=self._waited(eid), step=site,
                        detail={"site": site})

    def _query(self, eid: Any, done: bool, site: str | None = None) -> None:
        self._record_op(HOST, "event_query", waits=self._waited(eid), step=site,
                        detail={"site": site, "done": bool(done)})

    def _sync_stream(self, sid: int, site: str | None = None) -> None:
        self._record_op(HOST, "sync_stream", syncs=self._stream_of(sid), step=site,
                        detail={"site": site})

    def _sync_device(self, site: str | None = None) -> None:
        self._record_op(HOST, "sync_device", step=site, detail={"site": site})

    def _record_op(self, stream: str, kind: str, *, reads: tuple[Access, ...] = (),
                   writes: tuple[Access, ...] = (), records: str | None = None,
                   waits: str | None = None, syncs: str | None = None,
                   step: str | None = None, detail: dict[str, Any] | None = None,
                   t_issue_ns: int | None = None) -> None:
        self.seq += 1
        self._emit(OpRecord(self.seq, stream, kind, reads, writes, records, waits, syncs,
                            step, t_issue_ns, None, None,
                            {k: v for k, v in (detail or {}).items() if v is not None}))

    def finish(self) -> None:
        """The run ended: say what could not be placed, and what the graphs were."""
        by_site: dict[str | None, list[_Graph]] = {}
        for graph in self._graphs.values():  # a program may capture a graph per batch size
            by_site.setdefault(graph.site, []).append(graph)
        for site, graphs in by_site.items():
            where = f" made at {site}" if site else ""
            ops = sum(isinstance(item, _Node) for g in graphs for item in g.body)
            replays = sum(g.replays for g in graphs)
            branches = max(len(g.streams) for g in graphs)
            self._note(f"{_count(len(graphs), 'CUDA graph')}{where}: {_count(ops, 'op')} seen "
                       f"in capture, issued again at each of {_count(replays, 'replay')} on "
                       "the replay stream" + (
                           f" and {_count(branches - 1, 'branch stream')} of its own, ordered "
                           "by the captured forks and joins" if branches > 1 else ""))
        if self._unknown_frees:
            self._note(f"{self._unknown_frees} frees of memory no source saw handed out (a "
                       "library's own workspace, or memory made before capture began) were "
                       "left out")

    def owner_at(self, space: str, addr: int) -> str | None:
        """Who holds byte ``addr`` of ``space`` now (for tests and notes)."""
        live = self._live.get(space)
        span = live.at(addr) if live is not None else None
        return span.value.name if span is not None else None


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class _Names:
    """The names given so far (the streams', or the events'): a new one is its base, or
    ``base #2``, ``#3``...: the first that no other has. The next number is kept for each
    base, so the thousandth event made at one line is named at once (``wait_stream`` makes
    an event at each call: a search from ``#2`` made a long run's naming quadratic, 16 s for
    5,000 more events after 15,000 made at one line)."""

    def __init__(self, *taken: str) -> None:
        self._taken = set(taken)
        self._next: dict[str, int] = {}

    def unique(self, base: str) -> str:
        n = self._next.get(base, 1)
        name = base if n == 1 else f"{base} #{n}"
        while name in self._taken:
            n += 1
            name = f"{base} #{n}"
        self._next[base] = n + 1
        self._taken.add(name)
        return name


def _stream_name(sid: int, legacy: bool, site: str | None) -> str:
    if legacy:
        return "the legacy default stream"
    if sid == E.PER_THREAD_STREAM:
        return "the per-thread default stream"
    return f"stream made at {site}" if site else f"stream {sid:#x}"


def _owner_name(meta: dict[str, Any]) -> str:
    """``tensor kv float16[8, 64] made at serve.py:12``, with what the source knew of it."""
    what = str(meta.get("what") or "memory")
    head, _, shape = what.partition(" ")
    name = meta.get("name")
    words = [head] + ([str(name)] if name else []) + ([shape] if shape else [])
    site = meta.get("site")
    return " ".join(words) + (f" made at {site}" if site else "")

"""The Device interface: what the page pool needs of a GPU, and nothing more.

:class:`Device` validates every call, writes the op log, and hands the action to its backend
through the ``_do_*`` methods; ``cuda.py`` (CuPy) and ``sim.py`` (the simulated device)
implement only those (see :mod:`kvcore.device.backend`). So both backends share one set of
argument checks and one op log format.

Every backend action, and every op-log record, goes through one attribute, ``_actions``: the
device itself, or a :class:`~kvcore.device.recorder.Recorder` while :meth:`Device.capture`
records a program. :meth:`Device.reissue` hands a program to the device's
:class:`~kvcore.device.reissue.Reissuer`.

Semantics follow CUDA's: every stream-ordered call returns before the device runs it; copies from
pinned host memory read it when they run, not when issued; the legacy stream synchronizes
implicitly with blocking streams and not at all with non-blocking ones; after a device fault every
call raises :class:`~kvcore.errors.DeviceFaultError`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from kvcore.defects import Defects
from kvcore.device.backend import Backend, DeviceInfo
from kvcore.device.graph import Graph, Node
# What a device hands out, in a module of its own that the kernels import too.
from kvcore.device.handles import DEVICE, PINNED, Buffer, Event, Stream
from kvcore.device.kernels import Kernel
from kvcore.device.oplog import HOST, KERNEL_PREFIX, Access, OpLog, OpRecord, StreamInfo
from kvcore.device.program import BLOCKING, RECORD, Item, Live, Lowered, Program
from kvcore.device.recorder import Recorder
from kvcore.device.reissue import Reissuer
from kvcore.errors import DeviceFaultError, DeviceUsageError

__all__ = ["Device", "DeviceInfo"]

_KVCORE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_new = tuple.__new__


def _call_site() -> str:
    """The innermost frame outside kvcore: where the user's code issued the op. A frame walk,
    not traceback.extract_stack: this runs for every op while a detector listens."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_KVCORE):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class _Staging(NamedTuple):
    """The pinned buffer pageable copies are staged in, and the event of its last copy."""

    buffer: Buffer
    done: Event


class Device(Backend):
    """A GPU as the page pool sees it. Use :func:`kvcore.open_device` to get one."""

    kind: str = "abstract"

    def __init__(self, *, defects: Defects, seed: int) -> None:
        self.defects = defects
        self.seed = seed
        self.oplog = OpLog()
        self.record_call_sites = False
        # Ops whose device times a backend measures later (a GPU timing them with events):
        # (seq, what the backend returned for it), read by settle_times.
        self.timeline = False
        self._timed: list[tuple[int, object]] = []
        self.fault: DeviceFaultError | None = None
        # Device API calls so far. On the GPU each one lets go of Python's interpreter lock,
        # where another host thread may take over.
        self.calls = 0
        self._ids = itertools.count(1)
        self._streams: list[Stream] = []
        # Weak, so a buffer's memory is freed as soon as its owner drops it (at the end of a
        # trial), not whenever a garbage collection runs: cudaFree synchronizes the device, and
        # one in the middle of a trial would close the race window it is trying to widen.
        self._buffers: weakref.WeakValueDictionary[int, Buffer] = weakref.WeakValueDictionary()
        self._pageable_staging: _Staging | None = None
        # What the backend actions and the records go through: the device, or the recorder
        # of the program being captured (see capture).
        self._actions: Device | Recorder = self
        # Meanwhile, what a live host_write stores and a memset's Live byte: what the
        # recorder keeps in their place.
        self._live_store: np.ndarray | None = None
        self._live_value: Live | None = None
        self._reissuer = Reissuer(self)
        # The reissuer while it hands a run's records out as segments: a record written
        # meanwhile is a reissued call's (see Reissuer.in_call).
        self._run: Reissuer | None = None
        self._graph: Graph | None = None  # the CUDA graph being captured (see begin_graph)
        self.legacy_stream = self._register_stream(
            Stream(0, "legacy_stream", True, True, self._legacy_handle())
        )

    # ---- the interface -------------------------------------------------------------------------
    def create_stream(self, name: str, *, blocking: bool = False, priority: int = 0) -> Stream:
        """A new stream; non-blocking by default, as inference engines create theirs.
        ``priority`` is CUDA's (lower runs first; the device clamps it to its range). Give
        each stream its own name: the op log and findings know streams by name."""
        self._alive()
        return self._register_stream(Stream(next(self._ids), name, blocking, False,
                                            self._actions._do_stream(blocking, priority), priority))

    def rename_stream(self, stream: Stream, name: str) -> None:
        """Give ``stream`` the name the op log and findings use (the legacy stream of a scenario
        that calls it ``default``, say). Rename before issuing work to it."""
        self._check_stream(stream)
        if name != stream.name and name in self.oplog.streams:
            raise DeviceUsageError(f"a stream named {name!r} exists already; name it otherwise")
        self.oplog.streams.pop(stream.name, None)
        stream.name = name
        self.oplog.announce_stream(StreamInfo(name, stream.blocking, stream.legacy,
                                              stream.priority))

    def alloc(self, nbytes: int, *, name: str, role: str = "data") -> Buffer:
        """Device memory of ``nbytes`` bytes (contents undefined)."""
        return self._alloc(nbytes, DEVICE, name, role)

    def alloc_host(self, nbytes: int, *, name: str, role: str = "data") -> Buffer:
        """Pinned (page-locked) host memory of ``nbytes`` bytes, zero-filled, that async copies
        read and write directly, and that kernels can read through unified addressing."""
        return self._alloc(nbytes, PINNED, name, role)

    def create_event(self, name: str) -> Event:
        self._alive()
        return Event(next(self._ids), name, self._actions._do_event())

    def record_event(self, event: Event, stream: Stream) -> None:
        """Record ``event`` on ``stream``: it completes when all work issued before it does."""
        self._check_stream(stream)
        if self._graph is not None and self._graph.record(event, stream):
            return  # a point of the graph, not an op (see kvcore.device.graph)
        times = self._actions._do_record(event, stream)
        if self.oplog.active:
            self._emit(stream.name, "event_record", records=event.name, times=times)

    def wait_event(self, stream: Stream, event: Event) -> None:
        """Make later work on ``stream`` wait for ``event``'s latest record: the fence."""
        self._check_stream(stream)
        if self._graph is not None and self._graph.wait(stream, event):
            return  # a fork into the capture, or a join within it
        times = self._actions._do_wait(stream, event)
        if self.oplog.active:
            self._emit(stream.name, "event_wait", waits=event.name, times=times)

    def copy(
        self, dst: Buffer, dst_off: int, src: Buffer, src_off: int, nbytes: int, stream: Stream
    ) -> None:
        """cudaMemcpyAsync between any two buffers, device or pinned host."""
        self._check_stream(stream)
        # One test for the common case, the named checks only to say what is wrong: a copy
        # sits inside race windows, and each check's call was a measurable part of a trial.
        if dst.owner is not self or src.owner is not self or nbytes < 0 or dst_off < 0 \
                or src_off < 0 or dst_off + nbytes > dst.nbytes or src_off + nbytes > src.nbytes:
            self._check_range(dst, dst_off, nbytes)
            self._check_range(src, src_off, nbytes)
        if self._graph is not None and self._graph.captures(stream):
            self._graph_node("_do_copy", (dst, dst_off, src, src_off, nbytes, stream),
                             _COPY_KIND[src.space, dst.space], (Access(src.id, src_off, nbytes),),
                             (Access(dst.id, dst_off, nbytes),), {})
            return
        times = self._actions._do_copy(dst, dst_off, src, src_off, nbytes, stream)
        if self.oplog.active:
            self._emit(
                stream.name, _COPY_KIND[src.space, dst.space],
                reads=(Access(src.id, src_off, nbytes),),
                writes=(Access(dst.id, dst_off, nbytes),), times=times,
            )

    def copy_2d(
        self, dst: Buffer, dst_off: int, dst_pitch: int, src: Buffer, src_off: int,
        src_pitch: int, width: int, height: int, stream: Stream,
    ) -> None:
        """cudaMemcpy2DAsync: ``height`` rows of ``width`` bytes, each side with its own pitch."""
        self._check_stream(stream)
        if width > min(dst_pitch, src_pitch) or height < 0 or width < 0:
            raise DeviceUsageError(
                f"copy_2d: width {width} exceeds a pitch ({dst_pitch}, {src_pitch})"
            )
        if height:
            self._check_range(dst, dst_off, dst_pitch * (height - 1) + width)
            self._check_range(src, src_off, src_pitch * (height - 1) + width)
        kind = "copy2d" + _COPY_KIND[src.space, dst.space][4:]
        if self._graph is not None and self._graph.captures(stream):
            self._graph_node(
                "_do_copy_2d", (dst, dst_off, dst_pitch, src, src_off, src_pitch, width, height,
                                stream), kind, _rows(src, src_off, src_pitch, width, height),
                _rows(dst, dst_off, dst_pitch, width, height), {})
            return
        times = self._actions._do_copy_2d(dst, dst_off, dst_pitch, src, src_off, src_pitch, width,
                                 height, stream)
        if self.oplog.active:
            self._emit(stream.name, kind, reads=_rows(src, src_off, src_pitch, width, height),
                       writes=_rows(dst, dst_off, dst_pitch, width, height), times=times)

    def copy_sync(self, dst: Buffer, dst_off: int, src: Buffer, src_off: int,
                  nbytes: int) -> None:
        """cudaMemcpy between device or pinned buffers: a copy on the legacy stream (so it waits
        for blocking streams, not for non-blocking ones) that the host waits for. Built from the
        primitives, so the op log shows exactly those two edges."""
        self.copy(dst, dst_off, src, src_off, nbytes, self.legacy_stream)
        self.synchronize_stream(self.legacy_stream)

    def copy_from_pageable(self, dst: Buffer, dst_off: int, data: np.ndarray) -> None:
        """cudaMemcpy from ordinary (pageable) host memory, done as CUDA does it: the bytes are
        staged into pinned memory and the call returns while the DMA from there may still be in
        flight. So the host is NOT ordered after the write, unlike :meth:`copy_sync`."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        staging = self._pageable_staging
        if staging is None or staging.buffer.nbytes < raw.size:
            staging = _Staging(self.alloc_host(max(raw.size, 1 << 16), name="pageable-staging"),
                               self.create_event("pageable-staging"))
            self._pageable_staging = staging
        else:
            self.synchronize_event(staging.done)  # the last staged copy has read the buffer
        buf, done = staging
        self.host_write(buf, 0, raw)
        self.copy(dst, dst_off, buf, 0, raw.size, self.legacy_stream)
        self.record_event(done, self.legacy_stream)

    def memset(self, dst: Buffer, off: int, nbytes: int, value: int | Live,
               stream: Stream) -> None:
        """cudaMemsetAsync of device memory. ``value``: a byte, or a :class:`Live` one (a
        device program issuing this again sets what it holds then)."""
        self._check_stream(stream)
        self._check_range(dst, off, nbytes)
        if dst.space != DEVICE:
            raise DeviceUsageError(f"memset needs device memory; {dst.name} is pinned host memory")
        if type(value) is not Live:
            self._memset(dst, off, nbytes, value & 0xFF, stream)  # type: ignore[operator]
            return
        self._live_value = value  # what a recorder keeps (see Recorder._do_memset)
        try:
            self._memset(dst, off, nbytes, value.value & 0xFF, stream)
        finally:
            self._live_value = None

    def _memset(self, dst: Buffer, off: int, nbytes: int, byte: int, stream: Stream) -> None:
        if self._graph is not None and self._graph.captures(stream):
            if self._live_value is not None:
                raise DeviceUsageError("a memset of a Live byte cannot be captured into a "
                                       "graph (a graph's memset sets the byte it was given)")
            self._graph_node("_do_memset", (dst, off, nbytes, byte, stream), "memset", (),
                             (Access(dst.id, off, nbytes),), {"value": byte})
            return
        times = self._actions._do_memset(dst, off, nbytes, byte, stream)
        if self.oplog.active:
            self._emit(stream.name, "memset", writes=(Access(dst.id, off, nbytes),), times=times,
                       detail={"value": byte})

    def launch(self, kernel: Kernel, stream: Stream) -> None:
        """Launch one of the kernels in :mod:`kvcore.device.kernels` on ``stream``."""
        self._check_stream(stream)
        for buf, lo, hi in kernel.extents():
            self._check_range(buf, lo, hi - lo)
        if self._graph is not None and self._graph.captures(stream):
            if not kernel.graphable:
                raise DeviceUsageError(f"the {kernel.name} kernel cannot be captured into a "
                                       "graph: its arguments live in a ring reused after it "
                                       "runs; issue it outside the capture")
            self._graph_node("_do_launch", (kernel, stream), KERNEL_PREFIX + kernel.name,
                             kernel.reads(), kernel.writes(), kernel.detail())
            return
        times = self._actions._do_launch(kernel, stream)
        if self.oplog.active:
            self._emit(stream.name, KERNEL_PREFIX + kernel.name, reads=kernel.reads(),
                       writes=kernel.writes(), times=times, detail=kernel.detail())

    def host_write(self, buf: Buffer, off: int, data: bytes | np.ndarray, *,
                   live: bool = False) -> None:
        """The host writes ``data`` into pinned memory, now (a plain CPU store, logged).
        ``live``: ``data`` is a contiguous array the caller keeps current, and a device
        program issuing this store again stores what it holds then (otherwise the program
        keeps a copy of the bytes stored now)."""
        flat = isinstance(data, np.ndarray) and data.ndim == 1 and data.flags.c_contiguous
        if isinstance(data, (bytes, bytearray)):
            raw = np.frombuffer(bytes(data), np.uint8)
        elif flat:  # the usual case, in fewer calls
            raw = data.view(np.uint8)  # type: ignore[union-attr]
        else:
            raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        self._host_access(buf, off, raw.size)
        if live:
            if not flat:
                raise DeviceUsageError("a live host_write stores from a contiguous 1-D array "
                                       "(its bytes are read again when a program reissues it)")
            self._live_store = raw  # what a recorder keeps (see Recorder._do_write)
            try:
                self._actions._do_write(buf, off, raw)
            finally:
                self._live_store = None
        else:
            self._actions._do_write(buf, off, raw)
        if self.oplog.active:
            self._emit(HOST, "host_write", writes=(Access(buf.id, off, raw.size),))

    def host_fill(self, buf: Buffer, off: int, nbytes: int, value: int) -> None:
        """The host sets ``nbytes`` bytes of pinned memory to ``value`` (a memset on the CPU)."""
        self._host_access(buf, off, nbytes)
        self._actions._do_fill(buf, off, nbytes, value & 0xFF)
        if self.oplog.active:
            self._emit(HOST, "host_write", writes=(Access(buf.id, off, nbytes),),
                       detail={"value": value & 0xFF})

    def host_read(self, buf: Buffer, off: int, nbytes: int) -> np.ndarray:
        """A copy of ``nbytes`` bytes of pinned memory as the host sees them now."""
        return self.host_view(buf, off, nbytes).copy()

    def host_view(self, buf: Buffer, off: int, nbytes: int) -> np.ndarray:
        """:meth:`host_read` without the copy: a read-only view of the bytes as the host sees
        them now (logged as the same read). A later device op or host store may change what it
        shows, so compare it at once and keep only what the comparison gives."""
        self._host_access(buf, off, nbytes)
        out = self._actions._do_host_view(buf)[off:off + nbytes]  # a view of its own
        out.flags.writeable = False
        if self.oplog.active:
            self._emit(HOST, "host_read", reads=(Access(buf.id, off, nbytes),))
        return out

    def _blocking(self) -> None:
        for hook in self.oplog.blocking_hooks:
            hook()

    # ---- CUDA graphs (see kvcore.device.graph) --------------------------------------------------
    def begin_graph(self, stream: Stream, name: str) -> None:
        """Begin capturing ``stream``'s work into a graph named ``name`` (cudaStreamBeginCapture):
        until :meth:`end_graph`, its copies, memsets and kernels become the graph's nodes and do
        not run. CUDA cannot capture the legacy default stream."""
        self._check_stream(stream)
        if self._graph is not None:
            raise DeviceUsageError(f"graph {self._graph.name!r} is being captured already; "
                                   "end it before beginning another")
        self._graph = Graph(name, stream)  # refuses the legacy stream, as CUDA does

    def end_graph(self) -> Graph:
        """End the capture (cudaStreamEndCapture, then instantiate): the graph, ready to
        launch."""
        self._alive()
        graph = self._graph
        if graph is None:
            raise DeviceUsageError("no graph is being captured; begin_graph first")
        graph.check_joined()
        self._graph = None
        graph.handle = self._do_graph_end(graph)
        graph.ended = True
        return graph

    def abandon_graph(self) -> None:
        """Drop the graph being captured, if any (after an error inside the capture)."""
        self._graph = None

    def launch_graph(self, graph: Graph, stream: Stream) -> None:
        """cudaGraphLaunch: run ``graph``'s nodes on ``stream`` in capture order, as one unit
        (see :mod:`kvcore.device.graph`). Each node writes its op-log record on ``stream``, at
        the launching step, its ``origin`` the line that captured it; ``detail`` names the
        ``graph`` and where it was captured and launched (see :meth:`Graph.launch_records`)."""
        self._check_stream(stream)
        if not graph.ended:
            raise DeviceUsageError(f"graph {graph.name!r} is still being captured; end it "
                                   "before launching it")
        if self._graph is not None:
            raise DeviceUsageError(f"launching graph {graph.name!r} while graph "
                                   f"{self._graph.name!r} is captured is not modelled; end "
                                   "the capture first")
        self._actions._do_graph_launch(graph, stream)
        log = self.oplog
        if log.active:
            for lane in graph.lanes(stream.name).values():
                if lane not in log.streams:
                    log.announce_stream(StreamInfo(lane, False, False, 0))
            record = self._actions._record
            for r in graph.launch_records(stream.name, log.origin):
                record(r.stream, r.kind, r.reads, r.writes, r.records, r.waits, None, None,
                       r.detail)

    def _graph_node(self, name: str, args: tuple[Any, ...], kind: str, reads: tuple[Access, ...],
                    writes: tuple[Access, ...], detail: dict[str, object]) -> None:
        """A stream op on the capturing stream: a node of the graph, not run now."""
        assert self._graph is not None
        self._graph.add(Node(name, args, kind, reads, writes, detail, self.oplog.step,
                             self.oplog.origin))

    def _not_capturing(self, call: str) -> None:
        if self._graph is not None:
            self._graph.refuse_host_wait(call)

    def synchronize(self) -> None:
        """cudaDeviceSynchronize: the host waits for every stream."""
        self._alive()
        self._not_capturing("synchronize")
        self._blocking()
        self._actions._do_sync_device()
        if self.oplog.active:
            self._emit(HOST, "sync_device")

    def synchronize_stream(self, stream: Stream) -> None:
        """cudaStreamSynchronize: the host waits for all work issued to ``stream``."""
        self._check_stream(stream)
        self._not_capturing("synchronize_stream")
        self._blocking()
        self._actions._do_sync_stream(stream)
        if self.oplog.active:
            self._emit(HOST, "sync_stream", syncs=stream.name)

    def synchronize_event(self, event: Event) -> None:
        """cudaEventSynchronize: the host waits for ``event``'s latest record."""
        self._alive()
        self._not_capturing("synchronize_event")
        self._blocking()
        self._actions._do_sync_event(event)
        if self.oplog.active:
            self._emit(HOST, "sync_event", waits=event.name)

    def query_event(self, event: Event) -> bool:
        """cudaEventQuery: whether ``event``'s latest record has completed, without waiting. A
        query that saw "done" orders the host after the record, as a synchronize would; one
        that saw "not ready" orders nothing."""
        self._alive()
        done = self._actions._do_query(event)
        if self.oplog.active:
            self._emit(HOST, "event_query", waits=event.name, detail={"done": done})
        return done

    def poll_event(self, event: Event) -> int:
        """Spin on cudaEventQuery until ``event`` has completed (how some engines wait without a
        blocking synchronize); returns how many queries it took. Logged as one query that saw
        "done"."""
        self._alive()
        self._blocking()
        polls = 1
        while not self._actions._do_query(event):
            polls += 1
        if self.oplog.active:
            self._emit(HOST, "event_query", waits=event.name, detail={"done": True,
                                                                       "polls": polls})
        return polls

    def label(self, buf: Buffer, ranges: Sequence[tuple[int, int]], name: str, *,
              stream: str | None = None) -> None:
        """Say that these byte ranges of ``buf`` now belong to ``name`` (a lease, a pinned block
        of a scenario's buffer): findings then speak of ``name``, and of reuse when the bytes
        had another owner before. ``stream``: the stream a caching allocator handed them out
        on (the one stream it orders their reuse by). Costs nothing while nobody listens."""
        log = self.oplog
        if log.active:
            for off, nbytes in ranges:
                self._check_range(buf, off, nbytes)
                log.labels.alloc(buf.id, off, nbytes, name)
                self._owner_record("alloc", name, buf, off, nbytes, stream)

    def unlabel(self, buf: Buffer, ranges: Sequence[tuple[int, int]]) -> None:
        """These byte ranges were given back (released pages, a freed pinned block)."""
        log = self.oplog
        if log.active:
            for off, nbytes in ranges:
                self._owner_record("free", log.labels.free(buf.id, off, nbytes), buf, off,
                                   nbytes)

    def _owner_record(self, kind: str, name: str | None, buf: Buffer, off: int,
                      nbytes: int, stream: str | None = None) -> None:
        # Not through _emit: an owner change touches no bytes and is issued by kvcore itself,
        # so it needs no scenario line or call-site walk (it runs for every materialize).
        detail: dict[str, object] = {"name": name, "range": [buf.id, off, nbytes]}
        if stream is not None:
            detail["stream"] = stream
        self._actions._record(HOST, kind, (), (), None, None, None, None, detail)

    # ---- programs (see kvcore.device.program) ---------------------------------------------------
    @contextlib.contextmanager
    def capture(self) -> Iterator[Program]:
        """Record the device calls made inside the block as a :class:`Program` that
        :meth:`reissue` can issue again. The calls happen as usual meanwhile. A program whose
        block raised, or that saw a call it cannot stand for (``Program.refused`` says which),
        must not be issued."""
        if self._actions is not self:
            raise DeviceUsageError("a capture is running on this device already")
        program = Program(observed=self.oplog.active)
        if self.timeline:
            program.refuse("timed ops (each op's times are its own)")
        self._actions = Recorder(self, program)
        try:
            yield program
        except BaseException:
            program.refuse("a call that raised")
            raise
        finally:
            self._actions = self
        if program.refused is None:
            program.calls = [Lowered(*self._lower(item), item.kind, item.name in BLOCKING,
                                     item.template) for item in program.items]

    def reissued(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, captured as itself while a capture runs: issuing the program again
        calls it again, in full, at this point, instead of repeating what it did. For work
        that depends on state a program cannot see (a generation that grows, a comparison's
        answer)."""
        actions = self._actions
        if isinstance(actions, Recorder):
            return actions.call(call, args)
        return call(*args)

    def reissue(self, program: Program, start: int = 0, stop: int | None = None) -> None:
        """Issue items ``start`` to ``stop`` of a captured ``program`` again: the same device
        calls, the same records to the op log's observers (numbered and stamped now, or as
        segments, unbuilt, when every observer takes them so), the calls captured as
        themselves called again. On an error, ``program.failed_at`` is the item that raised;
        CUDA's errors arrive as kvcore's, as from any other call."""
        self._reissuer.issue(program, start, stop)

    def _lower(self, item: Item) -> tuple[Callable[..., Any] | None, tuple[Any, ...]]:
        """The call that issues ``item`` again (None: nothing to call, only its record). A
        backend may put a cheaper call of its own for an action."""
        if item.kind == RECORD:
            return None, ()
        if item.name == "_do_memset" and type(item.args[3]) is Live:
            return self._reissuer.memset_live, (item.fn, *item.args)
        return item.fn, item.args

    def settle_times(self) -> list[tuple[int, int, int]]:
        """The device times of the ops timed since the last call, as ``(seq, t_start_ns,
        t_end_ns)`` on the host's clock, handed to the op log's times observers too. Call it
        with the device idle (after a synchronize); an op whose times cannot be read (its
        context died) is left out."""
        pending, self._timed = self._timed, []
        times = self._do_times(pending) if pending else []
        for observer in self.oplog.times_observers:
            observer(times)
        return times

    def host_step(self) -> None:
        """The harness goes on to a scenario's next step. Real time passes on the GPU; the
        simulated device moves its clock on by what a step costs the harness there, so a small
        copy issued by the step before can land meanwhile, as it does."""
        self._actions._do_host_step()

    def host_thread_switch(self, *, start: bool) -> None:
        """The host goes on in another of its threads (``start``: one that had not run yet).
        Real time passes on the GPU; the simulated device moves its clock on by what a start or
        a switch costs, so a device op issued just before can finish meanwhile, as it does."""
        self._actions._do_host_thread_switch(start)

    def clock_ns(self) -> int:
        """The host clock in ns: virtual time on sim, perf_counter on cuda (for benchmarks)."""
        return self._clock_ns()

    @property
    def streams(self) -> Sequence[Stream]:
        return tuple(self._streams)

    # ---- shared checks -------------------------------------------------------------------------
    def _register_stream(self, stream: Stream) -> Stream:
        self._streams.append(stream)
        stream.owner = self
        self.oplog.announce_stream(StreamInfo(stream.name, stream.blocking, stream.legacy,
                                              stream.priority))
        return stream

    def _alloc(self, nbytes: int, space: str, name: str, role: str) -> Buffer:
        self._alive()
        if self._graph is not None:
            raise DeviceUsageError(f"allocating {name} while graph {self._graph.name!r} is "
                                   "captured: CUDA refuses cudaMalloc during a capture; "
                                   "allocate before begin_graph")
        if nbytes <= 0:
            raise DeviceUsageError(f"cannot allocate {nbytes} bytes for {name}")
        handle = self._actions._do_alloc(nbytes, space)
        buf = Buffer(next(self._ids), name, space, nbytes, role, handle)
        buf.owner = self
        self._buffers[buf.id] = buf
        self.oplog.announce_buffer(buf.info())
        return buf

    def _alive(self) -> None:
        self.calls += 1
        if self.fault is not None:
            raise self.fault

    def _check_stream(self, stream: Stream) -> None:
        self.calls += 1
        if self.fault is not None:
            raise self.fault
        if stream.owner is not self:
            raise DeviceUsageError(f"{stream!r} does not belong to this {self.kind} device")

    def _check_range(self, buf: Buffer, off: int, nbytes: int) -> None:
        if buf.owner is not self:
            raise DeviceUsageError(f"{buf!r} was not allocated on this device")
        if off < 0 or nbytes < 0 or off + nbytes > buf.nbytes:
            raise DeviceUsageError(
                f"bytes [{off}, {off + nbytes}) are outside {buf.name} ({buf.nbytes} bytes)"
            )

    def _host_access(self, buf: Buffer, off: int, nbytes: int) -> None:
        if self.fault is not None:  # not _alive: a CPU store calls nothing on the device
            raise self.fault
        self._check_range(buf, off, nbytes)
        if buf.space != PINNED:
            raise DeviceUsageError(
                f"the host cannot touch {buf.name} directly: it is device memory; copy it first"
            )

    def _emit(
        self, stream: str, kind: str, *, reads: tuple[Access, ...] = (),
        writes: tuple[Access, ...] = (), records: str | None = None, waits: str | None = None,
        syncs: str | None = None, times: tuple[int, int] | None = None,
        detail: dict[str, object] | None = None,
    ) -> None:
        if self._run is not None:  # a call of a reissued run: where it is, before the below
            self._run.in_call()
        log = self.oplog
        info: dict[str, object] = {} if detail is None else detail  # callers build it fresh
        # Where the op came from: the scenario's line when a scenario step issued it (what
        # findings print), else the Python line, found by a frame walk only then.
        if log.origin is not None:
            info["origin"] = log.origin
        elif self.record_call_sites:
            info["site"] = _call_site()
        self._actions._record(stream, kind, reads, writes, records, waits, syncs, times, info)

    def _record(self, stream: str, kind: str, reads: tuple[Access, ...],
                writes: tuple[Access, ...], records: str | None, waits: str | None,
                syncs: str | None, times: object, info: dict[str, object]) -> None:
        """Number an op, stamp it, and hand its record to the observers: every record of the
        log is made here."""
        if self._run is not None:  # a call of a reissued run
            self._run.in_call()
        log = self.oplog
        if log.thread is not None:  # a scenario's host thread: its own track in a timeline
            info["thread"] = log.thread
        log.seq += 1
        if times is None:
            start = end = None
        elif type(times) is tuple:
            start, end = times
        else:  # the backend will know them once the device has run it (settle_times)
            self._timed.append((log.seq, times))
            start = end = None
        # tuple.__new__ rather than OpRecord(...): the named tuple's own __new__ is a Python
        # function, and this runs for every op while anyone listens.
        record = _new(OpRecord, (log.seq, stream, kind, reads, writes, records, waits, syncs,
                                 log.step, self._clock_ns(), start, end, info))
        for observer in log.observers:
            observer(record)


def _rows(buf: Buffer, off: int, pitch: int, width: int, height: int) -> tuple[Access, ...]:
    """The rows of a strided copy's side, as accesses."""
    return tuple(Access(buf.id, off + r * pitch, width) for r in range(height))


_COPY_KIND = {(a, b): f"copy_{x}to{y}" for a, x in ((DEVICE, "d"), (PINNED, "h"))
              for b, y in ((DEVICE, "d"), (PINNED, "h"))}
"""A copy's op-log kind by (source space, destination space): ``copy_htod`` and so on."""


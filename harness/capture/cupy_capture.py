"""The CuPy source's shared state: one watched call becoming one op, and how it is said.

Every hook of the CuPy source (its memory, streams, copies, ndarray methods, kernels and module
functions, each in a module of its own) reports through one :class:`CupyCapture`: the sink, the
streams announced so far, the patches to undo, the failures counted, and the call in progress on
each thread (:class:`CallFrame`). A watched call runs through :meth:`CupyCapture.run`: what it
reads and is known to write is planned before it runs (:class:`CallPlan`), the fresh arrays it
returns are written too, and what CuPy does inside it is that op, not ops of its own; but an
event CuPy records or a synchronize it makes inside the call is ordered after the op's work, so
the op is written out first (:meth:`CupyCapture.commit`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, NamedTuple

from harness.capture.amplify import Amplifier
from harness.capture.cupy_spans import CupySpans
from harness.capture.events import LEGACY_STREAM, PER_THREAD_STREAM, Sink, Span
from harness.capture.extents import covered
from harness.capture.sites import program_site, thread_name
from harness.capture.source import Failures

SOURCE = "cupy"
"""What the events of the CuPy source say as their ``source``."""


class CallPlan(NamedTuple):
    """What a watched call reads and is known to write, worked out before it runs, and the
    stream it is issued on."""

    reads: list[Span]
    writes: list[Span]
    sid: int


class CallFrame:
    """One watched call in progress on this thread: what it was known to read and write before
    it ran, and the blocks the pools handed out while it ran (its outputs, its temporaries,
    CuPy's pinned staging buffers)."""

    __slots__ = ("label", "kind", "sid", "site", "reads", "writes", "allocs", "staging",
                 "committed", "covered")

    def __init__(self, label: str, kind: str, sid: int, site: str | None, reads: list[Span],
                 writes: list[Span]) -> None:
        self.label, self.kind, self.sid, self.site = label, kind, sid, site
        self.reads, self.writes = reads, writes
        self.allocs: list[Span] = []
        self.staging: list[Span] = []
        self.committed = False
        self.covered: list[Span] = []


OPAQUE = CallFrame("", "", 0, None, [], [])
OPAQUE.committed = True
"""The frame of a copy whose op was written before it ran: nothing inside it is an op."""

_SPIN_CODE = r'''
extern "C" __global__ void gpurace_delay(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
'''
"""The delay: one thread spinning on the global timer (nanoseconds, whatever the clock)."""


class CupyCapture:
    """The state one install's hooks share, what they report through, and their undoing."""

    def __init__(self, sink: Sink, cupy: Any, amplifier: Amplifier | None = None) -> None:
        self.sink = sink
        self.cp = cupy
        self.active = False
        self.tls = threading.local()
        self._patches: list[tuple[Any, str, Any, bool]] = []
        self._undo: list[Callable[[], None]] = []
        self.spans = CupySpans(cupy)
        self._seen_streams: set[int] = set()
        self._stream_sites: dict[int, str | None] = {}
        self._notes: set[Any] = set()
        self.failures = Failures(self.emit, "the CuPy source")
        self.amplifier = amplifier
        self._spin: Any = None  # the delay's kernel, built at the first delay
        self._delay_streams: dict[int, Any] = {}

    # -- undoing ------------------------------------------------------------------------------

    def patch(self, target: Any, name: str, value: Any) -> Any:
        """Set ``target.name`` to ``value``, remembering how to undo it; the original."""
        # A class's own entry is kept as it is (a property, a plain function) so undoing puts
        # back exactly that; an inherited one is undone by deleting the override.
        own = name in vars(target)
        original = vars(target)[name] if own else getattr(target, name)
        setattr(target, name, value)
        self._patches.append((target, name, original, own))
        return original

    def on_uninstall(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` when the source stops, after the patches are taken out."""
        self._undo.append(undo)

    def uninstall(self) -> None:
        """Take every hook out (what the program still holds, such as a RawKernel it built,
        falls back to CuPy's own behaviour), say the failures' counts and write out what is
        buffered."""
        if not self.active:
            return
        self.active = False
        for target, name, original, own in reversed(self._patches):
            if own:
                setattr(target, name, original)
            else:
                delattr(target, name)
        self._patches.clear()
        for undo in self._undo:
            undo()
        self._undo.clear()
        for line in self.failures.summary():  # emit() says nothing once inactive
            self.sink.emit(["note", line])
        self.sink.flush()

    # -- emitting -----------------------------------------------------------------------------

    def emit(self, event: list[Any]) -> None:
        if self.active:
            self.sink.emit(event)

    def note(self, text: str, key: Any = None) -> None:
        """A ``note`` event, once per ``key`` (the text itself by default)."""
        key = text if key is None else key
        if key not in self._notes:
            self._notes.add(key)
            self.emit(["note", text])

    def failed(self, where: str, exc: BaseException) -> None:
        """Our own bookkeeping broke on a call: the call still runs, unwatched, and says so."""
        self.failures.failed(where, exc)

    def sid(self, ptr: int) -> int:
        """The vocabulary's name of the stream with handle ``ptr``, announced the first time."""
        sid = LEGACY_STREAM if ptr in (0, 1) else ptr  # 1 is cudaStreamLegacy by its own name
        if sid not in self._seen_streams:
            self._seen_streams.add(sid)
            self._announce(sid)
        return sid

    def _announce(self, sid: int) -> None:
        rt = self.spans.rt
        if sid == LEGACY_STREAM:
            blocking, name = True, "legacy"
        elif sid == PER_THREAD_STREAM:
            blocking, name = True, "per-thread"  # not non-blocking: it orders with legacy
        else:
            name = None
            try:
                blocking = not rt["streamGetFlags"](sid) & rt["streamNonBlocking"]
            except Exception:  # a handle CUDA does not know: CuPy's default flag
                blocking = True
        site = self._stream_sites.get(sid) or program_site()
        self.emit(["stream", sid, {"blocking": bool(blocking), "legacy": sid == LEGACY_STREAM,
                                   "name": name, "site": site, "source": SOURCE}])

    def stream_created(self, ptr: int) -> None:
        """A stream the program made: where (its announcement names that line), and forget a
        destroyed stream that had the same handle."""
        if ptr not in (0, 1, PER_THREAD_STREAM):
            self._stream_sites[ptr] = program_site()
            self._seen_streams.discard(ptr)

    def current_sid(self) -> int:
        return self.sid(self.cp.cuda.get_current_stream().ptr)

    def stream_sid(self, stream: Any) -> int:
        """The sid of a ``stream=`` argument (None: the current stream)."""
        return self.current_sid() if stream is None else self.sid(stream.ptr)

    def op(self, sid: int | None, kind: str, reads: list[Span], writes: list[Span],
           site: str | None, label: str, sync: bool = False) -> None:
        self.emit(["op", sid, kind, reads, writes, {"site": site, "op": label,
                                                    "thread": thread_name(),
                                                    "source": SOURCE, "sync": sync,
                                                    "t": perf_counter_ns()}])

    def before_wait(self) -> None:
        """The host is about to wait on the device: write everything out first, since a dead
        context or a hang is found right here."""
        self.sink.flush()

    def on_sync(self, event: list[Any]) -> None:
        """A host wait: the current call's op, the wait, then everything written out. Inside a
        copy that already said it waits (its op's ``sync``), only the writing out."""
        if not self.active:
            return
        if self.frame is not OPAQUE:
            self.ordered()
            self.emit(event)
        self.before_wait()

    # -- calls --------------------------------------------------------------------------------

    @property
    def frame(self) -> CallFrame | None:
        return getattr(self.tls, "frame", None)

    def run(self, label: str, kind: str, call: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any], plan: Callable[[], CallPlan]) -> Any:
        """Run one watched call as one op. ``plan`` says, before the call, what it reads, what
        it is known to write and on which stream; the fresh arrays it returns are written too.
        A call inside another watched call is part of that one's op."""
        if not self.active or self.frame is not None:
            return call(*args, **kwargs)
        try:
            planned = plan()
            frame = CallFrame(label, kind, planned.sid, program_site(), planned.reads,
                              planned.writes)
        except Exception as exc:
            self.failed(label, exc)
            return call(*args, **kwargs)
        if self.amplifier is not None:
            self.amplify(frame.site, kind, planned.sid)
        self.tls.frame = frame
        try:
            result = call(*args, **kwargs)
        finally:
            self.tls.frame = None
        try:
            self.finish(frame, result)
        except Exception as exc:
            self.failed(label, exc)
        return result

    def ordered(self) -> None:
        """Something that follows the current call's work is about to be written (an event
        CuPy records to mark the work done, a synchronize, a copy of its result): write the
        call's op first."""
        frame = self.frame
        if frame is not None and not frame.committed:
            self.commit(frame, None)

    def commit(self, frame: CallFrame, writes: list[Span] | None) -> None:
        """Write the frame's op. Early (``writes`` None), the blocks handed out so far stand for
        its outputs. CuPy's staging buffers are pinned blocks it filled on the host first."""
        if writes is None:
            writes = frame.writes + frame.allocs
        if not writes and not frame.staging:
            return
        frame.committed, frame.covered = True, writes
        for block in frame.staging:
            self.op(None, "host_write", [], [block], frame.site, frame.label)
        # Never said to wait: a copy CuPy makes inside a call goes through pinned memory or is
        # a fill, and a wait that did not happen would hide a race (its own waits are events).
        self.op(frame.sid, frame.kind, frame.reads + frame.staging, writes, frame.site,
                frame.label)

    def finish(self, frame: CallFrame, result: Any) -> None:
        """The call returned: write its op with the fresh arrays it returned (an array that
        shares bytes with an argument is a view, not a write)."""
        known = frame.reads + frame.writes
        fresh = [r for r in self.spans.ranges(result) if not covered(r, known)]
        if frame.committed:
            extra = [r for r in fresh if not covered(r, frame.covered)]
            if extra:
                self.op(frame.sid, frame.kind, frame.reads, extra, frame.site, frame.label)
            return
        self.commit(frame, frame.writes + fresh)

    # -- copies -------------------------------------------------------------------------------

    def copy_op(self, label: str, kind: str, sid: int, reads: list[Span],
                writes: list[Span], sync: bool) -> None:
        """A copy whose op is known before it runs: written first (after the current call's
        op), and everything written out before it runs if it waits."""
        self.ordered()
        if reads or writes:
            site = program_site()
            if self.amplifier is not None:
                self.amplify(site, kind, sid)
            self.op(sid, kind, reads, writes, site, label, sync)
        if sync:
            self.before_wait()

    def opaque(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a copy whose op was written: nothing inside it is reported again."""
        outer = self.frame
        self.tls.frame = OPAQUE
        try:
            return call(*args, **kwargs)
        finally:
            self.tls.frame = outer

    # -- delays -------------------------------------------------------------------------------

    def amplify(self, site: str | None, kind: str, sid: int | None) -> None:
        """Queue the delay the amplifier wants before this op, on the op's stream: a spin on
        the GPU's global timer, so its length does not follow the SM clock."""
        assert self.amplifier is not None
        delay = self.amplifier.wants(site, kind)
        if delay is None or sid is None:
            return
        try:
            if self._spin is None:
                self._spin = self.cp.RawKernel(_SPIN_CODE, "gpurace_delay")
            stream = self._delay_streams.get(sid)
            if stream is None:
                stream = self._delay_streams[sid] = self.cp.cuda.ExternalStream(sid)
            import numpy
            ns = numpy.uint64(int(delay.us * 1000))
            self.opaque(self._spin, (1,), (1,), (ns,), stream=stream)
        except Exception as exc:  # a delay that cannot be queued must not stop the program
            self.amplifier.failed(delay, repr(exc))
            return
        self.amplifier.queued(delay, sid)


def named(function: Callable[..., Any], name: str, original: Any) -> Callable[..., Any]:
    """``function`` under the hooked attribute's name, with its doc."""
    function.__name__ = function.__qualname__ = name
    function.__doc__ = getattr(original, "__doc__", None)
    return function

"""The capture vocabulary: what a source inside the watched program says happened.

A source (PyTorch's dispatch mode and trace callbacks, CuPy's hooks) reports each device-visible
action as one *event*, a short JSON list whose first item names its type. The watched process
appends events to a :class:`Sink`, which writes them to the capture file as JSON Lines, one event
a line, in the order they happened on the host; the watching process reads that file as it grows
(:func:`read_events`) and translates it (:mod:`harness.capture.translate`). The same files,
recorded on a GPU and committed, are what the translator's tests replay where no GPU is.

Memory is named by address, as the program's own allocator sees it: an access is
``[space, address, nbytes]`` with ``space`` ``"d"`` (device memory) or ``"h"`` (pinned host
memory, which a stream's copy reads or writes and the host touches directly). Streams are named
by their ``cudaStream_t`` value (``0``: the legacy default stream, ``2``: the per-thread default
stream); events by any number the source keeps unique while the event lives. ``site`` is the
program's own ``file:line`` that made the call (never a library frame), or None.

The events, field by field::

    ["hello", {"schema", "pid", "argv", "cwd", "python", "importable": [name, ...]}]
    ["source", name, version]                    a source switched on (as its framework loaded)
    ["stream", sid, {"blocking", "legacy", "name", "site", "source"}]
    ["alloc", space, address, nbytes, {"what", "name", "site", "stream", "source"}]
        what: ``tensor float16[8, 64]``, ``array``...; name: the program's variable for it,
        when its frame has one (a source may fill it in until the event is written out)
    ["event", event, {"name", "site", "source"}] an event the program made
    ["free", space, address, {"site", "streams", "source"}]
        streams: the streams the block was recorded on (``record_stream``) beyond its own:
        the allocator hands the bytes out again only once the work queued on them is done
    ["op", sid, kind, reads, writes, {"site", "op", "thread", "source", "sync", "t"}]
        sid None: the host's own access (kind ``host_read`` / ``host_write``); a stream op's
        kind is ``kernel:NAME``, ``copy_htod``/``copy_dtoh``/``copy_dtod``/``copy_htoh`` or
        ``memset``; ``sync`` true: the host waited for the stream after issuing it (a
        synchronous copy, ``.item()``); ``t`` the host's clock when it was issued, in ns
        (``time.perf_counter_ns``: only differences between one run's ops mean anything)
    ["record", event, sid, site]                 cudaEventRecord
    ["wait", event, sid, site]                   cudaStreamWaitEvent
    ["sync_event", event, site]                  cudaEventSynchronize
    ["query", event, done, site]                 cudaEventQuery, and what it saw
    ["sync_stream", sid, site]                   cudaStreamSynchronize
    ["sync_device", site]                        cudaDeviceSynchronize
    ["graph_begin", graph, sid, site]            a CUDA graph's capture began on stream sid:
        what is issued on sid (and on the streams that wait for events recorded there) until
        graph_end is the graph's body, not run now
    ["graph_end", graph, site]                   its capture ended
    ["graph_replay", graph, sid, site, t]        its body issued on stream sid, as one launch
        (``t`` the host's clock then, as an op's)
    ["note", text]                               something the source could not see, in words
    ["delays", [{"path", "line", "us", "kind", "queued", "streams"}, ...], [failure, ...]]
        what amplification queued (:mod:`harness.capture.amplify`), written as the program ends
    ["stats", {"source", "ops", "own_ns", "max_own_ns", "max_site", "slow", "failures"}]
        what a source cost the program, written as it stops: ops it handled, nanoseconds of
        its own code over all of them and on the costliest one (and that op's site), the
        first ops it spent over 10 ms on ([ns, site, op]), and what it could not read,
        counted (those ops ran unwatched)
    ["exit", {"status", "error", "traceback"}]   how the program ended, as its process saw it

Every field is optional but the positional ones; a reader ignores keys it does not know, so a
newer source's extra detail does not break an older gpurace.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from harness.capture.backlog import Backlog
from harness.faults.writes import reason

CAPTURE_SCHEMA = "gpurace.capture/1"
DEVICE = "d"
HOST = "h"
LEGACY_STREAM = 0
PER_THREAD_STREAM = 2


class Span(NamedTuple):
    """One access, ``[space, address, nbytes]``: JSON writes it as that very list."""

    space: str  # DEVICE or HOST
    address: int
    nbytes: int


LOST = "gpurace watch: capture stopped, the events file cannot be written: "
"""The line a program's capture says on its standard error when its events file will not take
more (the reason follows)."""

FLUSH_EVENTS = 4096
"""Events a sink holds before it writes them out, at most (it writes at every host wait too)."""


def _not_json(value: Any) -> Any:
    raise TypeError(f"not JSON: {value!r}")


def _encoder() -> Callable[[Any], str]:
    """An event's compact JSON line, by the standard library's C encoder made once (json.dumps
    with any argument set builds a new encoder, and its own C one, at every call: twice the
    time of the line itself). An event is a tree, so no check for cycles."""
    from json import encoder
    make = getattr(encoder, "c_make_encoder", None)
    if make is None:  # a Python without json's C speedups
        return json.JSONEncoder(separators=(",", ":")).encode
    iterate = make(None, _not_json, encoder.encode_basestring_ascii, None, ":", ",", False,
                   False, True)
    return lambda event: "".join(iterate(event, 0))


_encode = _encoder()


class Sink:
    """Where a source's events go: a buffer, written to the capture file in batches.

    A batch is written whenever the host is about to wait on the device (a synchronize: the
    moment a dead context or a hung kernel is found, and the process may never come back), when
    the buffer holds :data:`FLUSH_EVENTS`, at exit, and, once :meth:`flush_when_quiet` is on,
    whenever no event has come for a while; so a program that dies loses at most the events
    since its last wait, or, idle, none. An event is written as its JSON line when it is
    emitted: what the sink holds are strings, which Python's garbage collector does not track,
    so a program with a large heap pays no full collection for thousands of held lists
    (measured: 650 ms once in 200,000 ops beside 3 million objects). An event that may still
    change until it is written out (a tensor's name, filled in at the next op) is
    :meth:`hold`'s. Thread-safe: sources may fire from any of the program's threads (an emit
    waits while another thread's flush writes). With a ``backlog``, a write waits while the
    watch is too far behind in reading the file (:mod:`harness.capture.backlog`)."""

    def __init__(self, out: TextIO, backlog: Backlog | None = None) -> None:
        self._out = out
        self._events: list[str | list[Any]] = []
        # Re-entrant: a signal handler of the program's (a checkpoint saved at SIGTERM) may
        # run its own CUDA work in the middle of a flush, on the same thread.
        self._lock = threading.RLock()
        self._flushing: int | None = None  # the thread writing out now
        self.closed = False
        self.lost = ""  # why the capture file stopped taking events, or ""
        self.backlog = backlog  # how far the sink may write ahead of the watch, if bounded
        self.written = 0  # bytes written (JSON is ASCII: a character is a byte)
        # Called before a write when the process is quiet (flush_when_quiet): a source that
        # holds events to finish them at its next op (a tensor's name) finishes them there.
        self.on_quiet: list[Callable[[], None]] = []

    @classmethod
    def to_path(cls, path: str | os.PathLike[str], backlog: Backlog | None = None) -> Sink:
        return cls(open(path, "a", encoding="utf-8", buffering=1 << 16),  # noqa: SIM115
                   backlog)

    def emit(self, event: list[Any]) -> None:
        self._add(_encode(event) + "\n")

    def hold(self, event: list[Any]) -> None:
        """Emit an event that its source may still change until the next flush."""
        self._add(event)

    def _add(self, event: str | list[Any]) -> None:
        with self._lock:  # another thread's flush may be taking the list
            events = self._events
            events.append(event)
        if len(events) >= FLUSH_EVENTS:
            self.flush()

    def flush(self) -> None:
        """Write what is held, and hand it to the operating system (not to the disk: the
        watching process reads it, and a crashed program's file stays with the kernel).

        A file that will not take them (a full disk, its folder removed) is never the
        program's failure: the capture stops there, says so once on the program's standard
        error (:data:`LOST`, which the watching process looks for), and the program runs on."""
        if self._flushing == threading.get_ident():
            return  # a signal handler's, inside this thread's flush: the next one writes it
        with self._lock:
            if self.closed:
                self._events = []
                return
            events, self._events = self._events, []
            self._flushing = threading.get_ident()
            try:
                if events:
                    text = "".join(e if isinstance(e, str) else _encode(e) + "\n"
                                   for e in events)
                    self._out.write(text)
                    self.written += len(text)
                self._out.flush()
            except OSError as exc:
                self.closed, self.lost = True, reason(exc)
                with contextlib.suppress(OSError):
                    self._out.close()
                # The program's own stderr may be closed or replaced: never its failure either.
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    print(f"{LOST}{self.lost}", file=sys.stderr, flush=True)
                return
            finally:
                self._flushing = None
            written = self.written
        # Waited for outside the lock: a signal handler that runs meanwhile (a checkpoint
        # saved at SIGTERM) may emit and flush without deadlocking on it.
        backlog = self.backlog  # close() may take it meanwhile
        if backlog is not None:
            backlog.wrote(written)

    def flush_when_quiet(self, seconds: float) -> None:
        """Write what is held once no event has come for about ``seconds``, from a thread of
        the sink's own, until the sink is closed: for a process that may be ended while it
        waits on something other than the device (a pool worker idle on its task queue, then
        ended by SIGTERM). No host wait comes there to write its last events, and no exit
        handler runs. A busy process is left to write in its batches; what the sources still
        hold is finished first (:attr:`on_quiet`)."""
        def run() -> None:
            # Never the program's failure, nor a traceback on its stderr (a bare thread's
            # would go there): each step's failure is its own, and the loop's ends it.
            with contextlib.suppress(Exception):
                before = 0
                while not self.closed:
                    time.sleep(seconds)
                    held = len(self._events)
                    if held and held == before:  # none came since the last look
                        with contextlib.suppress(Exception):
                            for finish in self.on_quiet:
                                finish()
                        with contextlib.suppress(Exception):
                            self.flush()
                        held = 0
                    before = held

        # A bare thread, not a threading.Thread: the program's threading.enumerate() and
        # active_count() stay what they are unwatched (a test may count its threads).
        _thread.start_new_thread(run, ())

    def forked(self) -> None:
        """In a child forked from this process: never write again. The lock is made anew, as
        another thread of the parent (one of the program's, or the sink's own) may have held
        it at the fork, and the child has no such thread to let it go."""
        self._lock = threading.RLock()
        self._flushing = None
        self.closed = True

    def close(self) -> None:
        backlog, self.backlog = self.backlog, None  # the last write waits for no one
        if backlog is not None and (said := backlog.note()):
            self.emit(["note", said])
        self.flush()
        with self._lock:
            if not self.closed:
                self.closed = True
                with contextlib.suppress(OSError):  # said by flush already, if it failed
                    self._out.close()


READ_MAX = 4 << 20
"""Bytes of a capture file read and analysed at a time (about 20,000 events). A long run's file
grows to gigabytes, and its events as Python lists take five times their bytes (24.7 MB of a
recorded transformers run parse to 124 MB): read whole, the watching process would run out of
memory at the end of the very runs that need it most."""


def read_events(path: Path, offset: int = 0, limit: int | None = None
                ) -> tuple[list[list[Any]], int]:
    """The whole events of the capture file from byte ``offset`` on, about ``limit`` bytes of
    them at most (:data:`READ_MAX` unless said; a longer line is read whole), and the offset
    after the last whole line (a line still being written is left for the next read)."""
    limit = READ_MAX if limit is None else limit
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(limit)
        skip = len(data) - len(data.lstrip(b"\0"))
        if skip:  # bytes given back once read (give_back): the lines after them come next
            if skip == len(data):  # all of it a hole, maybe gigabytes: on where data is
                with contextlib.suppress(OSError, AttributeError):  # no data after it yet
                    skip = max(skip, os.lseek(f.fileno(), offset, os.SEEK_DATA) - offset)
            return [], offset + skip
        end = data.rfind(b"\n") + 1
        while end == 0 and len(data) >= limit:  # no line's end yet: the line is that long
            more = f.read(limit)
            if not more:
                break
            data += more
            end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        if line.strip():
            try:
                events.append(json.loads(line))
            except ValueError as exc:
                raise NotEvents(f"{path}: a line that is not an event's JSON ({exc}): "
                                f"{line[:80]!r}", offset + end) from None
    return events, offset + end


class NotEvents(ValueError):
    """A capture file's line that is not an event (a file no capture wrote, or one damaged):
    ``after`` is the offset past the batch it came in, where a reader may go on."""

    def __init__(self, message: str, after: int) -> None:
        super().__init__(message)
        self.after = after


_PUNCH_HOLE = 0x03  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE


def give_back(path: Path, upto: int) -> bool:
    """Give the disk back the first ``upto`` bytes of a capture file, read already (``upto``
    at a line's end). A hole is punched in place: the program appending to the file and the
    offsets taken in it stay as they are, and a reader finds zeros there, which it skips.
    Linux only, on a file system that has holes; whether it was done."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = libc.fallocate
    except (OSError, AttributeError):
        return False
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    try:
        with open(path, "r+b") as f:
            return fallocate(f.fileno(), _PUNCH_HOLE, 0, upto) == 0
    except OSError:
        return False


def batches(path: Path, offset: int = 0) -> Iterator[tuple[list[list[Any]], int]]:
    """A finished capture file's events from byte ``offset`` on, :data:`READ_MAX` bytes at a
    time, each batch with the offset after it (a torn last line is left out)."""
    while True:
        events, after = read_events(path, offset)
        if after == offset:
            return
        offset = after
        yield events, offset


def iter_file(path: Path) -> Iterator[list[Any]]:
    """Every event of a finished capture file (a torn last line is left out), read a batch
    at a time."""
    for events, _ in batches(path):
        yield from events

"""The flight recorder: a trial's op trace on disk, current up to the last time the host blocked.

A worker may die at any moment (a device-side assert surfaces at a synchronize; a hang blocks in
one until the watchdog kills it). So the recorder keeps records in memory while the host issues
work, and writes them to the trial's trace file just before every blocking call, and at the
trial's end when its trace is kept. Whatever the worker's fate, the parent then finds every op
issued before the fatal wait.

The file is written through a shared memory map: a write is a copy into the kernel's page cache,
with no system call, and what was copied outlives the process as a write() would (not a crash of
the machine). The file is kept longer than its lines, the rest zeros, until the trial's trace is
kept or the recorder closes; the parent cuts a dead worker's file at its last whole line.

A disk that will not take the trace (full, a quota, the folder removed) costs the trace, never
the trial: the file's room is reserved before it is mapped (so a full disk is an error here,
not a SIGBUS at a copy into the map), and the recorder then drops that trial's trace and says
why (:attr:`FlightRecorder.error`), the next trial trying again.

The trace file is versioned JSON Lines (:mod:`harness.traces.optrace` describes and reads it).
A trial the device reissued from a captured program comes as segments (its records unbuilt):
the recorder writes each piece of the program once per trace, as a "program" record, and each
time it runs, one short "run" record (its first seq, one issue time, the bytes its live memsets
set), rather than an op line per op. Readers expand the runs into their ops (:func:`plain`
writes a trace's ops out in full, as the parent does for an incident). A recorder made with
``issue_times`` takes the records instead, each op with its own issue time. The lines
themselves are :mod:`harness.traces.lines`'s, the writer a watched run's trace shares.
A worker killed in the middle of a write leaves a torn last line; :func:`cut_torn_tail` is how
the parent takes such a file in, so every reader after it can be strict.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.faults.writes import reason
from harness.traces.lines import (buffer_line, header_line, label_line, op_line, program_line,
                                  run_line, stream_line, times_line, with_numbers)
from kvcore.device import Device, OpRecord
from kvcore.device.oplog import Label, OpLog, Segment

CURRENT = "trial-current.jsonl"
TRACE_MAP_BYTES = 1 << 16
"""The trace file's first size (it doubles as a trial needs): a trial of a step-list scenario
writes a few KiB, a replay of ninfer-210 about 250 KiB."""
PROGRAMS_MAX = 65536
"""The most program pieces a recorder numbers before it forgets them (it holds each one)."""


def trace_path(folder: Path, index: int) -> Path:
    """Where a finished trial's trace is kept when the trial was not clean."""
    return folder / f"trial-{index:06d}.jsonl"


@dataclass(frozen=True, slots=True)
class Piece:
    """A piece of a reissued program, the number its "program" record has, and that record's
    line (made once: a piece runs trial after trial). The templates are held so that no other
    tuple takes their id while the piece is known by it."""

    templates: tuple[tuple[Any, ...], ...]
    number: int
    line: str


class FlightRecorder:
    """Records every op of the devices it is attached to into ``folder/trial-current.jsonl``."""

    def __init__(self, folder: Path, issue_times: bool = False) -> None:
        self.folder = folder
        self.issue_times = issue_times  # every op its own issue time: records, not segments
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / CURRENT
        self._map: mmap.mmap | None = None
        self._fd = -1
        self._used = 0  # bytes of the file the trial has written
        self._pending: list[OpRecord | Segment] = []
        self._times: list[tuple[int, int, int]] = []  # device times measured after the ops
        self._first_seq = 0  # the trial's first op
        self._device: Device | None = None
        self._log = OpLog()  # the device's op log (this one until a device is attached)
        # Who owned which bytes when the trial began: the trial's first flush writes them,
        # with every buffer and stream (then None). Those lines are kept while the op log
        # declares nothing new and the owners are the same (``_opening``): a worker's
        # trials mostly begin alike.
        self._labels: tuple[Label, ...] | None = ()
        self._opening: tuple[tuple[OpLog, int, tuple[Label, ...]] | None, list[str]] = (
            None, [])
        # The header's line without the trial's numbers, for the header it was made of.
        self._header: tuple[dict[str, Any] | None, str] = (None, "")
        # How many of the op log's buffers and streams this trace has declared. The op log
        # only ever adds to them, in order: what is new lies past these counts.
        self._buffers_told = 0
        self._streams_told = 0
        # Program pieces by their templates' identity; the next number; the numbers whose
        # program record this trace has.
        self._pieces: dict[int, Piece] = {}
        self._numbered = 0
        self._written: set[int] = set()
        self.total = 0
        self.error = ""  # why this trial's trace could not be written, or ""

    def attach(self, device: Device) -> None:
        """Observe ``device`` (a new one each trial on sim, one for all trials on cuda)."""
        if device is self._device:
            return
        self._device = device
        self._log = device.oplog
        self._labels = device.oplog.labels.live()  # another device: declared again
        device.oplog.subscribe(self._pending.append,
                               segments=None if self.issue_times else self._pending.append)
        device.oplog.before_blocking(self.flush)
        device.oplog.on_times(self._timed)

    def start_trial(self, header: dict[str, Any], **numbers: int) -> None:
        """Begin a trial's trace: the file emptied (or made, when the last one was kept) and
        its header line written: ``header``'s keys, then ``numbers`` (the trial's own: its
        index, seed, pid)."""
        log = self._log
        self._pending.clear()
        self._times.clear()
        self._first_seq = log.seq + 1 if self._device is not None else 0
        self.total = 0
        self._labels = log.labels.live()
        self._written.clear()
        self.error = ""
        if self._map is None:
            try:
                self._open()
            except OSError as exc:
                self._fail(exc)
                return
        else:
            # The last trial's file, not kept: zeroed rather than made again, which cost more
            # than the rest of a trial's recording.
            self._map[:self._used] = bytes(self._used)
            self._used = 0
        if self._header[0] is not header:
            self._header = (header, header_line(header))
        self._write((with_numbers(self._header[1], **numbers) + "\n").encode())

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        _reserve(self._fd, TRACE_MAP_BYTES)
        self._map = mmap.mmap(self._fd, TRACE_MAP_BYTES)
        self._used = 0

    def _write(self, data: bytes) -> None:
        if self._map is None:  # this trial's trace was lost (self.error says why)
            return
        end = self._used + len(data)
        if end > len(self._map):  # a long trial: a map twice as large (or more)
            size = max(end, 2 * len(self._map))
            try:
                _reserve(self._fd, size)
            except OSError as exc:
                self._fail(exc)
                return
            self._map.close()
            self._map = mmap.mmap(self._fd, size)
        self._map[self._used:end] = data
        self._used = end

    def _fail(self, exc: OSError) -> None:
        """The disk would not take the trace: this trial's is dropped, its file removed (a
        part of a trace is not left as if it were one)."""
        self.error = reason(exc)
        self._pending.clear()
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)
        self._used = 0

    def flush(self) -> None:
        """Write what was issued since the last flush; called before every blocking call.
        Into the kernel's page cache: enough to outlive this process (not a machine crash)."""
        if self._map is None:
            self._pending.clear()  # a trace that was lost takes no memory either
            self._times.clear()
            return
        if not (self._pending or self._times):
            return
        lines = self._declarations()
        for entry in self._pending:
            if type(entry) is Segment:
                lines.extend(self._run_lines(entry))
                self.total += len(entry.templates)
            else:
                lines.append(op_line(entry))
                self.total += 1
        self._pending.clear()
        if self._times:  # after the ops they time (--timeline, read once the trial ended)
            lines.append(times_line(self._times))
            self._times.clear()
        self._write(("\n".join(lines) + "\n").encode())

    def _declarations(self) -> list[str]:
        """The buffer and stream records this trace has not declared yet, and at its first
        flush who owned which bytes when the trial began (a world's buffers outlive trials;
        later changes are the trace's alloc and free ops)."""
        if self._device is None:
            return []
        log = self._device.oplog
        told = (len(log.buffers), len(log.streams))
        if self._labels is not None:  # the trial's first flush: everything from the start
            key = (log, log.declared, self._labels)  # the owners' tuple: the same, unchanged
            if self._opening[0] != key:
                self._opening = (key, self._declared(log, 0, 0) +
                                 [label_line(label) for label in self._labels])
            lines = list(self._opening[1])
            self._labels = None
        elif told != (self._buffers_told, self._streams_told):
            lines = self._declared(log, self._buffers_told, self._streams_told)
        else:
            lines = []
        self._buffers_told, self._streams_told = told
        return lines

    @staticmethod
    def _declared(log: OpLog, buffers_from: int, streams_from: int) -> list[str]:
        """The buffers and streams of ``log`` from these counts on."""
        lines = [buffer_line(info, log.page_bytes.get(info.id, 0)) for info in
                 itertools.islice(log.buffers.values(), buffers_from, None)]
        return lines + [stream_line(info) for info in
                        itertools.islice(log.streams.values(), streams_from, None)]

    def _run_lines(self, segment: Segment) -> list[str]:
        """A reissued piece of a program: its "program" record, the first time this trace
        has it, then its "run" record."""
        templates = segment.templates
        piece = self._pieces.get(id(templates))
        if piece is None or piece.templates is not templates:
            if len(self._pieces) >= PROGRAMS_MAX:  # a bound; numbers are never reused
                self._pieces.clear()
            number = self._numbered
            self._numbered += 1
            piece = Piece(templates, number, program_line(number, templates))
            self._pieces[id(templates)] = piece
        lines = []
        if piece.number not in self._written:
            self._written.add(piece.number)
            lines.append(piece.line)
        lines.append(run_line(piece.number, segment))
        return lines

    def _timed(self, times: list[tuple[int, int, int]]) -> None:
        """Device times measured once the trial ended: of this trial's ops only (the first
        trial's also time what built the world before its trace began)."""
        first = self._first_seq
        self._times.extend((seq, start, end) for seq, start, end in times if seq >= first)

    def end_trial(self, index: int, keep: bool) -> str | None:
        """End the trial's trace; keep it (closed, renamed for the parent) when ``keep``. A
        trace not kept is not written to its end: the file must hold what was issued before
        each wait, where a worker may die, and after the trial's last wait none comes (the
        next trial's trace begins the file again). Its ops are counted all the same."""
        if keep:
            self.flush()
        else:
            self._drop()
        if not keep or self._map is None:
            return None
        self.close()
        kept = trace_path(self.folder, index)
        try:
            os.replace(self.path, kept)
        except OSError as exc:  # its folder went away
            self._fail(exc)
            return None
        return str(kept)

    def _drop(self) -> None:
        """The end of a trace not kept: what is left unwritten counted, and forgotten."""
        for entry in self._pending:
            self.total += len(entry.templates) if type(entry) is Segment else 1
        self._pending.clear()
        self._times.clear()

    def close(self, *, discard: bool = False) -> None:
        """End the file at its last line (the zeros beyond cut off), or with ``discard``
        remove it: the last trial's trace, not kept."""
        if self._map is not None:
            self._map.close()
            self._map = None
            os.ftruncate(self._fd, self._used)
            os.close(self._fd)
            self._fd = -1
            if discard:
                self.path.unlink(missing_ok=True)


def _reserve(fd: int, size: int) -> None:
    """Make the file ``size`` bytes long with its blocks allocated, where the system can say
    so (posix_fallocate): a disk that is full then fails here, with ENOSPC, and not later at a
    store into the map, which would kill the process with SIGBUS."""
    allocate = getattr(os, "posix_fallocate", None)
    if allocate is None:
        os.ftruncate(fd, size)
        return
    try:
        allocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # a file system that cannot reserve: as before


def cut_torn_tail(path: Path) -> bool:
    """Cut a torn last line (a writer killed mid-line) off ``path``; whether there was one.

    The recorder writes whole lines, so only the end of the file can be torn, and only when its
    process died in the write; what came before is intact and is what the parent keeps.
    """
    with open(path, "rb+") as file:
        data = file.read()
        if not data or data.endswith(b"\n"):
            return False
        file.truncate(data.rfind(b"\n") + 1)
        return True

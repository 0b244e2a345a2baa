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
``issue_times`` takes the records instead, each op with its own issue time. Trial after trial, a
reissued program's flushes are the same lines but for their numbers (first seqs, issue times,
live values): each such flush is written from a format made once, the numbers put in, and most
often from the last trial's flush at the same place, with nothing worked out again.
A worker killed in the middle of a write leaves a torn last line; :func:`cut_torn_tail` is how
the parent takes such a file in, so every reader after it can be strict.
"""

from __future__ import annotations

import errno
import itertools
import json
import mmap
import operator
import os
from pathlib import Path
from typing import Any

from harness.faults.writes import reason
from harness.traces.optrace import TRACE_SCHEMA
from kvcore.device import Device, OpRecord
from kvcore.device.oplog import Access, Label, OpLog, Segment

CURRENT = "trial-current.jsonl"
TRACE_MAP_BYTES = 1 << 16
"""The trace file's first size (it doubles as a trial needs): a trial of a step-list scenario
writes a few KiB, a replay of ninfer-210 about 250 KiB."""


def trace_path(folder: Path, index: int) -> Path:
    """Where a finished trial's trace is kept when the trial was not clean."""
    return folder / f"trial-{index:06d}.jsonl"


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
        # The trial's labels until its first flush declares them (then None); the owners as
        # the op log's count of their changes last found them (taken again only when it
        # moved), and how many times what they are changed (see _owners_now); the buffers
        # and streams its trace has declared (how many, and the op log's count of their
        # changes then); and the last trial's declarations.
        self._labels: list[Label] | None = []
        self._owners: tuple[int, list[Label], int] = (-1, [], 0)
        self._told = (0, 0)
        self._told_at = -1
        self._preamble: tuple[Any, list[str]] = (None, [])
        # The last header, and its line as a format of the trial's numbers (their names).
        self._header: tuple[dict[str, Any] | None, bytes, tuple[str, ...]] = (None, b"", ())
        self._lines: dict[tuple[Any, ...], str] = {}
        # Pieces of reissued programs, by their templates' identity: (templates, number,
        # program line, run line's start), the templates held so that no other tuple takes
        # their id; the next number; the numbers this trace has written.
        self._programs: dict[int, tuple[tuple[Any, ...], int, str, str]] = {}
        self._numbered = 0
        self._written: set[int] = set()
        # A flush of runs alone, as bytes with a %d for each of its numbers, by its shape
        # (see _runs): a reissued trial's flushes differ from the last trial's only there.
        self._formats: dict[tuple[Any, ...], tuple[bytes, int]] = {}
        # The flushes of this trial so far, then the last trial's from here on (see _again):
        # a flush of runs alone, as (its piece when it was one run, else None, its live values,
        # untimed, format, ops, the programs whose lines it writes, the preamble's key or
        # None, its shape: see _runs), or None; this trial's flushes, and whether each was the
        # last trial's.
        self._plan: list[tuple[Any, ...] | None] = []
        self._flushes = 0
        self._matching = True
        self.total = 0
        self.error = ""  # why this trial's trace could not be written, or ""

    def attach(self, device: Device) -> None:
        """Observe ``device`` (a new one each trial on sim, one for all trials on cuda)."""
        if device is self._device:
            return
        self._device = device
        self._log = device.oplog
        self._preamble = (None, [])  # another device's declarations, whatever their count
        self._formats = {}  # and its flushes, their preambles among them
        self._plan = []
        self._owners = (-1, [], self._owners[2] + 1)  # another op log's count and owners
        self._labels = self._owners_now(device.oplog)
        device.oplog.subscribe(self._pending.append,
                               segments=None if self.issue_times else self._pending.append)
        device.oplog.before_blocking(self.flush)
        device.oplog.on_times(self._timed)

    def start_trial(self, header: dict[str, Any], **numbers: int) -> None:
        """Begin a trial's trace: the file emptied (or made, when the last one was kept) and
        its header line written: ``header``'s keys, then ``numbers`` (the trial's own: its
        index, seed, pid). A worker passes the same ``header`` every trial, encoded once."""
        log = self._log
        self._pending.clear()
        self._times.clear()
        self._first_seq = log.seq + 1 if self._device is not None else 0
        self.total = 0
        self._labels = self._owners_now(log)
        self._written.clear()
        self._flushes, self._matching = 0, True
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
        names = tuple(numbers)
        if self._header[0] is not header or self._header[2] != names:
            text = json.dumps({"type": "header", "schema": TRACE_SCHEMA, "level": "ops",
                               **header}, separators=(",", ":"))
            tail = "".join(f',"{key}":{_NUMBER}' for key in names)
            # held: no other dict takes its id meanwhile
            self._header = (header, _format(f"{text[:-1]}{tail}}}\n"), names)
        line = self._header[1] % tuple(numbers.values())  # %d: an int's digits
        if len(line) < len(self._map):  # the file is empty: _write's, without its call
            self._map[:len(line)] = line
            self._used = len(line)
        else:
            self._write(line)

    def _owners_now(self, log: OpLog) -> list[Label]:
        """Who owns which bytes now (what the trial's trace begins with): most trials, the
        last trial's list itself, as no owner changed since, or the owners changed and came
        back (a step-list trial hands its pages out and takes them back: the same list, so
        the same preamble: see :meth:`_preamble_key`)."""
        labels = log.labels
        owners = self._owners
        if labels.changes != owners[0]:
            live = labels.live()
            self._owners = (labels.changes, owners[1], owners[2]) if live == owners[1] else \
                (labels.changes, live, owners[2] + 1)
        return self._owners[1]

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
        """Write what was issued since the last flush; called before every blocking call."""
        pending = self._pending
        # Into the kernel's page cache: enough to outlive this process (not a machine crash).
        if len(pending) == 1 and self._matching and self._again(pending[0]):
            return
        if self._map is None:
            pending.clear()  # a trace that was lost takes no memory either
            self._times.clear()
            return
        if not (pending or self._times):
            return
        plan, k = self._plan, self._flushes
        last = plan[k] if self._matching and k < len(plan) else None
        self._flushes = k + 1
        data, plan[k:k + 1] = self._runs() if not self._times else (None, [None])
        # Whether this trial's flushes are still the last one's (then so are its program lines).
        self._matching = data is not None and last is not None and last[-1] == plan[k][-1]
        if data is not None:
            pending.clear()
            self._write(data)
            return
        lines = []
        if self._device is not None:
            self._declare(lines)
        ops = 0
        for entry in self._pending:
            if type(entry) is Segment:
                lines.extend(self._run_lines(entry))
                ops += len(entry.templates)
            else:
                lines.append(op_line(entry))
                ops += 1
        if self._times:  # after the ops they time (--timeline, read once the trial ended)
            lines.append(json.dumps({"type": "times", "ops": self._times},
                                    separators=(",", ":")))
            self._times.clear()
        self.total += ops
        self._pending.clear()
        self._write(("\n".join(lines) + "\n").encode())

    def _again(self, segment: OpRecord | Segment) -> bool:
        """Write a flush of one run, as the last trial's flush at this place had it, from that
        flush's format: the same piece, as many live values, an issue time or not, the same
        preamble (or nothing new to declare), after flushes that were all the last trial's
        (so the same program lines are written). False, writing nothing: it is not."""
        plan, k = self._plan, self._flushes
        if k >= len(plan) or self._map is None or self._times:
            return False
        entry = plan[k]
        if entry is None or entry[0] is not segment[0]:  # not its piece (nor a Segment)
            return False
        _, count, untimed, form, ops, new, declared, _ = entry
        values, issued = segment[2], segment[3]
        if len(values) != count or (issued is None) is not untimed:
            return False
        log = self._log
        if declared is not None:
            if self._labels is None or declared != self._preamble_key(log):
                return False
            self._labels = None
            self._told, self._told_at = (len(log.buffers), len(log.streams)), log.declared
        elif log.declared != self._told_at:
            return False
        self._flushes = k + 1
        if new:
            self._written |= new
        self.total += ops
        self._pending.clear()
        data = form % ((segment[1], *values) if untimed else (segment[1], issued, *values))
        used = self._used
        end = used + len(data)
        if end > len(self._map):
            self._write(data)  # a map to grow first
        else:  # _write's, without its call: this runs at every wait of a reissued trial
            self._map[used:end] = data
            self._used = end
        return True

    def _runs(self) -> tuple[bytes | None, list[tuple[Any, ...] | None]]:
        """The flush's lines when it holds runs of reissued programs only (and, first in the
        trial, the preamble), from the format of the last flush of its shape: which pieces
        ran, whether the trace has their program lines yet, how many live values and issue
        times they carry. Its numbers (first seqs, issue times, values) are all that differ
        from trial to trial, so it costs one %-format. With them, the flush as the plan keeps
        it (see :meth:`_again`); (None, [None]): write it line by line."""
        log = self._device.oplog if self._device is not None else None
        if log is None:
            return _LINE_BY_LINE
        if self._labels is not None:  # the trial's first flush: the preamble's key
            declared: Any = self._preamble_key(log)
        elif log.declared != self._told_at:
            return _LINE_BY_LINE  # buffers or streams to declare
        else:
            declared = None
        shape: list[Any] = [declared]
        numbers: list[int] = []
        programs, written = self._programs, self._written
        new: set[int] = set()  # pieces whose program line this flush writes
        for entry in self._pending:
            if type(entry) is not Segment:
                return _LINE_BY_LINE
            known = programs.get(id(entry[0]))
            if known is None or known[0] is not entry[0]:
                return _LINE_BY_LINE  # a program this trace has not seen: its numbering first
            values, issued, number = entry[2], entry[3], known[1]
            told = number in written or number in new
            if not told:
                new.add(number)
            shape.append((number, told, len(values), issued is None))
            numbers.append(entry[1])
            if issued is not None:
                numbers.append(issued)
            numbers.extend(values)
        key = tuple(shape)
        found = self._formats.get(key)
        if found is None:
            found = self._format_runs(key)
        if declared is not None:
            self._labels = None
            self._told, self._told_at = (len(log.buffers), len(log.streams)), log.declared
        written |= new
        self.total += found[1]
        one = self._pending[0][0] if len(shape) == 2 else None  # a flush of one run: its piece
        return found[0] % tuple(numbers), [(one, shape[1][2], shape[1][3], found[0], found[1],
                                            frozenset(new), declared, key)]

    def _format_runs(self, key: tuple[Any, ...]) -> tuple[bytes, int]:
        """The format of a flush of runs of shape ``key`` (see :meth:`_runs`), and its ops,
        from the lines :meth:`_run_lines` writes: made once per shape."""
        lines: list[str] = []
        if key[0] is not None:
            self._declare(lines)
        ops = 0
        for entry, (_, written, count, untimed) in zip(self._pending, key[1:]):
            templates = entry[0]
            known = self._programs[id(templates)]
            if not written:
                lines.append(known[2])
            issued = "" if untimed else _ISSUED
            values = f',"values":[{",".join([_NUMBER] * count)}]' if count else ""
            lines.append(f"{known[3]}{_NUMBER}{issued}{values}}}")
            ops += len(templates)
        found = (_format("\n".join(lines) + "\n"), ops)
        if len(self._formats) >= _QUOTED_MAX:
            self._formats.clear()
        self._formats[key] = found
        return found

    def _declare(self, lines: list[str]) -> None:
        """The buffer and stream records this trace has not declared yet, and at its first
        flush who owned which bytes when the trial began (a world's buffers outlive trials;
        later changes are the trace's alloc and free ops). The op log's buffers and streams
        are only ever added to, in order: what is new is what lies past the count declared."""
        log = self._device.oplog  # type: ignore[union-attr]
        buffers, streams = log.buffers, log.streams
        if self._labels is not None:  # the trial's first flush: most often the last's block
            key = self._preamble_key(log)
            if key != self._preamble[0]:
                block = [self._line(("buffer", info, log.page_bytes.get(info.id, 0)))
                         for info in buffers.values()]
                block += [self._line(("stream", stream)) for stream in streams.values()]
                block += [self._line(("label", label)) for label in self._labels]
                self._preamble = (key, block)
            lines.extend(self._preamble[1])
            self._labels = None
            self._told, self._told_at = (len(buffers), len(streams)), log.declared
            return
        told_buffers, told_streams = self._told
        if len(buffers) > told_buffers:
            lines.extend(self._line(("buffer", info, log.page_bytes.get(info.id, 0)))
                         for info in itertools.islice(buffers.values(), told_buffers, None))
        if len(streams) > told_streams:
            lines.extend(self._line(("stream", stream))
                         for stream in itertools.islice(streams.values(), told_streams, None))
        self._told, self._told_at = (len(buffers), len(streams)), log.declared

    def _preamble_key(self, log: OpLog) -> tuple[int, int]:
        """What a trial's preamble is made of (its trial's first flush, ``_labels`` not yet
        None): the buffers, streams and page strides as the op log's count of their changes
        finds them, and the owners as they were when the trial began, by the recorder's
        count of their contents (:meth:`_owners_now` counts one more only when the owners it
        takes are not the same as the last ones; attach, when the device is another)."""
        return (log.declared, self._owners[2])

    def _run_lines(self, segment: Segment) -> list[str]:
        """A reissued piece of a program: its "program" record, the first time this trace
        has it, then its "run" record."""
        templates = segment.templates
        known = self._programs.get(id(templates))
        if known is None or known[0] is not templates:
            if len(self._programs) >= _QUOTED_MAX:  # a bound; numbers are never reused
                self._programs.clear()
            number, self._numbered = self._numbered, self._numbered + 1
            known = self._programs[id(templates)] = (
                templates, number, program_line(number, templates),
                f'{{"type":"run","program":{number},"seq":')
        lines = [] if known[1] in self._written else [known[2]]
        self._written.add(known[1])
        values = f',"values":[{",".join(map(str, segment.values))}]' if segment.values else ""
        issued = f',"t_issue_ns":{segment.t_issue_ns}' if segment.t_issue_ns is not None \
            else ""
        lines.append(f"{known[3]}{segment.first_seq}{issued}{values}}}")
        return lines

    def _timed(self, times: list[tuple[int, int, int]]) -> None:
        """Device times measured once the trial ended: of this trial's ops only (the first
        trial's also time what built the world before its trace began)."""
        first = self._first_seq
        self._times.extend(t for t in times if t[0] >= first)

    def _line(self, what: tuple[Any, ...]) -> str:
        """A buffer, stream or label line: the same ones begin every trial's trace, so each is
        encoded once (their records never change)."""
        line = self._lines.get(what)
        if line is None:
            kind, item = what[0], what[1]
            if kind == "buffer":
                data = {"type": "buffer", "id": item.id, "name": item.name, "space": item.space,
                        "nbytes": item.nbytes, "role": item.role, "page_bytes": what[2]}
            elif kind == "stream":
                data = {"type": "stream", "name": item.name, "blocking": item.blocking,
                        "legacy": item.legacy, "priority": item.priority}
            else:
                data = {"type": "label", "buffer": item.buffer, "offset": item.offset,
                        "length": item.length, "name": item.name}
            line = json.dumps(data, separators=(",", ":"))
            if len(self._lines) < _QUOTED_MAX:
                self._lines[what] = line
        return line

    def end_trial(self, index: int, keep: bool) -> str | None:
        """End the trial's trace; keep it (closed, renamed for the parent) when ``keep``. A
        trace not kept is not written to its end: the file must hold what was issued before
        each wait, where a worker may die, and after the trial's last wait none comes (the
        next trial's trace begins the file again). Its ops are counted all the same."""
        if keep:
            self.flush()
        else:
            self._drop()
        del self._plan[self._flushes:]  # the plan is this trial's flushes: the next one's last
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
        ops = 0
        for entry in self._pending:
            ops += len(entry[0]) if type(entry) is Segment else 1
        self.total += ops
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


_LINE_BY_LINE: tuple[None, list[None]] = (None, [None])
"""What :meth:`FlightRecorder._runs` gives for a flush it cannot write from a format."""
_NUMBER = "\0"  # a number's place in a line made to be a format: no JSON line holds a NUL
_ISSUED = f',"t_issue_ns":{_NUMBER}'


def _format(text: str) -> bytes:
    """``text``, its numbers' places marked with :data:`_NUMBER`, as bytes to %-format with
    them (its own percent signs doubled)."""
    return text.replace("%", "%%").replace(_NUMBER, "%d").encode()


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


_JSON = json.JSONEncoder(separators=(",", ":"), default=str).encode
_QUOTED: dict[str, str] = {}
_QUOTED_MAX = 65536


def _quoted(text: str) -> str:
    """A string as JSON: the same few names (streams, kinds, steps, events) recur in every
    trial, so each is encoded once."""
    out = _QUOTED.get(text)
    if out is None:
        out = _JSON(text)
        if len(_QUOTED) < _QUOTED_MAX:  # a bound: step names may number in the thousands
            _QUOTED[text] = out
    return out


def _ranges(accesses: tuple[Access, ...]) -> str:
    return "[" + ",".join(f"[{a[0]},{a[1]},{a[2]}]" for a in accesses) + "]"


def op_line(record: OpRecord) -> str:
    """An op record as its trace line: what ``json.dumps(record.to_json() | {"type": "op"})``
    writes (keys in that order), from pieces: the recorder writes every op of every trial,
    and the general encoder was most of a trial's cost. The part from the stream to the step
    recurs trial after trial, so it is encoded once."""
    middle = _middle_of(record)
    text = _MIDDLES.get(middle)
    if text is None:
        text = _middle(*middle)
        if len(_MIDDLES) < _QUOTED_MAX:
            _MIDDLES[middle] = text
    seq, issued, start, end, detail = _numbers_of(record)
    times = "" if issued is None else f',"t_issue_ns":{issued}'
    if start is not None:  # the simulated device's (or a timeline's) device times
        times += f',"t_start_ns":{start}'
    if end is not None:
        times += f',"t_end_ns":{end}'
    if not detail:
        return f'{{"seq":{seq}{text}{times},"type":"op"}}'
    # Most ops' detail is only the scenario line that issued them.
    origin = detail.get("origin") if len(detail) == 1 else None
    if origin is None:
        return f'{{"seq":{seq}{text}{times},"detail":{_detail(detail)},"type":"op"}}'
    tail = _ORIGINS.get(origin)
    if tail is None:
        tail = f',"detail":{{"origin":{_JSON(origin)}}},"type":"op"}}'
        if len(_ORIGINS) < _QUOTED_MAX:
            _ORIGINS[origin] = tail
    return f'{{"seq":{seq}{text}{times}{tail}'


_numbers_of = operator.itemgetter(0, 9, 10, 11, 12)
_ORIGINS: dict[str, str] = {}  # a detail of the origin only: the line's end, by the origin


_DETAILS: dict[tuple[Any, ...], str] = {}


def _detail(detail: dict[str, object]) -> str:
    """An op's detail as JSON. The same few recur trial after trial (a fill's byte and line, a
    lease's name and range), and the general encoder cost more than the rest of the op's
    line: each is encoded once, found again by its items, each with its type (True is 1 to a
    dict, not to JSON), a list of ints as a tuple. Other lists and tuples are encoded every
    time (their items' types would be part of the key too)."""
    items = []
    for key, value in detail.items():
        kind = value.__class__
        if kind is list or kind is tuple:
            if not all(x.__class__ is int for x in value):  # type: ignore[attr-defined]
                return _JSON(detail)
            value = tuple(value)  # type: ignore[arg-type]
        items.append((key, kind, value))
    found = tuple(items)
    try:
        text = _DETAILS.get(found)
    except TypeError:  # a value that cannot be a key (a dict): encoded every time
        return _JSON(detail)
    if text is None:
        text = _JSON(detail)
        if len(_DETAILS) < _QUOTED_MAX:
            _DETAILS[found] = text
    return text


def program_line(number: int, templates: tuple[tuple[Any, ...], ...]) -> str:
    """A reissued program's piece as its trace record: each op as its op line has it, without
    its seq and times, and which ops take a live value (their detail's ``value``, from the
    run)."""
    ops = []
    for t in templates:
        middle = _middle(*t[:8])
        detail = t[8]
        ops.append("{" + middle[1:] + (',"detail":' + _JSON(detail) if detail else "") + "}")
    live = [k for k, t in enumerate(templates) if t[10] is not None]
    return (f'{{"type":"program","id":{number},"ops":[{",".join(ops)}]'
            + (f',"live":[{",".join(map(str, live))}]' if live else "") + "}")


_middle_of = operator.itemgetter(1, 2, 3, 4, 5, 6, 7, 8)
_MIDDLES: dict[tuple[Any, ...], str] = {}


def _middle(stream: str, kind: str, reads: tuple[Access, ...], writes: tuple[Access, ...],
            records: str | None, waits: str | None, syncs: str | None,
            step: str | None) -> str:
    parts = [',"stream":', _quoted(stream), ',"kind":', _quoted(kind)]
    if reads:
        parts += [',"reads":', _ranges(reads)]
    if writes:
        parts += [',"writes":', _ranges(writes)]
    for key, value in (("records", records), ("waits", waits), ("syncs", syncs),
                       ("step", step)):
        if value is not None:
            parts += [',"', key, '":', _quoted(value)]
    return "".join(parts)


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

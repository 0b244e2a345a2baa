"""One watched run's analysis: capture events in, findings and an op trace out.

The watching process feeds a run's events here as the program makes them (:meth:`feed`): the
translator turns them into op records, which go to the race detector and, line by line, to the
run's ``trace.jsonl``, written by the flight recorder's writer (:mod:`harness.traces.lines`), so
`gpurace check` on it finds what the online detector found.

A run of hours would write a trace of hundreds of gigabytes. Given ``part_bytes``, the trace
begins anew once it is over that size, at the next *quiet point*: a host wait after which no
access made before can race one made after (the detector forgets them there). The new part
starts with the buffers, streams and live allocations so far, so every race to come is whole
in it. An earlier part is kept beside it (``trace-part-NNN.jsonl``) only if a race was found
in it, the first :data:`PARTS_KEPT` such parts. :class:`Followed` reads a run's events file as
the program writes it, and gives the disk back what it has analysed.
"""

from __future__ import annotations

import contextlib
import os
import stat
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from harness.capture.backlog import ReadMark
from harness.capture.events import READ_MAX, NotEvents, give_back, read_events
from harness.capture.translate import Translator
from harness.faults.writes import reason
from harness.limits import MiB
from harness.races.detector import Finding, RaceDetector
from harness.traces.lines import buffer_line, header_line, label_line, op_line, stream_line
from kvcore.device.oplog import HOST, BufferInfo, OpRecord, StreamInfo

PARTS_KEPT = 3
"""Earlier parts of a long run's trace kept for the races found in them (the first ones)."""


class RunAnalysis:
    """The detector and trace of one run of a watched program."""

    def __init__(self, trace: Path | None, header: dict[str, Any], *,
                 part_bytes: int = 0) -> None:
        """``part_bytes``: the size past which the trace begins anew at the next quiet point
        (0: one trace, however long)."""
        # One long trial: nothing to remember, and only its findings to keep.
        self.detector = RaceDetector(remember=False, keep_racing=False)
        self.translator = Translator(self._record, self._buffer, self._stream)
        self.trace_path = trace
        self.part_bytes = part_bytes
        self._header = header
        self._lines: list[str] = []  # trace lines not written yet
        self._declared: list[str] = []  # every buffer and stream line: a part begins with them
        self._size = 0  # bytes of the trace's current part, written or held
        self._part = 1
        self._found = 0  # races found (each counted) when the current part began
        self.parts_kept: list[Path] = []  # earlier parts, each holding a race
        self.parts_dropped = 0  # earlier parts removed
        self._trace: TextIO | None = None
        self.lost = ""  # why the trace could not be written (it is then not kept), or ""
        if trace is not None:
            self._open()

    def _open(self) -> None:
        """Begin the trace's current part: its header; after the first, the buffers and
        streams declared so far and the allocations live now."""
        assert self.trace_path is not None
        lines = [header_line(self._header)]
        if self._part > 1:
            lines = [header_line(self._header, part=self._part), *self._declared,
                     *map(label_line, self.translator.owners())]
        text = "\n".join(lines) + "\n"
        try:
            self._trace = open(self.trace_path, "w", encoding="utf-8")  # noqa: SIM115
            self._trace.write(text)
        except OSError as exc:
            self._drop(exc)
        self._size = len(text)

    def _record(self, record: OpRecord) -> None:
        self.detector.observe(record)
        if self._trace is not None:
            line = op_line(record)
            self._lines.append(line)
            self._size += len(line) + 1
            if self.part_bytes and self._size > self.part_bytes and record.stream == HOST \
                    and record.kind.startswith("sync_"):
                self._next_part(record.seq)

    def _buffer(self, info: BufferInfo) -> None:
        self.detector.buffer(info.id, info.name, info.space, info.role)
        self._declare(buffer_line(info, page_bytes=0))

    def _stream(self, info: StreamInfo) -> None:
        self.detector.stream(info.name, info.blocking, info.legacy)
        self._declare(stream_line(info))

    def _declare(self, line: str) -> None:
        self._declared.append(line)
        self._lines.append(line)
        self._size += len(line) + 1

    def feed(self, events: list[list[Any]]) -> None:
        """Translate and analyse ``events``; the trace gets their records."""
        self.translator.feed(events)
        self.detector.findings  # noqa: B018 - analyse now, while the program runs
        self._write_held()

    def _write_held(self) -> None:
        if self._trace is not None and self._lines:
            try:
                self._trace.write("\n".join(self._lines) + "\n")
                self._trace.flush()
            except OSError as exc:
                self._drop(exc)
        self._lines.clear()

    def _next_part(self, seq: int) -> None:
        """End the trace's part at op ``seq``, a host wait, if it is a quiet point."""
        detector = self.detector
        detector.findings  # noqa: B018 - analysed up to this op
        if detector.quiet_seq != seq:
            return  # a stream may still be running: the next wait may do
        found = sum(finding.count for finding in detector.findings_now)
        self._write_held()
        trace, path = self._trace, self.trace_path
        if trace is None or path is None:
            return
        self._trace = None
        try:
            trace.close()
            if found > self._found and len(self.parts_kept) < PARTS_KEPT:
                kept = path.with_name(f"{path.stem}-part-{self._part:03d}{path.suffix}")
                os.replace(path, kept)
                self.parts_kept.append(kept)
            else:
                self.parts_dropped += 1  # the next part takes its file
        except OSError as exc:
            self._drop(exc)
            return
        self._found = found
        self._part += 1
        self._open()

    def _drop(self, exc: OSError) -> None:
        """The disk will not take the trace: the analysis goes on online, the trace is
        removed (a part of one is not left as if it were whole)."""
        self.lost = reason(exc)
        if self._trace is not None:
            with contextlib.suppress(OSError):
                self._trace.close()
            self._trace = None
        if self.trace_path is not None:
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(self.trace_path).st_mode):  # ours, not a device
                    self.trace_path.unlink()

    @property
    def findings(self) -> list[Finding]:
        return self.detector.findings

    def close(self) -> None:
        self.translator.finish()
        self._write_held()
        if self._trace is not None:
            try:
                self._trace.close()
            except OSError as exc:
                self._drop(exc)
            self._trace = None


class Shares(NamedTuple):
    """How ``--disk-mb`` is shared among a watched process's files, in bytes (0: no bound)."""

    part: int  # a trace part's size: the current part and the PARTS_KEPT ones, half in all
    keep: int  # events analysed and not yet given back to the disk: a quarter
    backlog: int  # events written and not yet analysed (the process waits past it): a quarter

    @classmethod
    def of(cls, disk_mb: int) -> Shares:
        disk = disk_mb * MiB
        return cls(disk // 8, disk // 4, disk // 4)


def fault_line(exc: BaseException) -> str:
    """A fault of the analysis (gpurace's own) in a line, with where it happened (the last
    frame): what a run's notes say of it."""
    where = traceback.extract_tb(exc.__traceback__)[-1:]
    at = f" at {where[0].filename}:{where[0].lineno}" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"[:500]


class Followed:
    """A capture events file that a process is still writing, read on from where the last read
    ended and fed to ``analysis``. Once more than ``keep`` bytes have been analysed (0: never),
    the analysed part is given back to the disk (:func:`give_back`), so a run of hours holds
    about ``keep`` bytes of it beside what is not read yet. With a ``backlog`` (the bytes the
    process may write ahead of this reading), how far it has read is said to the process after
    each read (:class:`ReadMark`), which waits when too far ahead."""

    def __init__(self, path: Path, analysis: RunAnalysis, keep: int = 0,
                 backlog: int = 0) -> None:
        self.path = path
        self.analysis = analysis
        self.keep = keep
        self.offset = 0  # the end of the last whole line read
        self.given = 0  # the file's first bytes given back to the disk
        self.backlog = backlog
        self.mark = ReadMark(path) if backlog else None
        # Behind by this much, read on without a pause: by half the backlog, or the process
        # would wait out each pause too.
        self.behind_at = min(READ_MAX, backlog // 2) if backlog else READ_MAX
        self.failed = ""  # the analysis's own failure, in a line ("": none)
        self.failed_at = 0  # the offset of the batch it failed on
        self.failure = ""  # its traceback

    def _feed(self, batch: list[list[Any]], at: int) -> None:
        """Feed the analysis. A failure of its own (a fault of gpurace's) is kept, and
        nothing more is fed: the program runs on, and its events are still read on (its
        wait for the watch and the disk's share are kept as they would be)."""
        if self.failed:
            return
        try:
            self.analysis.feed(batch)
        except Exception as exc:  # noqa: BLE001 - never the program's failure, nor the watch's
            self._fail(exc, at)

    def _fail(self, exc: Exception, at: int) -> None:
        if not self.failed:
            self.failed = fault_line(exc)
            self.failed_at = at
            self.failure = traceback.format_exc()

    def close(self) -> None:
        """Close the analysis once all is read: its last records written."""
        try:
            self.analysis.close()
        except Exception as exc:  # noqa: BLE001 - as in _feed
            self._fail(exc, self.offset)

    def findings(self) -> list[Finding]:
        """The races found; where the analysis failed, those found before."""
        try:
            return list(self.analysis.findings)
        except Exception as exc:  # noqa: BLE001 - as in _feed
            self._fail(exc, self.offset)
            return list(self.analysis.detector.findings_now)

    def failure_note(self) -> str:
        """The analysis's failure, in words for the run's notes ("" if none)."""
        if not self.failed:
            return ""
        return (f"the analysis failed at byte {self.failed_at:,} of {self.path.name} "
                f"({self.failed}): a fault of gpurace's, not the program's, which ran on as it "
                f"would; what it did from there was not analysed. Please report it with that "
                f"file and {self.path.name}.error.txt beside it")

    def write_failure(self) -> None:
        """The failure's traceback beside the events file, for a report (if it failed)."""
        if self.failed:
            with contextlib.suppress(OSError):  # the note says what failed either way
                self.path.with_name(self.path.name + ".error.txt").write_text(
                    f"{self.failed}\nat byte {self.failed_at} of {self.path}\n\n{self.failure}")

    def poll(self) -> bool:
        """Analyse what was written since the last read (:data:`READ_MAX` bytes at most);
        whether the watch is behind (read on without a pause)."""
        if not self._read():
            return False
        if self.mark is not None:
            self.mark.say(self.offset)
        if self.keep and self.offset - self.given > self.keep:
            if give_back(self.path, self.offset):
                self.given = self.offset
            else:
                self.keep = 0  # a file system without holes: the file stays whole
        return self.behind() >= self.behind_at

    def _read(self) -> bool:
        """Read and analyse the next batch, the offset moved past it; whether the file could
        be read (a failure to read it is kept as the analysis's own)."""
        at = self.offset
        try:
            batch, self.offset = read_events(self.path, at)
        except NotEvents as exc:  # read on past it: the process must not wait on it
            self.offset = exc.after
            self._fail(exc, at)
            return True
        except OSError as exc:  # the watch's own file gone: not the program's failure
            self._fail(exc, at)
            return False
        if batch:
            self._feed(batch, at)
        return True

    def behind(self) -> int:
        """Bytes written and not yet read."""
        try:
            return max(0, self.path.stat().st_size - self.offset)
        except OSError:
            return 0

    def rest(self) -> Iterator[int]:
        """Once the writer has ended: analyse the rest a batch at a time (a long run leaves
        gigabytes), yielding the offset reached after each."""
        if self.mark is not None:
            self.mark.close()
            self.mark = None
        while True:
            at = self.offset
            if not self._read() or self.offset == at:
                return
            yield self.offset

    def disk_note(self, disk_mb: int) -> str:
        """What ``--disk-mb`` took from this run's files, in words; "" if nothing."""
        analysis = self.analysis
        kept = analysis.parts_kept
        parts = analysis.parts_dropped + len(kept)
        if not self.given and not parts:
            return ""
        return (f"kept within --disk-mb {disk_mb}: {self.given / MiB:,.0f} MiB of "
                f"{self.path.name} given back once analysed, the trace begun anew at {parts} "
                "quiet point(s)" + (f", the parts that held races kept: "
                                    f"{', '.join(p.name for p in kept)}" if kept else ""))

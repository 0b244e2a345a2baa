"""One watched run's analysis: capture events in, findings and an op trace out.

The watching process feeds a run's events here as the program makes them (:meth:`feed`): the
translator turns them into op records, which go to the race detector and, line by line, to the
run's ``trace.jsonl``, written by the flight recorder's writer (:mod:`harness.traces.lines`), so
`gpurace check` on it finds what the online detector found.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Any, TextIO

from harness.capture.translate import Translator
from harness.races.detector import Finding, RaceDetector
from harness.faults.writes import reason
from harness.traces.lines import buffer_line, header_line, op_line, stream_line
from kvcore.device.oplog import BufferInfo, OpRecord, StreamInfo


class RunAnalysis:
    """The detector and trace of one run of a watched program."""

    def __init__(self, trace: Path | None, header: dict[str, Any]) -> None:
        # One long trial: nothing to remember, and only its findings to keep.
        self.detector = RaceDetector(remember=False, keep_racing=False)
        self.translator = Translator(self._record, self._buffer, self._stream)
        self.trace_path = trace
        self._lines: list[str] = []
        self._trace: TextIO | None = None
        self.lost = ""  # why the trace could not be written (it is then not kept), or ""
        if trace is not None:
            try:
                self._trace = open(trace, "w", encoding="utf-8")  # noqa: SIM115
                self._trace.write(header_line(header) + "\n")
            except OSError as exc:
                self._drop(exc)

    def _record(self, record: OpRecord) -> None:
        self.detector.observe(record)
        if self._trace is not None:
            self._lines.append(op_line(record))

    def _buffer(self, info: BufferInfo) -> None:
        self.detector.buffer(info.id, info.name, info.space, info.role)
        self._lines.append(buffer_line(info, page_bytes=0))

    def _stream(self, info: StreamInfo) -> None:
        self.detector.stream(info.name, info.blocking, info.legacy)
        self._lines.append(stream_line(info))

    def feed(self, events: list[list[Any]]) -> None:
        """Translate and analyse ``events``; the trace gets their records."""
        self.translator.feed(events)
        self.detector.findings  # noqa: B018 - analyse now, while the program runs
        if self._trace is not None and self._lines:
            try:
                self._trace.write("\n".join(self._lines) + "\n")
                self._trace.flush()
            except OSError as exc:
                self._drop(exc)
        self._lines.clear()

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
        if self._trace is not None:
            try:
                self._trace.close()
            except OSError as exc:
                self._drop(exc)
            self._trace = None

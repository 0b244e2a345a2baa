"""Capture inside the current process, one piece of work at a time: the pytest plugin's watch.

`gpurace watch` runs a program in a process of its own. A test suite is already a program: with
``pytest --gpurace-watch`` (or a test marked ``gpurace_watch``), the sources are switched on in
pytest's own process once, and each test's events are analysed on their own when it ends, so a
test whose work races fails with the finding as its message. Memory made before the test (a
fixture's tensors) is still memory; only who made it is unknown, and races with work of earlier
tests are not looked for.

A test's events are held as the sink writes them out and analysed when it ends, so the analysis
never pauses the test's own work; past :data:`HOLD_BYTES` of them (a test that runs a training
loop for minutes) what is held is analysed at once. The events of the unwatched tests that
follow a marked one are let go of as they come. Either way the suite's memory does not grow
with its length.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

from harness.capture.analysis import RunAnalysis, fault_line
from harness.capture.events import Sink
from harness.capture.source import REGISTERED, Installed, load


@dataclass(frozen=True)
class Watched:
    """What one piece of work did: its findings (as run.json has them) and the notes."""

    findings: list[dict[str, Any]]
    notes: list[str]
    ops: int
    failed: str = ""  # how the analysis itself failed (a fault of gpurace's), or ""
    # Per source, what it said of its own work as it stopped (its ops, its own time).
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)


HOLD_BYTES = 16 << 20
"""Bytes of a watched test's events held for the analysis at its end (about 25,000 ops)."""


class _Analysed(io.TextIOBase):
    """The sink's file: what it writes while a piece is watched is held, up to ``hold`` bytes,
    then analysed (:meth:`drain`); otherwise let go of. A fault of the analysis ends the
    piece's analysis and is kept, never raised into the program's op that flushed the sink."""

    def __init__(self, hold: int) -> None:
        self.analysis: RunAnalysis | None = None  # the piece's, while one is watched
        self.failed = ""
        self.hold = hold
        self._held: list[str] = []
        self._size = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.analysis is not None and not self.failed:
            self._held.append(text)
            self._size += len(text)
            if self._size > self.hold:
                self.drain()
        return len(text)

    def begin(self, analysis: RunAnalysis) -> None:
        """A new piece: what was held before is let go of."""
        self.analysis, self.failed, self._held, self._size = analysis, "", [], 0

    def drain(self) -> None:
        """Analyse what is held."""
        held, self._held, self._size = self._held, [], 0
        if self.analysis is None or self.failed:
            return
        try:
            for text in held:
                self.analysis.feed([json.loads(line) for line in text.splitlines() if line])
        except Exception as exc:  # noqa: BLE001 - gpurace's fault: never the test's failure
            self.failed = fault_line(exc)


class InProcessWatch:
    """The sources, switched on once for this process; :meth:`start` and :meth:`finish`
    bracket each test."""

    def __init__(self, hold: int = HOLD_BYTES) -> None:
        """``hold``: bytes of a piece's events held for the analysis at its end."""
        self._out = _Analysed(hold)
        self._sink = Sink(self._out)
        self._stops: list[Installed] = []
        self.sources: dict[str, str] = {}
        # What each source says as it starts (what it cannot see: a custom extension's own
        # launches, say) is said at the end, with what they say as they stop.
        self._said_at_start: dict[str, list[str]] = {}
        for name in REGISTERED:
            try:
                source = load(name)
            except ImportError:
                continue
            version = source.available()
            if version is not None:
                self.sources[source.name] = version
                self._out.begin(RunAnalysis(None, {}))
                self._stops.append(source.install(self._sink))
                self._said_at_start[source.name] = self.finish().notes

    @property
    def active(self) -> bool:
        return bool(self.sources)

    def start(self) -> None:
        """Forget what came before: the next piece's events start here."""
        self._out.analysis = None
        self._sink.flush()  # the events since the last piece: let go of
        self._out.begin(RunAnalysis(None, {}))

    def finish(self) -> Watched:
        """The piece's analysis, from :meth:`start` to now."""
        self._sink.flush()
        self._out.drain()
        analysis, self._out.analysis = self._out.analysis, None
        if analysis is None:
            return Watched([], [], 0)
        failed = self._out.failed
        if not failed:
            try:
                analysis.close()
                return Watched([f.to_json() for f in analysis.findings],
                               analysis.translator.notes, analysis.translator.ops,
                               stats=analysis.translator.stats)
            except Exception as exc:  # noqa: BLE001 - as in _Analysed.write
                failed = fault_line(exc)
        return Watched([], analysis.translator.notes, analysis.translator.ops, failed,
                       analysis.translator.stats)

    def close(self) -> list[str]:
        """Switch the sources off; what they said as they started (what they cannot see) and
        say as they stop (what they could not read, and what ran unseen, counted over every
        test) is returned."""
        self.start()
        for stop in reversed(self._stops):
            stop()
        self._stops.clear()
        said = self.finish()
        # Only the sources that saw the session's work: a suite that never uses CuPy is not
        # told what CuPy's source cannot see.
        used = [note for name, notes in self._said_at_start.items()
                if said.stats.get(name, {}).get("ops") for note in notes]
        return used + said.notes + (
            [f"the analysis of the sources' last words failed: {said.failed}"]
            if said.failed else [])

"""Capture inside the current process, one piece of work at a time: the pytest plugin's watch.

`gpurace watch` runs a program in a process of its own. A test suite is already a program: with
``pytest --gpurace-watch`` (or a test marked ``gpurace_watch``), the sources are switched on in
pytest's own process once, and each test's events are analysed on their own when it ends, so a
test whose work races fails with the finding as its message. Memory made before the test (a
fixture's tensors) is still memory; only who made it is unknown, and races with work of earlier
tests are not looked for.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

from harness.capture.analysis import RunAnalysis
from harness.capture.events import Sink
from harness.capture.source import REGISTERED, Installed, load


@dataclass(frozen=True)
class Watched:
    """What one piece of work did: its findings (as run.json has them) and the notes."""

    findings: list[dict[str, Any]]
    notes: list[str]
    ops: int
    failed: str = ""  # how the analysis itself failed (a fault of gpurace's), or ""


class InProcessWatch:
    """The sources, switched on once for this process; :meth:`piece` brackets each test."""

    def __init__(self) -> None:
        self._buffer = io.StringIO()
        self._sink = Sink(self._buffer)
        self._stops: list[Installed] = []
        self.sources: dict[str, str] = {}
        for name in REGISTERED:
            try:
                source = load(name)
            except ImportError:
                continue
            version = source.available()
            if version is not None:
                self.sources[source.name] = version
                self._stops.append(source.install(self._sink))
        self._taken = 0

    @property
    def active(self) -> bool:
        return bool(self.sources)

    def start(self) -> None:
        """Forget what came before: the next piece's events start here."""
        self._sink.flush()
        self._taken = self._buffer.tell()

    def finish(self) -> Watched:
        """Analyse the events since :meth:`start`."""
        self._sink.flush()
        text = self._buffer.getvalue()[self._taken:]
        self._buffer.seek(0)
        self._buffer.truncate()
        self._taken = 0
        analysis = RunAnalysis(None, {})
        try:
            analysis.feed([json.loads(line) for line in text.splitlines() if line.strip()])
            analysis.close()
            findings = [f.to_json() for f in analysis.findings]
        except Exception as exc:  # noqa: BLE001 - gpurace's fault: never the test's failure
            return Watched([], analysis.translator.notes, analysis.translator.ops,
                           f"{type(exc).__name__}: {exc}"[:500])
        return Watched(findings, analysis.translator.notes, analysis.translator.ops)

    def close(self) -> None:
        for stop in reversed(self._stops):
            stop()
        self._stops.clear()

"""What a watched program's runs come to (`gpurace watch`): the program, each run of it, the
races found, the amplified plans, the notes, the folder, and the exit code.

A watch has no scenario, so it has no plan for shards to share and no seed: its run document
(``gpurace.run/1``, the one `gpurace run` writes) says ``"plan": null``, and keeps the keys of
a scenario run at their empty values, so that one schema and one reader serve both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from harness.faults.writes import WriteFault
from harness.results.exitcodes import ExitCode, run_exit_code
from harness.results.outcome import VariantResult
from harness.results.run import RUN_SCHEMA, VERSION


@dataclass(frozen=True)
class WatchedRun:
    """One run of the program: how it ended, what was captured, and where its files are."""

    index: int
    label: str  # the amplified point's folder it ran in; "" for a plain run
    status: int | None  # exit status; None: it died of a signal, or the watch killed it
    signal: int | None
    timed_out: bool
    error: str | None  # the exception it raised, in a line
    ops: int  # stream and host accesses captured
    records: int  # op records written to its trace
    sources: dict[str, Any]  # what the capture switched on (torch, cupy), with versions
    events: str
    trace: str
    log: str
    start: str  # "fresh", or "forked" from the fork server
    duration_s: float  # from its launch to its end, the launch included
    launch_s: float
    capture: dict[str, Any]  # per source, what the capture cost the program
    children: tuple[dict[str, Any], ...] = ()  # Python children watched: pid, role, ops, ...
    analysis_error: str = ""  # how the analysis itself failed (gpurace's fault), or ""

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, **({"variant": self.label} if self.label else {}),
                "status": self.status, "signal": self.signal, "timed_out": self.timed_out,
                "error": self.error, "ops": self.ops, "records": self.records,
                "sources": self.sources, "events": self.events, "trace": self.trace,
                "log": self.log, "start": self.start,
                "duration_s": round(self.duration_s, 4), "launch_s": round(self.launch_s, 4),
                "capture": self.capture,
                **({"children": [dict(c) for c in self.children]} if self.children else {}),
                **({"analysis_error": self.analysis_error} if self.analysis_error else {})}


@dataclass(frozen=True)
class AmplifiedPlan:
    """One amplified variant: its delays (each a site, a length and the op kind), the racing
    pair it opens (with ``--amplify auto``), and how many of its runs failed."""

    variant: str
    delays: tuple[dict[str, Any], ...]  # each {path, line, us, kind}
    first: str | None
    second: str | None
    stream: str | None
    gap_us: float | None  # the host's µs from the first op to the second, where it was seen
    trials: int
    failed: int
    interval: tuple[float, float]  # the Wilson 95% interval of the failure rate
    queued: int  # delays the program's runs queued

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "delays": [dict(d) for d in self.delays],
                "first": self.first, "second": self.second, "stream": self.stream,
                "gap_us": self.gap_us, "trials": self.trials, "failed": self.failed,
                "interval": list(self.interval), "queued": self.queued}


@dataclass(frozen=True)
class WatchResult:
    """A watch's result: the plain runs' variant (``watched``) and each amplified one, in the
    order they ran."""

    program: str  # the program's name: its script's stem, or its module
    command: str  # the command line the watch ran
    folder: str  # the run's own folder under --out
    run_id: str
    device: dict[str, object]
    health: dict[str, object]
    results: tuple[VariantResult, ...]
    runs: tuple[WatchedRun, ...]
    amplified: tuple[AmplifiedPlan, ...] | None = None  # None: no --amplify
    notes: tuple[str, ...] = ()
    wall_s: float = 0.0
    interrupted: str = ""  # the signal that stopped the watch (SIGINT, SIGTERM), or ""
    write_errors: tuple[WriteFault, ...] = ()  # files the watch lost

    @property
    def exit_code(self) -> ExitCode:
        return run_exit_code(interrupted=self.interrupted, gpu_failed=False,
                             write_errors=bool(self.write_errors), results=self.results,
                             internal=any(run.analysis_error for run in self.runs))

    @property
    def findings(self) -> list[dict[str, Any]]:
        """The races the plain runs found, folded, the most found first."""
        return [f for r in self.results if not r.amplified for f in r.finding_summary()]

    def with_write_errors(self, faults: list[WriteFault]) -> WatchResult:
        """A copy with ``faults`` as the files it lost (the watch's, then its writer's)."""
        return replace(self, write_errors=tuple(faults))

    def to_json(self) -> dict[str, object]:
        watch: dict[str, object] = {"command": self.command,
                                    "runs": [r.to_json() for r in self.runs]}
        if self.amplified is not None:
            watch["amplified"] = [a.to_json() for a in self.amplified]
        return {
            "schema": RUN_SCHEMA, "version": VERSION, "run_id": self.run_id,
            "folder": self.folder, "interrupted": self.interrupted, "backend": "cuda",
            "device": self.device, "seed": 0, "poison": False,
            "wall_s": round(self.wall_s, 3), "exit_code": int(self.exit_code), "stopped": "",
            "health": self.health, "watch_notes": list(self.notes),
            # Nothing to merge: a watch is no shard, and has no scenario files to compare.
            "shard": None, "plan": None, "shards": [], "lanes": [], "retired": [],
            "results": [r.to_json() for r in self.results],
            "write_errors": [f.to_json() for f in self.write_errors],
            "watch_gaps": [], "watch": watch,
        }

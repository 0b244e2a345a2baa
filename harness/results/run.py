"""What a run of scenarios comes to: its variants' results, the devices and their health, why
it stopped, what it could not write, and the run document (``gpurace.run/1``) it becomes."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field, replace

from harness.faults.writes import WriteFault
from harness.results.exitcodes import ExitCode, run_exit_code
from harness.results.outcome import VariantResult

RUN_SCHEMA = "gpurace.run/1"


def _version() -> str:
    try:
        return importlib.metadata.version("gpurace")
    except importlib.metadata.PackageNotFoundError:
        return "0+source"  # run from a source tree that was never installed


VERSION = _version()
"""This gpurace's version, in every run document: shards of different versions do not merge."""


@dataclass
class RunResult:
    """A run's result. The runner fills it in as the run goes, so it is not frozen."""

    backend: str
    device: dict[str, object]
    seed: int
    results: list[VariantResult] = field(default_factory=list)
    wall_s: float = 0.0
    health: dict[str, object] = field(default_factory=dict)
    stopped: str = ""  # why the run stopped early (a GPU-fatal Xid), or ""
    watch_notes: list[str] = field(default_factory=list)
    interrupted: str = ""  # the signal that stopped the run (SIGINT, SIGTERM), or ""
    folder: str = ""  # the run's own folder under --out
    run_id: str = ""
    poison: bool = False  # released pages were poisoned (--poison)
    shard: tuple[int, int] | None = None  # (K, N) when the run was one part of N
    plan: dict[str, object] = field(default_factory=dict)  # what shards must agree on
    shards: list[dict[str, object]] = field(default_factory=list)  # a merged run's parts
    lanes: list[str] = field(default_factory=list)  # the GPUs (or simulated devices) it used
    retired: list[str] = field(default_factory=list)  # GPUs a fatal Xid took out of the run
    write_errors: list[WriteFault] = field(default_factory=list)  # files the run lost
    watch_gaps: list[str] = field(default_factory=list)  # when Xid watching stopped mid-run

    @property
    def exit_code(self) -> ExitCode:
        return run_exit_code(interrupted=self.interrupted,
                             gpu_failed=bool(self.stopped or self.retired),
                             write_errors=bool(self.write_errors), results=self.results)

    def with_write_errors(self, faults: list[WriteFault]) -> RunResult:
        """A copy of the result with ``faults`` as the files it lost (the run's, then its
        writer's): what run.json and the exit code say once the run's own files are out."""
        return replace(self, write_errors=list(faults))

    def to_json(self) -> dict[str, object]:
        return {
            "schema": RUN_SCHEMA,
            "version": VERSION,
            "run_id": self.run_id,
            "folder": self.folder,
            "interrupted": self.interrupted,
            "backend": self.backend,
            "device": self.device,
            "seed": self.seed,
            "poison": self.poison,
            "wall_s": round(self.wall_s, 3),
            "exit_code": int(self.exit_code),
            "stopped": self.stopped,
            "health": self.health,
            "watch_notes": self.watch_notes,
            "shard": None if self.shard is None else {"index": self.shard[0],
                                                      "count": self.shard[1]},
            "plan": self.plan,
            "shards": self.shards,
            "lanes": self.lanes,
            "retired": self.retired,
            "results": [r.to_json() for r in self.results],
            "write_errors": [f.to_json() for f in self.write_errors],
            "watch_gaps": self.watch_gaps,
        }

"""What decides a run's trials: the plan that shards of one run share, and each trial's seed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from harness.lang.model import Scenario
from harness.results.run import VERSION
from harness.run.options import RunOptions


def run_plan(scenarios: Sequence[Scenario], options: RunOptions, backend: str
             ) -> dict[str, object]:
    """What decides which trials a run makes and how: this gpurace, the backend, the options
    that change a trial, and each scenario's file contents. Shards of one run share it; the
    digest is what `gpurace merge` compares, the sources say which scenario differs."""
    sources = {}
    for scenario in scenarios:
        try:
            sources[scenario.name] = hashlib.sha256(Path(scenario.path).read_bytes()).hexdigest()
        except OSError:
            sources[scenario.name] = ""  # nothing on disk to compare: the name must do
    same = {"version": VERSION, "backend": backend, "sources": sources,
            **{k: v for k, v in dataclasses.asdict(options).items()
               if k not in ("out_dir", "record", "max_incidents", "shard", "spares", "gpus",
                            "executor", "address", "timeline", "reissue")}}
    digest = hashlib.sha256(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()
    return {"digest": digest, "version": VERSION, "backend": backend, "seed": options.seed,
            "sources": sources}


def trial_seed(seed: int, scenario: str, variant: str, index: int) -> int:
    """The seed of one trial, from the run's seed: stable whatever else the run contains, so
    ``--seed S`` replays a scenario's trials exactly even when run alone."""
    digest = hashlib.sha256(f"{seed}:{scenario}:{variant}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little")

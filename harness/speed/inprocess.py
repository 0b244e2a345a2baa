"""A run's worker in the benchmark's own process: the trial runner a worker process makes (its
executor, flight recorder and race detector), with none of the process around it, so that its
per-trial cost can be set beside a bare loop's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def worker_here(scenario: Any, variant: str, backend: str, delay_us: float, detect: bool,
                folder: Path, *, timeline: bool = False, reissue: bool = True,
                keep_world: bool | None = None) -> Any:
    """A :class:`harness.run.worker.TrialRunner` for ``variant`` of ``scenario``, its traces and log
    under ``folder``; it keeps as many traces of bad trials as a run's workers do.
    ``keep_world`` keeps the world from trial to trial on the simulated device too (a GPU
    worker always does), so a sim benchmark measures the trials a GPU's worker runs."""
    from harness.run.options import RunOptions
    from harness.run.worker import TrialRunner, WorkerJob

    job = WorkerJob(scenario=scenario, variant=variant, backend=backend, parent_pid=os.getpid(),
                    amplify=delay_us > 0, delay_us=delay_us or None,
                    log_path=str(folder / "worker.log"), trace_dir=str(folder / "traces"),
                    header={"scenario": scenario.name, "variant": variant}, detect=detect,
                    traces_kept=RunOptions.max_incidents, timeline=timeline, reissue=reissue,
                    keep_world=keep_world)
    return TrialRunner(job)

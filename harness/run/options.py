"""What a run is asked to do: the options of :class:`harness.run.runner.Runner`, as the CLI,
the pytest plugin and the benchmarks give them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunOptions:
    """The options of one run (most are flags of `gpurace run`)."""

    backend: str = "auto"
    dangerous: bool = False
    trials: int | None = None
    seed: int = 0
    variants: tuple[str, ...] = ()
    amplify: bool = True
    delay_us: float | None = None
    timeout_s: float | None = None
    sweep: bool = False
    out_dir: Path | None = None  # worker logs go to out_dir/workers (a temp folder if None)
    trial: int | None = None  # run only this trial index of each variant (a reproduction)
    max_incidents: int = 3  # incident folders written per variant; the rest are counted
    detect: bool = True  # run the race detector in every trial
    schedule: str | None = None  # replay this schedule token in every trial (sim only)
    record: bool = False  # keep every trial's op trace under out_dir/workers
    poison: bool = False  # the pool poisons released pages (kvcore's DeviceKVPagePool)
    timeline: bool = False  # time every stream op with CUDA events (the incidents' timelines)
    reissue: bool = True  # issue a captured clean trial's device calls again (harness.run.executor)
    shard: tuple[int, int] | None = None  # (K, N): run the K-th of N parts of the trials
    spares: int | None = None  # workers kept ready once a variant's workers die (None: the
    # backend's default, SPARES_DEFAULT; see harness.run.workers)
    gpus: str | None = None  # "all", "N" or "0,2": a lane of workers per GPU (sim: N devices)
    executor: str = "local"  # "ray": workers are Ray actors (harness.run.rayexec)
    address: str | None = None  # the Ray cluster's address; None: a local instance
    stop_on_write_error: bool = False  # stop at the first file that cannot be written

"""A run's worker taken apart: the same trials with its parts switched on one at a time.

A profile (:mod:`harness.speed.profile`) says where a trial's time goes by the functions that
spent it, and the profiler's own cost per call bends the shares toward code of many small
calls. This measures instead: the executor alone, then with the op log built for a reader that
does nothing (records, and the segments a reissued trial hands out instead; then the segments
cut where the host blocks, as a recorder's flushes cut them, with nothing done there), the
flight recorder, the race detector, and both, as a worker attaches and calls them (the recorder's
trace begun and ended, the detector reset and asked for its findings); last, a run's worker
itself (its trial runner), which also makes each trial's record, the findings' JSON among it,
and keeps the first bad trials' traces: what lies between the last two is the worker's own
bookkeeping. Each kind runs its own
executor on its own device, blocks of trials in turn, so drift touches all alike; a kind's
figure is its median block. The world is kept from trial to trial on every backend, as a GPU
worker keeps it, so reissued trials are measured on the simulated device too.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.speed.blocks import alternate
from harness.speed.inprocess import worker_here

WORKER = "a run's worker, whole"

_SPECS = (  # (name, the op log's reader that does nothing, recorder, detector)
    ("executor alone", None, False, False),
    ("+ op log, records", "records", False, False),
    ("+ op log, segments", "segments", False, False),
    # What the recorder's flushes cost the executor alone: its run cut where the host blocks.
    ("+ segments, cut at waits", "waits", False, False),
    ("+ flight recorder", None, True, False),
    ("+ race detector", None, False, True),
    ("+ recorder and detector", None, True, True),
    (WORKER, None, True, True),
)
KINDS = tuple(spec[0] for spec in _SPECS)
"""What each measured kind adds to the executor: the next to last is what a run's worker
attaches, the last the worker itself."""


@dataclass(frozen=True)
class Split:
    """One variant's trials, each kind's median microseconds a trial (:data:`KINDS` order)."""

    scenario: str
    variant: str
    delay_us: float  # queued before the scenario's amplified op; 0 for none
    asked: bool  # reissuing was asked for
    reissued: bool  # the trials were reissued from a captured program
    trials: int  # of each kind
    us: tuple[float, ...]
    manifested: tuple[int, ...]  # trials that went wrong, of each kind

    def heading(self) -> str:
        """What was measured: the variant, the delay, and how its trials ran."""
        how = ("reissued" if self.reissued else
               "step by step (asked to reissue; this variant cannot be)" if self.asked else
               "step by step")
        return (f"{self.variant}, delay {self.delay_us:g} us, {how} (went wrong: "
                f"{'/'.join(map(str, self.manifested))} of {self.trials} each):")

    def table(self, indent: str = "    ") -> str:
        """Each kind's time, its cost over the executor alone and its ratio to it."""
        width = max(len(k) for k in KINDS)
        base = self.us[0]
        return "\n".join(f"{indent}{kind:<{width}}  {us:7.1f} us  +{us - base:6.1f} us  "
                         f"{us / base:5.2f}x" for kind, us in zip(KINDS, self.us))


def split(scenario: Any, variant: str, backend: str, *, reissue: bool, trials: int,
          block: int = 100, delay_us: float = 0.0) -> Split:
    """Measure ``trials`` trials of each kind of ``scenario``'s ``variant`` (reissued from a
    captured program when ``reissue`` and the scenario allows it, else step by step)."""
    with tempfile.TemporaryDirectory(prefix="gpurace-split-") as tmp:
        kinds = [_kind(spec, scenario, variant, backend, reissue, delay_us, Path(tmp) / str(k))
                 for k, spec in enumerate(_SPECS)]
        try:
            for kind in kinds:  # past the capture: the trials a worker mostly runs
                for index in range(10):
                    kind.run(index)
            seconds, manifested = alternate([kind.run for kind in kinds], trials, block,
                                            first=10)
        finally:
            for kind in kinds:
                kind.close()
        reissued = all(kind.executor.reissued for kind in kinds)
    return Split(scenario.name, variant, delay_us, reissue, reissued,
                 max(1, trials // block) * block,
                 tuple(s * 1e6 for s in seconds), tuple(manifested))


def _kind(spec: tuple[str, str | None, bool, bool], scenario: Any, variant: str, backend: str,
          reissue: bool, delay_us: float, folder: Path) -> _Kind:
    """A trial function of one kind (whether the trial went wrong), its executor, and what
    ends it."""
    from harness.races.detector import RaceDetector
    from harness.run.executor import TrialExecutor
    from harness.traces.flight import FlightRecorder

    name, reader, recording, detecting = spec
    if name == WORKER:
        runner = worker_here(scenario, variant, backend, delay_us, True, folder,
                             reissue=reissue, keep_world=True)
        return _Kind(lambda index: runner.run(index, index).outcome != "clean",
                     runner.executor, runner.close)
    recorder = FlightRecorder(folder) if recording else None
    detector = RaceDetector() if detecting else None

    def on_device(device: Any) -> None:
        if reader is not None:
            device.oplog.subscribe(_nothing, segments=None if reader == "records" else _nothing)
        if reader == "waits":
            device.oplog.before_blocking(_nothing)
        if recorder is not None:
            recorder.attach(device)
        if detector is not None:
            detector.attach(device)

    executor = TrialExecutor(scenario, scenario.variant(variant), backend,
                             amplify=delay_us > 0, delay_us=delay_us or None,
                             on_device=on_device, reissue=reissue, keep_world=True)
    header = {"scenario": scenario.name, "variant": variant}

    def trial(index: int) -> bool:
        if recorder is not None:
            recorder.start_trial(header, trial=index, seed=index)
        if detector is not None:
            detector.reset()
        bad = executor.run(index, index).outcome.manifested
        if detector is not None:
            detector.findings_json()  # asked for as a worker asks: the analysis runs
        if recorder is not None:
            recorder.end_trial(index, keep=False)
        return bad

    def close() -> None:
        if recorder is not None:
            recorder.close(discard=True)

    return _Kind(trial, executor, close)


@dataclass(frozen=True)
class _Kind:
    run: Callable[[int], bool]
    executor: Any
    close: Callable[[], None]


def _nothing(*_: object) -> None:
    """A reader of the op log that reads nothing (or a hook before a wait that does nothing):
    what building the log costs by itself."""

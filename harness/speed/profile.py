"""A trial's host time by the part that spent it: the executor, the device layer, the flight
recorder, the race detector, the worker's record, the device's own library.

:func:`profile` runs a trial function twice as many times: first unprofiled (the trial's real
time), then under :mod:`cProfile`. Each function's own time goes to the part its file belongs
to (:data:`PARTS`); a built-in's or the standard library's (a list append, a JSON encoder, a
CUDA runtime call through CuPy's bindings) goes to its callers' parts, shared as they called
it. The profiler slows every Python call, so
the shares come from the profile and the microseconds from the unprofiled time: a part's
figure is its share of the trial's real time.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # The recorder's own files: the rest of traces/ (a ticket's requests and the engine's
    # batching plan) is the work a ticket replay's steps do, the executor's.
    ("flight recorder", ("harness/traces/flight.py", "harness/traces/lines.py",
                         "harness/traces/optrace.py")),
    ("race detector", ("harness/races/",)),
    ("executor (steps, checks, world)", ("harness/run/executor.py", "harness/run/steps.py",
                                         "harness/run/checks.py", "harness/run/world.py",
                                         "harness/run/workloads.py", "harness/run/threads.py",
                                         "harness/lang/steplist.py", "harness/lang/capacity.py",
                                         "harness/lang/graphs.py", "harness/lang/scope.py",
                                         "harness/lang/model.py", "harness/traces/batching.py",
                                         "harness/traces/ticket.py",
                                         "harness/traces/requests.py")),
    ("worker (the trial's record)", ("harness/run/worker.py", "harness/run/wire.py",
                                     "harness/results/outcome.py")),
    ("simulated device", ("kvcore/device/sim.py",)),
    ("CUDA device (kvcore's calls into CuPy)", ("kvcore/device/cuda.py",)),
    ("device layer (reissue, op log, pool)", ("kvcore/",)),
    ("CuPy and the CUDA runtime", ("cupy/", "cupy_backends/", "cupyx/")),
    ("NumPy", ("numpy/",)),
)
"""Each part and the paths of the files whose functions' time is its own, the first match
counting (the CUDA device before the rest of kvcore)."""

OTHER = "other"
_STDLIB = tuple({os.path.join(os.path.realpath(sysconfig.get_paths()[key]), "")
                 for key in ("stdlib", "platstdlib")})


@dataclass(frozen=True)
class Part:
    """One part's time in a trial: microseconds (its share of the unprofiled trial) and the
    share."""

    name: str
    us: float
    share: float


@dataclass(frozen=True)
class Profile:
    """A profiled trial function: its unprofiled time a trial and the parts, largest first."""

    trials: int
    trial_us: float
    parts: tuple[Part, ...]

    def table(self, indent: str = "    ") -> str:
        """The parts, a line each, and the trial's unprofiled time last."""
        label = "a trial, unprofiled"
        width = max([len(label), *(len(p.name) for p in self.parts)])
        rows = [f"{indent}{p.name:<{width}}  {p.us:7.1f} us  {100 * p.share:5.1f}%"
                for p in self.parts]
        return "\n".join([*rows, f"{indent}{label:<{width}}  {self.trial_us:7.1f} us"])


def part_of(filename: str) -> str:
    """The part a function's file belongs to (:data:`PARTS`), or :data:`OTHER`."""
    path = filename.replace("\\", "/")
    for name, marks in PARTS:
        if any(mark in path for mark in marks):
            return name
    return OTHER


def profile(trial: Callable[[int], Any], trials: int, first: int = 0) -> Profile:
    """Run ``trial(index)`` for ``trials`` indexes unprofiled, then ``trials`` more under the
    profiler; the parts of a trial's time."""
    start = time.perf_counter()
    for index in range(first, first + trials):
        trial(index)
    trial_us = (time.perf_counter() - start) / trials * 1e6
    profiler = cProfile.Profile()
    profiler.enable()
    for index in range(first + trials, first + 2 * trials):
        trial(index)
    profiler.disable()
    spent = _by_part(pstats.Stats(profiler).stats)  # type: ignore[attr-defined]
    total = sum(spent.values()) or 1.0
    parts = sorted((Part(name, trial_us * t / total, t / total) for name, t in spent.items()
                    if t > 0), key=lambda p: -p.us)
    return Profile(trials, trial_us, tuple(parts))


def _by_part(stats: dict[tuple[str, int, str], Any]) -> dict[str, float]:
    """Own time by part: a built-in's (no file of its own) or the standard library's shared
    among its callers by the time each spent calling it; a caller that is itself one goes by
    its callers in turn (the profiler's own disable call is left out)."""
    spent: dict[str, float] = {}

    def owner(func: tuple[str, int, str], seen: frozenset = frozenset()) -> dict[str, float]:
        filename = func[0]
        if filename != "~" and not os.path.realpath(filename).startswith(_STDLIB):
            return {part_of(filename): 1.0}
        callers = stats.get(func, (0, 0, 0.0, 0.0, {}))[4]
        weights = {caller: info[2] + info[3] for caller, info in callers.items()
                   if caller not in seen}
        total = sum(weights.values())
        if not total:
            return {OTHER: 1.0}
        out: dict[str, float] = {}
        for caller, weight in weights.items():
            for name, share in owner(caller, seen | {func}).items():
                out[name] = out.get(name, 0.0) + share * weight / total
        return out

    for func, (_, _, own, _, _) in stats.items():
        if func[2] == "<method 'disable' of '_lsprof.Profiler' objects>":
            continue
        for name, share in owner(func).items():
            spent[name] = spent.get(name, 0.0) + own * share
    return spent

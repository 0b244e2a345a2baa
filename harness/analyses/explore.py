"""Schedule exploration on the simulated device: try orderings of the unordered ops on purpose.

A schedule holds back some device ops and, in a scenario with host threads, preempts threads
at some of their decisions (kvcore.device.schedule). A choice is one held-back op or one
preemption. Strategies:
- ``random``: each op held back with probability 1/n, and each decision preempted with
  probability 1/d, ``runs`` times;
- ``pct``: probabilistic concurrency testing with bug depth d: d choices at random, ``runs``
  times (a depth-d ordering bug is found with probability at least 1/n^d per run);
- ``exhaustive``: every set of at most ``bound`` choices, in order of size: bounded model
  checking (with host threads, preemption-bounded as in loom and CHESS).

Each schedule runs one trial in this process with no amplification, and every schedule whose
trial did not end clean is returned with its token, which ``gpurace run --schedule`` replays.
"""

from __future__ import annotations

import enum
import itertools
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import kvcore
from harness.errors import TargetError
from harness.run.executor import TrialExecutor, sections
from harness.lang.model import Scenario, Variant
from harness.results.outcome import Outcome, TrialResult
from kvcore.device.schedule import Schedule


class Strategy(str, enum.Enum):
    RANDOM = "random"
    PCT = "pct"
    EXHAUSTIVE = "exhaustive"


class StopReason(str, enum.Enum):
    """Why exploration ended; each carries its own message."""

    EXHAUSTED = "every schedule within the bound was tried"
    BUDGET = "the run budget was spent"
    FIRST_FAILURE = "a failing schedule was found (--first)"


@dataclass(frozen=True)
class Tried:
    token: str
    outcome: Outcome
    detail: str


@dataclass
class Exploration:
    scenario: str
    variant: str
    strategy: Strategy
    ops: int  # device ops in an unperturbed trial: what schedules choose from
    decisions: int = 0  # host-thread decisions in an unperturbed trial
    tried: int = 0
    failing: list[Tried] = field(default_factory=list)
    stop: StopReason = StopReason.EXHAUSTED

    def to_json(self) -> dict[str, object]:
        return {"scenario": self.scenario, "variant": self.variant,
                "strategy": self.strategy.value, "ops": self.ops,
                "decisions": self.decisions, "tried": self.tried,
                "stop": self.stop.name.lower(), "stop_reason": self.stop.value,
                "failing": [{"token": t.token, "outcome": t.outcome.value, "detail": t.detail}
                            for t in self.failing]}


def _trial(scenario: Scenario, variant: Variant, schedule: Schedule,
           seed: int) -> tuple[TrialResult, int, int]:
    """One unamplified trial under ``schedule``; returns it, how many ops the device ran and
    how many host-thread decisions were taken."""
    devices: list[kvcore.Device] = []
    executor = TrialExecutor(scenario, variant, "sim", amplify=False, schedule=schedule,
                             on_device=devices.append)
    result = executor.run(0, seed)
    return result, getattr(devices[-1], "ops_issued", 0), executor.decisions


Choice = tuple[int, int]
"""``(op, -1)``: hold back device op ``op``; ``(decision, thread)``: a preemption."""


def _schedule(choices: Iterable[Choice]) -> Schedule | None:
    """The schedule of a set of choices; None when two preempt the same decision."""
    held = frozenset(op for op, thread in choices if thread < 0)
    preempt = tuple(sorted((d, t) for d, t in choices if t >= 0))
    if len({d for d, _ in preempt}) != len(preempt):
        return None
    return Schedule(held, preempt)


def _schedules(strategy: Strategy, ops: int, decisions: int, threads: int, *, bound: int,
               depth: int, runs: int, rng: random.Random) -> Iterator[Schedule]:
    choices = [(op, -1) for op in range(ops)] + [
        (d, t) for d in range(decisions) for t in range(threads if threads > 1 else 0)]
    if strategy is Strategy.EXHAUSTIVE:
        for size in range(1, bound + 1):
            for picked in itertools.combinations(choices, size):
                schedule = _schedule(picked)
                if schedule is not None:
                    yield schedule
        return
    for _ in range(runs):
        if strategy is Strategy.RANDOM:
            picked = [(i, -1) for i in range(ops) if rng.random() < 1.0 / max(ops, 1)]
            if threads > 1:
                picked += [(d, rng.randrange(threads)) for d in range(decisions)
                           if rng.random() < 1.0 / max(decisions, 1)]
        else:
            picked = rng.sample(choices, min(depth, len(choices)))
        schedule = _schedule(picked)
        if schedule is not None:
            yield schedule


def explore(scenario: Scenario, variant: Variant, strategy: Strategy, *, bound: int = 2,
            depth: int = 1, runs: int = 200, seed: int = 0, first: bool = False,
            progress: Callable[[int], None] | None = None) -> Exploration:
    """Explore ``variant`` of ``scenario`` (a steps scenario) under ``strategy``."""
    if scenario.workload is not None:
        raise TargetError(f"{scenario.name}: exploration runs step scenarios; a workload's "
                          "ops depend on its timing, so a schedule could not name them")
    endless = scenario.endless_step()
    if endless is not None:
        raise TargetError(f"{endless.origin}: {endless.label}: this step never ends (us: .inf), "
                          "and exploration runs its trials in this process, with no watchdog; "
                          "explore a scenario whose trials end")
    baseline, ops, decisions = _trial(scenario, variant, Schedule(), seed)
    threads = max((len(s.threads) for s in sections(scenario.steps_of(variant.name))), default=0)
    result = Exploration(scenario.name, variant.name, strategy, ops, decisions, tried=1)
    if baseline.outcome is not Outcome.CLEAN:
        result.failing.append(Tried(Schedule().token, baseline.outcome, baseline.detail))
    rng = random.Random(seed)
    for schedule in _schedules(strategy, ops, decisions, threads, bound=bound, depth=depth,
                               runs=runs, rng=rng):
        trial, _, _ = _trial(scenario, variant, schedule, seed)
        result.tried += 1
        if progress is not None:
            progress(result.tried)
        if trial.outcome is not Outcome.CLEAN:
            result.failing.append(Tried(schedule.token, trial.outcome, trial.detail))
            if first:
                result.stop = StopReason.FIRST_FAILURE
                return result
    result.stop = StopReason.EXHAUSTED if strategy is Strategy.EXHAUSTIVE else \
        StopReason.BUDGET
    return result

"""A parallel section's host threads: interleaved one step at a time by a seeded schedule on
the simulated device, or run as real threads on the GPU. What a step does is the trial's
(:class:`harness.run.steps._Steps` hands each one over); what is here is whose turn it is, the
mutexes the threads hold, and a deadlock when no thread can go on."""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Callable
from typing import Protocol

import kvcore
from harness.lang import vocabulary as V
from harness.lang.model import Step
from kvcore.device.schedule import Schedule

from harness.run.checks import _Corruption


class _Deadlock(Exception):
    """No host thread can go on: ends the trial as ``hang``."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(detail)
        self.step = step


_WAITING_STEPS = ("synchronize", "event_query")
"""Steps that wait for the device: on the GPU, a host thread runs them without holding the
others back, as an engine's threads do."""

PREEMPT_CHANCE = 0.02
"""How often a seeded interleaving on the simulated device switches threads after a host-only
step. CPython switches threads when one blocks or its 5 ms interval ends, and a scenario's host
steps take microseconds, so real threads rarely cut each other short there; ``explore`` and
schedule tokens take the preemptions that matter on purpose."""

RELEASE_CHANCE = 0.1
"""How often it switches after a step that called the device. The call lets go of the
interpreter lock, and whether the caller or a waiting thread runs next is a race of microseconds
either way, so the chance follows the harness's own host time between a thread's steps, and is
set where the simulated device finds cudf-22284's race as often as the H200 does: unamplified,
the H200 detected it in 509 of 600 trials (three runs of 200: 180, 168, 161), and the simulated
device detects it in 168 of 200 at 0.1 (176 at 0.05, 160 at 0.15, and 152 at 0.2, set when the
H200 detected it in 152 to 166 of 200). When the trial path's speed changes, the GPU zoo test (a
thread race's rate on sim against the GPU) says whether this needs measuring again."""


class Turns(Protocol):
    """What the threads read of the executor that runs the trial (a
    :class:`harness.run.executor.TrialExecutor`)."""

    backend: str
    schedule: Schedule | None
    decisions: int  # host-thread decisions of the trial (what explore perturbs)

    def held_steps(self) -> tuple[str, ...]: ...


class HostThreads:
    """The host threads of a trial's parallel sections. ``one`` runs a step that is not a lock
    or an unlock; ``exists`` says whether a trial has made a name of a kind (a thread may use
    it only once some thread has)."""

    def __init__(self, executor: Turns, device: kvcore.Device, seed: int,
                 one: Callable[[Step], None], exists: Callable[[str, str], bool]) -> None:
        self.ex = executor
        self.device = device
        self.seed = seed
        self.one = one
        self.exists = exists
        self.held: dict[str, str] = {}  # mutex -> the thread holding it

    def interleave(self, threads: tuple[tuple[str, tuple[Step, ...]], ...]) -> None:
        """A parallel section on the simulated device: one step at a time, from a thread that
        can go on. As under CPython's GIL, the threads begin in the order they are declared, and
        a thread keeps going until it ends or must wait, then the next ready one goes on; the
        device sees the host's time pass at each start and switch. Preemptions are the
        schedule's under a schedule; without one, the trial's seed preempts often after a step
        that called the device (the call let go of the interpreter lock) and rarely after
        another, so a seeded run predicts what real threads do, and ``explore`` covers the
        other interleavings."""
        names = [name for name, _ in threads]
        queues = {name: list(steps) for name, steps in threads}
        schedule = self.ex.schedule
        rng = random.Random(f"threads-{self.seed}") if schedule is None else None
        hold = self.ex.held_steps()
        device = self.device
        current: str | None = None
        begun: set[str] = set()
        called = False  # the last step called the device (let go of the interpreter lock)
        while any(queues.values()):
            ready = [t for t in names if queues[t] and self._ready(queues[t][0])]
            if not ready:
                raise self._deadlock(queues)
            if hold:
                # The amplified hold: a held thread goes on only once no other one can, and
                # then the one held first in the list.
                free = [t for t in ready if queues[t][0].id not in hold]
                ready = free or [min(ready, key=lambda t: hold.index(str(queues[t][0].id)))]
            pick = current if current in ready else ready[0]
            if len(ready) > 1:
                if rng is not None:
                    if rng.random() < (RELEASE_CHANCE if called else PREEMPT_CHANCE):
                        pick = rng.choice([t for t in ready if t != current] or ready)
                else:
                    wanted = schedule.thread_at(self.ex.decisions)  # type: ignore[union-attr]
                    if wanted is not None and wanted < len(names) and names[wanted] in ready:
                        pick = names[wanted]
                self.ex.decisions += 1
            if pick != current:
                device.host_thread_switch(start=pick not in begun)
                begun.add(pick)
            current = pick
            calls = device.calls
            self._threaded(queues[pick].pop(0), pick)
            called = device.calls != calls

    def in_parallel(self, threads: tuple[tuple[str, tuple[Step, ...]], ...]) -> None:
        """A parallel section on the GPU: a real thread per host thread. A step that names what
        another thread makes waits until it is made, and a mutex is taken under the same
        condition as that check; one thread's device calls are not cut by another's (the op
        log's step labels are the trial's), except while a step waits for the device. The
        amplified hold is the simulated device's: a held step begins only once every other
        thread has ended or waits."""
        changed = threading.Condition()
        issue = threading.Lock()
        hold = self.ex.held_steps()
        # The simulated device is not thread-safe; its waits take no real time anyway.
        simulated = self.ex.backend != "cuda"
        names = [name for name, _ in threads]
        waiting: dict[str, Step] = {}  # thread -> the step it waits to begin
        done: set[str] = set()
        failed: list[BaseException] = []

        def may_go(name: str) -> bool:
            step = waiting[name]
            if not self._ready(step):
                return False
            if step.id is None or step.id not in hold:
                return True
            mine = hold.index(step.id)
            for other in names:
                if other == name or other in done:
                    continue
                theirs = waiting.get(other)
                if theirs is None:
                    return False  # still running: it may reach the window the hold opens
                if self._ready(theirs) and not (theirs.id in hold and
                                                hold.index(str(theirs.id)) > mine):
                    return False
            return True

        def wake(name: str) -> bool:
            if failed or may_go(name):
                return True
            if all(t in done or (t in waiting and not may_go(t)) for t in names):
                failed.append(self._deadlock({t: [s] for t, s in waiting.items()}))
                changed.notify_all()
                return True
            return False

        def body(name: str, steps: tuple[Step, ...]) -> None:
            try:
                for step in steps:
                    with changed:
                        waiting[name] = step
                        changed.notify_all()  # what this one made, or that it now waits
                        changed.wait_for(functools.partial(wake, name))
                        del waiting[name]
                        if failed:
                            return
                        if step.op in ("lock", "unlock"):
                            self._threaded(step, name)
                            continue
                    if step.op in _WAITING_STEPS and not simulated:
                        self._threaded(step, name)  # blocks: the others must go on meanwhile
                    else:
                        with issue:
                            self._threaded(step, name)
            except BaseException as exc:  # ends the trial; the other threads stop at a step
                with changed:
                    failed.append(exc)
                    # A thread waiting for a mutex this one holds must not wait forever.
                    for mutex in [m for m, t in self.held.items() if t == name]:
                        self._give(mutex)
            finally:
                with changed:
                    done.add(name)
                    changed.notify_all()

        workers = [threading.Thread(target=body, args=item, name=f"gpurace-host-{item[0]}",
                                    daemon=True) for item in threads]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if failed:
            raise failed[0]

    def _threaded(self, step: Step, thread: str) -> None:
        """One step of a host thread. What the pool refuses here (a lease another thread has
        released, a pool another thread has emptied) is the race's consequence, not a fault of
        the scenario: the trial ends as corruption, saying which thread did what."""
        try:
            if step.op == "lock":
                self._take(str(step.args["mutex"]), thread)
            elif step.op == "unlock":
                self._give(str(step.args["mutex"]))
            else:
                self.one(step)
        except kvcore.DeviceError:
            raise
        except kvcore.KVCoreError as exc:
            raise _Corruption(step.label, f"{step.label} (thread {thread}): the pool refused: "
                                          f"{exc}") from exc

    def _take(self, mutex: str, thread: str) -> None:
        self.held[mutex] = thread

    def _give(self, mutex: str) -> None:
        del self.held[mutex]

    def _ready(self, step: Step) -> bool:
        """Whether a thread's next step can run now: what it names exists (another thread may
        not have made it yet), and the mutex it takes is free."""
        if step.op == "lock" and str(step.args["mutex"]) in self.held:
            return False
        return all(self.exists(kind, name) for kind, name in V.uses(step.op, step.args))

    def _deadlock(self, queues: dict[str, list[Step]]) -> _Deadlock:
        waits = []
        for thread, steps in queues.items():
            if not steps:
                continue
            step = steps[0]
            if step.op == "lock" and str(step.args["mutex"]) in self.held:
                mutex = str(step.args["mutex"])
                waits.append(f"thread {thread} waits at {step.label} for mutex {mutex} (held "
                             f"by thread {self.held[mutex]})")
            else:
                missing = [f"{k} {n}" for k, n in V.uses(step.op, step.args)
                           if not self.exists(k, n)]
                waits.append(f"thread {thread} waits at {step.label} for "
                             f"{', '.join(missing)}, which no thread can make now")
        first = next(steps[0] for steps in queues.values() if steps)
        return _Deadlock(first.label, "the host threads deadlocked: " + "; ".join(waits))


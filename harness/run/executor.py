"""The trial executor: runs one scenario variant's trials against kvcore on one device.

It knows nothing of processes, CLIs or reports: the worker calls :meth:`TrialExecutor.run` once
per trial and gets a :class:`TrialResult`. The world a scenario needs (context, pool, host
buffers, execution table) is built once per device and reused across trials, as an engine keeps
its streams and pool: building it per trial would add allocations (which synchronize the device)
to every race window.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable

import kvcore
from harness.lang.model import Amplify, Scenario, Step, Variant
from harness.results.outcome import Outcome, TrialResult
from harness.traces.ticket import Ticket, load_ticket
from kvcore.device.kernels import Delay
from kvcore.device.program import Program
from kvcore.device.schedule import Schedule

from harness.run.checks import _Corruption
from harness.run.steps import _Steps, sections
from harness.run.workloads import _Conversation, _TicketReplay, pool_for
from harness.run.world import World


class TrialExecutor:
    """Runs trials of one variant. On sim every trial gets a fresh simulated device seeded with
    the trial's seed (cheap, and it makes each trial reproducible on its own); on cuda one device
    and one world serve every trial of the worker."""

    def __init__(self, scenario: Scenario, variant: Variant, backend: str, *,
                 amplify: bool = True, delay_us: float | None = None,
                 on_device: Callable[[kvcore.Device], None] | None = None,
                 schedule: Schedule | None = None, poison: bool = False,
                 real_threads: bool | None = None, timeline: bool = False,
                 reissue: bool = True, keep_world: bool | None = None) -> None:
        self.ticket: Ticket | None = None
        workload = scenario.workload
        if workload is not None and workload.kind == "ticket" and workload.ticket is not None:
            self.ticket = load_ticket(workload.ticket)
            # The pool a ticket ran on is part of the ticket: its geometry and size win.
            scenario = dataclasses.replace(scenario, pool=pool_for(self.ticket))
        self.scenario = scenario
        self.schedule = schedule
        self.poison = poison  # the pool poisons released pages (see DeviceKVPagePool)
        self.timeline = timeline  # the GPU times its stream ops (see Device.settle_times)
        # Host threads: real ones on the GPU; interleaved step by step (by the seed or a
        # schedule) on the simulated device, which only a schedule can make reproducible.
        self.real_threads = backend == "cuda" if real_threads is None else real_threads
        self.on_device = on_device
        self.variant = variant
        self.backend = backend
        self.amplify: Amplify | None = scenario.amplify if amplify else None
        self.delay_us = delay_us if delay_us is not None else (
            self.amplify.delay_us if self.amplify else None)
        self.amplified_stream = scenario.amplified_stream(variant.name)
        # The step the delay goes before (None when nothing is delayed).
        self.amplified_step = self.amplify.before if self.amplify and self.delay_us else None
        self.steps = scenario.steps_of(variant.name)
        self.sections = sections(self.steps)
        # The last step to read the pool when only checks of buffers come after it (its wait
        # can cover the trial's scrub), or None.
        self.last_pool_read = _last_pool_read(self.steps)
        self.decisions = 0  # host-thread decisions of the last trial (what explore perturbs)
        self._world: World | None = None
        self.device_info: dict[str, object] = {}
        device = self._open(0)
        if backend == "cuda" if keep_world is None else keep_world:
            # The GPU's world outlives its trials: its pages would still hold the last trial's
            # bytes, which a stale read would take for the right ones. (A simulated device is
            # new every trial, and starts as 0xA5.)
            self._world = World(scenario, device, variant, scrubs=bool(self.steps),
                                poison=poison)
        # A world that serves many trials issues the same device calls every trial once its
        # state settles: a clean trial is captured as a device program and later trials
        # reissue it (see _reissue), as an engine replays a captured graph.
        # On a simulated device, new every trial, a kept program only says that the GPU would
        # be reissuing by now: the steps run, timed as a reissued trial's host (see _steps).
        self.reissues = reissue and reissuable(
            self.steps, schedule=schedule, timeline=timeline, workload=scenario.workload)
        self.program: Program | None = None
        self.unkept: str | None = None  # why the last program captured was not kept
        self.reissued = 0  # trials reissued from the program
        self._captures_left = CAPTURES

    def _open(self, seed: int) -> kvcore.Device:
        device = kvcore.open_device(self.backend, defects=self.variant.defects, seed=seed,
                                    schedule=self.schedule, timeline=self.timeline)
        if not self.device_info:  # the same for every device of the run; not worth a rebuild
            self.device_info = device.info().to_json()
        if self.on_device is not None:
            self.on_device(device)
        # Ops carry the scenario line that issued them; the Python line (what an observer may
        # ask for) would be the executor's own, so no frame walk is spent on it.
        device.record_call_sites = False
        return device

    def world(self, seed: int) -> World:
        if self._world is None:
            return World(self.scenario, self._open(seed), self.variant, poison=self.poison)
        return self._world

    def run(self, index: int, seed: int) -> TrialResult:
        """One trial; never raises for what the trial itself did (that is its outcome)."""
        world = self.world(seed)
        reissued = self.reissued
        start = time.perf_counter()
        # A collection inside the race window would stretch the host's part of it.
        gc.disable()
        try:
            world.begin()
            if self.ticket is not None:
                outcome, detail, step, requests = _TicketReplay(self, world, self.ticket).run()
            elif self.scenario.workload is not None:
                outcome, detail, step, requests = _Conversation(self, world).run()
            else:
                outcome, detail, step, requests = self._steps(world, seed)
            error = None
        except kvcore.DeviceFaultError as exc:
            outcome, detail, error = Outcome.CRASH, str(exc), exc.cuda_error
            step, requests = getattr(exc, "gpurace_step", None), getattr(
                exc, "gpurace_request", None)
        finally:
            gc.enable()
        if world.device.timeline and world.device.fault is None:
            world.device.settle_times()  # the trial ended with the device idle
        return TrialResult(index, seed, outcome, detail, error, step, requests,
                           time.perf_counter() - start, reissued=self.reissued != reissued)

    def _steps(self, world: World, seed: int) -> tuple[Outcome, str, str | None, int | None]:
        """A step-list trial: reissued when a program is kept, else step by step (captured
        while the executor still looks for a program)."""
        if self.program is not None:
            if self._world is not None:
                self.reissued += 1
                return self._reissue(world, self.program)
            world.device.as_reissued()
            return _Steps(self, world, seed).run()
        trial = _Steps(self, world, seed)
        if not self.reissues or not self._captures_left:
            return trial.run()
        key = world.state_key()
        with world.device.capture() as program:
            trial.capturing = program
            result = trial.run()
        # Kept only when issuing it again is what the steps would do: nothing refused, the
        # whole trial ran (a clean one), and it left the world as it found it (the next
        # trial's own world starts as this one did, on a simulated device).
        if program.refused is not None:
            self.unkept = f"it captured {program.refused}"
        elif result[0] is not Outcome.CLEAN:
            self.unkept = f"the trial ended {result[0].value}"
        elif self._world is not None and world.state_key() != key:
            self.unkept = "the trial left the world other than it found it"
        else:
            self.program, self.unkept = program, None
            return result
        self._captures_left -= 1
        return result

    def _reissue(self, world: World,
                 program: Program) -> tuple[Outcome, str, str | None, int | None]:
        """A trial as the device program an earlier trial captured: its device calls,
        comparisons and scrub, without the steps' lookups and the pool's bookkeeping. A failed
        check ends it as the step path does: the checks after it are skipped, the device is
        synchronized, and the cleanup runs."""
        device = world.device
        cleanup = program.marks["cleanup"]
        result: tuple[Outcome, str, str | None, int | None] = (Outcome.CLEAN, "", None, None)
        late_scrub = False
        try:
            try:
                device.reissue(program)  # the whole trial, when no check fails
                return result
            except _Corruption as exc:
                result = (Outcome.CORRUPTION, str(exc), exc.step, None)
                oplog = device.oplog
                oplog.step = oplog.origin = oplog.thread = None  # the cleanup is no step's
                failed = program.failed_at if program.failed_at is not None else cleanup
                if failed < program.marks["idle"]:
                    world.context.synchronize()
                # The scrub the program makes before its last synchronize was not reached:
                # the cleanup scrubs, as the step path's does.
                late_scrub = failed < program.marks.get("scrub", -1)
            device.reissue(program, cleanup)
            if late_scrub:
                world.scrub("later")
        except kvcore.DeviceFaultError as exc:
            exc.gpurace_step = program.step_at(  # type: ignore[attr-defined]
                program.failed_at if program.failed_at is not None else -1)
            raise
        finally:
            oplog = device.oplog
            oplog.step = oplog.origin = oplog.thread = None
        return result

    def held_steps(self) -> tuple[str, ...]:
        """The steps of host threads that amplification holds back, in the order they go on."""
        amp = self.amplify
        return amp.hold if amp is not None and self.delay_us else ()

    def amplifier(self, world: World, before: str) -> None:
        """Queue the amplifying delay if it belongs before ``before``."""
        amp = self.amplify
        if amp is not None and amp.before == before and self.delay_us:
            stream = self.amplified_stream
            assert stream is not None  # the loader saw to it
            world.device.launch(Delay(self.delay_us), world.stream(stream))


REISSUED_OPS = frozenset({
    "materialize", "release", "host_fill", "copy_from_host", "copy_to_host", "copy_page",
    "zero_pages", "page_list", "gather", "scatter", "read_pinned", "kernel", "record_event",
    "wait_event", "synchronize", "delay", "check", "graph_capture", "graph_end", "graph_replay",
    "catalog", "retain", "bind", "activate", "publish", "release_catalog", "kv_write",
    "read_table", "attention", "host_alloc", "host_free"})
"""The ops whose device calls depend only on the world's state when the trial starts (the
pool's, the arena's and the execution table's), so a program captured in one trial is right in
the next. What differs is counted again as the program runs: the released pages' generations,
and with them a table row's entries (a publish stores them live), a check's or a counting
kernel's comparison. A pinned block a trial takes and gives back (host_alloc, host_free) is
the arena's, which the trial leaves as it found it; one freed after an event is handed out
again only once a query sees the event done, and a trial that queries is never kept (the
capture refuses it). Left out: event queries (their answer is the device's timing),
record_stream (the caching pool hands the pages out again after a query), and mutexes
(threads). A CUDA graph's capture runs nothing a program holds: a reissued trial launches the
graph the captured trial built, whose nodes name the pages the kept world hands out again."""

CAPTURES = 5
"""Trials an executor captures before it gives up looking for a program (each costs the
capture's own bookkeeping): a variant that never ends clean is never reissued."""


def reissuable(steps: tuple[Step, ...], *, schedule: Schedule | None, timeline: bool,
               workload: object) -> bool:
    """Whether a step list's trials can be reissued from a captured program: one host thread,
    no schedule (it decides per trial), untimed, only :data:`REISSUED_OPS`, and the checks
    last (a failed check ends the trial there, and what the steps after it would have held
    is not known to a program)."""
    if schedule is not None or timeline or workload is not None:
        return False
    if any(step.thread is not None or step.op not in REISSUED_OPS for step in steps):
        return False
    ops = [step.op for step in steps]
    first = ops.index("check") if "check" in ops else len(ops)
    return all(op == "check" for op in ops[first:])


def _last_pool_read(steps: tuple[Step, ...]) -> Step | None:
    """The last step to read the pool, when it is a check of a lease on the scenario's own
    thread that only checks of buffers follow."""
    for step in reversed(steps):
        if step.op != "check":
            return None
        if "lease" in step.args:
            return step if step.thread is None else None
    return None

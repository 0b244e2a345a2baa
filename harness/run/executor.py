"""The trial executor: runs one scenario variant's trials against kvcore on one device.

It knows nothing of processes, CLIs or reports: the worker calls :meth:`TrialExecutor.run` once
per trial and gets a :class:`TrialResult`. The world a scenario needs (context, pool, host
buffers, execution table) is built once per device and reused across trials, as an engine keeps
its streams and pool: building it per trial would add allocations (which synchronize the device)
to every race window.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import kvcore
from harness.traces import batching
from harness.lang import vocabulary as V
from harness.lang.footprint import host_bytes
from harness.limits import COUNTED_READS_MAX
from harness.lang.model import Amplify, PlaneSpec, PoolSpec, Scenario, Step, Variant
from harness.results.outcome import Outcome, TrialResult
from harness.traces.ticket import Ticket, load_ticket
from kvcore.device.kernels import (FIRST_BYTES, TOUCH_SPANS_MAX, Delay, Touch, Verify,
                                  first_mismatch)
from kvcore.device.program import Live, Program
from kvcore.device.schedule import Schedule
from kvcore.device.sim import UNWRITTEN


@dataclass(frozen=True)
class Section:
    """A run of steps on the scenario's own thread (``threads`` empty), or a parallel section:
    each host thread's steps, in order, the threads in the order they first appear."""

    steps: tuple[Step, ...]
    threads: tuple[tuple[str, tuple[Step, ...]], ...] = ()


def sections(steps: tuple[Step, ...]) -> tuple[Section, ...]:
    """Consecutive steps with a ``thread`` form a parallel section; the others run in order."""
    out: list[Section] = []
    run: list[Step] = []
    for step in steps:
        if run and (step.thread is None) != (run[0].thread is None):
            out.append(_section(run))
            run = []
        run.append(step)
    if run:
        out.append(_section(run))
    return tuple(out)


def _section(steps: list[Step]) -> Section:
    if steps[0].thread is None:
        return Section(tuple(steps))
    by: dict[str, list[Step]] = {}
    for step in steps:
        by.setdefault(str(step.thread), []).append(step)
    return Section(tuple(steps), tuple((name, tuple(s)) for name, s in by.items()))


class _Deadlock(Exception):
    """No host thread can go on: ends the trial as ``hang``."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(detail)
        self.step = step


class _Corruption(Exception):
    """A check saw data it should not have: ends the trial as ``corruption``."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(detail)
        self.step = step


@dataclass
class _HostBuffer:
    view: kvcore.HostKVAllocationView
    pages: int
    readback: bool  # written by the device (copy_to_host): zeroed before every trial


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

CHECK_STREAM = "(check)"
"""The stream a check reads device pages back on: its own, so that a check adds no ordering to
the scenario's streams (and no scenario can name it)."""


class World:
    """The device-side world of one scenario variant on one device: its streams (with the
    scenario's names, so the op log and findings speak them), the pool, the execution table,
    and the pinned arena its world buffers and its host_alloc'd buffers come from."""

    def __init__(self, scenario: Scenario, device: kvcore.Device,
                 variant: Variant | None = None, *, scrubs: bool = False,
                 poison: bool = False) -> None:
        self.device = device
        self.streams: dict[str, kvcore.device.Stream] = {}
        for spec in (scenario.streams_of(variant) if variant else scenario.streams):
            if spec.kind == "legacy":
                device.rename_stream(device.legacy_stream, spec.name)
                self.streams[spec.name] = device.legacy_stream
            else:
                self.streams[spec.name] = device.create_stream(
                    spec.name, blocking=spec.kind == "blocking", priority=spec.priority)
        self.check_stream = device.create_stream(CHECK_STREAM)
        self.context = kvcore.DeviceContext(
            device, stream=self.streams.get("compute", self.check_stream),
            transfer_stream=self.streams.get("transfer", self.check_stream))
        steps = scenario.steps_of(variant.name) if variant else scenario.steps
        # Bytes no step writes or expects: what a stale read of a scrubbed or poisoned page
        # returns cannot be mistaken for data. Worked out only where they are used (a
        # simulated world is built every trial).
        unused = _unused_bytes(steps) if scrubs or poison else []
        self.poison = unused.pop() if poison else None
        spec = scenario.pool
        self.pool = kvcore.DeviceKVPagePool(self.context, spec.geometry(), spec.pages,
                                            poison=self.poison, allocator=spec.allocator)
        self.layout = kvcore.plan_host_kv_page_layout(self.pool.geometry)
        rows = spec.max_pages_per_row or spec.pages
        self.table = kvcore.KVExecutionTablePool(self.pool, spec.table_rows, rows)
        sizes = _host_buffer_sizes(steps)
        allocs = [int(s.args.get("pages", 1)) for s in steps  # type: ignore[arg-type]
                  if s.op == "host_alloc"]
        scratch = max([spec.pages, 1])
        # Room for every buffer at once, each rounded up to the arena's granule (a page of
        # an odd size would otherwise leave the last buffer without room).
        stride = self.layout.page_stride
        total = sum(host_bytes(pages, stride) for pages in
                    [*(pages for pages, _ in sizes.values()), scratch, *allocs])
        self.arena = kvcore.HostKVArena(self.context, total, [self.layout])
        self.host: dict[str, _HostBuffer] = {}
        for name, (pages, readback) in sizes.items():
            self.host[name] = _HostBuffer(self.view(pages, f"buffer {name}"), pages, readback)
        self.scratch = self.view(scratch, "the check's readback")
        # One int32 slot per counting read_table step (the loader keeps them to this many).
        self.counters = device.alloc(4 * COUNTED_READS_MAX, name="table-read-counts")
        self.counters_host = device.alloc_host(4 * COUNTED_READS_MAX,
                                               name="table-read-counts-host")
        # And per slot, where a counting attention keeps the first page it found wrong.
        self.firsts = device.alloc(FIRST_BYTES * COUNTED_READS_MAX, name="attention-firsts")
        self.firsts_host = device.alloc_host(FIRST_BYTES * COUNTED_READS_MAX,
                                             name="attention-firsts-host")
        self.scrubs = scrubs
        self.settling = False  # a scrub was issued and nobody has waited for it yet
        self.events: dict[str, kvcore.device.Event] = {}
        # What a page holds before a trial writes it: the last scrub's byte on the GPU, the
        # simulated device's initial byte on sim. A check that finds it says so. (A scrub at
        # a trial's end sets it for the next trial: see begin.)
        self.unwritten: int | None = UNWRITTEN if device.kind == "sim" else None
        self._unwritten_next = self.unwritten
        self.scrubbed = 0
        self._scrub_bytes = unused
        self._scrub_byte = Live(0)
        if scrubs:
            self.scrub()
            self.begin()

    def scrub(self, wait: str = "now") -> None:
        """Fill every page with a byte that no step of the scenario writes or expects (another
        one each time): the next trial's reads of a page it did not write then see bytes they
        cannot mistake for data. A world that serves many trials (on the GPU) does this at its
        start and at the end of each trial, once nothing reads the pages any more. ``wait``:
        ``now``, the host waits for it; ``later``, the next trial's :meth:`begin` does (by then
        it has landed, and the wait costs the call alone); ``check``, the caller's next wait
        for the check stream does."""
        # Its byte changes every time: a device program issuing this again picks the next
        # one (a call of its own) and sets it (a Live byte).
        self.device.reissued(self._next_scrub, wait)
        if self.pool.poison is not None:
            # The poison of the trial's last releases runs on the pool's own stream, still
            # writing these pages: the scrub must not race it.
            self.context.synchronize()
        self.device.memset(self.pool.buffer, 0, self.pool.buffer.nbytes, self._scrub_byte,
                           self.check_stream)
        if wait == "now":
            self.context.synchronize()

    def _next_scrub(self, wait: str) -> None:
        """The scrub's next byte, and who waits for it (see :meth:`scrub`)."""
        value = self._scrub_bytes[self.scrubbed % len(self._scrub_bytes)]
        self.scrubbed += 1
        self._unwritten_next = self._scrub_byte.value = value
        self.settling = wait == "later"

    def begin(self) -> None:
        """A trial begins: with the device idle (the last scrub waited for, if nobody has yet),
        and its pages holding the last scrub's byte."""
        if self.settling:
            self.settling = False
            self.context.synchronize()
        self.unwritten = self._unwritten_next

    def event(self, name: str) -> kvcore.device.Event:
        """The scenario's event ``name``: made once per world, as an engine makes its events
        once (an event is recorded again by each trial that records it)."""
        event = self.events.get(name)
        if event is None:
            event = self.events[name] = self.device.create_event(name)
        return event

    def state_key(self) -> tuple[object, ...]:
        """What a trial's device calls depend on besides the scenario (see
        DeviceKVPagePool.state_key): the pool, the arena, the events made so far, and the
        owners the op log knows."""
        log = self.device.oplog
        return (self.pool.state_key(), self.arena.state_key(), tuple(self.events),
                tuple(log.labels.live()) if log.active else ())

    def view(self, pages: int, name: str | None = None) -> kvcore.HostKVAllocationView:
        allocation = self.arena.allocate(self.layout, pages, name=name)
        assert allocation is not None  # sized above
        return self.arena.writable_view(allocation)

    def stream(self, name: str) -> kvcore.device.Stream:
        return self.streams[name]


def _unused_bytes(steps: tuple[Step, ...]) -> list[int]:
    """The bytes 1-255 that no step fills, compares or expects, in order."""
    used = {int(s.args["byte"]) for s in steps if "byte" in s.args}  # type: ignore[call-overload]
    return [b for b in range(1, 256) if b not in used]


def _host_buffer_sizes(steps: tuple[Step, ...]) -> dict[str, tuple[int, bool]]:
    """Each world buffer the steps name (pinned buffers not from host_alloc): its size in
    pages and whether the device writes it."""
    lease_pages: dict[str, int] = {}
    allocated: set[str] = {str(s.args["buffer"]) for s in steps if s.op == "host_alloc"}
    lists: dict[str, int] = {}  # page list -> entries
    sizes: dict[str, tuple[int, bool]] = {}
    for step in steps:
        a = step.args
        if step.op == "materialize" and step.id:
            lease_pages[step.id] = int(a["pages"])  # type: ignore[arg-type]
        elif step.op == "host_fill" and str(a["buffer"]) not in allocated:
            name = str(a["buffer"])
            pages = int(a.get("pages", 1))  # type: ignore[arg-type]
            old = sizes.get(name, (0, False))
            sizes[name] = (max(old[0], pages), old[1])
        elif step.op == "page_list":
            lists[str(a["buffer"])] = lease_pages.get(str(a["lease"]), 1)
            if str(a["buffer"]) not in allocated:
                old = sizes.get(str(a["buffer"]), (0, False))
                sizes[str(a["buffer"])] = (max(old[0], 1), old[1])
        elif step.op in ("copy_to_host", "gather"):
            name = str(a["dst"] if step.op == "copy_to_host" else a["to"])
            if name in allocated:
                continue
            pages = lease_pages.get(str(a["src"]), 1) if step.op == "copy_to_host" else \
                lists.get(str(a["page_list"]), 1)
            old = sizes.get(name, (0, True))
            sizes[name] = (max(old[0], pages), True)
    return sizes


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
        return TrialResult.made(index, seed, outcome, detail, error, step, requests,
                                time.perf_counter() - start, self.reissued != reissued)

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
        if program.refused is None and result[0] is Outcome.CLEAN and (
                self._world is None or world.state_key() == key):
            self.program = program
        else:
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
    "wait_event", "synchronize", "delay", "check", "graph_capture", "graph_end", "graph_replay"})
"""The ops whose device calls depend only on the world's state when the trial starts (the
pool's and the arena's), so a program captured in one trial is right in the next. Left out:
catalogs and tables (their entries carry generations, which grow), event queries (their answer
is the device's timing), host_alloc and host_free (a deferred free waits on a query),
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


class _Steps:
    """One trial of a step-list scenario."""

    def __init__(self, executor: TrialExecutor, world: World, seed: int = 0) -> None:
        self.ex = executor
        self.w = world
        self.seed = seed
        executor.decisions = 0  # counted per trial: a schedule's preemptions name them
        self.current: Step | None = None  # the step running (the last one begun)
        self.held: dict[str, str] = {}  # mutex -> the thread holding it (the interleaved threads)
        self.freed: dict[str, _HostBuffer] = {}  # host_free'd buffers another thread may use
        # Who wrote each byte value, for a check's findings: (what, name, step) as recorded,
        # put into words only if a check fails (host steps sit inside race windows).
        self.wrote: list[tuple[int, str, str, Step | None]] = []
        self.leases: dict[str, list[kvcore.DeviceKVPageLease]] = {}
        self.catalogs: dict[str, kvcore.KVConversationCatalog] = {}
        self.events: dict[str, kvcore.device.Event] = {}
        self.allocs: dict[str, _HostBuffer] = {}  # host_alloc'd buffers not freed yet
        self.lists: dict[str, kvcore.PageIndex] = {}  # page lists the host wrote, by buffer
        self.graphs: dict[str, kvcore.device.Graph] = {}  # captured CUDA graphs, by name
        # Kernels that count instead of asserting, a counter slot each: (step, what it says).
        self.counted: list[tuple[str, str, bool]] = []  # (step, says, keeps its first)
        self.idle = False  # every stream is known idle (the trial's last synchronize ran)
        self.capturing: Program | None = None  # the device program this trial is captured in
        # Nothing is in flight on the device since the last synchronize (checks wait for their
        # own reads): the trial's end can scrub the pool at once.
        self.quiet = False
        self.scrubbed = False  # the pool was scrubbed before the cleanup

    def run(self) -> tuple[Outcome, str, str | None, int | None]:
        w = self.w
        for name, buf in w.host.items():
            if buf.readback:
                buf.view.fill(0)
                self.wrote.append((0, "readback", name, None))
        oplog = w.device.oplog
        try:
            for section in self.ex.sections:
                if not section.threads:
                    self._in_order(section.steps)
                elif self.ex.real_threads:
                    self._threads(section)
                else:
                    self._interleave(section)
            if self.scrubbed and self.quiet:
                pass  # the last check's wait was the scrub's: nothing runs on the device
            elif self.quiet and w.scrubs and w.pool.poison is None:
                # Nothing runs on the device: the scrub can go now, its wait the trial's last
                # synchronize, and the next trial need not wait for it.
                self._scrub("now")
            else:
                w.context.synchronize()
            self.idle = True
            self._mark("idle")
            self._check_counts()
            return Outcome.CLEAN, "", None, None
        except _Corruption as exc:
            return Outcome.CORRUPTION, str(exc), exc.step, None
        except _Deadlock as exc:
            return Outcome.HANG, str(exc), exc.step, None
        except kvcore.DeviceFaultError as exc:
            step = self.current
            exc.gpurace_step = step.label if step else None  # type: ignore[attr-defined]
            raise
        finally:
            oplog.step = oplog.origin = oplog.thread = None
            self._cleanup()

    def _in_order(self, steps: tuple[Step, ...]) -> None:
        """Steps on the scenario's own thread: :meth:`_one` unrolled, since every call here is
        host time inside the race windows."""
        device = self.w.device
        oplog = device.oplog
        oplog.thread = None  # the scenario's own thread
        host_step = device.host_step
        before = self.ex.amplified_step
        handlers, quiet_ops = _HANDLERS, _QUIET
        for step in steps:
            self.current = step
            oplog.step, oplog.origin = step.label, step.origin
            host_step()
            if step.id is not None and step.id == before:
                self.ex.amplifier(self.w, step.id)
            handlers[step.op](self, step)
            if step.op not in quiet_ops:
                self.quiet = False
            elif step.op == "synchronize" and not step.args:
                self.quiet = True

    def _one(self, step: Step) -> None:
        self.current = step
        # Set directly, not through oplog.in_step: a context manager per step is a measurable
        # share of a trial's host time, which sits inside race windows.
        oplog = self.w.device.oplog
        oplog.step, oplog.origin, oplog.thread = step.label, step.origin, step.thread
        self.w.device.host_step()
        self.ex.amplifier(self.w, step.id or "")
        _HANDLERS[step.op](self, step)
        self.quiet = False  # another host thread may have work in flight

    # ---- host threads ----------------------------------------------------------------------------
    def _interleave(self, section: Section) -> None:
        """A parallel section on the simulated device: one step at a time, from a thread that
        can go on. As under CPython's GIL, the threads begin in the order they are declared, and
        a thread keeps going until it ends or must wait, then the next ready one goes on; the
        device sees the host's time pass at each start and switch. Preemptions are the
        schedule's under a schedule; without one, the trial's seed preempts often after a step
        that called the device (the call let go of the interpreter lock) and rarely after
        another, so a seeded run predicts what real threads do, and ``explore`` covers the
        other interleavings."""
        names = [name for name, _ in section.threads]
        queues = {name: list(steps) for name, steps in section.threads}
        schedule = self.ex.schedule
        rng = random.Random(f"threads-{self.seed}") if schedule is None else None
        hold = self.ex.held_steps()
        device = self.w.device
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

    def _threads(self, section: Section) -> None:
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
        names = [name for name, _ in section.threads]
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
                                    daemon=True) for item in section.threads]
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
                self._one(step)
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
        return all(self._exists(kind, name) for kind, name in V.uses(step.op, step.args))

    def _exists(self, kind: str, name: str) -> bool:
        if kind == "memory":  # a kernel's: a lease or a pinned buffer
            return self._exists("lease", name) or self._exists("buffer", name)
        if kind == "lease":
            return name in self.leases
        if kind == "catalog":
            return name in self.catalogs
        if kind == "event":
            return name in self.events
        return name in self.allocs or name in self.w.host or name in self.freed

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
                           if not self._exists(k, n)]
                waits.append(f"thread {thread} waits at {step.label} for "
                             f"{', '.join(missing)}, which no thread can make now")
        first = next(steps[0] for steps in queues.values() if steps)
        return _Deadlock(first.label, "the host threads deadlocked: " + "; ".join(waits))

    def _mark(self, name: str) -> None:
        """Name the position the trial has reached in the program it is captured in, if any."""
        if self.capturing is not None:
            self.capturing.mark(name)

    def _cleanup(self) -> None:
        """Leave the world as the trial found it: idle, every page free, every row free."""
        self._mark("cleanup")
        w = self.w
        w.device.abandon_graph()  # a trial that ended inside a capture
        if w.device.fault is not None:
            return
        if not self.idle:
            w.context.synchronize()
        for catalog in self.catalogs.values():
            catalog.leases = [lease for lease in catalog.leases if not lease.released]
            catalog.release()
        held = [lease for group in self.leases.values() for lease in group if not lease.released]
        if held:
            # The device was synchronized above: every use of these pages is done, and a
            # fence would only make the next trial's first use wait for nothing.
            w.pool.release(held, idle=True)
        for buf in self.allocs.values():
            w.arena.free(buf.view.allocation)
        w.arena.reclaim()  # the device is idle: every deferred free is due
        if w.scrubs and not self.scrubbed:
            w.scrub("later")  # the next trial begins by waiting for it (World.begin)

    # ---- steps ---------------------------------------------------------------------------------
    def _materialize(self, s: Step) -> None:
        stream = s.args.get("stream")
        self.leases[str(s.id)] = self.w.pool.materialize(
            int(s.args["pages"]), name=f"lease {s.id}",  # type: ignore[arg-type]
            stream=self.w.stream(stream) if stream is not None else None)

    def _record_stream(self, s: Step) -> None:
        self.w.pool.record_stream(self._handles(s.args["lease"]), self.w.stream(s.args["stream"]))

    def _release(self, s: Step) -> None:
        self.w.pool.release(self.leases[str(s.args["lease"])])

    def _handles(self, lease: object) -> list[kvcore.DeviceKVPageHandle]:
        return [lease_.handle for lease_ in self.leases[str(lease)]]

    def _buffer(self, name: object) -> _HostBuffer:
        """A pinned buffer: one host_alloc'd in this trial, else a world buffer, else one that
        another host thread has freed already (its bytes may be someone else's by now)."""
        key = str(name)
        return self.allocs.get(key) or self.w.host.get(key) or self.freed[key]

    def _host_fill(self, s: Step) -> None:
        a = s.args
        view = self._buffer(a["buffer"]).view
        value = int(a["byte"])  # type: ignore[arg-type]
        self.wrote.append((value, "fill", str(a["buffer"]), s))
        if "offset" in a:
            start = view.allocation.offset + int(a["offset"])  # type: ignore[call-overload]
            self.w.device.host_fill(view.buffer, start, int(a.get("length", 1)),  # type: ignore
                                    value)
        elif "page" in a:
            page = a["page"]
            for p in page if isinstance(page, tuple) else (page,):
                view.fill(value, page=int(p))  # type: ignore[arg-type]
        else:
            view.fill(value)

    def _host_alloc(self, s: Step) -> None:
        name, pages = str(s.args["buffer"]), int(s.args.get("pages", 1))  # type: ignore
        self.allocs[name] = _HostBuffer(self.w.view(pages, f"buffer {name}"), pages, False)
        self.freed.pop(name, None)

    def _host_free(self, s: Step) -> None:
        after = s.args.get("after", ())
        names = after if isinstance(after, tuple) else (after,)
        buf = self.allocs.pop(str(s.args["buffer"]))
        self.freed[str(s.args["buffer"])] = buf
        self.w.arena.free(buf.view.allocation, after=tuple(self.events[str(n)] for n in names))

    def _copy_from_host(self, s: Step) -> None:
        a = s.args
        handles = self._handles(a["dst"])
        self.w.pool.copy_from_host(self._buffer(a["src"]).view, handles,
                                   self.w.stream(str(a["stream"])))
        # A page list copied into a lease is a device index (a block table): kernels that
        # follow it read its entries from the lease's first page where they run, whatever
        # has landed there by then.
        listed = self.lists.get(str(a["src"]))
        dst = str(a["dst"])
        if listed is None:
            self.lists.pop(dst, None)
            return
        pool = self.w.pool
        index = kvcore.PageIndex(pool, pool.buffer, pool.page_offset(handles[0]),
                                 pool.page_stride)
        index.pages = listed.pages
        self.lists[dst] = index

    def _copy_to_host(self, s: Step) -> None:
        a = s.args
        self.w.pool.copy_to_host(self._handles(a["src"]), self._buffer(a["dst"]).view,
                                 self.w.stream(str(a["stream"])))

    def _copy_page(self, s: Step) -> None:
        a = s.args
        self.w.pool.copy_page(self._handles(a["src"])[0], self._handles(a["dst"])[0],
                              self.w.stream(str(a["stream"])))

    def _zero_pages(self, s: Step) -> None:
        self.wrote.append((0, "zero", str(s.args["lease"]), s))
        self.w.pool.zero_pages(self._handles(s.args["lease"]), self.w.stream(str(s.args["stream"])))

    def _catalog(self, s: Step) -> None:
        self.catalogs[str(s.id)] = kvcore.KVConversationCatalog(self.w.table, str(s.id))

    def _retain(self, s: Step) -> None:
        self.catalogs[str(s.args["catalog"])].retain(self.leases[str(s.args["lease"])])

    def _release_catalog(self, s: Step) -> None:
        self.catalogs[str(s.args["catalog"])].release()

    def _bind(self, s: Step) -> None:
        self.catalogs[str(s.args["catalog"])].bind()

    def _activate(self, s: Step) -> None:
        self.catalogs[str(s.args["catalog"])].activate(self.w.stream(str(s.args["stream"])))

    _publish = _activate

    def _read_table(self, s: Step) -> None:
        catalog = self.catalogs[str(s.args["catalog"])]
        asserting = bool(s.args.get("assert", True))
        offset = self._counter(s, asserting, "the table reader saw {count} stale or "
                                             "out-of-range entries")
        self.w.table.read(catalog.rows[0], max(1, len(catalog.leases)),
                          self.w.stream(str(s.args["stream"])), result=self.w.counters,
                          assert_on_stale=asserting, result_offset=offset)

    def _page_list(self, s: Step) -> None:
        name = str(s.args["buffer"])
        view = self._buffer(name).view
        listing = kvcore.PageIndex(self.w.pool, view.buffer, view.page_offset(0),
                                   view.layout.page_stride)
        listing.write(self._handles(s.args["lease"]))
        self.lists[name] = listing

    def _kv_write(self, s: Step) -> None:
        value = int(s.args["byte"])  # type: ignore[arg-type]
        stream = self.w.stream(str(s.args["stream"]))
        if "page_list" in s.args:
            self.wrote.append((value, "kv_write", f"page list {s.args['page_list']}", s))
            self._follow(s, stream).write_pages(value, stream)
            return
        catalog = self.catalogs[str(s.args["catalog"])]
        self.wrote.append((value, "kv_write", f"catalog {s.args['catalog']}'s table row", s))
        self.w.table.write_pages(catalog.rows[0], max(1, len(catalog.leases)), value, stream)

    def _attention(self, s: Step) -> None:
        asserting = bool(s.args.get("assert", True))
        expected = int(s.args["byte"])  # type: ignore[arg-type]
        stream = self.w.stream(str(s.args["stream"]))
        follows = f"page list {s.args['page_list']}" if "page_list" in s.args else \
            f"catalog {s.args['catalog']}'s table row"
        offset = self._counter(s, asserting, (
            f"attention through {follows} read {{count}} bytes that are not 0x{expected:02X} in "
            "the pages it names: another owner's data"), first=True)
        # Where a counting attention keeps the first page it found wrong (its slot's own).
        first = {"first": self.w.firsts, "first_offset": offset * 2} if not asserting else {}
        if "page_list" in s.args:
            self._follow(s, stream).attend(
                expected, stream, result=self.w.counters, result_offset=offset,
                assert_on_mismatch=asserting, **first)
            return
        catalog = self.catalogs[str(s.args["catalog"])]
        self.w.table.attend(catalog.rows[0], max(1, len(catalog.leases)), expected, stream,
                            result=self.w.counters, result_offset=offset,
                            assert_on_mismatch=asserting, **first)

    def _gather(self, s: Step) -> None:
        view = self._buffer(s.args["to"]).view
        stream = self.w.stream(str(s.args["stream"]))
        self._follow(s, stream).gather(view.buffer, view.page_offset(0), stream)

    def _scatter(self, s: Step) -> None:
        view = self._buffer(s.args["from"]).view
        stream = self.w.stream(str(s.args["stream"]))
        self._follow(s, stream).scatter(view.buffer, view.page_offset(0), stream)

    def _follow(self, s: Step, stream: kvcore.device.Stream) -> kvcore.PageIndex:
        """The page list a kernel on ``stream`` follows; one in a lease (a device index) is
        read from the lease's pages, so the stream waits for their release fences first, as
        for any pool op."""
        name = str(s.args["page_list"])
        if name in self.leases:
            self.w.pool.use(self._handles(name), stream)
        return self.lists[name]

    def _kernel(self, s: Step) -> None:
        """A kernel of the scenario's own: its leases' pages and buffers as spans, eight of
        each a launch (a kernel over more is launched again on its stream, in order), its
        duration on the first."""
        reads = self._spans(s.args.get("reads", ()))
        writes = self._spans(s.args.get("writes", ()))
        # Without a byte it writes what it read: whose that is, the check traces back itself.
        value = int(s.args["byte"]) if "byte" in s.args else None  # type: ignore[call-overload]
        for item in s.args.get("writes", ()) if value is not None else ():  # type: ignore
            name = V.part_name(item)
            kind = "lease" if name in self.leases else "buffer"
            self.wrote.append((value, "kernel", f"{kind} {name}", s))
        stream = self.w.stream(str(s.args["stream"]))
        named = dict.fromkeys(V.part_name(item) for item in (  # type: ignore[misc]
            *s.args.get("reads", ()), *s.args.get("writes", ())))  # type: ignore[misc]
        for name in named:  # in the step's order: the same waits every run
            if name in self.leases:  # after the pages' release fences, as pool ops are
                self.w.pool.use(self._handles(name), stream)
        us = float(s.args.get("us", 0.0))  # type: ignore[arg-type]
        label = str(s.id or "kernel")
        n = TOUCH_SPANS_MAX
        for i in range(0, max(len(reads), len(writes), 1), n):
            self.w.device.launch(Touch(tuple(reads[i:i + n]), tuple(writes[i:i + n]), value,
                                       us if i == 0 else 0.0, label), stream)

    def _spans(self, names: object) -> list[tuple[kvcore.device.Buffer, int, int]]:
        """The bytes of leases (a span per run of adjacent pages) and pinned buffers, or of
        the parts named of them (a span per page touched)."""
        spans: list[tuple[kvcore.device.Buffer, int, int]] = []
        pool = self.w.pool
        for item in names:  # type: ignore[attr-defined]
            if isinstance(item, dict):
                spans += self._part_spans(item)
            elif str(item) in self.leases:
                spans += [(pool.buffer, off, n) for off, n in pool.byte_runs(self._handles(item))]
            else:
                buf = self._buffer(item)
                spans.append((buf.view.buffer, buf.view.page_offset(0),
                              buf.pages * buf.view.layout.page_stride))
        return spans

    def _part_spans(self, part: dict[str, object]) -> list[tuple[kvcore.device.Buffer, int, int]]:
        """A part's bytes: its pages, or its byte range cut at the pages it crosses (a lease's
        pages need not be adjacent in the pool)."""
        if "lease" in part:
            pool, handles = self.w.pool, self._handles(part["lease"])
            buffer, stride = pool.buffer, pool.page_stride
            starts = [pool.page_offset(h) for h in handles]
        else:
            held = self._buffer(part["buffer"])
            buffer, stride = held.view.buffer, held.view.layout.page_stride
            starts = [held.view.page_offset(p) for p in range(held.pages)]
        if "page" in part:
            pages = part["page"] if isinstance(part["page"], tuple) else (part["page"],)
            return [(buffer, starts[int(p)], stride) for p in pages]  # type: ignore[call-overload]
        lo = int(part["offset"])  # type: ignore[call-overload]
        hi = lo + int(part["length"])  # type: ignore[call-overload]
        return [(buffer, starts[p] + max(lo - p * stride, 0),
                 min(hi, (p + 1) * stride) - max(lo, p * stride))
                for p in range(lo // stride, (hi - 1) // stride + 1)]

    def _read_pinned(self, s: Step) -> None:
        name = str(s.args["buffer"])
        buf = self._buffer(name)
        expected = int(s.args["byte"])  # type: ignore[arg-type]
        offset = self._counter(s, False, (
            f"a kernel reading buffer {name} in place saw {{count}} bytes that are not "
            f"0x{expected:02X}: the host changed them under it"))
        view = buf.view
        self.w.device.launch(Verify(view.buffer, view.page_offset(0),
                                    buf.pages * view.layout.page_stride, expected,
                                    self.w.counters, offset),
                             self.w.stream(str(s.args["stream"])))

    def _counter(self, s: Step, asserting: bool, says: str, first: bool = False) -> int:
        """The counter slot a counting kernel adds to (zeroed first, on its stream), and what
        a non-zero count says ({count} in ``says``); 0 for a kernel that asserts instead. With
        ``first``, the slot's first-mismatch record (8 bytes at twice the offset in
        ``firsts``) is set to all ones too."""
        if asserting:
            return 0
        slot = len(self.counted)
        stream = self.w.stream(str(s.args["stream"]))
        self.w.device.memset(self.w.counters, slot * 4, 4, 0, stream)
        if first:
            self.w.device.memset(self.w.firsts, slot * 8, 8, 0xFF, stream)
        self.counted.append((s.label, says, first))
        return slot * 4

    def _record_event(self, s: Step) -> None:
        name = str(s.args["event"])
        event = self.events[name] = self.w.event(name)
        self.w.device.record_event(event, self.w.stream(str(s.args["stream"])))

    def _wait_event(self, s: Step) -> None:
        self.w.device.wait_event(self.w.stream(str(s.args["stream"])),
                                 self.events[str(s.args["event"])])

    def _synchronize(self, s: Step) -> None:
        if "stream" in s.args:
            self.w.device.synchronize_stream(self.w.stream(str(s.args["stream"])))
        elif "event" in s.args:
            self.w.device.synchronize_event(self.events[str(s.args["event"])])
        else:
            self.w.context.synchronize()

    def _event_query(self, s: Step) -> None:
        event = self.events[str(s.args["event"])]
        if s.args.get("poll", False):
            self.w.device.poll_event(event)
        else:
            self.w.device.query_event(event)

    def _graph_capture(self, s: Step) -> None:
        self.w.device.begin_graph(self.w.stream(str(s.args["stream"])), str(s.id))

    def _graph_end(self, s: Step) -> None:
        self.graphs[str(s.args["graph"])] = self.w.device.end_graph()

    def _graph_replay(self, s: Step) -> None:
        self.w.device.launch_graph(self.graphs[str(s.args["graph"])],
                                   self.w.stream(str(s.args["stream"])))

    def _delay(self, s: Step) -> None:
        us = float(s.args["us"])  # type: ignore[arg-type]
        # `us: .inf` is a kernel that never ends: the hang the watchdog must catch.
        self.w.device.launch(Delay(None if math.isinf(us) else us),
                             self.w.stream(str(s.args["stream"])))

    def _scrub(self, wait: str) -> None:
        """The world's scrub, before the cleanup (it waits as ``wait`` says; see World.scrub):
        a program marks where, so a reissued trial that ends before it scrubs in its cleanup,
        as a trial step by step does."""
        self._mark("scrub")
        self.w.scrub(wait)
        self.scrubbed = True

    def _check(self, s: Step) -> None:
        w = self.w
        if "lease" in s.args:
            handles = self._handles(s.args["lease"])
            view = w.scratch
            w.pool.copy_to_host(handles, view, w.check_stream)
            if s is self.ex.last_pool_read and self.quiet and w.scrubs and w.pool.poison is None:
                # Nothing else runs on the device and no later step reads the pool: the scrub
                # goes behind this read, on its stream, and this wait is the scrub's too.
                self._scrub("check")
            w.device.synchronize_stream(w.check_stream)
            pages = len(handles)
        else:
            buf = self._buffer(s.args["buffer"])
            view, pages = buf.view, buf.pages
        read = _Pages.of(view, pages)
        equals = _Pages.of(self._buffer(s.args["equals"]).view, pages) \
            if "equals" in s.args else None
        # The logged reads, as views of the pinned bytes: a device program issues them again
        # as they are, and what they show then is that trial's answer, compared anew.
        want = _view(w.device, equals) if equals is not None else None
        w.device.reissued(self._compare, s, read, _view(w.device, read), equals, want)

    def _compare(self, s: Step, read: _Pages, got: np.ndarray, equals: _Pages | None,
                 want: np.ndarray | None) -> None:
        # Every page in one read and one comparison; page by page only to say what is wrong.
        # Compared as bytes: a page or two is a few KiB, where numpy's comparison and reduction
        # cost ten times a memcmp of the copies.
        pages = read.pages
        got = _payloads(read, got)
        if equals is not None:
            want = _payloads(equals, want)  # type: ignore[arg-type]
            if got.tobytes() == want.tobytes():  # the same shape
                return
            want = want.reshape(pages, -1)
        else:
            value = int(s.args["byte"])  # type: ignore[arg-type]
            if got.tobytes() == _filled(value, got.size):
                return
            want = np.full((pages, got.size // pages), value, np.uint8)
        got = got.reshape(pages, -1)
        for page in range(pages):
            bad = int(np.count_nonzero(got[page] != want[page]))
            if bad:
                read = f"lease {s.args['lease']}" if "lease" in s.args else \
                    f"buffer {s.args['buffer']}"
                raise _Corruption(s.label, self._describe(f"{s.label}: {read}", page, got[page],
                                                          want[page], bad))

    def _describe(self, label: str, page: int, got: np.ndarray, want: np.ndarray,
                  bad: int) -> str:
        """What a check found, and whose bytes those are: a buffer a step filled, the pool's
        poison, or what the page held before the trial wrote it."""
        values = sorted(set(got[got != want].tolist()))[:4]
        shown = ", ".join(f"0x{v:02X} ({self._whose(v)})" for v in values)
        return (f"{label}: page {page}: {bad}/{got.size} bytes differ from what was expected "
                f"(0x{int(want[0]):02X}...); found {shown}")

    def _whose(self, value: int) -> str:
        said: list[str] = []
        for byte, what, name, step in self.wrote:
            if byte != value:
                continue
            if what == "readback":
                words = f"buffer {name} as each trial starts it: nothing had landed in it yet"
            elif what == "kv_write":
                assert step is not None
                words = f"written through {name} at {step.label}" + (
                    f" (thread {step.thread})" if step.thread else "")
            elif what == "kernel":
                assert step is not None
                words = f"{name}, written by the kernel at {step.label}" + (
                    f" (thread {step.thread})" if step.thread else "")
            else:
                assert step is not None
                verb = "filled" if what == "fill" else "zeroed"
                kind = "buffer" if what == "fill" else "lease"
                words = f"{kind} {name}, {verb} at {step.label}" + (
                    f" (thread {step.thread})" if step.thread else "")
            if words not in said:
                said.append(words)
        if value == self.w.poison:
            said.append("the pool's poison: the page had been released")
        if value == self.w.unwritten:
            said.append("what the page held before this trial: nothing wrote it yet")
        return "; ".join(said) or "no step of this trial wrote it"

    def _check_counts(self) -> None:
        if not self.counted:
            return
        w = self.w
        n = len(self.counted)
        w.device.copy(w.counters_host, 0, w.counters, 0, 4 * n, w.check_stream)
        w.device.copy(w.firsts_host, 0, w.firsts, 0, 8 * n, w.check_stream)
        w.device.synchronize_stream(w.check_stream)
        w.device.reissued(self._compare_counts, n)

    def _compare_counts(self, n: int) -> None:
        w = self.w
        counts = w.device.host_view(w.counters_host, 0, 4 * n).view(np.int32)
        firsts = w.device.host_view(w.firsts_host, 0, 8 * n).view(np.uint64)
        for (label, says, kept), count, first in zip(self.counted, counts.tolist(),
                                                     firsts.tolist()):
            if count:
                found = first_mismatch(int(first)) if kept else None
                raise _Corruption(label, f"{label}: " + says.format(count=count) + (
                    self._first_wrong(*found) if found else ""))

    def _first_wrong(self, entry: int, page: int, byte: int) -> str:
        """Whose page a counting attention read, and whose bytes it found there."""
        holders = [name for name, group in self.leases.items()
                   if any(lease.handle.index == page and not lease.released for lease in group)]
        held = f"lease {holders[0]}'s" if holders else "a page no lease holds now,"
        return (f"; entry {entry} named page {page} ({held} page), which held 0x{byte:02X} "
                f"({self._whose(byte)})")




@dataclass(frozen=True)
class _Pages:
    """The first ``pages`` pages of a host allocation, as a check reads them: where they lie,
    and where each page's payload lies in it (``None``: the whole page is payload)."""

    buffer: kvcore.device.Buffer
    offset: int
    pages: int
    stride: int
    slices: tuple[slice, ...] | None

    @classmethod
    def of(cls, view: kvcore.HostKVAllocationView, pages: int) -> _Pages:
        layout = view.layout
        slices = layout.payload_slices()
        whole = len(slices) == 1 and slices[0] == slice(0, layout.page_stride)
        return cls(view.buffer, view.page_offset(0), pages, layout.page_stride,
                   None if whole else slices)


@functools.lru_cache(maxsize=64)
def _filled(value: int, nbytes: int) -> bytes:
    """``nbytes`` bytes of ``value``: what a check of one byte compares against."""
    return bytes((value,)) * nbytes


def _view(device: kvcore.Device, at: _Pages) -> np.ndarray:
    """The pages' bytes, in one logged read: a view of the pinned memory, to compare at once."""
    return device.host_view(at.buffer, at.offset, at.pages * at.stride)


def _payloads(at: _Pages, raw: np.ndarray) -> np.ndarray:
    """The payloads (padding left out) of the pages' bytes ``raw`` (:func:`_view`): one row
    per page, or all in one when a page holds no padding."""
    if at.slices is None:
        return raw
    rows = raw.reshape(at.pages, -1)
    if len(at.slices) == 1:
        return rows[:, at.slices[0]]
    return np.concatenate([rows[:, part] for part in at.slices], axis=1)


def _last_pool_read(steps: tuple[Step, ...]) -> Step | None:
    """The last step to read the pool, when it is a check of a lease on the scenario's own
    thread that only checks of buffers follow."""
    for step in reversed(steps):
        if step.op != "check":
            return None
        if "lease" in step.args:
            return step if step.thread is None else None
    return None


_QUIET = frozenset({"synchronize", "check", "host_fill", "materialize"})
"""Steps after which the device is as idle as before them (a check waits for its own reads);
a synchronize of the device makes it idle."""

_HANDLERS: dict[str, Callable[[_Steps, Step], None]] = {
    op: getattr(_Steps, "_" + op) for op in V.OPS if hasattr(_Steps, "_" + op)}
"""Each step op's handler: looked up once, not by name at every step."""


class _RequestLoop:
    """What request-level workloads share: each request's phases label the ops (and may carry
    the amplifying delay), and a fault is attributed to the request it surfaced in."""

    def __init__(self, executor: TrialExecutor, world: World) -> None:
        self.ex = executor
        self.w = world

    def _phase(self, name: str, number: int) -> None:
        self.w.device.oplog.step = f"request {number} {name}"
        self.ex.amplifier(self.w, name)

    @staticmethod
    def _crashed_in(exc: kvcore.DeviceFaultError, number: int) -> None:
        exc.gpurace_step = f"request {number}"  # type: ignore[attr-defined]
        exc.gpurace_request = number  # type: ignore[attr-defined]


class _Conversation(_RequestLoop):
    """One trial of the conversation workload (#210's shape): a retained catalog re-activated
    every request, the decode reading its row, while a second lane churns pages."""

    def __init__(self, executor: TrialExecutor, world: World) -> None:
        super().__init__(executor, world)
        assert executor.scenario.workload is not None
        self.wl = executor.scenario.workload

    def run(self) -> tuple[Outcome, str, str | None, int | None]:
        w, wl = self.w, self.wl
        pool, device, compute, transfer = w.pool, w.device, w.context.stream, \
            w.context.transfer_stream
        fill = w.scratch
        fill.fill(0x5A)
        conversation = kvcore.KVConversationCatalog(w.table, "conversation")
        conversation.retain(pool.materialize(wl.initial_pages))
        pool.copy_from_host(fill, conversation.handles, compute)
        conversation.bind()
        request = 0
        try:
            for request in range(1, wl.requests + 1):
                self._phase("churn", request)
                churn = pool.materialize(wl.churn_pages)
                pool.copy_from_host(fill, [lease.handle for lease in churn], transfer)
                if churn:  # churn_pages: 0 (no second lane); kvcore releases no empty list
                    pool.release(churn)
                self._phase("prefill", request)
                fresh = pool.materialize(wl.pages_per_turn)
                pool.copy_from_host(fill, [lease.handle for lease in fresh], compute)
                conversation.retain(fresh)
                self._phase("activate", request)
                entries = conversation.activate(compute)
                self._phase("decode", request)
                w.table.read(conversation.rows[0], entries, compute, result=w.counters)
                # The engine waits for each decode step's result before sampling: the
                # assert, if one fired, surfaces here.
                device.synchronize_stream(compute)
        except kvcore.DeviceFaultError as exc:
            self._crashed_in(exc, request)
            raise
        finally:
            device.oplog.step = None
        w.context.synchronize()
        conversation.release()
        w.context.synchronize()
        return Outcome.CLEAN, "", None, wl.requests




def pool_for(ticket: Ticket) -> PoolSpec:
    """The pool a ticket describes: its KV geometry and page count, a table row per lane."""
    h = ticket.header
    return PoolSpec(pages=h.pool_pages, page_tokens=h.page_tokens,
                    planes=(PlaneSpec(h.dtype, h.leading, h.heads, 256),),
                    table_rows=h.lanes, max_pages_per_row=h.pool_pages)


class _TicketReplay(_RequestLoop):
    """One trial of a recorded ticket: its requests in order over its lanes, like an engine's
    batch slots. A conversation's pages stay retained in its catalog between turns and are
    re-activated every turn; prefill writes the new pages; each decode step reads the lane's
    table row with the asserting reader; a finished conversation releases its pages, which other
    lanes then reuse."""

    def __init__(self, executor: TrialExecutor, world: World, ticket: Ticket) -> None:
        super().__init__(executor, world)
        self.ticket = ticket

    def run(self) -> tuple[Outcome, str, str | None, int | None]:
        w = self.w
        pool, device, compute = w.pool, w.device, w.context.stream
        fill = w.scratch
        fill.fill(0x5A)
        rows = [w.table.acquire() for _ in range(self.ticket.header.lanes)]
        live: dict[str, kvcore.KVConversationCatalog] = {}
        entries: dict[str, int] = {}  # conversation -> entries its row holds
        step = None
        try:
            for step in batching.plan(self.ticket):
                for work in step.work:
                    req = work.request
                    if work.opens:
                        live[req.conversation] = kvcore.KVConversationCatalog(
                            w.table, req.conversation)
                        live[req.conversation].bind(rows[req.lane])
                    catalog = live[req.conversation]
                    if work.new_pages:
                        self._phase("prefill", work.number)
                        fresh = pool.materialize(work.new_pages)
                        pool.copy_from_host(fill, [lease.handle for lease in fresh], compute)
                        catalog.retain(fresh)
                    if work.activate:
                        self._phase("activate", work.number)
                        entries[req.conversation] = catalog.activate(compute)
                    self._phase("decode", work.number)
                    w.table.read(rows[req.lane], entries[req.conversation], compute,
                                 result=w.counters)
                # The engine waits for the step's tokens before it schedules the next one.
                device.synchronize_stream(compute)
                for conversation in step.releases:
                    pool.release(live.pop(conversation).leases)
                    del entries[conversation]
        except kvcore.DeviceFaultError as exc:
            if step is not None:
                # Several requests were in flight; the fault names none of them. Say how far
                # into the ticket the engine had got, and which were in the batch.
                self._crashed_in(exc, step.admitted)
                exc.gpurace_step = (  # type: ignore[attr-defined]
                    f"request {step.admitted} (in flight: requests "
                    f"{', '.join(map(str, step.in_flight))})")
            raise
        finally:
            device.oplog.step = None
        w.context.synchronize()
        for catalog in live.values():
            pool.release(catalog.leases)
        for row in rows:
            w.table.release_row(row)
        w.context.synchronize()
        return Outcome.CLEAN, "", None, len(self.ticket.requests)

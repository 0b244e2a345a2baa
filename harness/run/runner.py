"""The runner: scenario variants, trials in worker processes, a watchdog, and the verdict.

The engine knows nothing of the CLI: it reports progress through :class:`RunHooks` and returns a
:class:`RunResult`. A run has named phases (plan, then each variant's trials, then the verdict);
why a variant ended is in its status and reason. A variant's trials go to lanes, one a GPU (or a
simulated device), each with its workers and spares (:mod:`harness.run.workers`), local processes
or Ray actors (:mod:`harness.run.rayexec`); ``--shard`` keeps a deterministic part of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import kvcore
from harness.errors import BackendUnavailable, HarnessError, TargetError
from harness.faults.writes import FOLDER_GONE, WriteFaults, WriteStop
from harness.gpu.probe import cuda_state, cuda_usable, gpu_uuids
from harness.gpu.watch import GpuWatch, TrialXids
from harness.lang.model import Scenario, Variant
from harness.limits import GPUS_MAX
from harness.results.hooks import RunHooks
from harness.results.outcome import Outcome, Status, TrialResult, VariantResult
from harness.results.run import RunResult
from harness.run.endings import death, keep_current_trace, log_tail, worker_failed
from harness.run.incidents import Subject, build_report, reproduce_argv, write_report
from harness.run.lanes import BATCH_MAX, SPARES_DEFAULT, Lane, lane_count
from harness.run.options import RunOptions
from harness.run.outputs import RunFolder
from harness.run.plan import run_plan, trial_seed
from harness.run.worker import WorkerJob, context_died
from harness.run.workers import GONE, Worker, WorkerFailed, WorkerSupply, start_local, wait_any
from harness.traces.flight import CURRENT
from harness.words import counted
from kvcore.device.schedule import Schedule

WORKER_START_TIMEOUT_S = 120.0
"""How long a new worker may take to import, open its device and compile kernels."""

DEAD_END_S = 10.0
"""How long a worker whose CUDA context died may take to end (the driver tears the context
down) before it is killed; its last trial is recorded once it ended."""

class Interrupted(KeyboardInterrupt):
    """The run was asked to stop (Ctrl-C, SIGTERM): the runner keeps what finished."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def choose_backend(requested: str) -> str:
    if requested == "sim":
        return "sim"
    ok, why = cuda_usable()
    if requested == "cuda" and not ok:
        raise BackendUnavailable(f"--backend cuda: {why}")
    return "cuda" if ok else "sim"


class Runner:
    """Runs scenario variants (see the module docstring)."""

    def __init__(self, options: RunOptions, hooks: RunHooks | None = None) -> None:
        self.options = options
        self.hooks = hooks or RunHooks()
        self.backend = choose_backend(options.backend)
        if options.schedule is not None:
            if self.backend != "sim":
                raise TargetError("--schedule replays an ordering on the simulated device; "
                                  "add --backend sim")
            try:
                Schedule.parse(options.schedule)
            except kvcore.KVCoreError as exc:
                raise TargetError(f"--schedule: {exc}") from exc
        self.device: dict[str, object] = {"backend": self.backend}
        self._workers = 0
        # A lane's worker once its variant's trials all ended, for the next variant (by the
        # lane's pin): see _park.
        self._idle: dict[str | None, Worker] = {}
        self.folder: RunFolder | None = None  # made when the run starts
        self.watch: GpuWatch | None = None
        self.health: dict[str, object] = {}
        self.stopped = ""
        self._running: VariantResult | None = None  # the variant whose trials are running
        self._position = 0  # trials planned before the variant that runs next, for --shard
        self.lanes = self._resolve_lanes(options.gpus)
        self.retired: dict[str, str] = {}  # lane name -> why its GPU runs nothing more
        # Said through the hooks as they are when a write fails (the CLI sets them later).
        self.faults = WriteFaults(options.stop_on_write_error, lambda text: self.hooks.note(text))

    def _resolve_lanes(self, spec: str | None) -> list[tuple[str, str | None]]:
        """The run's lanes, each a name and the CUDA_VISIBLE_DEVICES of its workers: without
        --gpus one lane on the device this process sees first, as ever; with it a lane per GPU
        (``all``, the first ``N``, or ordinals ``0,2`` among the GPUs this process sees), or on
        the simulated device N devices side by side (``all``: one a CPU core)."""
        if self.options.executor == "ray":
            # Ray gives each actor its GPU: lanes are only how many run side by side.
            n = 1 if spec is None else lane_count(spec, GPUS_MAX)
            return [(f"ray {i}", None) for i in range(n)]
        if spec is None:
            return [("GPU 0" if self.backend == "cuda" else "sim", None)]
        if self.backend == "sim":
            n = lane_count(spec, min(os.cpu_count() or 1, GPUS_MAX))
            return [(f"sim {i}", None) for i in range(n)]
        uuids = gpu_uuids()
        count = len(uuids)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        # A worker sees one GPU, named by its UUID: CUDA's ordinals skip a GPU it cannot use
        # and need not follow NVML's order. Without a UUID, the parent's own entry for it, so
        # CUDA_VISIBLE_DEVICES="3,5" with --gpus all gives workers "3" and "5".
        entries = [e.strip() for e in visible.split(",")] if visible else [
            str(i) for i in range(count)]
        chosen = list(range(count)) if spec == "all" else (
            list(range(int(spec))) if spec.isdigit() else [int(x) for x in spec.split(",")])
        beyond = [i for i in chosen if i >= count or (uuids[i] is None and i >= len(entries))]
        if beyond:
            raise TargetError(f"--gpus {spec}: this process sees {count} GPU(s), numbered "
                              f"0 to {count - 1}; ask for those")
        return [(f"GPU {i}", uuids[i] or entries[i]) for i in chosen]

    def _start_worker(self, job: WorkerJob) -> Worker:
        if self.options.executor == "ray":
            from harness.run.rayexec import start_actor

            return start_actor(job, self.options.address)
        idle = self._idle.pop(job.gpu, None)
        if idle is not None:
            try:
                if idle.proc.is_alive():
                    idle.take_job(job)
                    return idle
            except (OSError, ValueError):
                pass  # it died as it was handed the job: a new one starts
            idle.stop(1.0)
        return start_local(job)

    def run(self, scenarios: Iterable[Scenario]) -> RunResult:
        """Phases: watch and health first, then every variant's trials, then health again."""
        start = time.perf_counter()
        # A folder of the run's own under --out: runs that share --out share nothing else.
        self.folder = RunFolder.create(self.options.out_dir or Path(tempfile.mkdtemp(
            prefix="gpurace-")))
        scenarios = list(scenarios)
        result = RunResult(self.backend, self.device, self.options.seed, poison=self.options.poison,
                           folder=str(self.out_dir), run_id=self.folder.run_id,
                           shard=self.options.shard,
                           plan=run_plan(scenarios, self.options, self.backend))
        self._position = 0
        self.started = time.monotonic()  # Xids are told apart by the clock a step leaves alone
        self.watch = GpuWatch(self.backend, on_gap=lambda text: self.hooks.note(text))
        if self.backend == "cuda":  # on sim there is nothing to watch, and reports say so
            for note in self.watch.notes:
                self.hooks.note(note)
        self.health = {"before": self.watch.health(self._gpu_of(None)), "after": None}
        self._retire_unusable_gpus()
        try:
            for scenario in scenarios:
                sweep = scenario.amplify.sweep if (self.options.sweep and self.options.amplify
                                                   and scenario.amplify) else ()
                for variant in scenario.variants:
                    if self.options.variants and variant.name not in self.options.variants:
                        continue
                    for delay in sweep or (None,):
                        if not self.stopped:
                            result.results.append(
                                self.run_variant(scenario, variant.name, delay))
            self.check_folder()  # gone since the last worker started: run.json must say so
        except KeyboardInterrupt as exc:
            # Keep what finished, the variant in progress with its trials so far too.
            result.interrupted = signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
            self._keep_partial(result, f"interrupted by {result.interrupted}")
        except WriteStop as exc:
            self._keep_partial(result, f"stopped ({exc})")
        finally:
            self._stop_idle()
            self.health["after"] = self.watch.health(self._gpu_of(None))
            self.watch.stop()
        result.device = self.device
        result.health = self.health
        result.stopped = self.stopped
        result.lanes = [name for name, _ in self.lanes]
        result.retired = list(self.retired.values())
        result.watch_notes = list(self.watch.notes)
        result.watch_gaps = self.watch.gaps
        result.write_errors = self.faults.records
        result.wall_s = time.perf_counter() - start
        return result

    def _keep_partial(self, result: RunResult, why: str) -> None:
        """The run stopped part way: the variant in progress is kept with its trials so far."""
        partial = self._running
        if partial is not None and all(partial is not r for r in result.results):
            partial.judge()
            so_far = counted(partial.trials, "trial")
            partial.reason = f"{why} after {so_far}; {partial.reason}".rstrip("; ")
            result.results.append(partial)

    def check_folder(self) -> None:
        """A run whose folder went away ends here, with what it knows (WriteStop)."""
        if self.folder is not None and self.folder.gone():
            self.faults.failed(FOLDER_GONE, self.out_dir, "removed while the run ran",
                               fatal=True)

    @property
    def out_dir(self) -> Path:
        """The run's folder, where its run.json, incidents and workers' files go."""
        assert self.folder is not None, "the run has not started"
        return self.folder.path

    @property
    def log_dir(self) -> Path:
        return self.out_dir / "workers"

    def run_variant(self, scenario: Scenario, variant_name: str,
                    sweep_delay: float | None = None) -> VariantResult:
        """All trials of one variant (at one point of a sweep when ``sweep_delay`` is given)."""
        opts = self.options
        variant = scenario.variant(variant_name)
        # A schedule names ops by issue index, as explored without amplification: an amplifying
        # delay would add an op and shift them.
        amplified = opts.amplify and scenario.amplify is not None and opts.schedule is None
        delay = (sweep_delay if sweep_delay is not None else
                 opts.delay_us if opts.delay_us is not None else
                 scenario.amplify.delay_us if amplified and scenario.amplify else None)
        result = VariantResult(
            scenario=scenario.name, variant=variant.name, expect=variant.expect,
            path=str(scenario.path), dangerous=scenario.dangerous, amplified=amplified,
            delay_us=delay if amplified else None, min_rate=variant.min_rate,
            sweep=sweep_delay is not None,
        )
        self._running = result
        indices = self._shard_of([opts.trial] if opts.trial is not None else range(
            opts.trials or scenario.trials))
        # --dangerous guards a real GPU's CUDA context; the simulated device has none to crash.
        if scenario.dangerous and not opts.dangerous and self.backend != "sim":
            result.status = Status.SKIP
            result.reason = "dangerous: it can crash the CUDA context; pass --dangerous to run it"
            self.hooks.variant_finished(result)
            return result
        if not indices:
            assert opts.shard is not None  # only a shard can leave a variant no trial
            result.reason = (f"none of its trials falls in shard {opts.shard[0]}/"
                             f"{opts.shard[1]}")
        timeout = opts.timeout_s or scenario.timeout_s
        pending = [(i, trial_seed(opts.seed, scenario.name, variant.name, i)) for i in indices]
        self.hooks.variant_started(result, len(pending))
        amp = scenario.amplify if amplified else None
        where = None if amp is None else {"stream": scenario.amplified_stream(variant.name),
                                          "before": amp.before}
        header = {
            "scenario": scenario.name, "path": str(scenario.path), "variant": variant.name,
            "backend": self.backend, "defects": variant.defects.to_json(),
            "run_seed": opts.seed, "delay_us": delay if amplified else None, "amplify": where,
            "poison": opts.poison,
        }
        argv = functools.partial(
            reproduce_argv, scenario, variant, backend=self.backend, run_seed=opts.seed,
            amplified=amplified, delay_us=delay,
            delay_overridden=sweep_delay is not None or opts.delay_us is not None,
            timeout_s=opts.timeout_s, schedule=opts.schedule, poison=opts.poison)
        run = _VariantRun(scenario, variant, result,
                          None if where is None else {**where, "delay_us": delay}, argv)
        def make_job(gpu: str | None) -> Callable[[], WorkerJob]:
            def job() -> WorkerJob:
                self.check_folder()  # a worker's folder made again would hide that it went
                self._workers += 1
                folder = self.log_dir / f"{self._workers:04d}-{scenario.name}-{variant.name}"
                return WorkerJob(scenario, variant.name, self.backend, os.getpid(), amplified,
                                 delay if amplified else None, str(folder / "worker.log"),
                                 str(folder), header, opts.detect, opts.schedule, opts.record,
                                 opts.poison, gpu,
                                 traces_kept=None if opts.record else opts.max_incidents,
                                 timeline=opts.timeline, reissue=opts.reissue,
                                 # A sweep's window plot reads the host's gap between
                                 # the racing ops: every op with its own issue time.
                                 issue_times=sweep_delay is not None)
            return job

        spares = SPARES_DEFAULT[self.backend] if opts.spares is None else opts.spares
        lanes = [Lane(name, WorkerSupply(make_job(gpu), WORKER_START_TIMEOUT_S, spares,
                                          self._start_worker), pin=gpu)
                 for name, gpu in self.lanes if name not in self.retired]
        finished = False
        try:
            self._run_trials(lanes, pending, timeout, run)
            finished = True
        finally:
            for lane in lanes:
                if finished:
                    self._park(lane)
                lane.close()
        result.judge()
        self.hooks.variant_finished(result)
        return result

    def _park(self, lane: Lane) -> None:
        """Keep the lane's worker for the next variant, when its trials all ended and it lives
        (a worker whose context died has left; a hung one was killed): the next variant's job
        goes to it (see :meth:`_start_worker`), and a zoo of short variants pays one process
        and CUDA context start per lane, not one per variant. A Ray actor is not kept (its
        node's resources are the cluster's)."""
        worker = lane.worker
        if worker is None or lane.inflight or lane.retired or lane.dead is not None \
                or self.options.executor != "local" or not worker.proc.is_alive():
            return
        kept = self._idle.pop(lane.pin, None)
        if kept is not None:
            kept.stop()
        self._idle[lane.pin] = worker
        lane.worker = None

    def _stop_idle(self) -> None:
        """Stop the workers kept for a next variant: the run has none left (all asked first,
        so their contexts end side by side)."""
        for worker in self._idle.values():
            worker.ask_to_stop()
        while self._idle:
            self._idle.popitem()[1].stop()

    def _gpu_of(self, pin: str | None) -> str | None:
        """The UUID of the GPU a lane pinned to ``pin`` (its workers' CUDA_VISIBLE_DEVICES)
        runs on, as far as known without a worker: the pin itself, or CUDA's first GPU for a
        lane that is not pinned (None: ask NVML for the first GPU it lets the workers see)."""
        if pin is not None:
            return pin if pin.startswith("GPU-") else None
        shown = gpu_uuids() if self.backend == "cuda" and self.options.executor == "local" \
            else []
        return shown[0] if shown else None

    def _retire_unusable_gpus(self) -> None:
        """Before any trial: a GPU that must be reset runs nothing (its lane is retired, and
        the run exits 1); with ``--gpus all`` a GPU that NVML sees and CUDA no longer shows is
        named among the retired too, so a fleet soak says which GPU needs attention instead of
        quietly running on fewer."""
        if self.backend != "cuda" or self.options.executor != "local" or self.watch is None:
            return
        for name, pin in self.lanes:
            gpu = self._gpu_of(pin)
            # The lane that is not pinned runs on the GPU whose health the run just took.
            why = str(self.health["before"].get("needs_reset") or "") if pin is None and gpu \
                else self._needs_reset(gpu)  # type: ignore[union-attr]
            if why:
                self._retire(name, f"{name} ({gpu}) cannot run: {why}")
        if self.options.gpus == "all":
            _, _, shown, seen = cuda_state()
            for gpu in seen:
                if gpu not in shown:
                    health = self.watch.health(gpu)
                    why = health.get("needs_reset") or "CUDA does not show it"
                    self._retire(f"NVML GPU {health.get('index')}",
                                 f"NVML GPU {health.get('index')} ({gpu}) cannot run: {why}")
        if self.lanes and all(name in self.retired for name, _ in self.lanes):
            self.stopped = "; ".join(self.retired.values()) + "; the run stopped here"

    def _needs_reset(self, gpu: str | None) -> str:
        """Why GPU ``gpu`` (a UUID) must be reset before it runs anything, as NVML says now;
        "" when it need not, or when there is no GPU to ask about."""
        if gpu is None or self.watch is None or self.backend != "cuda":
            return ""
        return str(self.watch.health(gpu).get("needs_reset") or "")

    def _retire(self, name: str, why: str) -> str:
        """Take a GPU out of the run for good: said now, listed in the run document, exit 1."""
        why += ": it needs attention (a reset or service) before it runs anything else"
        self.retired[name] = why
        self.hooks.note(why)
        return why

    def _shard_of(self, indices: Sequence[int]) -> list[int]:
        """The trial indices of the next variant that this run makes: all of them, or with
        --shard K/N those whose place in the whole run's trials is K-1 modulo N. Places count
        every variant's trials, skipped ones too, so shards that run the same targets with the
        same options split them the same way, each trial to exactly one shard."""
        start, self._position = self._position, self._position + len(indices)
        if self.options.shard is None:
            return list(indices)
        k, n = self.options.shard
        return [i for place, i in enumerate(indices, start) if place % n == k - 1]

    def _run_trials(self, lanes: list[Lane], pending: list[tuple[int, int]],
                    timeout: float, run: _VariantRun) -> None:
        """Hand the trials out to the lanes until all ended. One lane gets them all at once;
        several get them in small batches, the next batch to whichever lane is free, so a
        slow or crashing GPU holds up only its own. Nothing here waits for one lane: a worker
        starting, a trial running and a dead worker's end are all waited for together, so
        one GPU's crash costs the others nothing. A worker that dies leaves the rest of its
        batch to the front of the queue; its last trial is recorded once its process has
        ended (the device's own words reach its log only then), and its lane's next worker
        (a spare, once one died) is handed work as soon as it is ready."""
        queue = deque(pending)
        for lane in lanes[:len(queue)]:
            lane.supply.prestart()
        while True:
            self._retire_lanes(lanes, queue)
            for lane in lanes:
                if not lane.inflight and queue and not lane.retired \
                        and self._ready_worker(lane, queue):
                    size = len(queue) if len(lanes) == 1 else max(
                        1, min(BATCH_MAX, len(queue) // (4 * len(lanes))))
                    self._hand(lane, [queue.popleft() for _ in range(size)], run)
                if lane.dead is not None and lane.dead_ended():
                    self._finish_dead(lane, run)
            active = [lane for lane in lanes if lane.inflight]
            starting = [w for lane in lanes if lane.worker is None and queue
                        and not lane.retired and (w := lane.supply.starting) is not None]
            dead = [lane for lane in lanes if lane.dead is not None]
            if not active and not starting and not dead:
                self._stop_if_all_retired(lanes)  # a lane retired as it was handed work
                return
            self._wait(lanes, active, starting, dead, timeout, run, queue)

    def _ready_worker(self, lane: Lane, queue: deque[tuple[int, int]]) -> bool:
        """Whether the lane has a worker ready for trials, taking its supply's once that one
        said it is ready. One that could not start retires its lane where its GPU needs a
        reset (the others go on); anywhere else it stops the run."""
        if lane.worker is not None:
            return True
        try:
            worker = lane.supply.poll()
        except WorkerFailed as failed:
            failed.worker.stop(1.0)
            self.check_folder()  # its log could not be made: the folder went, not the worker
            gpu = lane.uuid or self._gpu_of(lane.pin)
            why = self._needs_reset(gpu)
            if not why:
                raise HarnessError(worker_failed(failed.worker, failed.message)) from None
            self._retire_lane(lane, f"{lane.name} ({gpu}) cannot start a worker: {why}", queue)
            return False
        if worker is None:
            return False
        lane.worker = worker
        if worker.info.get("log_error"):
            self.check_folder()  # a log lost with the whole folder is the folder's one line
            self.faults.failed("worker log", worker.job.log_path, str(worker.info["log_error"]))
        lane.device = {k: v for k, v in worker.info.items() if k not in ("pid", "log_error")}
        self.device.update(lane.device)
        return True

    def _hand(self, lane: Lane, batch: list[tuple[int, int]], run: _VariantRun) -> None:
        assert lane.worker is not None
        lane.worker.give(batch)
        lane.inflight = deque(batch)
        lane.started = time.monotonic()
        if lane.died_at is not None:
            run.result.add_restart(lane.started - lane.died_at)
            lane.died_at = None
        lane.supply.refill()

    def _wait(self, lanes: list[Lane], active: list[Lane], starting: list[Worker],
              dead: list[Lane], timeout: float, run: _VariantRun,
              queue: deque[tuple[int, int]]) -> None:
        """Take every message that came, or once a lane's trial has run past the timeout,
        end it: a living, silent worker hangs and is killed; a dead one crashed. After each
        trial recorded, a fatal Xid retires its GPU before another trial is taken. Wakes up
        too when a starting worker says it is ready (or is due) and when a dead one's process
        ends or is due to be put down."""
        assert all(lane.worker is not None for lane in active)
        by_conn = {lane.worker.conn: lane for lane in active}  # type: ignore[union-attr]
        due = min([lane.started + timeout for lane in active]
                  + [w.ready_by for w in starting] + [lane.dead_by for lane in dead])
        ready = wait_any([*by_conn, *(w.conn for w in starting),
                          *(lane.dead_signal() for lane in dead)],
                         max(0.0, due - time.monotonic()))
        for conn in ready:
            lane = by_conn.get(conn)  # type: ignore[call-overload]
            if lane is None:
                continue  # a worker ready, or a dead one gone: the loop takes it
            worker = lane.worker
            while worker is not None and lane.inflight and lane.worker is worker \
                    and worker.has_message():
                self._message(lane, worker.message(), run, queue)
                self._retire_lanes(lanes, queue)
        now = time.monotonic()
        for lane in active:
            if lane.inflight and lane.worker is not None and now >= lane.started + timeout \
                    and not lane.worker.conn.poll():
                self._ended_unreported(lane, timeout, queue)

    def _message(self, lane: Lane, message: tuple, run: _VariantRun,
                 queue: deque[tuple[int, int]]) -> None:
        worker = lane.worker
        assert worker is not None
        if message is GONE:
            self._ended_unreported(lane, None, queue)
            return
        if message[0] == "error":
            worker.stop(1.0)
            raise HarnessError(worker_failed(worker, message))
        if message[0] != "trial":
            return  # "done": the worker waits for more; the lane's inflight says it is free
        lane.inflight.popleft()
        lost = message[1].trace_error
        if lost:
            self.faults.failed("trace", lost[0], lost[1])
        trial = worker.trial(message[1])
        if context_died(message[1], worker.job.backend):
            # The context is dead and the worker exits: the rest go to the next worker.
            self._died(lane, trial, queue)
            return
        self._record(run, trial, lane.started, worker.job, lane)
        lane.started = time.monotonic()

    def _ended_unreported(self, lane: Lane, timeout: float | None,
                          queue: deque[tuple[int, int]]) -> None:
        """The lane's trial in flight ended without a report: past ``timeout`` with a living
        worker, a hang (the watchdog kills it); otherwise the worker died, a crash."""
        worker = lane.worker
        assert worker is not None
        proc, job = worker.proc, worker.job
        index, seed = lane.inflight.popleft()
        hung = timeout is not None and proc.is_alive()
        if hung:
            proc.kill()
        proc.join(5)
        # Measured after the kill: how long the trial held the GPU in all.
        waited = time.monotonic() - lane.started
        if hung:
            kind, detail = Outcome.HANG, (
                f"no result within the {timeout:g} s trial timeout; worker {proc.pid} killed "
                f"after {waited:.2f} s")
        else:
            kind, detail = Outcome.CRASH, (
                f"worker {proc.pid} {death(proc)} after {waited:.2f} s, before it reported "
                "the trial")
        try:
            trace = keep_current_trace(job, index)
        except OSError as exc:  # the trial is recorded without it
            trace = None
            self.faults.failed("trace", Path(job.trace_dir) / CURRENT, exc)
        self._died(lane, TrialResult(index, seed, kind, detail=detail, duration_s=waited,
                                     worker_pid=proc.pid, trace=trace), queue)

    def _died(self, lane: Lane, trial: TrialResult, queue: deque[tuple[int, int]]) -> None:
        lane.died_at = time.monotonic()
        lane.dead_by = lane.died_at + DEAD_END_S
        queue.extendleft(reversed(lane.inflight))  # back in front, in order
        lane.inflight.clear()
        assert lane.worker is not None
        lane.dead, lane.dead_started, lane.worker = (lane.worker, trial), lane.started, None
        lane.supply.died()

    def _finish_dead(self, lane: Lane, run: _VariantRun) -> None:
        """Record the trial a worker died in, once it is gone (or due to be put down): the
        device's own words (the assert's file, line, block and thread) reach its log only
        when the process ends."""
        assert lane.dead is not None
        worker, trial = lane.dead
        lane.dead = None
        trial = dataclasses.replace(trial, device_log=log_tail(worker.job.log_path))
        worker.stop()
        self._record(run, trial, lane.dead_started, worker.job, lane)

    def _retire_lanes(self, lanes: list[Lane], queue: deque[tuple[int, int]]) -> None:
        """A GPU that reported a fatal Xid runs nothing more: its lane is retired (its trials
        go to the others); with none left, the run stops. An NVML Xid that names no GPU of
        ours, or any on a run of one GPU, stops it all; a kernel-log line counts for the lane
        whose GPU has its PCI address (the log is the host's: other GPUs print there too)."""
        assert self.watch is not None
        fatal = self.watch.fatal_since(self.started)
        for lane in lanes:
            mine = [ev for ev in fatal if lane.hit_by(ev, len(lanes))]
            if mine and not lane.retired:
                xids = ", ".join(f"Xid {ev.xid} ({ev.meaning})" for ev in mine)
                self._retire_lane(lane, f"{lane.name} reported {xids}", queue)
        self._stop_if_all_retired(lanes)

    def _stop_if_all_retired(self, lanes: list[Lane]) -> None:
        if lanes and all(lane.retired for lane in lanes) and not self.stopped:
            self.stopped = "; ".join(lane.retired for lane in lanes) + "; the run stopped here"

    def _retire_lane(self, lane: Lane, why: str, queue: deque[tuple[int, int]]) -> None:
        lane.retired = self._retire(lane.name, why)
        queue.extendleft(reversed(lane.inflight))  # for the other lanes, if any
        lane.inflight.clear()
        lane.close()

    def _record(self, run: _VariantRun, trial: TrialResult, started: float,
                job: WorkerJob, lane: Lane) -> None:
        """Keep a finished trial; for one that was not clean, gather what its GPU said and
        write its incident."""
        assert self.watch is not None
        lost: OSError | None = None
        if trial.outcome.manifested or trial.race:
            # Told apart by GPU only where there are several: one GPU's Xids are all its own.
            said = self.watch.for_trial(trial.worker_pid, started,
                                        crashed=trial.outcome in (Outcome.CRASH, Outcome.HANG),
                                        gpu=lane.uuid if len(self.lanes) > 1 else None)
            if said.xids:  # most racing trials have none: no copy of the trial made for them
                trial = dataclasses.replace(trial, xids=said.xids)
            kept = None
            if run.incidents_tried < self.options.max_incidents:
                run.incidents_tried += 1  # one that would not fit counts: a full disk is
                # tried again by the next variant, not by each bad trial of this one
                try:
                    incident = self._incident(run, trial, said, job, lane.device)
                    run.result.reports.append(str(incident))
                    kept = str(incident / "trace.jsonl") if trial.trace else None
                except OSError as exc:  # the trial counts all the same: its report is lost
                    lost = exc
            trace = self._settle_trace(trial.trace, kept)
            if trace != trial.trace:
                trial = dataclasses.replace(trial, trace=trace)
        run.result.add(trial)
        self.hooks.trial_finished(run.result, trial)
        if lost is not None:
            self.check_folder()
            self.faults.failed("incident", self.out_dir, lost)
        self.faults.stop_if_due()  # --stop-on-write-error: once the trial is counted

    def _settle_trace(self, worker_trace: str | None, incident_trace: str | None) -> str | None:
        """Where a bad trial's trace lives on: the worker's copy when --record keeps every
        trace, else its incident's copy, else nowhere (a soak's thousandth crash keeps its
        counts, not 20,000 files)."""
        if worker_trace is None or self.options.record:
            return worker_trace
        with contextlib.suppress(OSError):
            Path(worker_trace).unlink()
        return incident_trace

    def _incident(self, run: _VariantRun, trial: TrialResult, said: TrialXids,
                  job: WorkerJob, device: dict[str, object]) -> Path:
        report = build_report(
            Subject.of_scenario(run.scenario, run.variant), trial, backend=self.backend,
            device=dict(device or self.device),  # the trial's own GPU, where a lane said
            health={"before": self.health.get("before"), "after": self.watch.health()
                    if self.watch else None, "note": ""},
            run_seed=self.options.seed, amplification=run.amplification, xids=said.xids,
            xid_note=said.note, kernel_log=said.kernel_log, argv=run.argv(trial),
            # The lane's GPU: with several, another one would not be the GPU that failed.
            env={"CUDA_VISIBLE_DEVICES": job.gpu} if job.gpu and self.backend == "cuda"
            else None)
        log = log_tail(job.log_path, 400)
        extra = {"worker.log": log + "\n"} if log.strip() else {}
        if said.kernel_log:
            extra["kernel-log.txt"] = "\n".join(said.kernel_log) + "\n"
        return write_report(self.out_dir, report, trial, extra)


@dataclass
class _VariantRun:
    """What the runner carries for the variant it is running."""

    scenario: Scenario
    variant: Variant
    result: VariantResult
    amplification: dict[str, object] | None
    argv: Callable[[TrialResult], list[str]]
    incidents_tried: int = 0  # incident folders written, or tried and lost

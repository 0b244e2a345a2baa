"""The runner: scenario variants, trials in worker processes, a watchdog, and the verdict.

The engine knows nothing of the CLI: it reports progress through :class:`RunHooks` and returns a
:class:`RunResult`. A run has named phases (plan, then each variant's trials, then the verdict);
why a variant ended is in its status and reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import kvcore
from harness.errors import BackendUnavailable, HarnessError, TargetError
from harness.traces.flight import CURRENT, cut_torn_tail, trace_path
from harness.incidents import build_report, reproduce_argv
from harness.model import Scenario, Variant
from harness.outputs import RunFolder
from harness.outcome import Outcome, Status, TrialResult, VariantResult
from harness.gpu.probe import cuda_usable
from harness.gpu.watch import GpuWatch, TrialXids
from harness.worker import WorkerJob
from harness.workers import GONE, SILENT, Worker, WorkerFailed, WorkerSupply, receive
from kvcore.device.schedule import Schedule
from reports import write_incident

WORKER_START_TIMEOUT_S = 120.0
"""How long a new worker may take to import, open its device and compile kernels."""

RUN_SCHEMA = "gpurace.run/1"


class ExitCode(enum.IntEnum):
    """The process exit codes: 0 every expectation met, 1 one failed, 2 usage error or
    invalid input, 3 internal error, 77 nothing could run here; an interrupted run exits as a
    shell reports a signal (128 + its number: 130 for Ctrl-C, 143 for SIGTERM)."""

    OK = 0
    EXPECTATION_FAILED = 1
    USAGE = 2
    INTERNAL = 3
    NOTHING_RAN = 77
    INTERRUPTED = 130
    TERMINATED = 143


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop (Ctrl-C, SIGTERM): the runner keeps what finished."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class RunOptions:
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
    shard: tuple[int, int] | None = None  # (K, N): run the K-th of N parts of the trials
    spares: int = 4  # workers kept ready once a variant's workers die (harness.workers)


class RunHooks:
    """Progress callbacks; the CLI subclasses this. Every method is optional."""

    def variant_started(self, result: VariantResult, trials: int) -> None: ...

    def trial_finished(self, result: VariantResult, trial: TrialResult) -> None: ...

    def variant_finished(self, result: VariantResult) -> None: ...

    def note(self, text: str) -> None: ...


@dataclass
class RunResult:
    backend: str
    device: dict[str, object]
    seed: int
    results: list[VariantResult] = field(default_factory=list)
    wall_s: float = 0.0
    health: dict[str, object] = field(default_factory=dict)
    stopped: str = ""  # why the run stopped early (a GPU-fatal Xid), or ""
    watch_notes: list[str] = field(default_factory=list)
    interrupted: str = ""  # the signal that stopped the run (SIGINT, SIGTERM), or ""
    folder: str = ""  # the run's own folder under --out
    run_id: str = ""
    poison: bool = False  # released pages were poisoned (--poison)
    shard: tuple[int, int] | None = None  # (K, N) when the run was one part of N
    plan: dict[str, object] = field(default_factory=dict)  # what shards must agree on
    shards: list[dict[str, object]] = field(default_factory=list)  # a merged run's parts

    @property
    def exit_code(self) -> ExitCode:
        if self.interrupted:
            return ExitCode.TERMINATED if self.interrupted == "SIGTERM" \
                else ExitCode.INTERRUPTED
        if self.stopped:
            return ExitCode.EXPECTATION_FAILED
        ran = [r for r in self.results if r.status is not Status.SKIP]
        # A sweep maps the race window; its points at small delays are not expected to pass.
        if any(r.status is Status.FAIL and not r.sweep for r in ran):
            return ExitCode.EXPECTATION_FAILED
        return ExitCode.OK if ran else ExitCode.NOTHING_RAN

    def to_json(self) -> dict[str, object]:
        return {
            "schema": RUN_SCHEMA,
            "version": VERSION,
            "run_id": self.run_id,
            "folder": self.folder,
            "interrupted": self.interrupted,
            "backend": self.backend,
            "device": self.device,
            "seed": self.seed,
            "poison": self.poison,
            "wall_s": round(self.wall_s, 3),
            "exit_code": int(self.exit_code),
            "stopped": self.stopped,
            "health": self.health,
            "watch_notes": self.watch_notes,
            "shard": None if self.shard is None else {"index": self.shard[0],
                                                      "count": self.shard[1]},
            "plan": self.plan,
            "shards": self.shards,
            "results": [r.to_json() for r in self.results],
        }


def choose_backend(requested: str) -> str:
    if requested == "sim":
        return "sim"
    ok, why = cuda_usable()
    if requested == "cuda" and not ok:
        raise BackendUnavailable(f"--backend cuda: {why}")
    return "cuda" if ok else "sim"


def _version() -> str:
    try:
        return importlib.metadata.version("gpurace")
    except importlib.metadata.PackageNotFoundError:
        return "0+source"  # run from a source tree that was never installed


VERSION = _version()
"""This gpurace's version, in every run document: shards of different versions do not merge."""


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
               if k not in ("out_dir", "record", "max_incidents", "shard", "spares")}}
    digest = hashlib.sha256(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()
    return {"digest": digest, "version": VERSION, "backend": backend, "seed": options.seed,
            "sources": sources}


def trial_seed(seed: int, scenario: str, variant: str, index: int) -> int:
    """The seed of one trial, from the run's seed: stable whatever else the run contains, so
    ``--seed S`` replays a scenario's trials exactly even when run alone."""
    digest = hashlib.sha256(f"{seed}:{scenario}:{variant}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


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
        self.folder: RunFolder | None = None  # made when the run starts
        self.watch: GpuWatch | None = None
        self.health: dict[str, object] = {}
        self.stopped = ""
        self._running: VariantResult | None = None  # the variant whose trials are running
        self._position = 0  # trials planned before the variant that runs next, for --shard

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
        self.started_wall = time.time()
        self.watch = GpuWatch(self.backend)
        if self.backend == "cuda":  # on sim there is nothing to watch, and reports say so
            for note in self.watch.notes:
                self.hooks.note(note)
        self.health = {"before": self.watch.health(), "after": None}
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
        except KeyboardInterrupt as exc:
            # Keep what finished, the variant in progress with its trials so far too.
            result.interrupted = signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
            partial = self._running
            if partial is not None and all(partial is not r for r in result.results):
                partial.judge()
                partial.reason = (f"interrupted by {result.interrupted} after "
                                  f"{partial.trials} trials; " + partial.reason).rstrip("; ")
                result.results.append(partial)
        finally:
            self.health["after"] = self.watch.health()
            self.watch.stop()
        result.device = self.device
        result.health = self.health
        result.stopped = self.stopped
        result.watch_notes = list(self.watch.notes)
        result.wall_s = time.perf_counter() - start
        return result

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
        if scenario.dangerous and not opts.dangerous:
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
        def make_job() -> WorkerJob:
            self._workers += 1
            folder = self.log_dir / f"{self._workers:04d}-{scenario.name}-{variant.name}"
            return WorkerJob(scenario, variant.name, self.backend, os.getpid(), amplified,
                             delay if amplified else None, str(folder / "worker.log"),
                             str(folder), header, opts.detect, opts.schedule, opts.record,
                             opts.poison)

        supply = WorkerSupply(make_job, WORKER_START_TIMEOUT_S, opts.spares)
        try:
            self._run_trials(supply, pending, timeout, run)
        finally:
            supply.close()
        result.judge()
        self.hooks.variant_finished(result)
        return result

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

    def _run_trials(self, supply: WorkerSupply, pending: list[tuple[int, int]],
                    timeout: float, run: _VariantRun) -> None:
        """Hand the trials to workers until all ended: a worker that dies leaves the rest to
        the next one, which is the warm spare once a worker of this variant has died. The dead
        worker's last trial is recorded after the hand-over, so its joining and its Xid wait
        do not hold up the next trial."""
        died_at: float | None = None
        dead: tuple[Worker, _Ended] | None = None
        while pending and not self._stop_for_fatal_xid():
            worker = self._take(supply)
            worker.give(pending)
            if died_at is not None:
                run.result.add_restart(time.monotonic() - died_at)
            supply.refill()
            if dead is not None:  # now that the next worker runs, the dead one's last trial
                self._finish_dead(*dead, run)
                dead = None
            ended = self._supervise(worker, timeout, run)
            pending = pending[ended.finished:]
            died_at = ended.died_at
            if died_at is not None:
                supply.died()
                dead = (worker, ended)
        if dead is not None:
            self._finish_dead(*dead, run)

    def _take(self, supply: WorkerSupply) -> Worker:
        try:
            worker = supply.take()
        except WorkerFailed as failed:
            failed.worker.stop(1.0)
            raise HarnessError(_worker_failed(failed.worker, failed.message)) from None
        self.device.update({k: v for k, v in worker.info.items() if k != "pid"})
        return worker

    def _supervise(self, worker: Worker, timeout: float, run: _VariantRun) -> _Ended:
        """Run a worker's trials until it finishes, crashes or hangs. A worker that died
        (``died_at`` set) is left to :meth:`_finish_dead`, with the trial it died in."""
        finished = 0
        proc, job = worker.proc, worker.job
        while finished < len(worker.trials) and not self.stopped:
            index, seed = worker.trials[finished]
            started, wall = time.monotonic(), time.time()
            message = receive(worker.conn, timeout)
            if message in (SILENT, GONE):
                # Silent and alive: it hangs, and the watchdog kills it. Gone (its pipe
                # closed), or silent and already dead: it died on its own, or was killed
                # from outside; a crash, whatever the clock says.
                hung = message is SILENT and proc.is_alive()
                if hung:
                    proc.kill()
                proc.join(5)
                # Measured after the kill: how long the trial held the GPU in all.
                waited = time.monotonic() - started
                if hung:
                    kind, detail = Outcome.HANG, (
                        f"no result within the {timeout:g} s trial timeout; worker "
                        f"{proc.pid} killed after {waited:.2f} s")
                else:
                    kind, detail = Outcome.CRASH, (
                        f"worker {proc.pid} {_death(proc)} after {waited:.2f} s, "
                        "before it reported the trial")
                return _Ended(finished + 1, time.monotonic(), wall, TrialResult(
                    index, seed, kind, detail=detail, duration_s=waited,
                    worker_pid=proc.pid, trace=_keep_current_trace(job, index)))
            if message[0] == "error":
                worker.stop(1.0)
                raise HarnessError(_worker_failed(worker, message))
            if message[0] == "done":
                break
            trial = TrialResult.from_json(message[1])
            if trial.outcome is Outcome.CRASH and job.backend == "cuda":
                # The context is dead and the worker exits: the rest go to the next worker.
                return _Ended(finished + 1, time.monotonic(), wall, trial)
            self._record(run, trial, wall, job)
            finished += 1
        worker.stop()
        return _Ended(finished, None, 0.0, None)

    def _finish_dead(self, worker: Worker, ended: _Ended, run: _VariantRun) -> None:
        """Record the trial a worker died in, once it is gone: the device's own words (the
        assert's file, line, block and thread) reach its log only when the process ends."""
        worker.proc.join(10)
        assert ended.last is not None
        trial = dataclasses.replace(ended.last, device_log=_tail(worker.job.log_path))
        worker.stop()
        self._record(run, trial, ended.wall, worker.job)

    def _record(self, run: _VariantRun, trial: TrialResult, wall: float,
                job: WorkerJob) -> None:
        """Keep a finished trial; for one that was not clean, gather what the GPU said and write
        its incident; stop the run if the GPU reported a fatal Xid."""
        assert self.watch is not None
        if trial.outcome.manifested or trial.race:
            said = self.watch.for_trial(trial.worker_pid, wall,
                                        crashed=trial.outcome in (Outcome.CRASH, Outcome.HANG))
            trial = dataclasses.replace(trial, xids=said.xids)
            kept = None
            if len(run.result.reports) < self.options.max_incidents:
                incident = self._incident(run, trial, said, job)
                run.result.reports.append(str(incident))
                kept = str(incident / "trace.jsonl") if trial.trace else None
            trial = dataclasses.replace(trial, trace=self._settle_trace(trial.trace, kept))
        run.result.add(trial)
        self.hooks.trial_finished(run.result, trial)
        self._stop_for_fatal_xid()

    def _stop_for_fatal_xid(self) -> bool:
        """Whether the run must stop: the GPU reported a fatal Xid (said once, as a note)."""
        assert self.watch is not None
        fatal = self.watch.fatal_since(self.started_wall)
        if fatal and not self.stopped:
            xids = ", ".join(f"Xid {ev.xid} ({ev.info.meaning})" for ev in fatal)
            self.stopped = (f"the GPU reported {xids}: it needs attention (a reset or service) "
                            "before it runs anything else; the run stopped here")
            self.hooks.note(self.stopped)
        return bool(self.stopped)

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
                  job: WorkerJob) -> Path:
        report = build_report(
            run.scenario, run.variant, trial, backend=self.backend, device=dict(self.device),
            health={"before": self.health.get("before"), "after": self.watch.health()
                    if self.watch else None, "note": ""},
            run_seed=self.options.seed, amplification=run.amplification, xids=said.xids,
            xid_note=said.note, kernel_log=said.kernel_log, argv=run.argv(trial))
        log = _tail(job.log_path, 400)
        extra = {"worker.log": log + "\n"} if log.strip() else {}
        if said.kernel_log:
            extra["kernel-log.txt"] = "\n".join(said.kernel_log) + "\n"
        trace = Path(trial.trace) if trial.trace else None
        return write_incident(self.out_dir, report, trace, extra)


@dataclass
class _VariantRun:
    """What the runner carries for the variant it is running."""

    scenario: Scenario
    variant: Variant
    result: VariantResult
    amplification: dict[str, object] | None
    argv: Callable[[TrialResult], list[str]]


@dataclass(frozen=True)
class _Ended:
    """How a worker's turn ended: ``finished`` trials ended (the one it died in too); when it
    died, the time the parent learned it, and that trial (``last``) with its start's wall
    time, still to record."""

    finished: int
    died_at: float | None
    wall: float
    last: TrialResult | None


def _death(proc: multiprocessing.process.BaseProcess) -> str:
    """How a worker process ended, in words: the signal that killed it, or its exit code."""
    code = proc.exitcode
    if code is None:
        return "is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def _keep_current_trace(job: WorkerJob, index: int) -> str | None:
    """The trace of the trial a worker died in: everything flushed before its last wait."""
    current = Path(job.trace_dir) / CURRENT
    if not current.exists():
        return None
    # Killed in the middle of a flush, the worker may have left half a line: drop it here, the
    # one place a trace can be torn, so every reader downstream refuses a torn trace.
    cut_torn_tail(current)
    kept = trace_path(Path(job.trace_dir), index)
    current.replace(kept)
    return str(kept)


def _tail(path: str, lines: int = 20) -> str:
    """The last lines of a worker's log (what CUDA and Python printed), for the trial record."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _worker_failed(worker: Worker, message: tuple) -> str:
    job, proc = worker.job, worker.proc
    if message in (SILENT, GONE):
        proc.join(1)
        return (f"the worker for {Path(job.scenario.path).name} ({job.variant}) did not start "
                f"(it {_death(proc)}; its log: {job.log_path}); run with --backend sim to "
                "check the scenario")
    return (f"the worker for {Path(job.scenario.path).name} ({job.variant}) failed "
            f"(its log: {job.log_path}):\n{message[1]}")



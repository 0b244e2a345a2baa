"""The worker process: makes its device, then runs the trials it is handed and reports each one
to the parent as it ends.

A worker is never forked from the run's parent (it would share the parent's state): it forks from
a fork server that imported the harness once and never touches CUDA, or is spawned where there is
none (:mod:`harness.run.workers`). A worker says it is ready only once its device, kernels and pool
are made, and waits for trials: so the parent can keep one ready as a spare. A CUDA fault kills
the context, so a cuda worker exits after a crash and the parent hands the remaining trials to
another; a hang is ended by the parent's watchdog killing the worker. A worker that is still
whole when its variant's trials end may be handed the next variant's job: it makes that job's
device in the same process and context, as it made the first.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from harness.faults.writes import reason
from harness.processes.lifetime import die_with_parent, leave_fork_server
from harness.results.outcome import Outcome
from harness.run.wire import TrialMessage, trial_message


@dataclass(frozen=True)
class WorkerJob:
    """What a worker is to do: trials of one scenario variant, handed to it once it is ready."""

    scenario: Any  # harness.lang.model.Scenario, pickled whole: a replay's scenario has no file
    variant: str
    backend: str
    parent_pid: int
    amplify: bool
    delay_us: float | None
    log_path: str
    trace_dir: str
    header: dict[str, Any]
    detect: bool = True
    schedule: str | None = None  # a schedule token (sim): every trial replays that ordering
    record: bool = False  # keep every trial's op trace, not only the ones that went wrong
    poison: bool = False  # the pool poisons released pages
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES for the worker: the one GPU of its lane
    # Traces of bad trials a worker keeps (None: all). The parent writes incidents for the
    # first few bad trials only and deletes the other traces; each of those trials is among
    # its own worker's first few, so keeping more only costs file operations per trial.
    traces_kept: int | None = None
    timeline: bool = False  # time the stream ops with CUDA events (cuda)
    reissue: bool = True  # issue a captured clean trial's device calls again (cuda)
    # The world kept from trial to trial (None: on cuda only, as a GPU's pages outlive trials).
    # A benchmark keeps it on the simulated device too, to measure what a GPU's worker runs.
    keep_world: bool | None = None
    # Every op's own issue time in the trace (a sweep's window plot reads them): the flight
    # recorder takes records, not a reissued trial's segments with one time each.
    issue_times: bool = False
    # The parent's environment when the job was made: a worker forked by the fork server would
    # otherwise have the server's, as it was when the server started.
    env: dict[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))


def worker_main(conn: Connection, job: WorkerJob) -> None:
    """Entry point of a worker process. Messages to the parent: ("ready", device_info), then
    for each ("trials", ((index, seed), ...)) it is handed ("trial", message) per trial (see
    :mod:`harness.run.wire`) and
    ("done",); ("error", text) when something failed. ("job", WorkerJob) once its trials are
    done makes it the worker of another variant: the last one's device goes, the new job's is
    made and it says ("ready", ...) again, in the same process and CUDA context (a context
    and a process start cost more than most variants' trials). ("stop",), or the parent's
    end closing, ends it."""
    die_with_parent(job.parent_pid)
    leave_fork_server()
    gpu = job.gpu  # fixed for the process: CUDA reads it once, when the first device is made
    try:
        next_job: WorkerJob | None = job
        while next_job is not None:
            job, next_job = next_job, None
            if job.gpu != gpu:
                raise RuntimeError(f"a worker started on GPU {gpu} was handed a job for GPU "
                                   f"{job.gpu}: a worker serves the lane it started in")
            os.environ.clear()
            os.environ.update(job.env)
            if gpu is not None:
                # Before anything imports CuPy: the worker's device 0 is its lane's GPU.
                os.environ["CUDA_VISIBLE_DEVICES"] = gpu
            lost = log_to(job.log_path)
            runner = TrialRunner(job)
            conn.send(("ready", {**runner.info, "log_error": lost} if lost else runner.info))
            ended: list[tuple] = []
            for index, seed in handed_trials(conn, ended):
                payload = runner.run(index, seed)
                conn.send(("trial", payload))
                if runner.context_died(payload):
                    # The context is dead: exit now, without the destructors that would try
                    # to free its memory and print CUDA errors. The parent starts a new worker.
                    conn.close()
                    exit_now()
            runner.close()
            if ended and ended[0][0] == "job":
                next_job = ended[0][1]
                # The last variant's device, pool and pinned memory freed before the next
                # variant's are made: the GPU holds one world at a time.
                del runner
                gc.collect()
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def log_to(path: str) -> str:
    """Everything the process prints, CUDA's device-side assert messages included, goes to the
    worker's log: the parent's terminal keeps its progress bar, and reports quote the log.
    Where the log cannot be made (its folder removed, no room for it), the output goes nowhere
    and the trials run all the same: returns why, for the parent to say ("" when made)."""
    try:
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        log, lost = os.open(os.devnull, os.O_WRONLY), reason(exc)
    else:
        lost = ""
    # What the last job printed goes to its own log, before the descriptors point elsewhere.
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    if log > 2:
        os.close(log)  # 1 and 2 hold it: a worker that serves many variants opens one per log
    return lost


def exit_now() -> None:
    """Leave the process at once, its log flushed: after a CUDA fault, destructors would only
    try to free a dead context's memory and print errors."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class TrialRunner:
    """A worker's device and its trials, whatever carries the messages (a pipe to the parent,
    or Ray): the executor, the flight recorder and the race detector, made once."""

    def __init__(self, job: WorkerJob) -> None:
        # Imported here: a spawned worker imports this module to find its entry point, and
        # the heavy parts only once it runs (the fork server has them preloaded).
        from harness.races.detector import RaceDetector
        from harness.run.executor import TrialExecutor
        from harness.traces.flight import FlightRecorder
        from kvcore.device.schedule import Schedule

        self.job = job
        scenario = job.scenario
        self.recorder = FlightRecorder(Path(job.trace_dir), issue_times=job.issue_times)
        self.detector = RaceDetector() if job.detect else None

        def on_device(device: Any) -> None:
            self.recorder.attach(device)
            if self.detector is not None:
                self.detector.attach(device)

        self.executor = TrialExecutor(
            scenario, scenario.variant(job.variant), job.backend, amplify=job.amplify,
            delay_us=job.delay_us, on_device=on_device,
            schedule=Schedule.parse(job.schedule) if job.schedule else None, poison=job.poison,
            timeline=job.timeline, reissue=job.reissue, keep_world=job.keep_world)
        self.pid = os.getpid()  # asked once: a worker never forks (and a call is a system call)
        self.info: dict[str, Any] = {**self.executor.device_info, "pid": self.pid}
        self.kept = 0  # traces of bad trials kept so far

    def run(self, index: int, seed: int) -> TrialMessage:
        """One trial, as the message the parent reads it from (:mod:`harness.run.wire`)."""
        job, recorder, detector = self.job, self.recorder, self.detector
        recorder.start_trial(job.header, trial=index, seed=seed, pid=self.pid)
        if detector is not None:
            detector.reset()
        result = self.executor.run(index, seed)
        findings = detector.findings_json() if detector is not None else []
        bad = result.outcome is not Outcome.CLEAN or bool(findings)
        keep = job.record or bad and (job.traces_kept is None or self.kept < job.traces_kept)
        self.kept += bool(keep and bad)
        trace = recorder.end_trial(index, keep=keep)
        lost = (str(recorder.path), recorder.error) if recorder.error else None
        return trial_message(result, self.pid, findings, trace, recorder.total, lost)

    def close(self) -> None:
        """The worker is done: its scratch trace (the last trial's, not kept) goes."""
        self.recorder.close(discard=True)

    def context_died(self, message: TrialMessage) -> bool:
        """Whether the trial crashed a CUDA context: the process must go."""
        return context_died(message, self.job.backend)


def context_died(message: TrialMessage, backend: str) -> bool:
    """Whether a trial (its message, :mod:`harness.run.wire`) crashed a CUDA context, so its
    worker's process must go: on the simulated device a crash leaves the worker whole."""
    return message.outcome == "crash" and backend == "cuda"


def handed_trials(conn: Connection, ended: list[tuple] | None = None
                  ) -> Iterator[tuple[int, int]]:
    """The trials the parent hands over, list after list, each list followed by ("done",); ends
    when the parent says anything else (stop, or another job: put in ``ended``) or its end
    closes."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] != "trials":
            if ended is not None:
                ended.append(message)
            return
        yield from message[1]
        conn.send(("done",))

"""The parent's side of worker processes: starting one, handing it trials, and warm spares.

A worker is started with its job (a scenario variant and how to run it) and makes its device,
kernels and pool before it says it is ready; only then is it handed trials. So a worker can be
started before it is needed. Once a variant's workers have started to die (a CUDA fault kills
its worker, the watchdog kills a hung one), the supply keeps a spare ready beside the worker
that runs trials, and the next death costs a hand-over instead of a start (an interpreter,
CuPy, a context, the kernels, the pool). Where every trial crashes at once, as in a crash soak,
one spare has only a trial's time to start, so the supply keeps several: after the first death
they start together, and then one for each taken, so each has had that many hand-overs' time
when its turn comes. Spares that are not needed are stopped with the supply: none outlives its
variant. The worker that ran a variant's trials may (:meth:`Worker.take_job`): the runner hands
it the next variant's job, so a run of many variants starts one worker per lane.
"""

from __future__ import annotations

import math
import multiprocessing
import select
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import connection
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from harness.results.outcome import TrialResult
from harness.run.wire import TrialMessage
from harness.run.worker import WorkerJob, worker_main

SILENT = ("silent",)
"""What :func:`receive` says when the worker sent nothing in time."""
GONE = ("gone",)
"""What :func:`receive` says when the worker's end of the pipe closed: it died."""
DONE = ("done",)
"""What a worker says once it ran the trials it was handed."""


def receive(conn: Connection, timeout: float) -> tuple:
    """The worker's next message, or SILENT (nothing in time), or GONE (it died)."""
    try:
        if not conn.poll(timeout):
            return SILENT
    except (EOFError, OSError):
        return GONE
    return taken(conn)


def taken(conn: Connection) -> tuple:
    """The message that waits on ``conn``, or GONE where the worker's end of it closed."""
    try:
        return conn.recv()  # type: ignore[no-any-return]
    except (EOFError, OSError):
        return GONE


def wait_any(conns: Sequence[Connection | int], timeout: float) -> list[Connection | int]:
    """Of the workers' connections (and process sentinels), those with a message (or closed,
    or ended) within ``timeout`` seconds."""
    return connection.wait(conns, timeout)  # type: ignore[return-value]


@dataclass
class Worker:
    """One worker: its process, the parent's end of its pipe, its job, and the trials
    it was handed (none while it waits as a spare)."""

    proc: multiprocessing.process.BaseProcess
    conn: Connection
    job: WorkerJob
    trials: tuple[tuple[int, int], ...] = ()
    info: dict[str, Any] = field(default_factory=dict)  # its "ready" message: the device
    ready_by: float = math.inf  # monotonic: a worker not ready by then failed to start
    fresh: bool = False  # started because no spare waited (not a warm one)
    # What tells that a message waits, made at the first ask (see has_message).
    _poller: Any = field(default=None, repr=False, compare=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def has_message(self) -> bool:
        """Whether a message waits now, or the worker's end of the pipe closed: one poll system
        call. (``Connection.poll`` makes a selector at every call, and the parent asks once
        per trial, which on a GPU ends every few tens of microseconds.)"""
        poller = self._poller
        if poller is None:
            if not hasattr(select, "poll"):  # no poll(2) here: the connection's own way
                return self.conn.poll()
            poller = self._poller = select.poll()
            poller.register(self.conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))  # a closed end says POLLHUP, whatever was asked

    def message(self) -> tuple:
        """The message :meth:`has_message` said waits (GONE where the pipe's end closed)."""
        return taken(self.conn)

    def trial(self, message: TrialMessage) -> TrialResult:
        """The trial of the worker's ("trial", ...) message's body (:mod:`harness.run.wire`)."""
        return message.trial()

    def give(self, trials: Sequence[tuple[int, int]]) -> None:
        """Hand the worker its trials; it runs them in order and reports each."""
        self.trials = tuple(trials)
        self.conn.send(("trials", self.trials))

    def take_job(self, job: WorkerJob) -> None:
        """Make this worker, its last job's trials all ended, the worker of ``job``: it makes
        the job's device in its own process and CUDA context, and says it is ready as a new
        worker does."""
        self.job, self.trials, self.info = job, (), {}
        self.conn.send(("job", job))

    def ask_to_stop(self) -> None:
        """Ask a living worker to leave once it has no trial left (it says nothing back)."""
        if self.proc.is_alive():
            try:
                self.conn.send(("stop",))
            except (OSError, ValueError):
                pass  # its end is closed: it is on its way out

    def stop(self, wait_s: float = 5.0) -> None:
        """End the worker: ask a living one to leave, kill it if it does not; safe twice."""
        if self.proc.is_alive():
            self.ask_to_stop()
            self.proc.join(min(wait_s, 1.0))
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(wait_s)
        self.conn.close()


PRELOAD = ("harness.run.worker", "harness.run.executor", "harness.races.detector",
           "harness.traces.flight", "kvcore", "numpy")
"""What the fork server imports once, so that a worker forked from it starts without importing
it (each crash costs a worker start). Not CuPy, nor anything that imports it: a process that
initialized CUDA cannot fork a child that uses CUDA, and the server must stay clear of it."""


def _context() -> multiprocessing.context.BaseContext:
    """Where workers come from: forked by Python's fork server, which imported
    :data:`PRELOAD` once (it starts with the first worker and ends with this process), or
    spawned where there is none, or where its life line is not where
    :func:`~harness.processes.lifetime.leave_fork_server` lets go of it."""
    from multiprocessing import forkserver

    if "forkserver" not in multiprocessing.get_all_start_methods() or not hasattr(
            getattr(forkserver, "_forkserver", None), "_forkserver_alive_fd"):
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def start_local(job: WorkerJob) -> Worker:
    """A worker in a process of this machine (see :func:`_context`)."""
    ctx = _context()
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=worker_main, args=(child, job), daemon=True)
    proc.start()
    child.close()
    return Worker(proc, parent, job)


class WorkerFailed(Exception):
    """A worker sent an error or died before it was ready; ``message`` is what it said."""

    def __init__(self, worker: Worker, message: tuple) -> None:
        super().__init__(message)
        self.worker = worker
        self.message = message


class WorkerSupply:
    """Workers for one variant: the spare when one is ready, else a new one (see the module
    docstring). ``make_job()`` makes the job of each new worker (its own log folder)."""

    def __init__(self, make_job: Callable[[], WorkerJob], start_timeout_s: float,
                 spares: int = 1, start: Callable[[WorkerJob], Worker] | None = None) -> None:
        self._make_job = make_job
        self._start_worker = start or start_local
        self._start_timeout_s = start_timeout_s
        self._spares: deque[Worker] = deque()  # oldest first: the likeliest to be ready
        self.spares = spares  # how many to keep once spares are wanted
        self.spares_wanted = False  # set once a worker of this variant died
        self.started = 0  # workers started, spares included
        self.warm = 0  # workers taken that were already started (spares, prestarted ones)

    def take(self) -> Worker:
        """A ready worker, waiting for it to start when none is ready yet (see :meth:`poll`).
        Raises WorkerFailed when the worker could not start."""
        while (worker := self.poll()) is None:
            starting = self._spares[0]
            wait_any([starting.conn], max(0.0, starting.ready_by - time.monotonic()))
        return worker

    def poll(self) -> Worker | None:
        """A ready worker without waiting: the oldest spare, once it has said it is ready;
        None while it still starts (one is started when none waits), and :attr:`starting` is
        what to wait on meanwhile. A spare that died waiting is passed over for the next, or a
        fresh start. Raises WorkerFailed when the worker could not start."""
        while True:
            if not self._spares:
                self._spares.append(self._start())
                self._spares[0].fresh = True
            worker = self._spares[0]
            alive = worker.proc.is_alive()  # before its message: "ready", then dead, is dead
            message = receive(worker.conn, 0)
            while message == DONE:  # a kept worker's last word of its last variant
                message = receive(worker.conn, 0)
            if message is SILENT and alive and time.monotonic() < worker.ready_by:
                return None
            self._spares.popleft()
            if not alive and not worker.fresh:
                worker.stop()  # a spare that died waiting
                continue
            if message in (SILENT, GONE) or message[0] != "ready":
                raise WorkerFailed(worker, message)
            worker.info = message[1]
            self.warm += not worker.fresh
            return worker

    @property
    def starting(self) -> Worker | None:
        """The worker :meth:`poll` waits to be ready, if any."""
        return self._spares[0] if self._spares else None

    def refill(self) -> None:
        """Start spares, when they are wanted, until ``spares`` wait: called once the worker
        taken has its trials, so starting them costs the hand-over nothing."""
        while self.spares_wanted and len(self._spares) < self.spares:
            self._spares.append(self._start())

    def prestart(self) -> None:
        """Start a worker now, to be taken later: lanes start theirs side by side rather than
        one after another."""
        if not self._spares:
            self._spares.append(self._start())

    def died(self) -> None:
        """A worker of this variant died: from now on spares wait beside each worker."""
        self.spares_wanted = True

    def close(self) -> None:
        """Stop the spares that wait: all asked first, so their contexts end side by side."""
        for spare in self._spares:
            spare.ask_to_stop()
        while self._spares:
            self._spares.popleft().stop()

    @property
    def waiting(self) -> list[Worker]:
        """The spares that wait, oldest first."""
        return list(self._spares)

    def _start(self) -> Worker:
        job = self._make_job()
        Path(job.trace_dir).mkdir(parents=True, exist_ok=True)
        self.started += 1
        worker = self._start_worker(job)
        worker.ready_by = time.monotonic() + self._start_timeout_s
        return worker

"""Workers as Ray actors: ``gpurace run --executor ray [--address ADDR]``.

Each worker is an actor holding one :class:`~harness.run.worker.TrialRunner` (its device, made
once) and asking Ray for one GPU (``num_gpus=1``; Ray pins it). The runner drives it as it
drives a local worker: a thread here carries the actor's answers into a local pipe, so lanes,
spares, the watchdog and the records are the same code. A trial that kills its CUDA context
ends its actor's process once the result is out, so the next trial gets a clean one; an actor
lost to Ray (killed, its node gone) is a crash of the trial it was running.

Trace and log files are written where the actor runs: on a cluster, ``--out`` must be on storage
every node sees, as a Slurm job's output is.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import signal
import threading
import traceback
from typing import Any

from harness.errors import ExecutorError
from harness.run.worker import TrialRunner, WorkerJob, context_died, exit_now, handed_trials, log_to
from harness.run.workers import Worker

_RAY: Any = None
_ACTOR: Any = None
_LOCK = threading.Lock()


def connect(address: str | None) -> Any:
    """Ray, connected to the cluster at ``address`` (or a local instance started here)."""
    global _RAY
    with _LOCK:
        if _RAY is None:
            try:
                import ray
            except ImportError as exc:
                raise ExecutorError(f"--executor ray needs Ray ({exc}); install "
                                    "'gpurace[ray]'") from None
            if not ray.is_initialized():
                try:
                    ray.init(address=address, include_dashboard=False, log_to_driver=False,
                             configure_logging=False)
                except Exception as exc:  # Ray's ConnectionError and friends
                    raise ExecutorError(f"Ray could not start or connect"
                                        f"{f' to {address}' if address else ''}: {exc}") from None
            _RAY = ray
        return _RAY


class _Actor:
    """The worker in a Ray actor process (see the module docstring)."""

    def __init__(self, job: WorkerJob) -> None:
        log_to(job.log_path)
        self.runner = TrialRunner(job)

    def ready(self) -> dict[str, Any]:
        return self.runner.info

    def run(self, index: int, seed: int) -> tuple[Any, ...]:
        payload = self.runner.run(index, seed)
        if self.runner.context_died(payload):
            # The answer goes out first; then the process, with its dead context.
            threading.Timer(0.2, exit_now).start()
        return payload


def _actor_class(ray: Any) -> Any:
    global _ACTOR
    if _ACTOR is None:
        _ACTOR = ray.remote(_Actor)
    return _ACTOR


class _ActorProcess:
    """What the runner asks of a worker's process, answered for an actor."""

    def __init__(self, ray: Any, actor: Any) -> None:
        self._ray, self._actor = ray, actor
        self.feeder: threading.Thread | None = None
        self.pid: int | None = None
        self.exitcode: int | None = None
        self.lost = ""  # why Ray lost the actor, in its words

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        if self.exitcode is None:
            self.exitcode = -signal.SIGKILL
        self._ray.kill(self._actor, no_restart=True)

    def join(self, timeout: float | None = None) -> None:
        if self.feeder is not None:
            self.feeder.join(timeout)


def start_actor(job: WorkerJob, address: str | None) -> Worker:
    """A worker as a Ray actor (see the module docstring), ready to be waited for as a local
    one is: its first message is ("ready", info) or ("error", text)."""
    ray = connect(address)
    # Not the parent's environment: that is this machine's, and an actor runs in its node's.
    job = dataclasses.replace(job, env={})
    gpus = 1 if job.backend == "cuda" else 0
    # No CPU reserved: spares wait idle, and a lane must not wait for a CPU slot to start one.
    actor = _actor_class(ray).options(num_gpus=gpus, num_cpus=0, max_restarts=0).remote(job)
    ours, theirs = multiprocessing.Pipe(duplex=True)
    proc = _ActorProcess(ray, actor)
    proc.feeder = threading.Thread(target=_feed, args=(ray, actor, theirs, proc, job),
                                   name="gpurace-ray-feeder", daemon=True)
    proc.feeder.start()
    return Worker(proc, ours, job)  # type: ignore[arg-type]


def _feed(ray: Any, actor: Any, conn: Any, proc: _ActorProcess, job: WorkerJob) -> None:
    """Carry the actor's answers to the runner, as a local worker's pipe would."""
    try:
        try:
            info = ray.get(actor.ready.remote())
        except Exception as exc:
            conn.send(("error", _reason(exc)))
            proc.exitcode = 1
            return
        proc.pid = info.get("pid")
        conn.send(("ready", info))
        for index, seed in handed_trials(conn):  # as a local worker takes them
            payload = ray.get(actor.run.remote(index, seed))
            conn.send(("trial", payload))
            if context_died(payload, job.backend):
                proc.exitcode = 0  # the actor ends itself, a clean context for the next
                return
        ray.kill(actor, no_restart=True)
        if proc.exitcode is None:
            proc.exitcode = 0
    except Exception as exc:  # the actor was lost mid-trial: killed, or its node went away
        proc.lost = _reason(exc).splitlines()[0]
        if proc.exitcode is None:
            proc.exitcode = 1
    finally:
        conn.close()


def _reason(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text or type(exc).__name__


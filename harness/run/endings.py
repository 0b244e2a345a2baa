"""How a worker ended, in words, and what it left behind: the trace of the trial it died in,
the last lines of its log, and why it could not start."""

from __future__ import annotations

import multiprocessing
import signal
from pathlib import Path

from harness.run.worker import WorkerJob
from harness.run.workers import GONE, SILENT, Worker
from harness.traces.flight import CURRENT, cut_torn_tail, trace_path


def death(proc: multiprocessing.process.BaseProcess) -> str:
    """How a worker process ended, in words: the signal that killed it, or its exit code (or,
    for a Ray actor, what Ray said when it lost it)."""
    lost = getattr(proc, "lost", "")
    if lost:
        return f"was lost ({lost})"
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


def keep_current_trace(job: WorkerJob, index: int) -> str | None:
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


def log_tail(path: str, lines: int = 20) -> str:
    """The last lines of a worker's log (what CUDA and Python printed), for the trial record."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def worker_failed(worker: Worker, message: tuple) -> str:
    """Why a worker could not start or failed, for the error the run ends with."""
    job, proc = worker.job, worker.proc
    if message in (SILENT, GONE):
        proc.join(1)
        return (f"the worker for {Path(job.scenario.path).name} ({job.variant}) did not start "
                f"(it {death(proc)}; its log: {job.log_path}); run with --backend sim to "
                "check the scenario")
    return (f"the worker for {Path(job.scenario.path).name} ({job.variant}) failed "
            f"(its log: {job.log_path}):\n{message[1]}")

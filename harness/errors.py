"""The harness's exception tree: one root, a docstring per error telling the user what to do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """Where something was written: file, 1-based line and column, and its path in the
    document (``spec.steps[3].stream``). What an error about a file says first."""

    file: str
    line: int
    column: int
    path: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.path}"


class HarnessError(Exception):
    """Root of every gpurace harness error (kvcore's errors have their own root,
    ``kvcore.KVCoreError``)."""

    exit_code = 3


class ScenarioError(HarnessError):
    """A scenario or suite file is invalid: YAML syntax, an unknown or missing key, a wrong type,
    or a reference to a stream, step, lease, catalog or buffer that does not exist.

    The message starts with ``file:line:col: path:``; fix the file there and run again.
    """

    exit_code = 2

    def __init__(self, where: Location | str, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}")


class TargetError(HarnessError):
    """A run target is neither a scenario file, a folder of them, nor a suite name.

    ``gpurace list`` shows the scenarios and suites it knows.
    """

    exit_code = 2


class BackendUnavailable(HarnessError):
    """The backend asked for cannot run here (``--backend cuda`` with no usable GPU).

    Use ``--backend auto`` or ``sim``, or install ``gpurace[cuda]`` on a GPU machine.
    """

    exit_code = 77


class GpuBusyError(HarnessError):
    """Other processes are using the GPU, and dangerous trials could crash their work.

    Wait until the GPU is free, or pass ``--insist`` if you own those processes.
    """

    exit_code = 2


class TraceError(HarnessError):
    """A trace file is not a gpurace trace: a line that is not JSON, a missing or unknown header,
    or a record without the fields its type needs. The message names the file and line."""

    exit_code = 2


class OutputError(HarnessError):
    """Where the run would write cannot be written: ``--out`` is a file, a device or read-only,
    or ``--junit`` names something that is not a regular file, or a folder that cannot be made.

    Pick a path you can write to; nothing ran.
    """

    exit_code = 2


class MergeError(HarnessError):
    """Run documents that cannot be merged into one run: a file that is not a ``gpurace.run/1``
    document, a run made without ``--shard``, a shard missing, given twice, or interrupted, or
    shards that did not run the same plan (another gpurace version, seed, backend, option or
    scenario file).

    Merge the N documents of one ``--shard K/N`` campaign, each run with the same command but
    for K; rerun the shard the message names.
    """

    exit_code = 2


class ExecutorError(HarnessError):
    """The executor asked for cannot run the trials: ``--executor ray`` without Ray installed,
    or a Ray cluster that cannot be reached at ``--address``.

    Install ``gpurace[ray]``, check the address (``ray status`` on the head node), or run with
    the local executor.
    """

    exit_code = 2


class WatchError(HarnessError):
    """`gpurace watch` cannot run what it was given: no program after ``--``, a program file
    that does not exist, or a command that is not a Python program.

    Give the program as you would run it: ``gpurace watch -- python serve.py --port 1``, or
    ``gpurace watch -- python -m mypkg.serve``."""

    exit_code = 2


class NothingToCapture(HarnessError):
    """The program's interpreter imports neither PyTorch nor CuPy, so there is nothing to
    capture: install torch or cupy-cuda13x into the interpreter the program runs with."""

    exit_code = 77


class CaptureFailed(HarnessError):
    """gpurace's capture could not start inside the program's interpreter (it could not import
    gpurace's capture package, or a source failed as it was switched on): a gpurace bug or an
    interpreter gpurace does not support (it needs Python 3.10 or newer). The message quotes
    the interpreter's last words; report it with them."""

    exit_code = 3

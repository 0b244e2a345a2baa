"""What a run does when the machine will not take its files.

A night's soak meets a full disk, a quota, a file system gone read-only, a cleanup job that
removes the run's folder. None of these is the run's result, and none may cost the trials that
finished. One policy for every file a run writes (incident folders, kept traces, run.json, the
JUnit file):

- the run keeps counting trials; a file that could not be written is not kept, and nothing
  half-written stays under a final name (incidents, reports and run.json are built under temp
  names and renamed into place, so a failed write leaves no file or the previous one);
- the first failure of each kind of file, and each new reason for it, is said once, with the
  path; the rest are counted;
- with ``--stop-on-write-error`` the run stops at the first, as an interruption does: what
  finished is kept;
- run.json goes into the run's folder, else into a folder of its own under the system's temp
  folder (:func:`fallback_folder`; ``TMPDIR`` moves it), and the summary says where;
- the run exits 4, and run.json's ``write_errors`` lists what was lost and why.

A run folder that disappears mid-run (:meth:`harness.run.outputs.RunFolder.gone`) ends the run with
what it knows: that is said in one line, and is one of the ``write_errors``.
"""

from __future__ import annotations

import errno
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FALLBACK = "gpurace-fallback"
"""The folder under the system's temp folder where a run's run.json goes when its own folder
will not take it."""

FOLDER_GONE = "the run's folder"
"""The fault of a run whose folder was removed while it ran: it stops at once."""


def reason(exc: OSError) -> str:
    """An OSError in words, with its errno's name: ``No space left on device (ENOSPC)``."""
    name = errno.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text} ({name})" if name else text


def fallback_folder(run_id: str) -> Path:
    """Where run ``run_id``'s run.json goes when its own folder cannot take it."""
    return Path(tempfile.gettempdir()) / FALLBACK / run_id


@dataclass(frozen=True)
class WriteFault:
    """One kind of file that could not be written, for one reason: the first such path, and
    how many files of that kind were lost for it."""

    what: str  # "incident", "trace", "worker log", "run.json", "the run's folder", ...
    path: str
    error: str
    count: int = 1

    def to_json(self) -> dict[str, object]:
        return {"what": self.what, "path": self.path, "error": self.error, "count": self.count}

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> WriteFault:
        return cls(str(doc["what"]), str(doc["path"]), str(doc["error"]),
                   int(doc["count"]))  # type: ignore[call-overload]


class WriteStop(Exception):
    """The run stops here: a write failed under ``--stop-on-write-error``, or the run's folder
    went away. Not a fault of the user's input: the runner ends the run with the trials that
    finished, and run.json's ``write_errors`` says why."""


class WriteFaults:
    """The write failures of one run: each said once (through ``note``), all counted. Under
    ``--stop-on-write-error`` (``stop``) the first one makes :meth:`stop_if_due` raise, which
    the runner calls once the trial the failure belonged to is counted."""

    def __init__(self, stop: bool = False, note: Callable[[str], None] | None = None, *,
                 ended: bool = False) -> None:
        self.stop = stop
        self.note = note
        self.ended = ended  # the run's trials are over (its own files are being written)
        self._first: dict[tuple[str, str], str] = {}  # (what, error) -> its first path
        self._count: dict[tuple[str, str], int] = {}
        self._due = ""

    def failed(self, what: str, path: Path | str, exc: OSError | str, *,
               fatal: bool = False) -> None:
        """``what`` at ``path`` could not be written (``exc``: the error, or its words): said
        the first time for each kind and reason. ``fatal``: the run cannot go on (its folder
        is gone), WriteStop now."""
        error = exc if isinstance(exc, str) else reason(exc)
        key = (what, error)
        stops = fatal or self.stop
        if key not in self._first:
            self._first[key] = str(path)
            if self.note is not None and fatal:
                self.note(f"{what} {path}: {error}; the run stops here, with the trials that "
                          "finished")
            elif self.note is not None:
                then = "" if self.ended else "; " + (
                    "the run stops here (--stop-on-write-error)" if stops else
                    "the run goes on without it (--stop-on-write-error stops a run at the "
                    "first)")
                self.note(f"cannot write {what} at {path}: {error}{then}")
        self._count[key] = self._count.get(key, 0) + 1
        if stops and not self._due:
            self._due = f"{what} at {path}: {error}"
        if fatal:
            self.stop_if_due()

    def stop_if_due(self) -> None:
        """Raise WriteStop once a failure stopped the run."""
        if self._due:
            raise WriteStop(self._due)

    @property
    def records(self) -> list[WriteFault]:
        return [WriteFault(what, path, error, self._count[(what, error)])
                for (what, error), path in self._first.items()]

    def __bool__(self) -> bool:
        return bool(self._first)

"""Where a run writes: checked before it starts, a folder of its own, and the sweep of what dead
runs left behind.

Two runs may share one ``--out`` (the default folder is shared by every run in a checkout), so
each run writes under ``--out/run-<when>-<pid>/``: its run.json, its workers' logs and traces,
its incident folders. A run's folder holds ``owner.json`` (its pid and the process's start
time), so a later run can tell a live run's half-written temp files, which it must leave alone,
from a killed run's, which it sweeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import OutputError
from harness.faults.writes import reason
from harness.processes.lifetime import pid_alive
from reports import remove_stale_temps
from reports.atomic import is_temp_name

RUN_PREFIX = "run-"
OWNER = "owner.json"
LOOSE_TEMP_AGE_S = 3600.0
"""Temp files outside any run folder (left by gpurace versions without run folders) are swept
only once this old: nothing says whose they are."""


@dataclass(frozen=True)
class RunFolder:
    """The folder of one run under ``--out``."""

    path: Path
    run_id: str
    identity: tuple[int, int] | None = None  # the folder's (device, inode) when it was made

    @classmethod
    def create(cls, out: Path) -> RunFolder:
        """A new folder for this process's run, with its owner record."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        base = f"{RUN_PREFIX}{stamp}-{os.getpid()}"
        for n in range(1000):
            run_id = base if n == 0 else f"{base}-{n}"
            path = out / run_id
            try:
                path.mkdir(parents=True)
            except FileExistsError:
                continue
            except OSError as exc:
                raise OutputError(f"--out {out}: cannot make a run folder there "
                                  f"({exc.strerror or exc}); pick a writable folder") from None
            try:
                (path / OWNER).write_text(json.dumps({"pid": os.getpid(),
                                                      "started": _start_time(os.getpid())}) + "\n")
            except OSError as exc:
                shutil.rmtree(path, ignore_errors=True)
                raise OutputError(f"--out {out}: cannot write there ({reason(exc)}); free "
                                  "space there or pick another folder") from None
            made = path.stat()
            return cls(path, run_id, (made.st_dev, made.st_ino))
        raise OutputError(f"--out {out}: 1000 runs of this process started this second; "
                          "pick another folder")

    def gone(self) -> bool:
        """Whether the folder was removed since the run made it (a cleanup job, a user). One
        made again under its name (a worker's folder made with its parents) is not it: the
        run's earlier files are not there. Told by its owner record, which only the run
        writes, and by its inode (a file system may hand a removed folder's number to the
        next one made, so that alone does not tell)."""
        try:
            now = self.path.stat()
            (self.path / OWNER).stat()
        except OSError:
            return True
        return self.identity is not None and (now.st_dev, now.st_ino) != self.identity


def sweep_dead_runs(out: Path) -> int:
    """Remove the temp files and folders that killed runs left under ``out``: inside run
    folders whose owner is no longer alive, and loose ones once they are an hour old. Returns
    how many entries went."""
    if not out.is_dir():
        return 0
    removed = 0
    cutoff = time.time() - LOOSE_TEMP_AGE_S
    for child in out.iterdir():
        if child.is_dir() and child.name.startswith(RUN_PREFIX):
            if not _owner_alive(child):
                removed += remove_stale_temps(child)
        elif is_temp_name(child.name):
            with contextlib.suppress(OSError):
                if child.lstat().st_mtime < cutoff:
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
                    removed += 1
    return removed


def _owner_alive(folder: Path) -> bool:
    try:
        owner = json.loads((folder / OWNER).read_text())
        pid, started = int(owner["pid"]), owner.get("started")
    except (OSError, ValueError, KeyError, TypeError):
        return False  # no readable owner: nobody can be writing there
    if pid == os.getpid():
        return True
    if not pid_alive(pid):
        return False
    # The pid may have been reused since: compare start times where the system says them.
    now = _start_time(pid)
    return started is None or now is None or now == started


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), or None elsewhere."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        text = Path(f"/proc/{pid}/stat").read_text()
        # The command name (field 2) may hold spaces and parentheses: count from its end.
        return int(text[text.rindex(")") + 2:].split()[19])
    return None


def check_folder(path: Path, option: str, shown: Path | None = None) -> None:
    """``path`` is, or can become, a folder this process may write in; else OutputError
    (naming ``shown``, the path the user gave, when that is a file inside ``path``)."""
    shown = shown or path
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe == shown and not probe.is_dir():
        raise OutputError(f"{option} {shown}: it is {_kind(probe)}, not a folder; pick a folder")
    if not probe.is_dir():
        raise OutputError(f"{option} {shown}: {probe} is {_kind(probe)}, not a folder; pick a "
                          "path gpurace can create")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {shown}: {probe} is not writable by this user; pick a "
                          "folder you can write in")


def check_file(path: Path, option: str) -> None:
    """``path`` can be written as a regular file (made, or replaced); else OutputError."""
    target = path.resolve() if path.is_symlink() else path
    if target.exists() and not target.is_file():
        raise OutputError(f"{option} {path}: it is {_kind(target)}; gpurace writes regular "
                          "files only: pick another path")
    check_folder(target.parent, option, shown=path)


def _kind(path: Path) -> str:
    try:
        mode = path.stat().st_mode
    except OSError:
        return "unreadable"
    for test, words in ((stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a file"),
                        (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"

"""Crash-safe file writes: a reader sees the old file or the new one, never half of one.

Every report file is written to a hidden temp file in the same folder (``.NAME.XXXX.tmp``),
flushed and fsynced, renamed onto its final name with :func:`os.replace` (atomic on POSIX within
one file system), and then the folder itself is fsynced so the rename survives a power loss.
A process SIGKILLed mid-write leaves at most a ``.*.tmp`` file behind, which
:func:`remove_stale_temps` sweeps away.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from reports.model import ReportError

TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"

_DEFAULT_UMASK = 0o022
_umask: int | None = None


def current_umask() -> int:
    """The process umask, read without changing it.

    ``os.umask`` can only be read by setting it, which races with other threads creating files,
    so read it from /proc where there is one and assume the common 022 elsewhere.
    """
    global _umask
    if _umask is None:
        _umask = _DEFAULT_UMASK
        with contextlib.suppress(OSError, ValueError):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("Umask:"):
                    _umask = int(line.split()[1], 8)
                    break
    return _umask


def _set_mode(fd: int) -> None:
    # mkstemp makes 0600 files; reports are meant to be read by the team, like any file
    # open() would have created.
    if hasattr(os, "fchmod"):
        os.fchmod(fd, 0o666 & ~current_umask())


def fsync_dir(folder: Path) -> None:
    """Flush ``folder``'s entries (a rename or a new file) to disk; a no-op where folders
    cannot be opened (Windows)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(folder, flags)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some file systems refuse fsync on folders
            os.fsync(fd)
    finally:
        os.close(fd)


def _temp_in(folder: Path, name: str) -> tuple[int, Path]:
    """A new temp file next to the final one, so os.replace never crosses file systems."""
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{name}.", suffix=TEMP_SUFFIX, dir=folder)
    return fd, Path(tmp)


def _commit(tmp: Path, path: Path) -> None:
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically and durably.

    A concurrent reader, or one that comes after a SIGKILL at any moment, finds either the
    previous content of ``path`` (or no file) or all of ``data``.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    with atomic_writer(path, "wb") as f:
        f.write(raw)


@contextlib.contextmanager
def atomic_writer(path: Path, mode: str = "w", encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """Stream a file to ``path`` atomically: ``with atomic_writer(p) as f: f.write(...)``.

    ``mode`` is ``"w"`` (text, ``encoding``) or ``"wb"``. The file appears under ``path`` only
    when the block ends normally; if it raises, the temp file is removed and ``path`` keeps
    whatever it held before. Missing folders above ``path`` are made.
    """
    if mode not in ("w", "wt", "wb"):
        raise ValueError(f"atomic_writer mode must be 'w' or 'wb', not {mode!r}")
    path = _target(Path(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_in(path.parent, path.name)
    try:
        binary = "b" in mode
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else encoding) as f:
            _set_mode(f.fileno())
            yield f
            f.flush()
            os.fsync(f.fileno())
        _commit(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _target(path: Path) -> Path:
    """The file to replace: a symlink's target (the link stays a link, as a plain write would
    keep it), and only ever a regular file: a FIFO, a device or a folder at the path is not
    replaced by a file of ours."""
    if path.is_symlink():
        path = path.resolve()
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(path.stat().st_mode):
            raise ReportError(f"{path}: not a regular file (a folder, FIFO or device); gpurace "
                              "will not replace it with a report: write somewhere else")
    return path


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is one of our temp files or temp incident folders."""
    return name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX) and len(name) > 4


def remove_stale_temps(folder: Path, min_age_s: float = 0.0) -> int:
    """Delete leftover ``.*.tmp`` files and folders under ``folder`` (recursively).

    They are what a killed writer leaves behind. Only call this when no writer is active on
    ``folder``, or pass ``min_age_s`` so that temps younger than that (a live writer's) are
    kept. Returns how many entries were removed (a temp folder counts as one).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    cutoff = time.time() - min_age_s if min_age_s > 0 else None
    removed = 0
    for parent, dirnames, filenames in os.walk(folder):
        for name in list(dirnames):
            if is_temp_name(name):
                dirnames.remove(name)  # don't descend into what we delete
                removed += _remove(Path(parent, name), cutoff)
        for name in filenames:
            if is_temp_name(name):
                removed += _remove(Path(parent, name), cutoff)
    return removed


def _remove(entry: Path, cutoff: float | None) -> int:
    """Remove one temp entry unless it changed after ``cutoff``; 1 if removed, else 0."""
    try:
        if cutoff is not None and entry.lstat().st_mtime > cutoff:
            return 0
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    except FileNotFoundError:
        return 0  # another sweeper, or the writer itself, got there first
    return 1

"""The one way gpurace reads a file it was given, and how an error quotes what the file says.

Every loader (scenario and suite YAML, tickets, op traces, the files `gpurace minimize` follows)
reads through :func:`read_input`: a regular file only (a FIFO, a device such as /dev/zero or a
folder is refused, never read), and only up to the loader's size limit from
:mod:`harness.limits`. The loader turns :class:`Unreadable` into its own error (a ScenarioError
or a TraceError) at line 1, column 1 of the file.

Messages quote values from the file with :func:`echo` and :func:`plain`: one line, printable,
at most :data:`~harness.limits.ECHO_MAX_CHARS` characters of the value.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from harness.limits import ECHO_MAX_CHARS, KiB, MiB

_CHUNK = 1 << 20


class Unreadable(Exception):
    """A file that cannot be read as input; the message says why and what to do."""


def size_words(nbytes: int) -> str:
    """A byte count as a person reads a limit: 16 MiB, 256 KiB, 100 bytes."""
    for unit, name in ((MiB, "MiB"), (KiB, "KiB")):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit} {name}"
    return f"{nbytes:,} bytes"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_input(path: str | Path, limit: int, what: str, *, head: bool = False,
               remedy: str = "split it or make it smaller") -> bytes:
    """The bytes of the regular file ``path``: all of them (refused when over ``limit``), or
    with ``head`` only its first ``limit`` bytes. ``what`` names the format for messages
    ("a scenario file"), ``remedy`` what to do about one too large. Raises
    :class:`Unreadable`."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise Unreadable(f"cannot read the file ({exc.strerror or exc}); check the path and "
                         "its permissions") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"{_kind(info.st_mode)}, not a file; pass {what}")
        if not head and info.st_size > limit:
            raise Unreadable(f"{info.st_size:,} bytes is more than {what} may have "
                             f"({size_words(limit)}); {remedy}")
        chunks: list[bytes] = []
        got = 0
        # Read one byte past the limit: a file that grew since fstat is refused too.
        want = limit if head else limit + 1
        while got < want:
            chunk = os.read(fd, min(_CHUNK, want - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise Unreadable(f"cannot read the file ({exc.strerror or exc}); check the path and "
                         "its permissions") from None
    finally:
        os.close(fd)
    if not head and got > limit:
        raise Unreadable(f"more than {what} may have ({size_words(limit)}); {remedy}")
    return b"".join(chunks)


def utf8_error_at(data: bytes, start: int) -> tuple[int, int]:
    """Line and column (1-based, in characters) of byte ``start`` of ``data``, whose bytes
    before ``start`` are valid UTF-8."""
    line_start = data.rfind(b"\n", 0, start) + 1
    line = data.count(b"\n", 0, start) + 1
    column = len(data[line_start:start].decode("utf-8", errors="replace")) + 1
    return line, column


def plain(text: str) -> str:
    """``text`` as one printable line: control characters, newlines included, as escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def clip(text: str, limit: int = ECHO_MAX_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with "…" when cut."""
    return text if len(text) <= limit else text[:limit] + "…"


def show_path(path: object) -> str:
    """A path for a message: as written, on one line, cut to a few times ECHO_MAX_CHARS."""
    return clip(plain(str(path)), 3 * ECHO_MAX_CHARS)


def echo(value: object) -> str:
    """A value from a file as a message quotes it: a string quoted (as Python's repr does,
    which escapes control characters), anything else as written; at most ECHO_MAX_CHARS of it."""
    if isinstance(value, str):
        return repr(clip(value))
    return clip(plain(repr(value)))

"""Xid lines from the kernel log: a parser, and a reader that reports the lines a run added.

The kernel-log line is the only Xid record that names the process (``pid=516, name=python3``),
which is how a trial's Xid is told apart from one a neighbour on a shared GPU caused. NVML's Xid
events (harness/nvml.py) arrive sooner but carry no pid, so the harness uses both.

Where it can, :class:`KernelLog` reads ``/dev/kmsg`` from where the log ended when the run began,
so a poll costs what was logged since; elsewhere it runs ``dmesg``, which returns the whole ring
buffer every time. Reading the kernel log often needs privileges (``kernel.dmesg_restrict=1``
means root or CAP_SYSLOG); when it cannot be read, :class:`KernelLog` says why in ``note`` and
reports nothing.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.gpu.xid import XidInfo, describe

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+)(?:,\s*(?P<text>.*))?$")
_PID = re.compile(r"pid=(?:'<unknown>'|<unknown>|(?P<pid>\d+))")
_NAME = re.compile(r"name=(?P<name>[^,]*)")
_DMESG_TS = re.compile(r"^\[\s*(?P<ts>\d+(?:\.\d+)?)\]")
_ISO_TS = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)")
_SYSLOG_TS = re.compile(r"^(?P<ts>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)")


@dataclass(frozen=True)
class KernelXid:
    """One Xid line from the kernel log.

    ``pci`` is the bus id as the driver wrote it, without ``PCI:`` (``0000:00:06``); ``pid`` and
    ``name`` are None where the line says ``<unknown>`` or has none (older drivers); ``text`` is
    everything after the Xid number; ``timestamp`` is the dmesg, ISO or syslog prefix, if any.
    """

    xid: int
    pci: str
    pid: int | None
    name: str | None
    text: str
    line: str
    timestamp: str | None

    @property
    def info(self) -> XidInfo:
        return describe(self.xid)


def parse_xid_line(line: str) -> KernelXid | None:
    """A :class:`KernelXid` for an ``NVRM: Xid`` kernel-log line, None for any other line."""
    line = line.rstrip("\r\n")
    at = line.find("NVRM: Xid")
    if at < 0:
        return None
    m = _XID.match(line, at)
    if m is None:
        return None
    text = (m.group("text") or "").strip()
    pid: int | None = None
    name: str | None = None
    # Only the fields the driver puts first: a fault description later in the line must not
    # be mistaken for them.
    head = text.split(",", 2)
    pid_m = _PID.match(head[0].strip()) if head else None
    if pid_m is not None:
        pid = int(pid_m.group("pid")) if pid_m.group("pid") else None
        if len(head) > 1:
            name_m = _NAME.match(head[1].strip())
            if name_m is not None:
                value = name_m.group("name").strip()
                name = None if value in ("", "<unknown>", "'<unknown>'") else value
    return KernelXid(xid=int(m.group("xid")), pci=m.group("pci"), pid=pid, name=name, text=text,
                     line=line, timestamp=_timestamp(line[:at].strip()))


def _timestamp(prefix: str) -> str | None:
    for pattern in (_DMESG_TS, _ISO_TS, _SYSLOG_TS):
        m = pattern.match(prefix)
        if m is not None:
            return m.group("ts")
    return None


def _later(stamp: str | None, than: str) -> bool:
    """Whether a line's stamp comes after ``than``: seconds since boot compare as numbers, ISO
    and syslog stamps as text."""
    if stamp is None:
        return False
    try:
        return float(stamp) > float(than)
    except ValueError:
        return stamp > than


class LogUnavailable(Exception):
    """Raised by a line source when the kernel log cannot be read here; the message says why
    (it becomes :attr:`KernelLog.note`)."""


ReadLines = Callable[[], Sequence[str]]


class DmesgReader:
    """The default line source: the whole kernel ring buffer, read with ``dmesg``.

    ``dmesg --time-format iso`` is tried first (wall-clock times line up with the run's own
    timestamps), plain ``dmesg`` where that option is missing (busybox, old util-linux).
    """

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self._argv: list[str] | None = None

    def __call__(self) -> list[str]:
        if not sys.platform.startswith("linux"):
            raise LogUnavailable("the kernel log is read only on Linux")
        candidates = [self._argv] if self._argv else [["dmesg", "--time-format", "iso"],
                                                      ["dmesg"]]
        reason = ""
        for argv in candidates:
            try:
                done = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                                      timeout=self.timeout_s, check=False)
            except FileNotFoundError:
                raise LogUnavailable("dmesg is not installed, so the kernel log cannot be "
                                     "read") from None
            except (OSError, subprocess.SubprocessError) as exc:
                reason = f"dmesg failed: {exc}"
                continue
            if done.returncode == 0:
                self._argv = argv
                return done.stdout.splitlines()
            reason = (done.stderr.strip() or f"dmesg exited with {done.returncode}")
        if "not permitted" in reason.lower() or "permission" in reason.lower():
            reason += (" (kernel.dmesg_restrict=1: reading the kernel log needs root or "
                       "CAP_SYSLOG)")
        raise LogUnavailable(f"cannot read the kernel log: {reason}")


class KmsgReader:
    """The records logged since the last call, from ``/dev/kmsg``: opened at its end, so the
    first call returns what came after the opening. Each line is given the ``dmesg --time-format
    iso`` look (the record's boot-time stamp made wall time), so :func:`parse_xid_line` reads it
    like any. A crash soak fills the ring buffer with Xid lines; reading only the new ones keeps
    a poll small and the run's memory flat."""

    incremental = True

    def __init__(self, path: str = "/dev/kmsg") -> None:
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self._fd, 0, os.SEEK_END)
        except OSError as exc:
            self._fd = None
            raise LogUnavailable(f"cannot read {path}: {exc.strerror or exc}") from None

    def __call__(self) -> list[str]:
        if self._fd is None:
            raise LogUnavailable("the kernel log reader was closed")
        lines: list[str] = []
        offset = time.time() - time.monotonic()  # the kernel stamps records in boot time
        while True:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:  # nothing more yet
                return lines
            except BrokenPipeError:  # records were overwritten before we read them: go on
                continue
            except OSError as exc:
                raise LogUnavailable(f"reading /dev/kmsg failed: {exc}") from None
            if not record:
                return lines
            # One record a read from /dev/kmsg: "prio,seq,usec,flags;message", then lines
            # beginning with a space that carry key=value pairs.
            for entry in record.decode("utf-8", "replace").splitlines():
                if not entry or entry.startswith(" "):
                    continue
                head, _, message = entry.partition(";")
                try:
                    wall = offset + int(head.split(",")[2]) / 1e6
                except (IndexError, ValueError):
                    lines.append(entry)
                    continue
                stamp = _dt.datetime.fromtimestamp(wall, _dt.timezone.utc)
                lines.append(stamp.strftime("%Y-%m-%dT%H:%M:%S,%f+00:00 ") + message)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _default_source() -> ReadLines:
    if sys.platform.startswith("linux"):
        try:
            return KmsgReader()
        except LogUnavailable:
            pass
    return DmesgReader()


class KernelLog:
    """Collects the Xid lines the kernel logs during a run.

    Call :meth:`start` before the run (what is already in the log is not reported), then
    :meth:`poll` as often as useful: each call returns the Xid lines that appeared since the
    last one. Neither ever raises; when the log cannot be read, ``available`` is False and
    ``note`` says why. ``read_lines`` returns the whole current log (one string a line) or
    raises :class:`LogUnavailable`; tests pass a fake. A source marked ``incremental`` (the
    default where ``/dev/kmsg`` opens: :class:`KmsgReader`) returns only the lines logged since
    its last call; otherwise (``dmesg``) the lines after the previous read's last ones are new.
    Nothing but those last lines is kept between polls: a run's memory does not grow with the
    kernel log.
    """

    # Lines of the previous read that mark where it ended. More than one, so a line repeated
    # verbatim (no timestamps in the log) is unlikely to be taken for the marker.
    _TAIL = 5

    def __init__(self, read_lines: ReadLines | None = None) -> None:
        self._read: ReadLines = read_lines if read_lines is not None else _default_source()
        self._incremental = bool(getattr(self._read, "incremental", False))
        self._started = False
        self._baseline = False
        self._tail: list[str] = []
        self._collected: list[KernelXid] = []
        self.available = False
        self.note = "not started"

    def start(self) -> bool:
        """Remember where the log ends now; return :attr:`available`."""
        self._started = True
        lines = self._read_safely()
        if lines is not None:
            self._remember(lines)
        return self.available

    def poll(self) -> list[KernelXid]:
        """The Xid lines logged since the last :meth:`start` or :meth:`poll` (empty when the log
        cannot be read)."""
        if not self._started:
            self.start()
            return []
        lines = self._read_safely()
        if lines is None:
            return []
        if not self._baseline:
            # start() could not read the log: the first read that works is the baseline, since
            # its lines cannot be told apart from those that were there before the run.
            self._remember(lines)
            return []
        fresh = lines if self._incremental else self._new_lines(lines)
        self._remember(lines)
        found = [x for x in (parse_xid_line(line) for line in fresh) if x is not None]
        self._collected.extend(found)
        return found

    @property
    def collected(self) -> list[KernelXid]:
        """Every Xid line :meth:`poll` has returned so far."""
        return list(self._collected)

    def _read_safely(self) -> list[str] | None:
        try:
            lines = [str(line).rstrip("\r\n") for line in self._read()]
        except LogUnavailable as exc:
            self.available, self.note = False, str(exc)
            return None
        except Exception as exc:  # a line source must never break the run it watches
            self.available = False
            self.note = f"cannot read the kernel log: {type(exc).__name__}: {exc}"
            return None
        self.available, self.note = True, ""
        return lines

    def close(self) -> None:
        """Let go of the log (an open ``/dev/kmsg``); polls then report nothing."""
        close = getattr(self._read, "close", None)
        if close is not None:
            close()

    def _remember(self, lines: list[str]) -> None:
        self._baseline = True
        if not self._incremental:  # an incremental source needs no marker
            self._tail = lines[-self._TAIL:]

    def _new_lines(self, lines: list[str]) -> list[str]:
        tail, k = self._tail, len(self._tail)
        if k == 0:
            return lines
        for end in range(len(lines), k - 1, -1):
            if lines[end - k:end] == tail:
                return lines[end:]
        # The marker rotated out of the ring buffer (or the log was cleared): the lines stamped
        # after the previous read's last one are new; without stamps, all of them.
        last = _timestamp(tail[-1])
        if last is None:
            return lines
        return [line for line in lines if _later(_timestamp(line), last)]

"""Xid lines from the kernel log: a parser, and a reader that reports the lines a run added.

The kernel-log line is the only Xid record that names the process (``pid=516, name=python3``),
which is how a trial's Xid is told apart from one a neighbour on a shared GPU caused. NVML's Xid
events (harness/nvml.py) arrive sooner but carry no pid, so the harness uses both.

Reading the kernel log often needs privileges (``kernel.dmesg_restrict=1`` means root or
CAP_SYSLOG); when it cannot be read, :class:`KernelLog` says why in ``note`` and reports nothing.
"""

from __future__ import annotations

import re
import subprocess
import sys
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


class KernelLog:
    """Collects the Xid lines the kernel logs during a run.

    Call :meth:`start` before the run (what is already in the log is not reported), then
    :meth:`poll` as often as useful: each call returns the Xid lines that appeared since the
    last one. Neither ever raises; when the log cannot be read, ``available`` is False and
    ``note`` says why. ``read_lines`` returns the whole current log (one string a line) or
    raises :class:`LogUnavailable`; tests pass a fake, the default runs ``dmesg``.
    """

    # Lines of the previous read that mark where it ended. More than one, so a line repeated
    # verbatim (no timestamps in the log) is unlikely to be taken for the marker.
    _TAIL = 5

    def __init__(self, read_lines: ReadLines | None = None) -> None:
        self._read: ReadLines = read_lines if read_lines is not None else DmesgReader()
        self._started = False
        self._baseline = False
        self._tail: list[str] = []
        self._previous: set[str] = set()
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
        fresh = self._new_lines(lines)
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

    def _remember(self, lines: list[str]) -> None:
        self._baseline = True
        self._tail = lines[-self._TAIL:]
        self._previous = set(lines)

    def _new_lines(self, lines: list[str]) -> list[str]:
        tail, k = self._tail, len(self._tail)
        if k == 0:
            return lines
        for end in range(len(lines), k - 1, -1):
            if lines[end - k:end] == tail:
                return lines[end:]
        # The marker rotated out of the ring buffer (or the log was cleared): everything not
        # in the previous read is new.
        return [line for line in lines if line not in self._previous]

"""How far a watched process may run ahead of the watch that reads its events file.

The watch reads a capture file as it grows, and gives back to the disk what it has analysed
(:func:`harness.capture.events.give_back`); what it has not read yet stays on the disk. A
program that issues ops faster than the watch analyses them (a launch-bound loop soaked for
hours) would fill the disk it writes to, and harm the program. So the watch says, in a small
file beside the events (:func:`mark_of`), how far it has read (:class:`ReadMark`), and the
process's sink, after each write, waits while it is more than its limit ahead
(:class:`Backlog`). The detector orders ops by what the program says, not by when they ran, so
a wait hides no race from it; it only slows the program to the watch's pace, and the run's notes
say for how long. A watch that stops reading (killed, hung) is waited for once, for
:data:`STALL_S`, and never again.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

WAIT_S = 0.01
"""Seconds between two looks at the watch's mark while a process waits for it."""

STALL_S = 5.0
"""Seconds without the watch reading on after which a process stops waiting for it (the watch
reads and analyses at most a few MiB between two marks, in well under a second)."""

_WIDTH = 20  # a mark's digits: rewritten in place, each mark as long as the last


def mark_of(events: Path) -> Path:
    """The file where the watch says how far it has read ``events``: a byte offset."""
    return events.with_name(events.name + ".read")


class ReadMark:
    """The watch's side: says how far it has read an events file, after each read."""

    def __init__(self, events: Path) -> None:
        self.path = mark_of(events)
        self._fd: int | None = None

    def say(self, offset: int) -> None:
        with contextlib.suppress(OSError):  # unsaid, the process only waits less
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            os.pwrite(self._fd, str(offset).rjust(_WIDTH).encode(), 0)

    def close(self) -> None:
        """Once the process has ended: the mark is of no more use."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        with contextlib.suppress(OSError):
            self.path.unlink()


class Backlog:
    """The watched process's side: at most ``limit`` bytes of its events file written and not
    yet read by the watch, waited for at the sink's writes (which come at the host's waits on
    the device, and every few thousand events)."""

    def __init__(self, events: Path, limit: int) -> None:
        self.mark = mark_of(events)
        self.limit = limit
        self.allowed = limit
        self.read = 0  # the watch's offset, as last seen
        self.waits = 0
        self.waited = 0.0  # seconds, in all
        self.longest = 0.0
        self.stalled = False  # the watch stopped reading once, and is not waited for again
        self._fd: int | None = None  # the mark, open for the process's life (one sink's)

    def wrote(self, written: int) -> None:
        """The events file holds ``written`` bytes now: wait while the watch is too far
        behind."""
        if not self.limit or written - self.read <= self.limit:
            return
        self.read = self._look()
        if written - self.read <= self.limit:
            return
        started = moved = time.monotonic()
        seen = self.read
        while self.limit and written - self.read > self.limit:  # 0: another wait gave up
            time.sleep(WAIT_S)
            self.read = self._look()
            now = time.monotonic()
            if self.read != seen:
                seen, moved = self.read, now
            elif now - moved >= STALL_S:
                self.stalled, self.limit = True, 0
                break
        spent = time.monotonic() - started
        self.waits += 1
        self.waited += spent
        self.longest = max(self.longest, spent)

    def _look(self) -> int:
        try:
            if self._fd is None:
                self._fd = os.open(self.mark, os.O_RDONLY)
            return max(self.read, int(os.pread(self._fd, _WIDTH, 0)))
        except (OSError, ValueError):  # no mark yet, or one being rewritten
            return self.read

    def note(self) -> str:
        """What waiting cost the process, in words ("" if it never waited)."""
        if not self.waits:
            return ""
        said = (f"the process waited {self.waited:.1f} s in all, at {self.waits} of its "
                f"writes of events (the longest {self.longest:.2f} s), for the watch to read "
                f"on: it ran more than {self.allowed / (1 << 20):,.0f} MiB ahead, the most "
                "--disk-mb leaves for events not yet analysed (--disk-mb 0: no limit)")
        if self.stalled:
            said += (f"; the watch read nothing for {STALL_S:g} s once, and the process "
                     "ran on without waiting from then on")
        return said

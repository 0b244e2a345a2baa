"""Stand-ins for the NVML helper process's entry point (harness.gpu.watchproc.watcher_main),
for the watchdog's tests: a helper that hangs, one whose NVML event wait is stuck, one that
dies the first time it runs. Each runs in a spawned process, so each is a module function."""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection
from pathlib import Path

from harness.gpu.watchproc import serve

MARKER = "GPURACE_TEST_HELPER_MARKER"
"""A file the helper that dies once makes on its first run (its path in this variable)."""


class _Watching:
    """A watcher that registered one GPU and whose event wait returned ``age_s`` ago."""

    watched = [0]
    note = ""
    available = True

    def __init__(self, age_s: float = 0.0) -> None:
        self.beat = time.monotonic() - age_s

    def start(self) -> bool:
        return True

    def stop(self) -> None:
        pass


def hangs(conn: Connection, parent_pid: int, wait_ms: int) -> None:
    """Says it is ready, then answers nothing (a helper stuck in a driver call)."""
    conn.send(("ready", True, [0], ""))
    time.sleep(3600)


def stuck_wait(conn: Connection, parent_pid: int, wait_ms: int) -> None:
    """Answers pings, but its event wait has not returned for ten minutes."""
    serve(conn, lambda on_event: _Watching(age_s=600.0), lambda index: {"available": True})


def dies_once(conn: Connection, parent_pid: int, wait_ms: int) -> None:
    """Dies soon after it is ready the first time; serves as a helper should after that."""
    marker = Path(os.environ[MARKER])
    if not marker.exists():
        marker.write_text("ran\n")
        conn.send(("ready", True, [0], ""))
        time.sleep(0.2)
        os._exit(3)
    serve(conn, lambda on_event: _Watching(), lambda index: {"available": True})

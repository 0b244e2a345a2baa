"""NVML Xid watching in a process of its own, so the run's parent loads no GPU library.

A crash soak is the parent's longest job: thousands of worker deaths, each one an Xid event.
Whatever memory the driver's libraries take per event or per context teardown would stay with
the process that loaded them; here that is a small helper that ends with the run, and the
parent that supervises the workers holds only Python objects.

The helper runs :class:`NvmlWatcher` and sends each event to the parent as it arrives. The parent
side, :class:`WatcherProcess`, answers the questions :class:`~harness.gpu.watch.GpuWatch` asks
(``available``, ``note``, ``events_between``) from what has arrived. Messages, child to parent:
``("ready", available, watched, note)`` once, ``("event", XidEvent)`` each, ``("health", snapshot)``
for each ``("health", index)`` the parent asks, ``("stopped", note)`` last. Parent to child:
``("health", index)`` and ``("stop",)``. NVML's health snapshots for reports are taken here too.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from harness.gpu.nvml import NvmlWatcher, XidEvent, health_snapshot

START_TIMEOUT_S = 30.0
"""How long the parent waits for the helper to register for events: Python's start and NVML's
registration, on a loaded host."""

HEALTH_TIMEOUT_S = 30.0
"""How long a health snapshot may take: each of its NVML queries can wait on a busy driver."""


def watcher_main(conn: Connection, parent_pid: int, wait_ms: int) -> None:
    """Entry point of the helper process (see the module docstring)."""
    from harness.worker import die_with_parent

    die_with_parent(parent_pid)
    serve(conn, lambda on_event: NvmlWatcher(on_event=on_event, wait_ms=wait_ms))


def serve(conn: Connection, make_watcher: Callable[[Callable[[XidEvent], None]], Any],
          snapshot: Callable[[int | None], dict[str, Any]] | None = None) -> None:
    """The helper's work: watch, send each event, answer health requests, stop when asked or
    when the parent's end of the pipe closes."""
    lock = threading.Lock()  # the watcher thread and this one both send

    def send(*message: Any) -> None:
        with lock:
            try:
                conn.send(message)
            except OSError:
                pass  # the parent is gone: the parent-death signal ends this process

    watcher = make_watcher(lambda ev: send("event", ev))
    available = watcher.start()
    send("ready", available, watcher.watched, watcher.note)
    try:
        while True:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                break  # the parent is gone
            if request[0] == "stop":
                break
            if request[0] == "health":
                index = request[1]
                send("health", snapshot(index) if snapshot else health_snapshot(index=index))
    finally:
        watcher.stop()
        send("stopped", watcher.note)
        conn.close()


class WatcherProcess:
    """The parent's side of the helper: the same questions as :class:`NvmlWatcher`, answered
    from the events the helper has sent. Never raises; a helper that could not start or died
    leaves ``available`` False or the events so far, and a ``note`` that says so."""

    def __init__(self, wait_ms: int = 500) -> None:
        self.wait_ms = wait_ms
        self._conn: Connection | None = None
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._events: list[XidEvent] = []
        self._notes: list[str] = []
        self._available = False
        self._watched: list[int] = []

    def start(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """Start the helper and wait until it has registered; return :attr:`available`."""
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=watcher_main, args=(child, os.getpid(), self.wait_ms),
                           name="gpurace-nvml-watcher", daemon=True)
        try:
            proc.start()
        except OSError as exc:
            self._notes.append(f"the NVML watcher process could not start: {exc}")
            return False
        child.close()
        self._conn, self._proc = parent, proc
        ready = self._await_ready(parent, timeout_s)
        if ready is None:
            self._notes.append(self._gone("did not start"))
            self._close()
            return False
        _, self._available, self._watched, note = ready
        if note:
            self._notes.append(note)
        self._drain()
        return self._available

    def _await_ready(self, conn: Connection, timeout_s: float) -> tuple | None:
        """The helper's "ready", or None if it did not come in time. Events can come before
        it: the watcher thread sends as soon as it is registered."""
        deadline = time.monotonic() + timeout_s
        try:
            while conn.poll(max(deadline - time.monotonic(), 0)):
                message = conn.recv()
                if message[0] == "ready":
                    return message  # type: ignore[no-any-return]
                self._take(message)
        except (EOFError, OSError):
            pass
        return None

    @property
    def available(self) -> bool:
        return self._available

    @property
    def watched(self) -> list[int]:
        return list(self._watched)

    @property
    def note(self) -> str:
        self._drain()
        return "; ".join(self._notes)

    @property
    def events(self) -> list[XidEvent]:
        self._drain()
        return list(self._events)

    def events_between(self, t0: float, t1: float) -> list[XidEvent]:
        """Events whose wall time lies in ``[t0, t1]`` (``time.time()`` values)."""
        return [e for e in self.events if t0 <= e.wall_time <= t1]

    def health(self, index: int | str | None = None) -> dict[str, Any]:
        """NVML's health snapshot of GPU ``index`` (NVML's number or the GPU's UUID; by default
        the workers' GPU), taken by the helper; taken here when the helper is not running."""
        conn = self._conn
        if conn is not None:
            try:
                conn.send(("health", index))
                while conn.poll(HEALTH_TIMEOUT_S):
                    message = conn.recv()
                    if message[0] == "health":
                        return message[1]  # type: ignore[no-any-return]
                    self._take(message)
            except (EOFError, OSError):
                pass
        return health_snapshot(index=index)

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the helper to stop and wait for it; safe to call twice."""
        conn = self._conn
        if conn is None:
            return
        try:
            conn.send(("stop",))
            limit = timeout_s if timeout_s is not None else self.wait_ms / 1000 + 5.0
            while conn.poll(limit):
                message = conn.recv()
                self._take(message)
                if message[0] == "stopped":
                    break
        except (EOFError, OSError):
            pass
        self._close()

    def _drain(self) -> None:
        """Take every message the helper has sent so far, without waiting."""
        conn = self._conn
        if conn is None:
            return
        try:
            while conn.poll(0):
                self._take(conn.recv())
        except (EOFError, OSError):
            self._notes.append(self._gone("stopped during the run; Xids after this are not "
                                          "watched"))
            self._available = False
            self._close()

    def _take(self, message: tuple) -> None:
        kind = message[0]
        if kind == "event":
            self._events.append(message[1])
        elif kind == "stopped" and message[1]:
            for note in message[1].split("; "):
                if note not in self._notes:
                    self._notes.append(note)

    def _gone(self, what: str) -> str:
        proc = self._proc
        if proc is not None:
            proc.join(1.0)
        code = proc.exitcode if proc is not None else None
        how = "" if code is None else f" (exit code {code})"
        return f"the NVML watcher process {what}{how}"

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        proc = self._proc
        if proc is not None:
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
            self._proc = None

"""NVML Xid watching in a process of its own, so the run's parent loads no GPU library.

A crash soak is the parent's longest job: thousands of worker deaths, each one an Xid event.
Whatever memory the driver's libraries take per event or per context teardown would stay with
the process that loaded them; here that is a small helper that ends with the run, and the
parent that supervises the workers holds only Python objects.

The helper runs :class:`NvmlWatcher` and sends each event to the parent as it arrives. The parent
side, :class:`WatcherProcess`, answers the questions :class:`~harness.gpu.watch.GpuWatch` asks
(``available``, ``note``, ``events_since``) from what has arrived. Messages, child to parent:
``("ready", available, watched, note)`` once, ``("event", XidEvent)`` each, ``("health", snapshot)``
for each ``("health", index)`` the parent asks, ``("pong", age_s)`` for each ``("ping",)``,
``("stopped", note)`` last. Parent to child: ``("health", index)``, ``("ping",)`` and
``("stop",)``. NVML's health snapshots for reports are taken here too.

The helper is watched in turn. The parent pings it every PING_EVERY_S as it reads its events;
a helper that has died (its pipe closed), does not answer within HUNG_AFTER_S, or whose NVML
event wait has not returned for that long (a driver call stuck: the pong says how long) is
killed and started again, once. Each such gap is said (:attr:`WatcherProcess.gaps`): when
watching stopped and when it came back, or that Xid watching is off for the rest of the run
after a second loss, so a run's Xids are never silently incomplete.
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

PING_EVERY_S = 5.0
"""How often the parent asks the helper whether it is alive (as it reads its events)."""

HUNG_AFTER_S = 30.0
"""A helper that has not answered a ping, or whose NVML event wait has not returned, for this
long is taken for hung: as long as a health snapshot may take."""

RESTARTS = 1
"""Times a helper that died or hung is started again before Xid watching is given up."""


def watcher_main(conn: Connection, parent_pid: int, wait_ms: int) -> None:
    """Entry point of the helper process (see the module docstring)."""
    from harness.processes.lifetime import die_with_parent

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
            elif request[0] == "ping":
                # How long the event wait has been away; a watcher that watches nothing has
                # no wait to be stuck in.
                send("pong", time.monotonic() - watcher.beat if watcher.available else 0.0)
    finally:
        watcher.stop()
        send("stopped", watcher.note)
        conn.close()


class WatcherProcess:
    """The parent's side of the helper: the same questions as :class:`NvmlWatcher`, answered
    from the events the helper has sent. Never raises; a helper that could not start or died
    leaves ``available`` False or the events so far, and a ``note`` that says so."""

    def __init__(self, wait_ms: int = 500, *,
                 target: Callable[[Connection, int, int], None] = watcher_main,
                 on_gap: Callable[[str], None] | None = None,
                 hung_after_s: float = HUNG_AFTER_S, ping_every_s: float = PING_EVERY_S
                 ) -> None:
        self.wait_ms = wait_ms
        self._target = target  # the helper's entry point (tests give fakes that die or hang)
        self._on_gap = on_gap
        self.hung_after_s = hung_after_s
        self.ping_every_s = ping_every_s
        self._conn: Connection | None = None
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._events: list[XidEvent] = []
        self._notes: list[str] = []
        self._available = False
        self._watched: list[int] = []
        self.gaps: list[str] = []  # each time watching stopped during the run, in words
        self._restarts = RESTARTS
        self._pinged: float | None = None  # when the ping not yet answered was sent
        self._last_ping = time.monotonic()
        self._hung = ""  # why the helper is taken for hung, once a pong said so

    def start(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """Start the helper and wait until it has registered; return :attr:`available`."""
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=self._target, args=(child, os.getpid(), self.wait_ms),
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
        if note and note not in self._notes:
            self._notes.append(note)
        self._pinged, self._last_ping = None, time.monotonic()
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

    def events_since(self, t0: float) -> list[XidEvent]:
        """Events that arrived at or after ``t0``, a ``time.monotonic()`` value: the clock
        both processes share, which a step of the wall clock (NTP, a VM resumed) leaves
        alone."""
        return [e for e in self.events if e.monotonic_time >= t0]

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
                self._lost(f"did not answer a health request within {HEALTH_TIMEOUT_S:g} s")
            except (EOFError, OSError):
                self._lost("died")
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
        """Take every message the helper has sent so far, without waiting; and see that it
        lives (see the module docstring)."""
        conn = self._conn
        if conn is None:
            return
        try:
            while conn.poll(0):
                self._take(conn.recv())
            now = time.monotonic()
            if self._hung:
                self._lost(self._hung)
            elif self._pinged is not None and now - self._pinged > self.hung_after_s:
                self._lost(f"did not answer for {now - self._pinged:.0f} s")
            elif self._pinged is None and now - self._last_ping >= self.ping_every_s:
                conn.send(("ping",))
                self._pinged = self._last_ping = now
        except (EOFError, OSError):
            self._lost("died")

    def _lost(self, why: str) -> None:
        """The helper died or hung: put it down, and start it again once (the gap said)."""
        self._hung = ""
        gone = self._gone(why)
        when = time_of_day()
        self._available = False
        self._close()
        if self._restarts <= 0:
            self._gap(f"{gone} at {when} again: Xid watching is off for the rest of the run "
                      "(NVML events after this are not seen)")
            return
        self._restarts -= 1
        self.start()
        if self._conn is not None:  # it runs again (whether NVML is there is its own note)
            self._gap(f"{gone} at {when}; a new one watches since {time_of_day()} (NVML "
                      "events between were not seen)")
        else:
            self._gap(f"{gone} at {when}, and a new one could not start: Xid watching is off "
                      f"for the rest of the run ({self.note})")

    def _gap(self, text: str) -> None:
        self.gaps.append(text)
        if text not in self._notes:
            self._notes.append(text)
        if self._on_gap is not None:
            self._on_gap(text)

    def _take(self, message: tuple) -> None:
        kind = message[0]
        if kind == "event":
            self._events.append(message[1])
        elif kind == "pong":
            self._pinged = None
            if message[1] > self.hung_after_s:
                self._hung = f"was stuck in NVML's event wait for {message[1]:.0f} s"
        elif kind == "stopped" and message[1]:
            for note in message[1].split("; "):
                if note not in self._notes:
                    self._notes.append(note)

    def _gone(self, what: str) -> str:
        proc = self._proc
        if proc is not None and what == "died":
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


def time_of_day() -> str:
    """The time of day, for a gap's words (the run's log and run.json say the date)."""
    return time.strftime("%H:%M:%S", time.localtime())

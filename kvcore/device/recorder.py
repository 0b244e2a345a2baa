"""The recorder: what a device's actions go through while a program is captured.

A :class:`~kvcore.device.base.Device` makes every backend action (``_do_copy``,
``_do_sync_stream``, ...), every backend call a program cannot stand for (``_do_query``, ...)
and every op-log record through one attribute, ``Device._actions``. Normally that is the
device itself. While :meth:`Device.capture` runs it is a :class:`Recorder`, which adds an item
to the program and passes the call on to the device. The calls a backend makes to itself go
straight to the device, so a program holds the actions the device's ops took, not the steps
inside them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from kvcore.device.handles import Buffer, Stream
from kvcore.device.oplog import Access, OpLog, Template
from kvcore.device.program import ACTION, CALL, RECORD, Item, Live, Program, Where

REFUSED = {
    "_do_query": "an event query (what it sees depends on the device's timing)",
    "_do_alloc": "an allocation",
    "_do_event": "an event's creation",
    "_do_stream": "a stream's creation",
}
"""Backend calls that make a captured program unfit to issue again, and why."""


class _Device(Protocol):
    """What a recorder reads of its device (a ``kvcore.device.base.Device``, which builds the
    recorder and so is not imported here), besides the actions it passes calls on to."""

    oplog: OpLog
    _live_store: np.ndarray | None  # what a live host_write stores, meanwhile
    _live_value: Live | None  # a memset's Live byte, meanwhile

    def _record(self, stream: str, kind: str, reads: tuple[Access, ...],
                writes: tuple[Access, ...], records: str | None, waits: str | None,
                syncs: str | None, times: object, info: dict[str, object]) -> None: ...


class Recorder:
    """Records one capture into ``program`` while passing every call on to ``device``."""

    def __init__(self, device: _Device, program: Program) -> None:
        self.device = device
        self.program = program
        # > 0 inside a call the program holds (an action, a call captured as itself): what
        # that call does in turn is its own doing, so the program holds none of it.
        self.depth = 0

    # ---- actions: each is an item, issued again as it was called -----------------------------
    def _do_record(self, *args: Any) -> Any:
        return self._action("_do_record", args)

    def _do_wait(self, *args: Any) -> Any:
        return self._action("_do_wait", args)

    def _do_copy(self, *args: Any) -> Any:
        return self._action("_do_copy", args)

    def _do_copy_2d(self, *args: Any) -> Any:
        return self._action("_do_copy_2d", args)

    def _do_memset(self, dst: Buffer, off: int, nbytes: int, value: int, stream: Stream) -> Any:
        # A Live byte is kept as itself: the program sets what it holds when issued again.
        live = self.device._live_value
        kept = (dst, off, nbytes, value if live is None else live, stream)
        return self._action("_do_memset", (dst, off, nbytes, value, stream), kept)

    def _do_launch(self, *args: Any) -> Any:
        return self._action("_do_launch", args)

    def _do_graph_launch(self, *args: Any) -> Any:
        return self._action("_do_graph_launch", args)

    def _do_fill(self, *args: Any) -> Any:
        return self._action("_do_fill", args)

    def _do_write(self, buf: Buffer, off: int, raw: np.ndarray) -> Any:
        # The program keeps a copy of the bytes, since the caller may reuse its array; but
        # not of a live store's, whose bytes it reads again each time it is issued.
        kept = raw if raw is self.device._live_store else raw.copy()
        return self._action("_do_write", (buf, off, raw), (buf, off, kept))

    def _do_host_view(self, *args: Any) -> Any:
        return self._action("_do_host_view", args)

    def _do_sync_device(self, *args: Any) -> Any:
        return self._action("_do_sync_device", args)

    def _do_sync_stream(self, *args: Any) -> Any:
        return self._action("_do_sync_stream", args)

    def _do_sync_event(self, *args: Any) -> Any:
        return self._action("_do_sync_event", args)

    # The host's steps: they move a simulated device's clock, so a program makes them too.
    def _do_host_step(self, *args: Any) -> Any:
        return self._action("_do_host_step", args)

    def _do_host_thread_switch(self, *args: Any) -> Any:
        return self._action("_do_host_thread_switch", args)

    # ---- calls a program cannot stand for: the program is refused ----------------------------
    def _do_query(self, *args: Any) -> Any:
        return self._refused("_do_query", args)

    def _do_alloc(self, *args: Any) -> Any:
        return self._refused("_do_alloc", args)

    def _do_event(self, *args: Any) -> Any:
        return self._refused("_do_event", args)

    def _do_stream(self, *args: Any) -> Any:
        return self._refused("_do_stream", args)

    # ---- records and calls captured as themselves ---------------------------------------------
    def _record(self, stream: str, kind: str, reads: tuple[Access, ...],
                writes: tuple[Access, ...], records: str | None, waits: str | None,
                syncs: str | None, times: object, info: dict[str, object]) -> None:
        """The device's record, and its template in the program: the record of the action
        just taken, or an item of its own (an owner change, which no action writes)."""
        device = self.device
        device._record(stream, kind, reads, writes, records, waits, syncs, times, info)
        if self.depth:
            return  # inside a call captured as itself: it writes its records again
        # After the device's _record: it has put the thread into ``info``.
        template = Template(stream, kind, reads, writes, records, waits, syncs,
                            device.oplog.step, info, times is not None, device._live_value)
        items = self.program.items
        last = items[-1] if items else None
        if last is not None and last.kind == ACTION and last.template is None:
            items[-1] = Item(last.kind, last.name, last.fn, last.args, template, last.where)
        else:
            items.append(Item(RECORD, "_record", None, (), template, self._where()))

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``fn(*args)``, captured as itself (see ``Device.reissued``)."""
        if self.depth:
            return fn(*args)
        name = getattr(fn, "__name__", "call")
        return self._hold(Item(CALL, name, fn, args, None, self._where()), args)

    # ---- the one place items are made ---------------------------------------------------------
    def _action(self, name: str, args: tuple[Any, ...],
                kept: tuple[Any, ...] | None = None) -> Any:
        """The device's action ``name`` called with ``args``, and an item of the program that
        calls it again with ``kept`` (``args`` unless given)."""
        action = getattr(self.device, name)
        if self.depth:
            return action(*args)
        item = Item(ACTION, name, action, args if kept is None else kept, None, self._where())
        return self._hold(item, args)

    def _refused(self, name: str, args: tuple[Any, ...]) -> Any:
        if not self.depth:
            self.program.refuse(REFUSED[name])
        return getattr(self.device, name)(*args)

    def _hold(self, item: Item, args: tuple[Any, ...]) -> Any:
        """Add ``item`` to the program and make its call (with ``args``, what the caller was
        given), capturing none of the calls it makes in turn."""
        assert item.fn is not None
        self.program.items.append(item)
        self.depth += 1
        try:
            return item.fn(*args)
        finally:
            self.depth -= 1

    def _where(self) -> Where:
        log = self.device.oplog
        return Where(log.step, log.origin, log.thread)

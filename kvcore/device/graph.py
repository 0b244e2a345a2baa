"""CUDA graphs: a stream's work captured once, launched again as a unit on any stream.

Between :meth:`Device.begin_graph` and :meth:`Device.end_graph` the stream ops issued to the
capturing stream (copies, memsets, kernel launches) do not run: each becomes a :class:`Node`
of the graph, with the op-log record it will write. :meth:`Device.launch_graph` runs the nodes
on the stream it is given, in capture order, after the work issued to that stream before it
and before the work issued after it; other streams are ordered with it only by events, as with
any stream op. What the nodes read is read when they run: a copy from pinned memory takes the
bytes the host left there by the time the launched graph reaches it, not those of the capture.
What they touch is fixed at capture: the same buffers and byte ranges every launch.

A capture may fork and join, as CUDA's does: an event recorded on a capturing stream marks a
point of the graph, another stream that waits for it joins the capture (its ops become nodes
of a branch that starts there), and the capture stream waiting for an event the branch recorded
joins the branch back. Launched, a branch runs beside the launching stream's nodes, ordered
with them only by those edges; every branch must be joined back before the capture ends
(cudaErrorStreamCaptureUnjoined), so the work issued to the launching stream after the launch
waits for all of it.

What CUDA refuses while a stream captures, the device refuses with CUDA's reason: the host
waiting for the device (cudaErrorStreamCaptureUnsupported), an allocation, and a captured wait
for an event recorded outside the capture (cudaErrorStreamCaptureIsolation).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvcore.device.handles import Event
from kvcore.errors import DeviceUsageError

STREAM_AT = {"_do_copy": 5, "_do_copy_2d": 8, "_do_memset": 4, "_do_launch": 1}
"""Where each capturable backend action takes its stream: a launch puts its own stream there."""

START = -1
"""The point of a graph before its first node: where a branch forked before any node starts."""


@dataclass(frozen=True)
class Node:
    """One captured op: the backend action (``name``, ``args``, the capturing stream among
    them), and the fields of its op-log record (``kind``, ``reads``, ``writes``, ``detail``),
    with the op log's step and origin when it was captured; ``branch``, the stream that
    captured it, and ``after``, the nodes of other branches (or :data:`START`) it waits for."""

    name: str
    args: tuple[Any, ...]
    kind: str
    reads: tuple[Any, ...]
    writes: tuple[Any, ...]
    detail: dict[str, object]
    step: str | None
    origin: str | None
    branch: str = ""
    after: tuple[int, ...] = ()

    def on(self, stream: object) -> tuple[Any, ...]:
        """The action's arguments with ``stream`` in the capturing stream's place."""
        at = STREAM_AT[self.name]
        return (*self.args[:at], stream, *self.args[at + 1:])


@dataclass(frozen=True)
class Plan:
    """How a launch orders a graph's branches: the nodes (or :data:`START`) whose point another
    branch waits for (``marked``), the cross-branch waits before each node (``waits``), and the
    branches' points the launching stream waits for after the last node (``tail``)."""

    marked: frozenset[int]
    waits: tuple[tuple[int, ...], ...]
    tail: tuple[int, ...]


class LaunchRecord(NamedTuple):
    """An op-log record a launch writes (see :meth:`Graph.launch_records`): a node's, or an
    edge of the launch as an event record or wait."""

    stream: str
    kind: str
    reads: tuple[Any, ...]
    writes: tuple[Any, ...]
    records: str | None
    waits: str | None
    detail: dict[str, object]


@dataclass(eq=False)
class Graph:
    """A graph being captured from ``stream``, or captured (``ended``; ``handle``: what the
    backend launches, a CUDA graph's executable on the GPU). ``branches``: the capturing
    streams by name, the capture stream first."""

    name: str
    stream: Any
    nodes: list[Node] = field(default_factory=list)
    ended: bool = False
    handle: object = None
    branches: dict[str, Any] = field(default_factory=dict)
    marks: dict[int, frozenset[int]] = field(default_factory=dict)  # event id -> its point
    _last: dict[str, int] = field(default_factory=dict)  # branch -> its last node
    _pending: dict[str, set[int]] = field(default_factory=dict)  # what a branch's next waits for
    _plan: Plan | None = None

    def __post_init__(self) -> None:
        if self.stream.legacy:
            raise DeviceUsageError("CUDA cannot capture the legacy default stream "
                                   "(cudaErrorStreamCaptureUnsupported); capture on a "
                                   "stream of your own")
        self.branches = {self.stream.name: self.stream}

    def captures(self, stream: Any) -> bool:
        return self.branches.get(stream.name) is stream

    def add(self, node: Node) -> None:
        """A node captured by the stream among its arguments (its branch), after what that
        stream waited for."""
        branch = node.args[STREAM_AT[node.name]].name
        after = tuple(sorted(self._pending.pop(branch, ())))
        self._last[branch] = len(self.nodes)
        self.nodes.append(dataclasses.replace(node, branch=branch, after=after))

    def point(self, branch: str) -> frozenset[int]:
        """What a record on ``branch`` now covers: its last node, and what it waited for."""
        covered = set(self._pending.get(branch, ()))
        if branch in self._last:
            covered.add(self._last[branch])
        return frozenset(covered or {START})

    def mark(self, event: int, branch: str) -> None:
        self.marks[event] = self.point(branch)

    def record(self, event: Event, stream: Any) -> bool:
        """An event recorded during the capture: a point of the graph, not an op, when
        ``stream`` captures (True); else the event no longer marks a point."""
        if self.captures(stream):
            self.mark(event.id, stream.name)
            return True
        self.marks.pop(event.id, None)
        return False

    def wait(self, stream: Any, event: Event) -> bool:
        """A wait during the capture: a fork into it or a join within it when ``event``
        marks a point (True); else an op, which CUDA refuses on a capturing stream."""
        if event.id in self.marks:
            self.join(stream, event.id)
            return True
        if self.captures(stream):
            raise DeviceUsageError(
                f"wait_event on {stream.name} while it captures graph {self.name!r} for "
                f"event {event.name}, recorded outside the capture: CUDA refuses that "
                "(cudaErrorStreamCaptureIsolation); make the launching stream wait before "
                "launch_graph")
        return False

    def join(self, stream: Any, event: int) -> None:
        """``stream`` waits for a point of the graph: it captures from here on (a fork), or
        its next node waits for that point (a join)."""
        self.branches.setdefault(stream.name, stream)
        self._pending.setdefault(stream.name, set()).update(self.marks[event])

    def refuse_host_wait(self, call: str) -> None:
        """Refuse ``call``, where the host waits for the device, as CUDA does in a capture."""
        raise DeviceUsageError(
            f"{call} while graph {self.name!r} is captured: the host cannot wait for the "
            "device during a capture (CUDA: cudaErrorStreamCaptureUnsupported); end the "
            "capture first")

    def check_joined(self) -> None:
        """Refuse to end a capture that a branch forked into and did not join back."""
        unjoined = self.unjoined()
        if unjoined:
            raise DeviceUsageError(
                f"stream {unjoined[0]} forked into graph {self.name!r}'s capture and was not "
                f"joined back (CUDA: cudaErrorStreamCaptureUnjoined): record an event on it "
                f"after its last op and make {self.stream.name} wait on it before end_graph")

    def unjoined(self) -> list[str]:
        """The branches whose last node the capture stream's end does not wait for."""
        seen: set[int] = set()
        todo = list(self.point(self.stream.name))
        previous = self._previous()
        while todo:
            i = todo.pop()
            if i == START or i in seen:
                continue
            seen.add(i)
            todo.extend(self.nodes[i].after)
            if previous[i] is not None:
                todo.append(previous[i])  # type: ignore[arg-type]
        return [b for b, last in self._last.items() if b != self.stream.name and last not in seen]

    def _previous(self) -> list[int | None]:
        """Each node's predecessor on its own branch."""
        last: dict[str, int] = {}
        out: list[int | None] = []
        for i, node in enumerate(self.nodes):
            out.append(last.get(node.branch))
            last[node.branch] = i
        return out

    def plan(self) -> Plan:
        """The edges a launch makes between branches (see :class:`Plan`); the same every
        launch."""
        if self._plan is None:
            origin = self.stream.name

            def branch_of(i: int) -> str:
                return origin if i == START else self.nodes[i].branch

            waits = tuple(tuple(d for d in node.after if branch_of(d) != node.branch)
                          for node in self.nodes)
            tail = tuple(sorted(d for d in self._pending.get(origin, ())
                                if branch_of(d) != origin))
            marked = frozenset(d for ds in waits for d in ds) | frozenset(tail)
            self._plan = Plan(marked, waits, tail)
        return self._plan

    def lanes(self, launched_on: str) -> dict[str, str]:
        """The op-log stream of each branch's records in a launch on ``launched_on``: that
        stream for the capture stream's, one of its own for another's (``BRANCH in graph G on
        STREAM``)."""
        origin = self.stream.name
        return {b: launched_on if b == origin else f"{b} in graph {self.name} on {launched_on}"
                for b in self.branches}

    def launch_records(self, launched_on: str, at: str | None) -> list[LaunchRecord]:
        """A launch's records: each node's on its lane (see :meth:`lanes`), and the launch's
        edges between them as event records and waits (``graph G node N``; ``graph G
        start``). A node's ``detail`` names the ``graph``, the step that captured the
        ``node``, its ``branch``, the streams it was ``captured_on`` and ``launched_on``, and
        the line that ``launched`` it (``at``), if any."""
        plan, origin, on = self.plan(), self.stream.name, self.lanes(launched_on)
        mark = {i: f"graph {self.name} node {i}" for i in plan.marked}
        mark[START] = f"graph {self.name} start"
        edge: dict[str, object] = {"graph": self.name}
        out: list[LaunchRecord] = []
        if START in plan.marked:
            out.append(LaunchRecord(launched_on, "event_record", (), (), mark[START], None,
                                    dict(edge)))
        for i, node in enumerate(self.nodes):
            lane = on[node.branch]
            for dep in plan.waits[i]:
                out.append(LaunchRecord(lane, "event_wait", (), (), None, mark[dep], dict(edge)))
            info: dict[str, object] = {**node.detail, "graph": self.name,
                                       "node": node.step or f"node {i}",
                                       "captured_on": origin, "launched_on": launched_on,
                                       "branch": node.branch}
            if node.origin is not None:
                info["origin"] = node.origin
            if at is not None:
                info["launched"] = at
            out.append(LaunchRecord(lane, node.kind, node.reads, node.writes, None, None, info))
            if i in plan.marked:
                out.append(LaunchRecord(lane, "event_record", (), (), mark[i], None, dict(edge)))
        for dep in plan.tail:
            out.append(LaunchRecord(launched_on, "event_wait", (), (), None, mark[dep],
                                    dict(edge)))
        return out

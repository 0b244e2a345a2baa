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
from typing import Any

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
        self.branches = {self.stream.name: self.stream}

    def captures(self, stream: Any) -> bool:
        return self.branches.get(stream.name) is stream

    def add(self, node: Node) -> None:
        """A node captured by ``node.branch``, after what that stream waited for."""
        after = tuple(sorted(self._pending.pop(node.branch, ())))
        self._last[node.branch] = len(self.nodes)
        self.nodes.append(dataclasses.replace(node, after=after))

    def point(self, branch: str) -> frozenset[int]:
        """What a record on ``branch`` now covers: its last node, and what it waited for."""
        covered = set(self._pending.get(branch, ()))
        if branch in self._last:
            covered.add(self._last[branch])
        return frozenset(covered or {START})

    def mark(self, event: int, branch: str) -> None:
        self.marks[event] = self.point(branch)

    def join(self, stream: Any, event: int) -> None:
        """``stream`` waits for a point of the graph: it captures from here on (a fork), or
        its next node waits for that point (a join)."""
        self.branches.setdefault(stream.name, stream)
        self._pending.setdefault(stream.name, set()).update(self.marks[event])

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

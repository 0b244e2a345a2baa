"""CUDA graphs: a stream's work captured once, launched again as a unit on any stream.

Between :meth:`Device.begin_graph` and :meth:`Device.end_graph` the stream ops issued to the
capturing stream (copies, memsets, kernel launches) do not run: each becomes a :class:`Node`
of the graph, with the op-log record it will write. :meth:`Device.launch_graph` runs the nodes
on the stream it is given, in capture order, after the work issued to that stream before it
and before the work issued after it; other streams are ordered with it only by events, as with
any stream op. What the nodes read is read when they run: a copy from pinned memory takes the
bytes the host left there by the time the launched graph reaches it, not those of the capture.
What they touch is fixed at capture: the same buffers and byte ranges every launch.

This is CUDA's single-stream capture, what ``torch.cuda.graph`` and
``cupy.cuda.Stream.begin_capture`` make of a stream's work. What CUDA refuses while a stream
captures, the device refuses with CUDA's reason: the host waiting for the device
(cudaErrorStreamCaptureUnsupported), an allocation, and a captured wait for an event recorded
outside the capture (cudaErrorStreamCaptureIsolation). Events recorded inside a capture (the
fork and join of multi-stream capture) are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STREAM_AT = {"_do_copy": 5, "_do_copy_2d": 8, "_do_memset": 4, "_do_launch": 1}
"""Where each capturable backend action takes its stream: a launch puts its own stream there."""


@dataclass(frozen=True)
class Node:
    """One captured op: the backend action (``name``, ``args``, the capturing stream among
    them), and the fields of its op-log record (``kind``, ``reads``, ``writes``, ``detail``),
    with the op log's step and origin when it was captured."""

    name: str
    args: tuple[Any, ...]
    kind: str
    reads: tuple[Any, ...]
    writes: tuple[Any, ...]
    detail: dict[str, object]
    step: str | None
    origin: str | None

    def on(self, stream: object) -> tuple[Any, ...]:
        """The action's arguments with ``stream`` in the capturing stream's place."""
        at = STREAM_AT[self.name]
        return (*self.args[:at], stream, *self.args[at + 1:])


@dataclass(eq=False)
class Graph:
    """A graph being captured from ``stream``, or captured (``ended``; ``handle``: what the
    backend launches, a CUDA graph's executable on the GPU)."""

    name: str
    stream: Any
    nodes: list[Node] = field(default_factory=list)
    ended: bool = False
    handle: object = None

"""The PyTorch source's CUDA graphs: each capture and replay, said as it happens.

``CUDAGraph.capture_begin`` and ``capture_end`` (which ``torch.cuda.graph`` and torch.compile's
cudagraph trees call) bracket a capture: the ops the sources see on the capturing stream
meanwhile are the graph's body, which the watching side keeps and issues again at each
``replay`` on the replay stream (:mod:`harness.capture.translate`). A graph is known by its
object's id: a graph captured anew is a new body.

A delay (``--amplify``) asked for at one of a graph's ops is queued on the replay stream
before each replay of the graph, since the program's lines do not issue a replay's ops: the
whole graph waits, and the program's other streams go first. A delay for a race between two
of the graph's own branches (``Delay.in_graph``) is captured into the graph instead, before
the op on its branch, so that at each replay that branch waits and the other goes first; the
spin's speed is measured before the capture begins (a capture allows no synchronize).
Kernels another source launches into a capture (Triton's, torch.compile's in
``reduce-overhead`` mode) are the graph's too: that source says them here
(:func:`captured_elsewhere`).
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from harness.capture import spin
from harness.capture.amplify import Delay


_INSTALLED: list[Graphs] = []
"""The PyTorch source's graphs, while it is installed (one in a process)."""


def captured_elsewhere(site: str | None, kind: str) -> None:
    """An op another source launched on a capturing stream (no delay queued there): the
    graphs being captured hold it, so a delay asked for at it is queued before their
    replays."""
    for graphs in _INSTALLED:
        graphs.remember(site, kind)


class Graphs:
    """The graphs being captured, and (with delays asked for) each graph's ops."""

    def __init__(self, cap: Any) -> None:
        self.cap = cap  # the PyTorch source's state
        self.capturing: set[int] = set()
        self.ops: dict[int, set[tuple[str | None, str]]] = {}  # graph -> its (site, kind)s
        _INSTALLED.append(self)

    def close(self) -> None:
        """The source is uninstalled: other sources' ops are no longer its graphs'."""
        if self in _INSTALLED:
            _INSTALLED.remove(self)

    def delay_for(self, site: str | None, kind: str) -> Delay | None:
        """The delay to queue before a stream op at ``site`` of ``kind``. While a graph is
        captured, only one for a race inside the graph (the op is remembered as the graph's,
        for the others)."""
        amplifier = self.cap.amplifier
        if not self.capturing:
            return amplifier.wants(site, kind)  # type: ignore[no-any-return]
        self.remember(site, kind)
        return amplifier.wants(site, kind, in_graph=True)  # type: ignore[no-any-return]

    def remember(self, site: str | None, kind: str) -> None:
        """An op at ``site`` of ``kind`` is one of the graphs' being captured, if any."""
        for gid in self.capturing:
            self.ops[gid].add((site, kind))

    def call(self, event: str, gid: int) -> None:
        """A graph's capture began or ended, or the graph was replayed (``event``:
        graph_begin, graph_end, graph_replay), on the current stream."""
        cap = self.cap
        frame, site = cap._edge()
        if event == "graph_end":
            self.capturing.discard(gid)
            cap.emit([event, gid, site])
            return
        sid = cap.raw_stream(cap.torch.cuda.current_device())
        cap._seen_stream(sid, frame)
        if event == "graph_begin":
            self.capturing.add(gid)
            self.ops[gid] = set()
            cap.emit([event, gid, sid, site])
        else:  # a replay's ops are issued now: the host's clock says when (for --amplify)
            cap.emit([event, gid, sid, site, perf_counter_ns()])

    def before_capture(self) -> None:
        """A capture begins: measure the spin now, if a delay may be captured into it."""
        cap = self.cap
        if cap.amplifier is not None and any(d.in_graph for d in cap.amplifier.delays):
            spin.ready(cap.torch, cap.torch.cuda.current_device())

    def before_replay(self, gid: int) -> None:
        """Queue on the current stream a delay asked for at one of the graph's ops."""
        cap = self.cap
        if cap.amplifier is None:
            return
        for site, kind in self.ops.get(gid, ()):
            delay = cap.amplifier.wants(site, kind)
            if delay is not None:
                index = cap.torch.cuda.current_device()
                cap.delay(delay, index, cap.raw_stream(index))
                return

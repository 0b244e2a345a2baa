"""The PyTorch source's CUDA graphs: each capture and replay, said as it happens.

``CUDAGraph.capture_begin`` and ``capture_end`` (which ``torch.cuda.graph`` and torch.compile's
cudagraph trees call) bracket a capture: the ops the sources see on the capturing stream
meanwhile are the graph's body, which the watching side keeps and issues again at each
``replay`` on the replay stream (:mod:`harness.capture.translate`). A graph is known by its
object's id: a graph captured anew is a new body.

Delays (``--amplify``) are never queued while a graph is captured: the spin kernel would be
captured into the graph. A delay asked for at one of a graph's ops is queued on the replay
stream before each replay of the graph instead, since the program's lines do not issue a
replay's ops.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from harness.capture.amplify import Delay


class Graphs:
    """The graphs being captured, and (with delays asked for) each graph's ops."""

    def __init__(self, cap: Any) -> None:
        self.cap = cap  # the PyTorch source's state
        self.capturing: set[int] = set()
        self.ops: dict[int, set[tuple[str | None, str]]] = {}  # graph -> its (site, kind)s

    def delay_for(self, site: str | None, kind: str) -> Delay | None:
        """The delay to queue before a stream op at ``site`` of ``kind``: none while a graph
        is captured (the op is then remembered as the graph's)."""
        if not self.capturing:
            return self.cap.amplifier.wants(site, kind)  # type: ignore[no-any-return]
        for gid in self.capturing:
            self.ops[gid].add((site, kind))
        return None

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

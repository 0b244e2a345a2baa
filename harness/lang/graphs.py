"""CUDA graphs in a step list: each graph's capture, checked per variant as the steps are read.

A graph is captured from one stream of the scenario's own, by the capturable steps between its
graph_capture and its graph_end on the streams capturing (that stream, and those that forked in
by waiting for an event recorded in the capture), on the scenario's thread; each forked stream
joins back before the graph_end. What CUDA would refuse at capture time (the legacy stream, a
wait for an event recorded outside, a fork not joined back) is refused here, at the step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from yaml.nodes import Node

from harness.lang import vocabulary as V
from harness.lang.model import StreamSpec
from harness.lang.scope import Sites
from harness.lang.yamlnodes import Fields, Reader


class _Recorded(NamedTuple):
    """An event recorded inside a capture: on which stream, after how many of its steps."""

    stream: str
    steps: int


@dataclass
class _Capture:
    """A graph's capture as one variant's steps leave it: the graph, the stream it is captured
    from and its graph_capture step; per stream capturing (the capture stream and those that
    forked in) its steps so far and how many were joined back; the events recorded inside it."""

    name: str
    stream: str
    began: int
    streams: dict[str, int] = field(default_factory=dict)
    back: dict[str, int] = field(default_factory=dict)
    events: dict[str, _Recorded] = field(default_factory=dict)


class GraphCaptures:
    """The graph being captured in each variant, and the graphs ended (module docstring)."""

    def __init__(self, reader: Reader, streams: Mapping[str, StreamSpec], sites: Sites) -> None:
        self.reader = reader
        self.streams = streams
        self.sites = sites
        self.capturing: dict[str, _Capture | None] = dict.fromkeys(sites.variants)
        self.ended: dict[str, dict[str, int]] = {v: {} for v in sites.variants}  # -> graph_end

    def step(self, f: Fields, op: str, step_id: str | None, args: dict[str, object],
             thread: str | None, runs: tuple[str, ...], index: int) -> None:
        """Step ``index``, in each variant it runs in: a replay inside the capture, before the
        graph is ended, is refused as a nested graph."""
        for v in runs:
            capture = self.capturing[v]
            if capture is not None and op != "graph_end":
                self.captured(f, op, args, thread, capture, self.sites.within(v))
            if op == "graph_capture":
                self.begins(f, step_id, args, thread, v, index)
            elif op == "graph_end":
                self.ends(f, args, v, index)

    def all_ended(self, nodes: list[Node], path: str) -> None:
        """Once every step is read: no variant is still capturing."""
        open_in = [v for v in self.sites.variants if self.capturing[v] is not None]
        if not open_in:
            return
        left = self.capturing[open_in[0]]
        assert left is not None
        name, began = left.name, left.began
        within = "" if len(open_in) == len(self.sites.variants) else \
            self.sites.within(open_in[0])
        raise self.reader.error(nodes[began], f"{path}[{began}]", (
            f"graph {name!r} is captured here and never ended{within}: add a graph_end "
            f"step (graph: {name}) after the steps it captures"))

    def captured(self, f: Fields, op: str, args: dict[str, object], thread: str | None,
                 capture: _Capture, within: str) -> None:
        """A step inside a capture: one a graph holds, on a stream capturing (or a wait that
        forks one in), on the scenario's thread."""
        reader = self.reader
        since = (f"graph {capture.name!r} is being captured (steps[{capture.began}], "
                 f"{self.sites.at(capture.began)}){within}")
        if op not in V.CAPTURABLE:
            raise reader.error(f.values["op"], f.sub("op"), f"{op} cannot stand inside a "
                               f"graph's capture ({since}): {V.NOT_CAPTURED[op]}")
        if thread is not None:
            raise reader.error(f.values[V.THREAD_KEY], f.sub(V.THREAD_KEY), (
                f"{since} on the scenario's own thread; a step of thread {thread!r} cannot "
                "join it: capture from one thread"))
        stream = str(args["stream"])
        if op == "wait_event":
            event = str(args["event"])
            if event not in capture.events:
                raise reader.error(f.values["event"], f.sub("event"), (
                    f"event {event!r} was recorded outside the capture ({since}): CUDA "
                    "refuses a captured wait for it (cudaErrorStreamCaptureIsolation); wait on "
                    "the replaying stream before graph_replay, or record the event inside"))
            recorded = capture.events[event]
            capture.streams.setdefault(stream, 0)  # a fork, when the stream was not capturing
            if stream == capture.stream and recorded.stream != capture.stream:
                # A join of what the recording stream did until its record.
                capture.back[recorded.stream] = recorded.steps
        elif stream not in capture.streams:
            forked = ", ".join(s for s in capture.streams if s != capture.stream)
            raise reader.error(f.values["stream"], f.sub("stream"), (
                f"{since} from stream {capture.stream!r}"
                + (f" (and {forked}, forked in)" if forked else "")
                + f"; this step on {stream!r} would run now, outside the graph: give it a "
                "capturing stream, fork it in (wait_event on it for an event recorded in the "
                "capture), or move it before graph_capture or after graph_end"))
        elif op == "record_event":
            capture.events[str(args["event"])] = _Recorded(stream, capture.streams[stream])
        else:
            capture.streams[stream] += 1

    def begins(self, f: Fields, step_id: str | None, args: dict[str, object],
               thread: str | None, v: str, index: int) -> None:
        reader = self.reader
        stream = str(args["stream"])
        if self.streams[stream].kind == "legacy":
            raise reader.error(f.values["stream"], f.sub("stream"), (
                f"{stream!r} is the legacy default stream, which CUDA cannot capture "
                "(cudaErrorStreamCaptureUnsupported; PyTorch: \"CUDA graphs must be captured "
                "on a non-default stream\"); capture on a stream of your own"))
        if thread is not None:
            raise reader.error(f.values[V.THREAD_KEY], f.sub(V.THREAD_KEY),
                               "a graph is captured on the scenario's own thread; remove the "
                               "thread")
        self.capturing[v] = _Capture(str(step_id), stream, index, streams={stream: 0})

    def ends(self, f: Fields, args: dict[str, object], v: str, index: int) -> None:
        reader, ended, within = self.reader, self.ended[v], self.sites.within(v)
        name = str(args["graph"])
        node, path = f.values["graph"], f.sub("graph")
        capture = self.capturing[v]
        if name in ended:
            raise reader.error(node, path, f"graph {name!r} was ended at steps[{ended[name]}] "
                               f"({self.sites.at(ended[name])}){within}; remove one graph_end")
        if capture is None or capture.name != name:
            raise reader.error(node, path, f"graph {name!r} is not being captured here{within}: "
                               "graph_end ends the graph_capture before it"
                               + (f" (now {capture.name!r})" if capture else ""))
        if not any(capture.streams.values()):
            raise reader.error(node, path, (
                f"graph {name!r} captures nothing{within}: put the stream ops it replays (on "
                f"{capture.stream!r}) between its graph_capture and this graph_end"))
        for stream, steps in capture.streams.items():
            if stream != capture.stream and capture.back.get(stream, 0) < steps:
                raise reader.error(node, path, (
                    f"stream {stream!r} forked into graph {name!r}'s capture and is not joined "
                    f"back{within} (CUDA: cudaErrorStreamCaptureUnjoined): record an event on "
                    f"{stream!r} after its last step in the capture, and make "
                    f"{capture.stream!r} wait on it before this graph_end"))
        self.capturing[v] = None
        ended[name] = index

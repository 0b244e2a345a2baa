"""The watching side on capture events in any order: it never fails, and what it says stays
its own.

A watched program's events arrive as its threads, callbacks and sources make them: a wait for
an event no source saw recorded, a replay of a graph captured before the watch began, a
capture that never ends, a free of memory no source saw handed out, a graph replayed inside
another's capture. Hypothesis draws such sequences from a small vocabulary (three streams, two
events, two graphs, four tensors); the translator and the detector must take every one without
raising, name every finding's streams as streams they were told of (or a replay's branch
stream), and find the same racing ops with the detector's pruning on and off.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.capture.analysis import RunAnalysis
from harness.races.detector import RaceDetector
from harness.races.kinds import GRAPH_BRANCH

BASE = 0x7F00_0000_0000
STREAMS = (0x11, 0x22, 0x33)
NAMES = {0x11: "s1", 0x22: "s2", 0x33: "s3"}
EVENTS = (5, 6)
FORK = 9
GRAPHS = (0x6000, 0x7000)
TENSORS = tuple(BASE + i * 4096 for i in range(4))


def _span(addr: int, part: int) -> list[Any]:
    return ["d", addr + part * 1024, 1024 * (1 + part % 2)]


stream = st.sampled_from(STREAMS)
event = st.sampled_from(EVENTS)
graph = st.sampled_from(GRAPHS)
tensor = st.sampled_from(TENSORS)
part = st.integers(0, 2)
site = st.integers(1, 60).map(lambda n: f"prog.py:{n}")

def stream_op() -> st.SearchStrategy[list[list[Any]]]:
    """A kernel on a stream writing or reading part of a tensor."""
    return st.tuples(stream, st.booleans(), tensor, part, site).map(
        lambda t: [["op", t[0], "kernel:fill_" if t[1] else "kernel:sum",
                    [] if t[1] else [_span(t[2], t[3])], [_span(t[2], t[3])] if t[1] else [],
                    {"site": t[4], "op": "fill_" if t[1] else "sum"}]])


def fork() -> st.SearchStrategy[list[list[Any]]]:
    """One stream made to wait for another's work so far (``b.wait_stream(a)``): inside a
    capture, a fork of the graph's branches or their join."""
    return st.tuples(stream, stream, site).map(
        lambda t: [["record", FORK, t[0], t[2]], ["wait", FORK, t[1], t[2]]])

single = st.one_of(
    st.tuples(st.just("host"), st.booleans(), tensor, part, site).map(
        lambda t: ["op", None, "host_write" if t[1] else "host_read",
                   [] if t[1] else [_span(t[2], t[3])], [_span(t[2], t[3])] if t[1] else [],
                   {"site": t[4]}]),
    st.tuples(st.just("host"), st.booleans(), tensor, part, site).map(
        lambda t: ["op", None, "host_write" if t[1] else "host_read",
                   [] if t[1] else [_span(t[2], t[3])], [_span(t[2], t[3])] if t[1] else [],
                   {"site": t[4]}]),
    st.tuples(st.just("record"), event, stream, site).map(list),
    st.tuples(st.just("wait"), event, stream, site).map(list),
    st.tuples(st.just("sync_event"), event, site).map(list),
    st.tuples(st.just("sync_stream"), stream, site).map(list),
    st.tuples(st.just("free"), tensor, site).map(
        lambda t: ["free", "d", t[1], {"site": t[2]}]),
    st.tuples(st.just("alloc"), tensor, site).map(
        lambda t: ["alloc", "d", t[1], 4096, {"what": "tensor float32[1024]",
                                              "name": f"t{(t[1] - BASE) // 4096}",
                                              "site": t[2]}]),
    st.tuples(st.just("graph_begin"), graph, stream, site).map(list),
    st.tuples(st.just("graph_end"), graph, site).map(list),
    st.tuples(st.just("graph_replay"), graph, stream, site).map(list),
).map(lambda event: [event])
def captured() -> st.SearchStrategy[list[list[Any]]]:
    """A graph captured on one stream with a branch forked onto another (its ops on both,
    joined back or not before more of them), ended, and replayed on a third."""
    return st.tuples(graph, stream, stream, stream, st.lists(stream_op(), max_size=6),
                     st.integers(0, 6), site).map(lambda t: [
        ["graph_begin", t[0], t[1], t[6]],
        ["record", FORK, t[1], t[6]], ["wait", FORK, t[2], t[6]],
        *[op for ops in t[4][:t[5]] for op in ops],
        ["record", FORK, t[2], t[6]], ["wait", FORK, t[1], t[6]],
        *[op for ops in t[4][t[5]:] for op in ops],
        ["graph_end", t[0], t[6]], ["graph_replay", t[0], t[3], t[6]]])


# Stream ops and forks are drawn most (one_of picks among its strategies alike, and takes a
# strategy given twice once): they make the races and the graphs' branches.
step = st.one_of(*(stream_op() for _ in range(6)), fork(), fork(), captured(), single)


def _program(steps: list[list[Any]]) -> list[list[Any]]:
    declared = [["stream", sid, {"blocking": False, "legacy": False, "name": NAMES[sid]}]
                for sid in STREAMS]
    events = [["event", eid, {"name": f"e{eid}"}] for eid in (*EVENTS, FORK)]
    allocs = [["alloc", "d", addr, 4096, {"what": "tensor float32[1024]",
                                          "name": f"t{i}", "site": "prog.py:0"}]
              for i, addr in enumerate(TENSORS)]
    return declared + events + allocs + [event for group in steps for event in group]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, max_size=40))
def test_any_order_of_capture_events_is_taken_and_its_findings_name_known_streams(steps):
    program = _program(steps)
    found, racing = {}, {}
    for prune in (True, False):
        analysis = RunAnalysis(None, {})
        analysis.detector = RaceDetector(prune=prune, remember=False)  # pruning on or off
        analysis.feed(program)
        analysis.close()
        found[prune], racing[prune] = analysis.findings, analysis.detector.racing
    # Pruning keeps, for each access, the latest unordered one of each other stream: every op
    # that races an earlier op is still found (not every earlier op it races).
    assert racing[True] == racing[False]
    known = set(NAMES.values()) | {"host"}
    for finding in found[True]:
        for side in (finding.first, finding.second):
            assert side.stream in known or GRAPH_BRANCH in side.stream, side.stream

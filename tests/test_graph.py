"""CUDA graphs (#30): `graph_capture`, `graph_end` and `graph_replay` on the simulated device,
in the race detector and in the loader, and kvcore's graph calls underneath them."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import ScenarioError
from harness.run.executor import TrialExecutor
from harness.run.options import RunOptions
from harness.run.runner import Runner
from harness.lang.scenario import load_scenario
from kvcore.device import open_device
from kvcore.device.kernels import Delay
from kvcore.errors import DeviceUsageError

HEAD = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {name: graphs, description: CUDA graphs captured and replayed}
spec:
  pool: {pages: 8, page_tokens: 64, planes: [{dtype: i8, leading: 8, heads: 2, align: 256}]}
  streams: {capture: non-blocking, forward: non-blocking, side: non-blocking}
  trials: 20
  variants:
    buggy: {expect: reproduces, min_rate: 0.9}
    fixed: {expect: clean}
  steps:
"""

CAPTURED = """\
    - {id: inputs, op: materialize, pages: 1}
    - {id: outputs, op: materialize, pages: 1}
    - {op: host_fill, buffer: args, byte: 0x01}
    - {id: g, op: graph_capture, stream: capture}
    - {id: load, op: copy_from_host, src: args, dst: inputs, stream: capture}
    - {id: forward, op: kernel, reads: inputs, writes: outputs, us: 50, stream: capture}
    - {id: fetch, op: copy_to_host, src: outputs, dst: result, stream: capture}
    - {op: graph_end, graph: g}
"""


# The kernel runs 500 us: under a run's worker the host's time between the replay and its read
# (the flight recorder writes the trial's records before each wait) is longer than a graph of
# 66 us (a 50 us kernel) on the H200, where such a read was never early.
WRONG_STREAM = HEAD + CAPTURED.replace("us: 50", "us: 500") + """\
    - {op: host_fill, buffer: args, byte: 0x2A}
    - {op: host_fill, buffer: expected, byte: 0x2A}
    - {id: replay, op: graph_replay, graph: g, stream: forward, only: buggy}
    - {id: replay, op: graph_replay, graph: g, stream: capture, only: fixed}
    - {op: synchronize, stream: capture}
    - {id: read, op: check, buffer: result, equals: expected}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "graphs.yaml"
    path.write_text(text)
    return path


def _run(tmp_path: Path, text: str, trials: int = 20, **options: object) -> dict[str, object]:
    result = Runner(RunOptions(backend="sim", trials=trials, out_dir=tmp_path / "out",
                               **options)).run([load_scenario(_write(tmp_path, text))])
    return {r.variant: r for r in result.results}


# ---- kvcore ------------------------------------------------------------------------------------
def _world():
    device = open_device("sim")
    records = []
    device.oplog.subscribe(records.append)
    dev = device.alloc(4096, name="dev")
    args = device.alloc_host(4096, name="args")
    out = device.alloc_host(4096, name="out")
    return device, records, dev, args, out


def _round_trip(device, dev, args, out):
    """A graph captured from a stream of its own: the pinned args copied in, and out again;
    with the stream to launch it on."""
    capture, launch = device.create_stream("capture"), device.create_stream("launch")
    device.begin_graph(capture, "g")
    device.copy(dev, 0, args, 0, 4096, capture)
    device.copy(out, 0, dev, 0, 4096, capture)
    return device.end_graph(), launch


def test_captured_ops_do_not_run_and_a_launch_reads_the_host_bytes_of_its_time():
    device, records, dev, args, out = _world()
    device.host_fill(args, 0, 4096, 0x01)
    graph, launch = _round_trip(device, dev, args, out)
    device.synchronize()
    seen = len(records)
    assert not device.host_read(out, 0, 4096).any()  # nothing ran at capture
    device.host_fill(args, 0, 4096, 0x07)  # the next call's inputs, after the capture
    device.launch_graph(graph, launch)
    device.synchronize()
    assert (device.host_read(out, 0, 4096) == 0x07).all()
    nodes = [r for r in records[seen:] if r.stream == "launch"]
    assert [(r.kind, r.detail["graph"], r.detail["node"], r.detail["captured_on"])
            for r in nodes] == [("copy_htod", "g", "node 0", "capture"),
                                ("copy_dtoh", "g", "node 1", "capture")]
    # Launched twice: the same nodes again, on the bytes the host holds then.
    device.host_fill(args, 0, 4096, 0x09)
    device.launch_graph(graph, launch)
    device.synchronize()
    assert (device.host_read(out, 0, 4096) == 0x09).all()


def test_a_launch_runs_its_nodes_in_order_after_the_streams_earlier_work():
    """A delay on the launching stream holds the whole graph; the nodes keep their order (the
    second reads what the first wrote), and the stream's next op waits for the last."""
    device, _, dev, args, out = _world()
    device.host_fill(args, 0, 4096, 0x05)
    graph, launch = _round_trip(device, dev, args, out)
    device.launch(Delay(500.0), launch)
    start = device.clock_ns()
    device.launch_graph(graph, launch)
    device.host_fill(args, 0, 4096, 0x06)  # after the launch: the held graph reads this
    device.synchronize()
    assert device.clock_ns() - start >= 500_000
    assert (device.host_read(out, 0, 4096) == 0x06).all()


def test_what_cuda_refuses_during_a_capture_the_device_refuses():
    device, _, dev, args, _ = _world()
    capture, other = device.create_stream("capture"), device.create_stream("other")
    event = device.create_event("e")
    device.record_event(event, other)
    with pytest.raises(DeviceUsageError, match="legacy default stream"):
        device.begin_graph(device.legacy_stream, "g")
    device.begin_graph(capture, "g")
    with pytest.raises(DeviceUsageError, match="cudaErrorStreamCaptureUnsupported"):
        device.synchronize()
    with pytest.raises(DeviceUsageError, match="cudaErrorStreamCaptureUnsupported"):
        device.synchronize_stream(other)
    with pytest.raises(DeviceUsageError, match="cudaErrorStreamCaptureIsolation"):
        device.wait_event(capture, event)
    with pytest.raises(DeviceUsageError, match="cudaMalloc"):
        device.alloc(64, name="late")
    with pytest.raises(DeviceUsageError, match="being captured already"):
        device.begin_graph(other, "h")
    device.copy(dev, 0, args, 0, 64, other)  # another stream runs as usual meanwhile
    graph = device.end_graph()
    assert graph.nodes == []
    with pytest.raises(DeviceUsageError, match="no graph is being captured"):
        device.end_graph()


# ---- scenarios on the simulated device and in the detector ---------------------------------------
def test_a_replay_is_ordered_as_its_capture_and_after_its_streams_work(tmp_path):
    """The graph's own nodes (a copy in, a kernel, a copy out) never race each other, the host
    reads the result after synchronizing the launching stream, and the replay reads the inputs
    the host wrote after the capture: every trial clean, nothing found."""
    text = HEAD.replace("expect: reproduces, min_rate: 0.9", "expect: clean") + CAPTURED + """\
    - {op: host_fill, buffer: args, byte: 0x2A}
    - {op: host_fill, buffer: expected, byte: 0x2A}
    - {id: replay, op: graph_replay, graph: g, stream: forward}
    - {op: synchronize, stream: forward}
    - {id: read, op: check, buffer: result, equals: expected}
"""
    # The delay inside the graph (before its kernel, on the capture stream) is a node of its
    # own: it holds the kernel and the copy out, in order, at every replay.
    amplified = text.replace("  steps:\n", "  amplify: {delay_us: 500, stream: capture, "
                                           "before: forward}\n  steps:\n")
    for scenario in (text, amplified):
        got = _run(tmp_path, scenario, 10)
        for result in got.values():
            assert (result.manifested, result.detected, result.trials) == (0, 0, 10)


def test_a_replay_is_unordered_with_the_stream_it_was_captured_on(tmp_path):
    """xpu_graph's GraphRunner: the replay runs on the current stream, the host synchronizes
    the capture stream, and reads the outputs while the replay writes them."""
    got = _run(tmp_path, WRONG_STREAM)
    buggy, fixed = got["buggy"], got["fixed"]
    assert buggy.manifested == buggy.detected == 20
    assert (fixed.manifested, fixed.detected) == (0, 0)
    (finding,) = buggy.finding_summary(1)
    assert finding["first"]["kind"] == "copy_dtoh, graph g's fetch,"
    assert finding["first"]["step"] == "replay"
    # Its line is the step that captured the node, not the replay's.
    assert finding["first"]["origin"].endswith("graphs.yaml:18:7")
    assert finding["missing"] == (
        "nothing orders forward's write (copy_dtoh, graph g's fetch, at step replay) before "
        "the host's read (host_read at step read) on pinned buffer result: graph g was "
        "captured from capture but launched on forward: a graph's nodes run on the stream it "
        "is launched on, so forward's order covers them (or an event recorded on forward after "
        "replay), not capture's")


def test_host_inputs_rewritten_for_the_next_replay_race_the_last_ones_copy(tmp_path):
    """Between replays the host writes the next call's inputs into the pinned buffer the
    graph's first node copies: unless the host waits for the last replay, the copy may read
    the new bytes (amplified: always), and the detector finds the write against the copy."""
    text = HEAD + CAPTURED + """\
    - {op: host_fill, buffer: args, byte: 0x11}
    - {id: replay-1, op: graph_replay, graph: g, stream: forward}
    - {op: synchronize, stream: forward, only: fixed}
    - {op: host_fill, buffer: expected, byte: 0x11}
    - {id: check-1, op: check, buffer: result, equals: expected, only: fixed}
    - {id: next-inputs, op: host_fill, buffer: args, byte: 0x22}
    - {id: replay-2, op: graph_replay, graph: g, stream: forward}
    - {op: synchronize, stream: forward}
    - {op: host_fill, buffer: expected, byte: 0x22}
    - {id: check-2, op: check, buffer: result, equals: expected}
"""
    # The buggy variant reads the first replay's result only after the second replay: the
    # result of a replay whose inputs changed under it is the second's too, so the corruption
    # is the first replay's copy reading 0x22; it is what a trace shows, not what a check sees.
    text = text.replace("  steps:\n", "  amplify: {delay_us: 1000, stream: forward, "
                                      "before: replay-1}\n  steps:\n")
    got = _run(tmp_path, text)
    buggy, fixed = got["buggy"], got["fixed"]
    assert buggy.detected == 20 and (fixed.manifested, fixed.detected) == (0, 0)
    (finding,) = buggy.finding_summary(1)
    assert (finding["first"]["kind"], finding["first"]["step"]) == (
        "copy_htod, graph g's load,", "replay-1")
    assert (finding["second"]["kind"], finding["second"]["step"]) == ("host_write",
                                                                      "next-inputs")


def test_a_side_streams_write_races_the_replays_read_until_it_waits(tmp_path):
    """Another stream writing the graph's inputs is ordered with the replay only by an event:
    recorded on the side stream, waited on by the launching stream before the replay."""
    text = HEAD + CAPTURED + """\
    - {op: synchronize}
    - {id: refill, op: zero_pages, lease: inputs, stream: side}
    - {op: record_event, event: refilled, stream: side, only: fixed}
    - {op: wait_event, event: refilled, stream: forward, only: fixed}
    - {id: replay, op: graph_replay, graph: g, stream: forward}
    - {op: synchronize}
"""
    got = _run(tmp_path, text.replace("expect: reproduces, min_rate: 0.9", "expect: clean"), 5)
    assert got["fixed"].detected == 0
    (finding,) = got["buggy"].finding_summary(1)
    assert (finding["first"]["stream"], finding["first"]["kind"]) == ("side", "memset")
    assert (finding["second"]["stream"], finding["second"]["kind"]) == (
        "forward", "copy_htod, graph g's load,")


def test_a_kept_worlds_trials_reissue_the_graph_launch(tmp_path):
    """On a world that outlives its trials (the GPU's), the executor reissues a graph scenario
    from its captured program: every trial launches the graph built in the first, its three
    nodes reading the inputs of the moment, and the op log shows them each time."""
    text = HEAD.replace("expect: reproduces, min_rate: 0.9", "expect: clean") + CAPTURED + """\
    - {op: host_fill, buffer: args, byte: 0x2A}
    - {op: host_fill, buffer: expected, byte: 0x2A}
    - {id: replay, op: graph_replay, graph: g, stream: forward}
    - {op: synchronize}
    - {id: read, op: check, buffer: result, equals: expected}
"""
    scenario = load_scenario(_write(tmp_path, text))
    variant = next(v for v in scenario.variants if v.name == "fixed")
    records: list = []
    executor = TrialExecutor(scenario, variant, "sim", keep_world=True,
                             on_device=lambda device: device.oplog.subscribe(records.append))
    nodes = []
    for i in range(6):
        records.clear()
        assert executor.run(i, i).outcome.value == "clean"
        nodes.append([(r.kind, r.step) for r in records if (r.detail or {}).get("graph")])
    assert executor.reissued >= 4
    assert nodes == [[("copy_htod", "replay"), ("kernel:forward", "replay"),
                      ("copy_dtoh", "replay")]] * 6


# ---- the loader ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("steps", "where", "says"), [
    (CAPTURED.replace("    - {op: graph_end, graph: g}\n", "    - {op: synchronize}\n"
                      "    - {op: graph_end, graph: g}\n"), "steps[7].op",
     "synchronize cannot stand inside a graph's capture (graph 'g' is being captured (steps[3]"),
    (CAPTURED.replace("stream: capture}\n    - {id: forward",
                      "stream: side}\n    - {id: forward"), "steps[4].stream",
     "from stream 'capture'; this step on 'side' would run now, outside the graph"),
    (CAPTURED.replace("    - {op: graph_end, graph: g}\n",
                      "    - {op: host_fill, buffer: args, byte: 2}\n"
                      "    - {op: graph_end, graph: g}\n"), "steps[7].op",
     "the host does it once, now, not at each replay"),
    ("    - {op: record_event, event: e, stream: side}\n" + CAPTURED.replace(
        "    - {op: graph_end, graph: g}\n", "    - {op: wait_event, event: e, stream: capture}\n"
        "    - {op: graph_end, graph: g}\n"), "steps[8].event",
     "event 'e' was recorded outside the capture"),
    (CAPTURED.replace("    - {op: graph_end, graph: g}\n", ""), "steps[3]",
     "graph 'g' is captured here and never ended: add a graph_end step"),
    (CAPTURED + "    - {op: graph_end, graph: g}\n", "steps[8].graph",
     "graph 'g' was ended at steps[7]"),
    ("""\
    - {id: g, op: graph_capture, stream: capture}
    - {op: graph_end, graph: g}
""", "steps[1].graph", "graph 'g' captures nothing"),
    (CAPTURED.replace("    - {op: graph_end, graph: g}\n",
                      "    - {op: graph_replay, graph: g, stream: forward}\n"
                      "    - {op: graph_end, graph: g}\n"), "steps[7].op",
     "graphs do not nest here"),
    (CAPTURED.replace("stream: capture}\n    - {id: load", "stream: default}\n    - {id: load"),
     "steps[3].stream",
     "the legacy default stream, which CUDA cannot capture"),
    (CAPTURED.replace("    - {op: graph_end, graph: g}\n", "")
     + "    - {op: graph_replay, graph: g, stream: forward}\n", "steps[7].op",
     "graphs do not nest here"),
])
def test_the_loader_says_what_a_capture_cannot_hold(tmp_path, steps, where, says):
    text = HEAD + steps
    if "stream: default" in steps:
        text = text.replace("side: non-blocking}", "side: non-blocking, default: legacy}")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(_write(tmp_path, text))
    message = str(caught.value)
    assert says in message, message
    assert f"spec.{where}" in message, message


def test_a_captured_step_may_belong_to_some_variants(tmp_path):
    """A graph captured with a step of one variant replays it in that variant only."""
    text = HEAD.replace("expect: reproduces, min_rate: 0.9", "expect: clean") + CAPTURED.replace(
        "    - {op: graph_end, graph: g}\n",
        "    - {id: wipe, op: zero_pages, lease: outputs, stream: capture, only: buggy}\n"
        "    - {id: again, op: copy_to_host, src: outputs, dst: result, stream: capture, "
        "only: buggy}\n"
        "    - {op: graph_end, graph: g}\n") + """\
    - {op: host_fill, buffer: args, byte: 0x2A}
    - {id: replay, op: graph_replay, graph: g, stream: forward}
    - {op: synchronize}
    - {id: read, op: check, buffer: result, byte: 0x2A}
"""
    got = _run(tmp_path, text, 3)
    assert got["fixed"].manifested == 0
    assert got["buggy"].manifested == 3  # its graph zeroes the outputs before copying them
    assert "read" in got["buggy"].first_manifested.detail


# ---- the host's time in a wait's hooks (what made the sim predict the H200 here) --------------
def test_a_waits_hooks_cost_the_simulated_host_per_record_as_a_flight_recorder_does():
    """Before a wait the op log's blocking hooks run (a run's flight recorder writes the records
    since the last wait): the simulated host's clock moves on by the cost model's flush time,
    per record, only when hooks are there, and a copy in flight meanwhile lands."""
    from kvcore.device.sim import CostModel

    cost = CostModel(jitter=0.0)
    for hooked in (False, True):
        device = open_device("sim")
        device.cost = cost
        if hooked:
            device.oplog.before_blocking(lambda: None)
        device.oplog.subscribe(lambda record: None)
        buf, host = device.alloc(1 << 20, name="b"), device.alloc_host(1 << 20, name="h")
        stream = device.create_stream("s")
        device.synchronize_stream(stream)  # the records so far are flushed
        seq = device.oplog.seq
        for _ in range(3):
            device.copy(buf, 0, host, 0, 64, stream)
        before = device.clock_ns()
        device.synchronize_stream(device.create_stream("idle"))
        waited = device.clock_ns() - before
        # Written at this wait: the last wait's own record (after its hooks ran) and the copies.
        assert device.oplog.seq - seq == 4
        flush = cost.flush_ns + cost.flush_record_ns * 4 if hooked else 0
        assert waited == cost.sync_ns + flush, (hooked, waited)


def test_a_graphs_short_output_is_read_late_under_a_worker_as_on_the_h200(tmp_path):
    """xpu-graph-491 with a module of 20 us: on the H200, under a run's worker, the host read the
    replay's output 110 to 140 us after the launch and never early (0 of 20); the simulated
    device, counting the flight recorder's writes before the host's wait, agrees (and with a
    module of 500 us both read it early: 49 of 50 there)."""
    zoo = Path(__file__).resolve().parent.parent / "scenarios" / "zoo" / "xpu_graph_491.yaml"
    text = zoo.read_text()
    for us, manifested in (("20", 0), ("500", 20)):
        got = _run(tmp_path, text.replace("us: 500,", f"us: {us},"), 20, amplify=False)
        assert got["buggy"].manifested == manifested, us
        assert got["buggy"].detected == 20


def test_a_delay_before_a_captured_step_goes_on_the_graphs_stream(tmp_path):
    """Amplifying a step inside a capture delays the capture stream (the delay is a node of the
    graph, run at every replay); a delay on another stream would run once, at the capture."""
    text = HEAD + CAPTURED + "    - {id: replay, op: graph_replay, graph: g, stream: forward}\n"
    for stream, ok in (("capture", True), ("forward", False)):
        amplified = text.replace("  steps:\n", f"  amplify: {{delay_us: 500, stream: {stream}, "
                                              "before: forward}\n  steps:\n")
        if ok:
            load_scenario(_write(tmp_path, amplified))
            continue
        with pytest.raises(ScenarioError, match="would run once, at the capture, not at each "
                                                "replay; delay 'capture'"):
            load_scenario(_write(tmp_path, amplified))


# ---- a capture that forks and joins --------------------------------------------------------------
def test_a_forked_branch_runs_beside_the_launch_and_joins_before_its_end():
    """A stream that waits for an event recorded in the capture forks in: its ops are a branch,
    launched on a stream of its own, after the fork point; the capture stream's wait for the
    branch's event joins it back, and the launching stream's later work waits for it."""
    device, records, dev, args, out = _world()
    capture, side, launch = (device.create_stream(n) for n in ("capture", "side", "launch"))
    mid = device.alloc(4096, name="mid")
    forked, joined = device.create_event("forked"), device.create_event("joined")
    device.host_fill(args, 0, 4096, 0x05)
    device.begin_graph(capture, "g")
    device.copy(dev, 0, args, 0, 4096, capture)
    device.record_event(forked, capture)
    device.wait_event(side, forked)                 # side forks in after the copy
    device.launch(Delay(300.0), side)
    device.copy(mid, 0, dev, 0, 4096, side)
    device.record_event(joined, side)
    device.wait_event(capture, joined)              # and joins back
    device.copy(out, 0, mid, 0, 4096, capture)
    graph = device.end_graph()
    seen = len(records)
    device.launch_graph(graph, launch)
    device.synchronize()
    assert (device.host_read(out, 0, 4096) == 0x05).all()  # the delayed branch was waited for
    branch = "side in graph g on launch"
    assert [(r.stream, r.kind, r.records or r.waits) for r in records[seen:]
            if r.stream != "host"] == [
        ("launch", "copy_htod", None), ("launch", "event_record", "graph g node 0"),
        (branch, "event_wait", "graph g node 0"), (branch, "kernel:delay", None),
        (branch, "copy_dtod", None), (branch, "event_record", "graph g node 2"),
        ("launch", "event_wait", "graph g node 2"), ("launch", "copy_dtoh", None)]
    assert branch in device.oplog.streams


def test_a_branch_not_joined_back_is_refused_at_the_end():
    device, _, dev, args, _ = _world()
    capture, side = device.create_stream("capture"), device.create_stream("side")
    forked = device.create_event("forked")
    device.begin_graph(capture, "g")
    device.record_event(forked, capture)
    device.wait_event(side, forked)
    device.copy(dev, 0, args, 0, 64, side)
    with pytest.raises(DeviceUsageError, match="stream side forked into graph 'g'.s capture and "
                                               "was not joined back.*cudaErrorStreamCapture"
                                               "Unjoined"):
        device.end_graph()


FORKED = """\
    - {id: inputs, op: materialize, pages: 1}
    - {id: outputs, op: materialize, pages: 1}
    - {op: host_fill, buffer: args, byte: 0x01}
    - {id: g, op: graph_capture, stream: capture}
    - {op: record_event, event: start, stream: capture}
    - {op: wait_event, event: start, stream: side}
    - {id: load, op: copy_from_host, src: args, dst: inputs, stream: capture}
    - {op: record_event, event: loaded, stream: capture, only: fixed}
    - {op: wait_event, event: loaded, stream: side, only: fixed}
    - {id: expert, op: kernel, reads: inputs, writes: outputs, us: 50, stream: side}
    - {op: record_event, event: done, stream: side}
    - {op: wait_event, event: done, stream: capture}
    - {id: fetch, op: copy_to_host, src: outputs, dst: result, stream: capture}
    - {op: graph_end, graph: g}
    - {op: host_fill, buffer: args, byte: 0x2A}
    - {op: host_fill, buffer: expected, byte: 0x2A}
    - {id: replay, op: graph_replay, graph: g, stream: forward}
    - {op: synchronize, stream: forward}
    - {id: read, op: check, buffer: result, equals: expected}
"""


def test_a_branch_forked_at_the_start_races_the_capture_streams_copy_until_it_waits(tmp_path):
    """A side stream forked in at the graph's start reads the inputs the capture stream copies
    in: nothing orders the two branches but an event after the copy (the fixed variant);
    amplified (the copy held), the branch reads the old inputs."""
    text = (HEAD + FORKED).replace("  steps:\n", "  amplify: {delay_us: 1000, stream: capture, "
                                                 "before: load}\n  steps:\n")
    got = _run(tmp_path, text)
    buggy, fixed = got["buggy"], got["fixed"]
    assert buggy.manifested == buggy.detected == 20
    assert (fixed.manifested, fixed.detected) == (0, 0)
    (finding,) = buggy.finding_summary(1)
    assert (finding["first"]["stream"], finding["first"]["kind"]) == (
        "forward", "copy_htod, graph g's load,")
    assert (finding["second"]["stream"], finding["second"]["kind"]) == (
        "side in graph g on forward", "kernel:expert, graph g's expert,")
    # The fix is the branches' own edge, in the capture's words (where the graph is launched
    # has no part in it).
    assert finding["missing"].endswith(
        "both are nodes of graph g, whose capture orders capture's load and side's expert by "
        "no edge: record an event on capture after load and make side wait on it before "
        "expert, inside the capture")


def test_the_loader_follows_a_captures_forks_and_joins(tmp_path):
    unjoined = FORKED.replace("    - {op: wait_event, event: done, stream: capture}\n", "")
    with pytest.raises(ScenarioError, match="stream 'side' forked into graph 'g'.s capture and "
                                            "is not joined back"):
        load_scenario(_write(tmp_path, HEAD + unjoined))
    # A join before the branch's last step does not cover it.
    late = FORKED.replace("    - {id: fetch,", "    - {id: more, op: zero_pages, lease: outputs, "
                          "stream: side}\n    - {id: fetch,")
    with pytest.raises(ScenarioError, match="is not joined back"):
        load_scenario(_write(tmp_path, HEAD + late))
    stray = FORKED.replace("    - {op: wait_event, event: start, stream: side}\n", "")
    with pytest.raises(ScenarioError, match="this step on 'side' would run now, outside the "
                                            "graph: give it a capturing stream, fork it in"):
        load_scenario(_write(tmp_path, HEAD + stray))


def test_every_op_is_capturable_or_says_why_not():
    """The loader's word for a step inside a capture: a graph holds it, or it says why not."""
    from harness.lang import vocabulary as V

    for op in V.OPS:
        if op != "graph_end":
            assert (op in V.CAPTURABLE) != (op in V.NOT_CAPTURED), op

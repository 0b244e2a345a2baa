"""CUDA graphs on the GPU (marker gpu): kvcore builds a real CUDA graph by stream capture and
launches it, so the graph scenarios give the same verdicts and findings on both devices."""

from __future__ import annotations


import pytest

from harness.run.executor import TrialExecutor
from harness.lang.scenario import load_scenario
from kvcore.device import open_device
from kvcore.device.kernels import Delay
from test_graph import CAPTURED, FORKED, HEAD, WRONG_STREAM
from test_kernel_step_gpu import _verdicts

pytestmark = pytest.mark.gpu

NEXT_INPUTS = (HEAD + CAPTURED + """\
    - {op: host_fill, buffer: args, byte: 0x11}
    - {id: replay-1, op: graph_replay, graph: g, stream: forward}
    - {op: synchronize, stream: forward, only: fixed}
    - {id: next-inputs, op: host_fill, buffer: args, byte: 0x22}
    - {id: replay-2, op: graph_replay, graph: g, stream: forward}
    - {op: synchronize, stream: forward}
    - {op: host_fill, buffer: expected, byte: 0x22}
    - {id: check-2, op: check, buffer: result, equals: expected}
""").replace("  steps:\n", "  amplify: {delay_us: 1000, stream: forward, before: replay-1}\n"
             "  steps:\n")


def test_a_cuda_graph_runs_nothing_at_capture_and_reads_host_inputs_at_launch():
    device = open_device("cuda")
    try:
        dev = device.alloc(1 << 20, name="dev")
        args = device.alloc_host(1 << 20, name="args")
        out = device.alloc_host(1 << 20, name="out")
        capture, launch = device.create_stream("capture"), device.create_stream("launch")
        device.host_fill(args, 0, 1 << 20, 0x01)
        device.begin_graph(capture, "g")
        device.copy(dev, 0, args, 0, 1 << 20, capture)
        device.copy(out, 0, dev, 0, 1 << 20, capture)
        graph = device.end_graph()
        device.synchronize()
        assert not device.host_read(out, 0, 1 << 20).any()
        # Held behind a delay on the launching stream, the graph reads what the host wrote
        # after the launch call returned.
        device.launch(Delay(2000.0), launch)
        device.launch_graph(graph, launch)
        device.host_fill(args, 0, 1 << 20, 0x07)
        device.synchronize()
        assert (device.host_read(out, 0, 1 << 20) == 0x07).all()
    finally:
        device.close()


def test_a_replay_on_the_current_stream_races_the_host_as_on_the_simulated_device(tmp_path):
    sim, cuda = (_verdicts(tmp_path, WRONG_STREAM, b) for b in ("sim", "cuda"))
    print("graph wrong-stream sync: sim", sim, "cuda", cuda)
    assert cuda["buggy"][0] >= 19 and cuda["buggy"][1] == 20
    assert cuda["fixed"][:2] == (0, 0)
    assert cuda["buggy"][2] == sim["buggy"][2]


def test_inputs_rewritten_under_a_held_replay_are_what_it_copies_on_the_gpu(tmp_path):
    got = _verdicts(tmp_path, NEXT_INPUTS, "cuda")
    print("graph next inputs: cuda", got)
    assert got["buggy"][1] == 20 and got["fixed"][:2] == (0, 0)


def test_the_gpus_trials_reissue_the_graph_launch(tmp_path):
    text = WRONG_STREAM.replace("expect: reproduces, min_rate: 0.9", "expect: clean")
    path = tmp_path / "reissue.yaml"
    path.write_text(text)
    scenario = load_scenario(path)
    variant = next(v for v in scenario.variants if v.name == "fixed")
    executor = TrialExecutor(scenario, variant, "cuda")
    outcomes = [executor.run(i, i).outcome.value for i in range(30)]
    print("graph reissued on cuda:", executor.reissued, "of 30;", set(outcomes))
    assert outcomes == ["clean"] * 30 and executor.reissued >= 27


def test_a_forked_capture_builds_a_cuda_graph_whose_branch_is_waited_for():
    """The branch (a delay of 2 ms, then a copy) runs beside the capture stream's nodes; the
    join makes the last copy wait for it, and the host's read after the launching stream's
    synchronize sees the bytes it carried."""
    device = open_device("cuda")
    try:
        n = 1 << 20
        dev, mid = device.alloc(n, name="dev"), device.alloc(n, name="mid")
        args, out = device.alloc_host(n, name="args"), device.alloc_host(n, name="out")
        capture, side, launch = (device.create_stream(s) for s in ("capture", "side", "launch"))
        forked, joined = device.create_event("forked"), device.create_event("joined")
        device.host_fill(args, 0, n, 0x05)
        device.begin_graph(capture, "g")
        device.copy(dev, 0, args, 0, n, capture)
        device.record_event(forked, capture)
        device.wait_event(side, forked)
        device.launch(Delay(2000.0), side)
        device.copy(mid, 0, dev, 0, n, side)
        device.record_event(joined, side)
        device.wait_event(capture, joined)
        device.copy(out, 0, mid, 0, n, capture)
        graph = device.end_graph()
        device.launch_graph(graph, launch)
        device.synchronize_stream(launch)
        assert (device.host_read(out, 0, n) == 0x05).all()
    finally:
        device.close()


def test_a_race_between_a_graphs_branches_shows_on_the_gpu_as_on_the_simulated_device(tmp_path):
    text = (HEAD + FORKED).replace("  steps:\n", "  amplify: {delay_us: 1000, stream: capture, "
                                                 "before: load}\n  steps:\n")
    sim, cuda = (_verdicts(tmp_path, text, b) for b in ("sim", "cuda"))
    print("graph branches: sim", sim, "cuda", cuda)
    assert cuda["buggy"][0] >= 19 and cuda["buggy"][1] == 20
    assert cuda["fixed"][:2] == (0, 0)
    assert cuda["buggy"][2] == sim["buggy"][2]

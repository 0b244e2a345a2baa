"""Op traces: the strict reader (each bad trace is one line-numbered error and exit 2, never a
traceback), the parent cutting a dead worker's torn last line, and minimize from a recorded op
trace."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from jsonl_columns import prefix

from harness.cli import main
from harness.errors import TraceError
from harness.traces.flight import cut_torn_tail
from harness.traces.optrace import TRACE_SCHEMA, load_trace, stream_trace
from harness.lang.targets import SCENARIO_ROOT
from harness.lang.scenario import load_scenario

HEADER = {"type": "header", "schema": TRACE_SCHEMA, "level": "ops", "scenario": "t",
          "trial": 0, "seed": 7}
KV = {"type": "buffer", "id": 1, "name": "kv", "space": "device", "nbytes": 4096,
      "role": "data", "page_bytes": 1024}
STAGING = {"type": "buffer", "id": 2, "name": "staging", "space": "host", "nbytes": 4096}
S1 = {"type": "stream", "name": "s1", "blocking": False, "legacy": False}


def op(seq: int, stream: str, kind: str, **rest: Any) -> dict[str, Any]:
    return {"seq": seq, "stream": stream, "kind": kind, **rest, "type": "op"}


FILL = op(1, "host", "host_write", writes=[[2, 0, 4096]])
COPY = op(2, "s1", "copy_htod", reads=[[2, 0, 4096]], writes=[[1, 0, 4096]], step="w")
SYNC = op(3, "host", "sync_stream", syncs="s1")
GOOD = [HEADER, KV, STAGING, S1, FILL, COPY, SYNC]


def lines(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def replaced(index: int, **changes: Any) -> Callable[[], str]:
    return lambda: lines([{**r, **changes} if i == index else r for i, r in enumerate(GOOD)])


BAD: dict[str, tuple[Callable[[], str], int, str, str]] = {
    "truncated line": (lambda: lines(GOOD)[:-20], 7, "(record)", "the file ends mid-record"),
    "not JSON mid-file": (lambda: lines(GOOD[:3]) + "{op\n" + lines(GOOD[3:]), 4, "(record)",
                          "truncated or not JSON"),
    "wrong schema version": (replaced(0, schema="gpurace.trace/2"), 1, "schema",
                             "gpurace.trace/2 is not supported; this gpurace reads "
                             "gpurace.trace/1"),
    "a ticket": (replaced(0, schema="gpurace.ticket/1"), 1, "schema",
                 "replay it with `gpurace replay`"),
    # A control character in the schema is said as an escape, not written into the message.
    "a later schema with a newline": (replaced(0, schema="gpurace.trace/2\nx"), 1, "schema",
                                      "gpurace.trace/2\\nx is not supported"),
    "no header": (lambda: lines(GOOD[1:]), 1, "type", "this is not a gpurace op trace"),
    "second header": (lambda: lines(GOOD + [HEADER]), 8, "type", "a second header"),
    "wrong level": (replaced(0, level="requests"), 1, "level", 'must be "ops"'),
    "unknown header key": (replaced(0, sead=3), 1, "sead", "did you mean 'seed'?"),
    "unknown op": (replaced(5, kind="teleport"), 6, "kind", "unknown op 'teleport' on stream"),
    "unknown host op": (replaced(4, kind="host_poke"), 5, "kind", "unknown host op"),
    "host op on a stream": (replaced(4, stream="s1"), 5, "kind", "unknown op 'host_write'"),
    "unknown record type": (lambda: lines(GOOD + [{"type": "event"}]), 8, "type",
                            "unknown record type \"event\""),
    "undeclared stream": (replaced(5, stream="s9"), 6, "stream", "'s9' is not declared above"),
    "undeclared buffer": (replaced(5, reads=[[9, 0, 16]]), 6, "reads[0]",
                          "buffer 9 is not declared above"),
    "negative offset": (replaced(5, writes=[[1, -64, 64]]), 6, "writes[0]",
                        "outside buffer 1 (0..4096)"),
    "beyond the buffer": (replaced(5, writes=[[1, 4000, 200]]), 6, "writes[0]",
                          "bytes 4000..4200 are outside buffer 1"),
    "bad access": (replaced(5, reads=[[2, 0]]), 6, "reads[0]",
                   "must be [buffer, offset, length] integers"),
    "seq going back": (replaced(6, seq=1), 7, "seq", "1 does not follow seq 2 on line 6"),
    "seq not an integer": (replaced(4, seq=True), 5, "seq", "must be an integer"),
    "negative time": (replaced(5, t_issue_ns=-5), 6, "t_issue_ns", "must be 0 or more"),
    "unknown op key": (replaced(5, steps="w"), 6, "steps", "did you mean 'step'?"),
    "sync of no stream": (replaced(6, syncs="s7"), 7, "syncs", "'s7' is not a stream"),
    "buffer declared twice": (lambda: lines(GOOD[:2] + [KV] + GOOD[2:]), 3, "id",
                              "already declared on line 2"),
    "bad space": (replaced(1, space="shared"), 2, "space", 'must be "device" or "host"'),
    "duplicate key": (lambda: lines(GOOD[:4]) + '{"seq":1,"seq":2,"stream":"host",'
                      '"kind":"sync_device","type":"op"}\n', 5, "seq", "appears twice"),
    "empty": (lambda: "", 1, "(file)", "empty file"),
    "times of an op not above": (lambda: lines(GOOD[:5] + [{"type": "times", "ops": [
        [2, 5, 9]]}] + GOOD[5:]), 6, "ops[0]", "op 2 is not above"),
    "times ending first": (lambda: lines(GOOD + [{"type": "times", "ops": [[2, 9, 5]]}]), 8,
                           "ops[0]", "op 2 ends (5) before it starts (9)"),
    "times not a triple": (lambda: lines(GOOD + [{"type": "times", "ops": [[2, 9]]}]), 8,
                           "ops[0]", "must be [seq, t_start_ns, t_end_ns]"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_trace_is_one_line_numbered_error_and_exit_2(tmp_path: Path, case: str) -> None:
    make, line, field, phrase = BAD[case]
    path = tmp_path / "t.jsonl"
    path.write_text(make())
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    message = str(caught.value)
    assert message.startswith(prefix(path, line, field)) and phrase in message, message
    check = CliRunner().invoke(main, ["check", str(path)])
    assert check.exit_code == 2 and check.output == f"error: {message}\n"  # one line, all
    # minimize reads a file without an op trace header as a ticket, and says so at its line.
    shrink = CliRunner().invoke(main, ["minimize", str(path), "-o", str(tmp_path / "m.yaml")])
    said = shrink.output.splitlines()
    assert shrink.exit_code == 2 and len(said) == 1 and "Traceback" not in shrink.output
    assert re.match(rf"error: {re.escape(str(path))}:\d+:\d+: ", said[0]), said
    assert not (tmp_path / "m.yaml").exists()
    # Read as a stream (a trace too large to load whole), the same error at the same place;
    # a times record is refused there as such (it sets the times of the ops above it).
    with pytest.raises(TraceError) as streamed:
        list(stream_trace(path))
    if case.startswith("times"):
        assert "a times record" in str(streamed.value)
    else:
        assert str(streamed.value) == message


def test_a_trace_read_as_a_stream_is_the_trace_load_reads(tmp_path: Path) -> None:
    """stream_trace hands on the records load_trace keeps, runs expanded into their ops."""
    from tests.test_flight_compact import _recorded
    from tests.test_reissue import CASES
    path = tmp_path / "t.jsonl"
    path.write_text(lines(GOOD))
    assert list(stream_trace(path)) == list(load_trace(path).records)
    traces: list[Path] = []
    for n, (scenario, variant) in enumerate(CASES):  # the first whose kept traces hold runs
        _, traces, _ = _recorded(scenario, variant, tmp_path / f"flight-{n}",
                                 issue_times=False)
        if any('"type":"run"' in t.read_text() for t in traces):
            break
    assert any('"type":"run"' in t.read_text() for t in traces)  # reissued: runs to expand
    for trace in traces:
        assert list(stream_trace(trace)) == list(load_trace(trace).records)


def test_a_good_trace_loads_and_checks_clean(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(lines(GOOD))
    trace = load_trace(path)
    assert trace.header == HEADER and [o["seq"] for o in trace.ops] == [1, 2, 3]
    assert CliRunner().invoke(main, ["check", str(path)]).exit_code == 0


def test_an_op_trace_given_to_replay_points_to_check(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(lines(GOOD))
    result = CliRunner().invoke(main, ["replay", str(path), "--backend", "sim"])
    assert result.exit_code == 2 and "an op trace goes to `gpurace check`" in result.output


def test_the_parent_cuts_a_torn_last_line_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "trial-current.jsonl"
    whole = lines(GOOD)
    path.write_text(whole + '{"seq":4,"stream":"ho')
    assert cut_torn_tail(path) is True
    assert path.read_text() == whole and len(load_trace(path).ops) == 3
    assert cut_torn_tail(path) is False and path.read_text() == whole  # whole: left alone


def test_minimize_from_a_recorded_op_trace(tmp_path: Path) -> None:
    """A trace `gpurace replay --record` wrote is enough to minimize from: its header says how
    the trial ran, and the result is a scenario that still fails."""
    ticket = str(SCENARIO_ROOT / "tickets" / "ninfer-210.jsonl")
    result = CliRunner().invoke(main, [
        "replay", ticket, "--defect", "publish_on_legacy_stream", "--dangerous", "--backend",
        "sim", "--no-amplify", "--record", "--format", "json", "--out", str(tmp_path / "rec")])
    [trace] = json.loads(result.stdout)["results"][0]["traces"]
    output = tmp_path / "min.yaml"
    result = CliRunner().invoke(main, ["minimize", trace, "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert "races on exec-table" in result.output  # unamplified: kept by the detector finding
    scenario = load_scenario(output)
    assert len(scenario.steps) <= 15
    ran = CliRunner().invoke(main, ["run", str(output), "--dangerous", "--backend", "sim",
                                    "--trials", "3", "--format", "json",
                                    "--out", str(tmp_path / "run")])
    doc = json.loads(ran.stdout)
    assert {r["variant"]: r["detected"] for r in doc["results"]} == {"buggy": 3, "fixed": 0}
    assert ran.exit_code == 0


def test_the_recorders_op_lines_are_what_the_json_encoder_writes() -> None:
    """The trace writer's op lines (the flight recorder's and a watched run's) are byte for
    byte what json.dumps writes for the record, whatever its fields hold (quotes, non-ASCII,
    nested detail, values json cannot take as they are)."""
    import random

    from harness.traces.lines import op_line
    from kvcore.device.oplog import Access, OpRecord

    rng = random.Random(5)
    names = ["s1", 'tr"ans', "legacy_stream", "é\\n", "host", None]
    details: list[Any] = [None, {}, {"origin": "a.yaml:3:7"}, {"origin": 'q"uote'},
                          {"done": True, "polls": 3}, {"name": "lease a", "range": [1, 0, 64]},
                          {"value": 171, "site": "x.py:1"}, {"us": 1000.0}, {"path": Path("p")},
                          {"entries": 3, "assert": False, "origin": None, "thread": "t\u00e9"},
                          {"us": float("inf")}, {"range": [1, True, 3]}, {"pieces": [[1]]},
                          # Equal as dict keys, not as JSON: the encoded details are kept by
                          # their items, and must not be taken for each other.
                          {"range": [1, 1, 3]}, {"value": 1}, {"value": True}, {"value": 1.0},
                          {"range": [1, 1.0, 3]}, {"name": {"a": 1}}, {"value": float("nan")},
                          {"pair": (1, True)}, {"pair": (1, 1)}, {"pair": [1, 1]}]
    for seq in range(1, 400):
        accesses = tuple(Access(rng.randrange(9), rng.randrange(4096), rng.randrange(1, 99))
                         for _ in range(rng.randrange(3)))
        record = OpRecord(
            seq, rng.choice(names[:-1]), rng.choice(["copy_htod", "kernel:kv_fill", "memset"]),
            accesses, accesses[::-1], rng.choice(names), rng.choice(names), rng.choice(names),
            rng.choice(names), rng.choice([None, seq * 1000]), rng.choice([None, 5]),
            rng.choice([None, 9]), rng.choice(details))
        data = record.to_json()
        data["type"] = "op"
        assert op_line(record) == json.dumps(data, separators=(",", ":"), default=str)


def test_the_recorders_header_and_run_lines_are_what_the_json_encoder_writes() -> None:
    """The header's numbers and a reissued piece's run line are written by hand: they must be
    the encoder's bytes all the same."""
    from harness.traces.lines import header_line, run_line
    from harness.traces.optrace import TRACE_SCHEMA
    from kvcore.device.oplog import Segment

    header = {"scenario": 'q"uote', "variant": "fixed", "delay_us": None, "amplify": {"a": 1.5},
              "path": "sc\u00e9narios/x.yaml"}
    expected = {"type": "header", "schema": TRACE_SCHEMA, "level": "ops", **header,
                "trial": 7, "seed": 2**63 + 5, "pid": 0}
    assert header_line(header, trial=7, seed=2**63 + 5, pid=0) == json.dumps(
        expected, separators=(",", ":"))
    for segment in (Segment((), 12), Segment((), 0, (171, 0), 5_000_000_123),
                    Segment((), 3, (), 9)):
        record: dict[str, Any] = {"type": "run", "program": 4, "seq": segment.first_seq}
        if segment.t_issue_ns is not None:
            record["t_issue_ns"] = segment.t_issue_ns
        if segment.values:
            record["values"] = list(segment.values)
        assert run_line(4, segment) == json.dumps(record, separators=(",", ":"))


def test_the_recorder_starts_each_trial_on_an_empty_trace(tmp_path: Path) -> None:
    """A trial's trace file is emptied, not made again, when the last one was not kept: its
    whole lines (what the parent takes of a dead worker's file) are that trial's only, and a
    kept trace is the kept trial's own, ending at its last line."""
    import kvcore
    from harness.traces.flight import CURRENT, FlightRecorder

    device = kvcore.open_device("sim")
    buf = device.alloc_host(64, name="pinned")
    recorder = FlightRecorder(tmp_path)
    recorder.attach(device)
    kept = None
    for trial, value in enumerate((1, 2, 3, 4)):
        recorder.start_trial({"trial": trial})
        for _ in range(value):
            device.host_fill(buf, 0, 8, value)
        device.synchronize()  # the trial's last wait: its ops on disk before it
        kept = recorder.end_trial(trial, keep=trial == 1) or kept
        data = (tmp_path / CURRENT).read_bytes() if trial != 1 else b""
        lines = [json.loads(line) for line in data[:data.rfind(b"\n") + 1].splitlines()]
        if trial != 1:
            assert lines[0] == {"type": "header", "schema": TRACE_SCHEMA, "level": "ops",
                                "trial": trial}
            written = [r["detail"]["value"] for r in lines if r.get("kind") == "host_write"]
            assert written == [value] * value
    text = Path(str(kept)).read_text()
    assert text.endswith("\n") and "\0" not in text
    records = [json.loads(line) for line in text.splitlines()]
    assert records[0]["trial"] == 1
    assert [r["detail"]["value"] for r in records if r.get("kind") == "host_write"] == [2, 2]


def test_a_trace_not_kept_ends_at_the_trial_s_last_wait_and_counts_every_op(
        tmp_path: Path) -> None:
    """What a trial issues after its last wait is written only to a trace that is kept: a
    worker cannot die in a wait of that trial any more. Its ops count all the same."""
    import kvcore
    from harness.traces.flight import CURRENT, FlightRecorder

    device = kvcore.open_device("sim")
    buf = device.alloc_host(64, name="pinned")
    recorder = FlightRecorder(tmp_path)
    recorder.attach(device)
    for trial, keep in enumerate((False, True)):
        recorder.start_trial({"trial": trial})
        for value in (1, 2, 0, 3, 4, 5):
            if value:
                device.host_fill(buf, 0, 8, value)
            else:
                device.synchronize()
        kept = recorder.end_trial(trial, keep=keep)
        assert recorder.total == 6
        data = Path(kept).read_bytes() if kept else (tmp_path / CURRENT).read_bytes()
        lines = [json.loads(line) for line in data[:data.rfind(b"\n") + 1].splitlines()]
        values = [r["detail"]["value"] for r in lines if r.get("kind") == "host_write"]
        assert values == ([1, 2, 3, 4, 5] if keep else [1, 2])


def test_a_killed_workers_trace_is_its_whole_lines(tmp_path: Path) -> None:
    """A worker killed in its trial (a hang, by the watchdog) leaves its trace file mapped and
    longer than its lines: the incident's trace is those lines, no zeros, and loads strictly,
    its last op the kernel that never ends (flushed before the wait on it)."""
    from harness.run.options import RunOptions
    from harness.run.runner import Runner
    from harness.lang.targets import resolve_targets
    from programs import hang_file

    runner = Runner(RunOptions(backend="sim", timeout_s=1.5, out_dir=tmp_path))
    [r] = runner.run(resolve_targets([str(hang_file(tmp_path, 1))])).results
    assert r.counts["hang"] == 1
    [report] = r.reports
    text = (Path(report) / "trace.jsonl").read_text()
    assert "\0" not in text and text.endswith("\n")
    ops = [rec for rec in load_trace(Path(report) / "trace.jsonl").records
           if rec.get("type") == "op"]
    assert ops and ops[-1]["kind"] == "kernel:delay"


def test_a_times_record_gives_the_ops_above_it_their_device_times(tmp_path: Path) -> None:
    """What a backend times after the fact (the GPU with --timeline) reaches the trace: the
    recorder writes a times record once the device settles them, and the reader gives each
    op named its device times; ops not named keep none."""
    import kvcore
    from harness.traces.flight import FlightRecorder
    from kvcore.device.sim import SimDevice

    class Later(SimDevice):  # a device that knows its copies' times only once settled
        def _do_copy(self, *args: Any) -> object:
            super()._do_copy(*args)
            return object()

        def _do_times(self, pending: list[tuple[int, object]]) -> list[tuple[int, int, int]]:
            return [(seq, 1000 * seq, 1000 * seq + 7) for seq, _ in pending]

    device = Later(defects=kvcore.Defects(), seed=0)
    stream = device.create_stream("s")
    dev, host = device.alloc(64, name="dev"), device.alloc_host(64, name="pinned")
    recorder = FlightRecorder(tmp_path)
    recorder.attach(device)
    device.copy(dev, 0, host, 0, 64, stream)  # before the trial (a world being built)
    recorder.start_trial({"scenario": "t"})
    device.host_fill(host, 0, 64, 1)
    device.copy(dev, 0, host, 0, 64, stream)
    device.synchronize()
    settled = device.settle_times()
    assert [seq for seq, _, _ in settled] == [1, device.oplog.seq - 1]
    # The trace is the trial's: it times its own copy, not the one from before it began
    # (a record naming an op it does not hold would not load).
    trace = load_trace(recorder.end_trial(0, keep=True))
    timed = {op["kind"]: (op.get("t_start_ns"), op.get("t_end_ns")) for op in trace.ops}
    copy_seq = next(op["seq"] for op in trace.ops if op["kind"] == "copy_htod")
    assert timed["copy_htod"] == (1000 * copy_seq, 1000 * copy_seq + 7)
    assert timed["host_write"] == (None, None)


def test_a_trace_longer_than_its_map_grows_it(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial that writes more than the map holds gets a larger one, losing nothing; the next
    trial starts on an empty trace in it; a kept trace ends at its last line."""
    import kvcore
    from harness.traces import flight
    from harness.traces.flight import CURRENT, FlightRecorder

    monkeypatch.setattr(flight, "TRACE_MAP_BYTES", 4096)
    device = kvcore.open_device("sim")
    host = device.alloc_host(64, name="pinned")
    recorder = FlightRecorder(tmp_path)
    recorder.attach(device)

    def values(records: list[dict]) -> list[int]:
        return [r["detail"]["value"] for r in records if r.get("kind") == "host_write"]

    for trial, count in enumerate((200, 3, 150)):
        recorder.start_trial({"trial": trial})
        for i in range(count):
            device.host_fill(host, 0, 8, i % 256)
            if i % 50 == 49:
                device.synchronize()  # a flush, mid-trial
        device.synchronize()  # and the trial's last wait
        kept = recorder.end_trial(trial, keep=trial == 2)
        if kept is None:  # what the parent would take of this file, had the worker died
            data = (tmp_path / CURRENT).read_bytes()
            assert len(data) > 4096  # grown by the first trial, and kept that size
            lines = [json.loads(line) for line in data[:data.rfind(b"\n") + 1].splitlines()]
            assert lines[0]["trial"] == trial and values(lines) == [i % 256 for i in
                                                                      range(count)]
        else:
            text = Path(kept).read_text()
            assert "\0" not in text
            assert values(list(load_trace(kept).records)) == [i % 256 for i in range(count)]

"""The flight recorder on reissued trials: each piece of the device program written once, each
run of it one short record, and what readers make of that the same ops, byte for byte, that a
recorder taking every record writes (times aside); whole at every blocking call, as a
killed worker leaves it; refused, at its line and field, where it does not hold together."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from harness import limits as L
from harness.races.detector import RaceDetector, check_trace
from harness.errors import TraceError
from harness.run.executor import TrialExecutor
from harness.lang.scenario import load_scenario
from harness.traces.flight import CURRENT, FlightRecorder, cut_torn_tail
from harness.traces.optrace import load_trace, plain, plain_file
from kvcore.device.oplog import Segment
from tests.test_reissue import CASES

HEADER = {"scenario": "s", "variant": "v"}


def _recorded(path: str, variant: str, folder: Path, issue_times: bool, trials: int = 8,
              on_blocking=None, amplify: bool = True,
              ) -> tuple[TrialExecutor, list[Path], list[list[dict]]]:
    """``trials`` trials on a simulated device that keeps its world, as a run's worker records
    them (the recorder and the detector on the device): each trial's kept
    trace, and the detector's findings online."""
    scenario = load_scenario(path)
    recorder = FlightRecorder(folder, issue_times=issue_times)
    detector = RaceDetector()

    def attach(device) -> None:
        recorder.attach(device)
        detector.attach(device)
        if on_blocking is not None:
            device.oplog.before_blocking(lambda: on_blocking(recorder))

    executor = TrialExecutor(scenario, scenario.variant(variant), "sim", amplify=amplify,
                             on_device=attach, keep_world=True)
    traces, findings = [], []
    for index in range(trials):
        recorder.start_trial(HEADER, trial=index, seed=index)
        detector.reset()
        executor.run(index, index)
        findings.append([f.to_json() for f in detector.findings])
        traces.append(Path(recorder.end_trial(index, keep=True)))
    return executor, traces, findings


TIMES = ("t_issue_ns", "t_start_ns", "t_end_ns")


def _without_times(text: str) -> list[str]:
    """The lines, each without its times: a run has one issue time, and no device times (the
    simulated device knows its delays' times; a GPU's are measured only with --timeline,
    whose trials are never reissued)."""
    lines = []
    for line in text.splitlines():
        record = json.loads(line)
        for key in TIMES:
            record.pop(key, None)
        lines.append(json.dumps(record, separators=(",", ":")))
    return lines


@pytest.mark.parametrize("amplify", [False, True], ids=["unamplified", "amplified"])
def test_a_reissued_trial_s_trace_is_the_trace_of_its_records(tmp_path, amplify):
    """Every reissuable variant of the catalog and the zoo: trial by trial, the compact trace
    written out (as an incident keeps it) is the per-record trace line for line, keys in the
    same order, but for times (see _without_times); both load strictly with the same ops;
    `gpurace check` of the compact trace finds what the detector found online (unamplified,
    the buggy variants race in their reissued trials)."""
    compact_seen = racing_seen = 0
    for n, (path, variant) in enumerate(CASES):
        fast, compact, online = _recorded(path, variant, tmp_path / f"{n}-c", False,
                                          amplify=amplify)
        _, full, _ = _recorded(path, variant, tmp_path / f"{n}-r", True, amplify=amplify)
        for index, (c, r) in enumerate(zip(compact, full)):
            where = (path, variant, index)
            text = c.read_text()
            compact_seen += '"type":"run"' in text
            racing_seen += '"type":"run"' in text and bool(online[index])
            assert _without_times(plain(text)) == _without_times(r.read_text()), where
            got, want = load_trace(c).records, load_trace(r).records
            assert [{k: v for k, v in x.items() if k not in TIMES} for x in got] == \
                [{k: v for k, v in x.items() if k not in TIMES} for x in want], where
            assert [f.to_json() for f in check_trace(got).findings] == online[index], where
        if fast.reissued:
            # Each piece of the program once a trace, one run record each time it ran.
            text = compact[-1].read_text()
            programs = text.count('"type":"program"')
            assert programs and text.count('"type":"run"') == programs, (path, variant)
    assert compact_seen >= len(CASES)  # reissued trials were recorded compactly
    assert racing_seen or amplify  # and unamplified, racing ones among them


def test_gpurace_check_of_a_compact_trace_says_the_race_found_online(tmp_path):
    from click.testing import CliRunner

    from harness.cli import main

    path = next(p for p, v in CASES if load_scenario(p).name == "cross-stream-race")
    executor, traces, online = _recorded(path, "buggy", tmp_path / "c", False, amplify=False)
    assert executor.reissued and '"type":"run"' in traces[-1].read_text() and online[-1]
    result = CliRunner().invoke(main, ["check", "--format", "json", str(traces[-1])])
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["findings"] == online[-1]


def test_a_run_s_ops_carry_the_bytes_its_live_memsets_set(tmp_path):
    """store-before-write's memsets set the byte the host chose that trial (a live value): a
    reissued trial's trace says each trial's own byte."""
    path = next(p for p, v in CASES if load_scenario(p).name == "store-before-write")
    _, compact, _ = _recorded(path, "fixed", tmp_path / "c", False)
    _, full, _ = _recorded(path, "fixed", tmp_path / "r", True)
    text = compact[-1].read_text()
    assert '"live":[' in text and '"values":[' in text
    values = [op["detail"]["value"] for op in load_trace(compact[-1]).ops
              if "value" in op.get("detail", {})]
    assert values == [op["detail"]["value"] for op in load_trace(full[-1]).ops
                      if "value" in op.get("detail", {})] and values


def test_at_every_blocking_call_the_trial_s_trace_is_whole(tmp_path):
    """What a worker killed in a wait leaves: at each blocking call, the trace file as it is
    then (cut where the parent cuts it) loads strictly, and its ops begin the trial's ops."""
    path = next(p for p, v in CASES if load_scenario(p).name == "cross-stream-race")
    snapshots: list[Path] = []

    def snapshot(recorder: FlightRecorder) -> None:
        if not recorder.path.exists():  # between trials (the world being made): no trace
            return
        copy = tmp_path / f"snap-{len(snapshots)}.jsonl"
        shutil.copyfile(recorder.path, copy)
        cut_torn_tail(copy)
        # The map is longer than its lines, zeros beyond: what the parent's cut leaves.
        copy.write_bytes(copy.read_bytes().rstrip(b"\0"))
        snapshots.append(copy)

    executor, traces, _ = _recorded(path, "fixed", tmp_path / "c", False,
                                    on_blocking=snapshot)
    assert executor.reissued
    last = load_trace(traces[-1]).ops
    taken = [s for s in snapshots if s.read_text().count("\n") > 1]
    final = [s for s in taken if '"trial":7' in s.read_text().split("\n", 1)[0]]
    assert final and any('"type":"run"' in s.read_text() for s in final)
    for snap in final:
        ops = load_trace(snap).ops
        assert ops == last[:len(ops)], snap


def test_a_trace_without_runs_is_kept_as_it_is(tmp_path):
    path = next(p for p, v in CASES if load_scenario(p).name == "cross-stream-race")
    _, full, _ = _recorded(path, "fixed", tmp_path / "r", True, trials=3)
    assert plain_file(full[-1]) == full[-1]
    text = full[-1].read_text()
    assert plain(text) is text


def _compact(*records: dict) -> str:
    head = [{"type": "header", "schema": "gpurace.trace/1", "level": "ops"},
            {"type": "buffer", "id": 1, "name": "page", "space": "device", "nbytes": 4096},
            {"type": "stream", "name": "s", "blocking": False, "legacy": False}]
    return "".join(json.dumps(r) + "\n" for r in (*head, *records))


PROGRAM = {"type": "program", "id": 0, "ops": [
    {"stream": "s", "kind": "memset", "writes": [[1, 0, 4096]], "detail": {"origin": "x"}},
    {"stream": "s", "kind": "copy_dtod", "reads": [[1, 0, 64]], "writes": [[1, 64, 64]]}],
    "live": [0]}


@pytest.mark.parametrize("records, where, says", [
    ([{"type": "run", "program": 0, "seq": 1, "values": [1]}], ":4: program",
     "not declared above"),
    ([PROGRAM, {"type": "run", "program": 0, "seq": 1}], ":5: values", "must be 1 byte"),
    ([PROGRAM, {"type": "run", "program": 0, "seq": 1, "values": [256]}], ":5: values",
     "must be 1 byte"),
    ([PROGRAM, PROGRAM], ":5: id", "already declared on line 4"),
    ([{**PROGRAM, "live": [2]}], ":4: live", "positions of ops"),
    ([{**PROGRAM, "ops": [{"stream": "s", "kind": "memset", "seq": 3}]}], ":4: ops[0].seq",
     "unknown key"),
    ([PROGRAM, {"type": "run", "program": 0, "seq": 1, "values": [7], "when": 3}],
     ":5: when", "unknown key"),
    ([{**PROGRAM, "ops": [{"stream": "t", "kind": "memset"}], "live": []},
      {"type": "run", "program": 0, "seq": 1}], ":5: stream", "not declared above"),
    ([PROGRAM, {"type": "run", "program": 0, "seq": 5, "values": [7]},
      {"type": "run", "program": 0, "seq": 6, "values": [7]}], ":6: seq", "does not follow"),
])
def test_program_and_run_records_that_do_not_hold_together_are_refused(tmp_path, records,
                                                                       where, says):
    trace = tmp_path / "t.jsonl"
    trace.write_text(_compact(*records))
    with pytest.raises(TraceError) as err:
        load_trace(trace)
    line, field = where[1:].split(": ", 1)
    assert re.search(rf":{line}:\d+: {re.escape(field)}: ", str(err.value)) and \
        says in str(err.value), str(err.value)


def test_a_run_expands_to_its_program_s_ops_numbered_from_its_seq(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(_compact(PROGRAM, {"type": "run", "program": 0, "seq": 5, "values": [171],
                                        "t_issue_ns": 90},
                              {"type": "run", "program": 0, "seq": 7, "values": [205]}))
    ops = load_trace(trace).ops
    assert [(o["seq"], o["kind"], o.get("t_issue_ns"), o.get("detail")) for o in ops] == [
        (5, "memset", None, {"origin": "x", "value": 171}), (6, "copy_dtod", 90, None),
        (7, "memset", None, {"origin": "x", "value": 205}), (8, "copy_dtod", None, None)]


def test_a_trace_may_not_stand_for_more_ops_than_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(L, "TRACE_MAX_OPS", 3)
    trace = tmp_path / "t.jsonl"
    trace.write_text(_compact(PROGRAM, {"type": "run", "program": 0, "seq": 1, "values": [1]},
                              {"type": "run", "program": 0, "seq": 3, "values": [1]}))
    with pytest.raises(TraceError, match=r":6:\d+: program: more than 3 ops"):
        load_trace(trace)


def test_the_worker_s_scratch_trace_is_the_current_trial_s(tmp_path):
    """The file a dead worker leaves is trial-current.jsonl, compact or not."""
    path = next(p for p, v in CASES if load_scenario(p).name == "cross-stream-race")
    recorder = FlightRecorder(tmp_path)
    executor = TrialExecutor(load_scenario(path), load_scenario(path).variant("fixed"), "sim",
                             on_device=recorder.attach, keep_world=True)
    for index in range(4):
        recorder.start_trial(HEADER, trial=index)
        executor.run(index, index)
        recorder.flush()
    assert executor.reissued and (tmp_path / CURRENT).exists()
    copy = tmp_path / "dead.jsonl"
    copy.write_bytes((tmp_path / CURRENT).read_bytes().rstrip(b"\0"))
    assert load_trace(copy).header["trial"] == 3 and load_trace(copy).ops


def test_a_piece_s_program_record_comes_once_a_trace_each_run_a_line(tmp_path):
    """The same piece twice in a flush, and again in the next ones, live values of each their
    own: every trace has the piece's program record once, before its first run, and each run
    one line with its own numbers; the runs expand to the segments' records."""
    path, variant = next((p, v) for p, v in CASES if any(
        type(e) is Segment and e.values for e in _segments_of(p, v)))
    taken = next(e for e in _segments_of(path, variant) if type(e) is Segment and e.values)
    piece, live = taken.templates, len(taken.values)  # every run of it sets as many bytes
    recorder = FlightRecorder(tmp_path)
    for index, first in enumerate((100, 5000, 100)):
        recorder.start_trial(HEADER, trial=index)
        segments = [Segment(piece, first, (1,) * live, 7),
                    Segment(piece, first + 50, (index,) * live)]
        recorder._pending += segments  # two runs in a flush
        recorder.flush()
        later = Segment(piece, first + 90, (9,) * live, 11)
        recorder._pending.append(later)  # one run a flush, as a reissued trial's waits cut them
        recorder.flush()
        segments.append(later)
        kept = Path(recorder.end_trial(index, keep=True))
        text = kept.read_text()
        assert text.count('"type":"program"') == 1, index
        assert text.index('"type":"program"') < text.index('"type":"run"')
        values = ",".join(["9"] * live)
        assert f'"seq":{first + 90},"t_issue_ns":11,"values":[{values}]}}' in text
        want = [op for s in segments for op in s.records()]
        # No device attached, so no buffers declared: expanded, not loaded.
        got = [json.loads(line) for line in plain(text).splitlines()[1:]]
        assert [r["seq"] for r in got] == [r.seq for r in want]
        assert [r.get("detail") for r in got] == [json.loads(json.dumps(r.detail)) or None
                                                 for r in want]
        assert recorder.total == len(want)


def _segments_of(path: str, variant: str) -> list:
    """The segments a reissued trial of ``path`` hands its observers (the third trial's)."""
    scenario = load_scenario(path)
    got: list = []
    executor = TrialExecutor(scenario, scenario.variant(variant), "sim", amplify=False,
                             keep_world=True, on_device=lambda device: device.oplog.subscribe(
                                 got.append, segments=got.append))
    for index in range(3):
        got.clear()
        executor.run(index, index)
    return got


def test_each_trial_s_trace_begins_with_the_owners_of_its_start(tmp_path):
    """A trial that hands bytes out and takes them back leaves the owners as they were (the
    next trace begins with the same ones); one that keeps them, or gives back bytes owned
    before it began, changes them: every trace's label records are the owners at its start."""
    import kvcore

    device = kvcore.open_device("sim")
    buf = device.alloc(4096, name="pool")
    recorder = FlightRecorder(tmp_path)
    recorder.attach(device)  # the op log listens from here on: owners are kept
    device.label(buf, [(0, 1024)], "lease a")
    # What each trial does to the owners: back as they were, kept, back, given back.
    trials = [
        lambda: (device.label(buf, [(1024, 512)], "lease b"), device.unlabel(buf, [(1024, 512)])),
        lambda: device.label(buf, [(2048, 256)], "lease c"),
        lambda: (device.label(buf, [(3072, 64)], "lease d"), device.unlabel(buf, [(3072, 64)])),
        lambda: device.unlabel(buf, [(0, 1024)]),
        lambda: None,
    ]
    for index, change in enumerate(trials):
        expected = [[label.offset, label.length, label.name]
                    for label in device.oplog.labels.live()]
        recorder.start_trial(HEADER, trial=index)
        change()
        device.synchronize()  # a blocking call: the trace is flushed
        trace = load_trace(Path(recorder.end_trial(index, keep=True)))
        labels = [[r["offset"], r["length"], r["name"]] for r in trace.records
                  if r["type"] == "label"]
        assert labels == expected, index
    assert expected == [[2048, 256, "lease c"]]

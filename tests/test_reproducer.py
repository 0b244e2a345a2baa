"""`gpurace minimize` of a watched run: each real program's recorded race becomes a scenario
that loads, keeps the program's names, is found on every trial unamplified, reproduces amplified
and is clean fixed, on the simulated device (the H200's side is tests/test_amplify_gpu.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.capture.analysis import RunAnalysis
from harness.capture.events import iter_file
from harness.capture.reproducer import reproducer
from harness.cli import main
from harness.errors import TraceError
from harness.lang.scenario import load_scenario
from harness.traces.optrace import load_trace

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "capture_recorded"
BUGGY = sorted(CORPUS.glob("*-buggy.jsonl"))
TRIALS = 20


def _traced(events: list[list], trace: Path, program: str = "prog",
            ) -> tuple[list[dict], list[dict]]:
    """Capture events through the watch's analysis: the trace it wrote, read back, and its
    findings."""
    analysis = RunAnalysis(trace, {"scenario": program, "variant": "watched"})
    analysis.feed(events)
    analysis.close()
    return load_trace(trace).records, [f.to_json() for f in analysis.findings]


def _run(path: Path, out: Path, *more: str) -> dict[str, dict]:
    got = CliRunner().invoke(main, ["run", str(path), "--backend", "sim", "--trials",
                                    str(TRIALS), "--format", "json", "--out", str(out), *more])
    return {r["variant"]: r for r in json.loads(got.stdout)["results"]}


@pytest.mark.parametrize("events", BUGGY, ids=lambda p: p.stem)
def test_a_watched_race_becomes_a_scenario_that_reproduces_amplified_and_is_clean_fixed(
        events, tmp_path):
    out = tmp_path / "race.yaml"
    made = CliRunner().invoke(main, ["minimize", str(events), "-o", str(out)])
    assert made.exit_code == 0, made.output
    # minimize tries what it wrote on the simulated device and says so.
    assert "buggy manifested 5/5 (race found 5/5), fixed 0/5 (found 0/5)" in made.output
    assert "warning" not in made.output
    scenario = load_scenario(out)
    steps = len(scenario.steps)
    assert 5 <= steps <= 20, steps
    text = out.read_text()
    # The program's lines and names are the scenario's.
    program = events.stem.rsplit("-", 1)[0]
    assert f"tests/watch_programs/{program}.py:" in text
    assert scenario.amplify is not None and scenario.amplify.before in {s.id for s in
                                                                       scenario.steps}
    amplified = _run(out, tmp_path / "amp")
    plain = _run(out, tmp_path / "plain", "--no-amplify")
    buggy, fixed = amplified["buggy"], amplified["fixed"]
    assert buggy["manifested"] >= 0.95 * TRIALS and buggy["detected"] == TRIALS, buggy
    assert fixed["manifested"] == 0 and fixed["detected"] == 0, fixed
    assert plain["buggy"]["detected"] == TRIALS and plain["fixed"]["detected"] == 0
    print(f"{program}: {steps} steps, amplified {buggy['manifested']}/{TRIALS}, "
          f"fixed {fixed['manifested']}/{TRIALS}")


def test_the_scenario_names_streams_and_memory_as_the_program_does(tmp_path):
    out = tmp_path / "views.yaml"
    CliRunner().invoke(main, ["minimize", str(CORPUS / "torch_views-buggy.jsonl"), "-o",
                              str(out)])
    scenario = load_scenario(out)
    assert {s.name for s in scenario.streams} == {"prefill", "decode"}
    ids = [s.id for s in scenario.steps if s.id]
    assert "kv_cache" in ids and "mm-68" in ids and "copy-dtod-79" in ids
    assert scenario.amplify.before == "mm-68" and scenario.amplify.stream == "prefill"
    stale = tmp_path / "stale.yaml"
    CliRunner().invoke(main, ["minimize", str(CORPUS / "torch_stale_event-buggy.jsonl"), "-o",
                              str(stale)])
    kinds = [(s.op, s.args.get("event")) for s in load_scenario(stale).steps
             if s.op in ("record_event", "wait_event") and "fixed" not in str(s.only)]
    # The stale record (line 59, before the write) and the wait that trusted it are kept.
    assert kinds == [("record_event", "event-59"), ("wait_event", "event-59")], kinds


def test_an_incident_folder_and_a_trace_of_a_watched_run_give_the_same_scenario(tmp_path):
    events = CORPUS / "torch_record_stream-buggy.jsonl"
    trace = tmp_path / "trace.jsonl"
    _traced(list(iter_file(events)), trace, "torch_record_stream")
    incident = tmp_path / "incident"
    incident.mkdir()
    (incident / "trace.jsonl").write_text(trace.read_text())
    (incident / "report.json").write_text(json.dumps({
        "variant": {"name": "watched"},
        "reproduce": {"argv": ["gpurace", "watch", "--", "python", "torch_record_stream.py"]}}))
    texts = []
    for source in (events, trace, incident):
        out = tmp_path / f"{source.name}.yaml"
        made = CliRunner().invoke(main, ["minimize", str(source), "-o", str(out)])
        assert made.exit_code == 0, made.output
        texts.append(out.read_text())
    assert texts[0] == texts[1]
    assert texts[2].replace(" of `gpurace watch -- python torch_record_stream.py`", "") == \
        texts[0]
    assert "allocator: caching" in texts[0] and "op: release" in texts[0]


def test_a_clean_watched_run_has_nothing_to_write(tmp_path):
    made = CliRunner().invoke(main, ["minimize", str(CORPUS / "torch_views-fixed.jsonl"), "-o",
                                     str(tmp_path / "x.yaml")])
    assert made.exit_code == 2 and "found no race" in made.output
    assert not (tmp_path / "x.yaml").exists()
    made = CliRunner().invoke(main, ["minimize", str(CORPUS / "torch_views-buggy.jsonl"), "-o",
                                     str(tmp_path / "x.yaml"), "--finding", "9"])
    assert made.exit_code == 2 and "found 1 race" in made.output


def test_a_race_that_begins_with_the_hosts_access_is_refused_with_why(tmp_path):
    records, findings = _traced(list(iter_file(CORPUS / "torch_pinned_rewrite-buggy.jsonl")),
                                tmp_path / "trace.jsonl", "p")
    f = findings[0]
    host = dict(f["second"], seq=0)  # the host's write, taken as if it came first
    with pytest.raises(TraceError, match="begins with the host's own access"):
        reproducer(records, {**f, "second": host}, program="p")


def test_a_stale_event_the_host_synchronized_is_kept_before_the_hosts_read(tmp_path):
    """The host synchronizes an event recorded before the copy it should cover, then reads the
    copy's pinned result: the record and the synchronize are kept, and the scenario shows it."""
    from tests.test_capture import BASE, PINNED, S1, _alloc, _op, _streams
    events = _streams() + [
        _alloc(PINNED, 256, "out", "h"), _alloc(BASE, 256, "dev"),
        ["event", 7, {"site": "prog.py:4"}], ["record", 7, S1, "prog.py:39"],
        _op(S1, "copy_dtoh", 40, r=[("d", BASE, 256)], w=[("h", PINNED, 256)]),
        ["sync_event", 7, "prog.py:41"],
        _op(None, "host_read", 42, r=[("h", PINNED, 256)])]
    records, (finding,) = _traced(events, tmp_path / "trace.jsonl")
    made = reproducer(records, finding, program="prog")
    out = tmp_path / "stale.yaml"
    out.write_text(made.text)
    steps = load_scenario(out).steps
    edges = [(s.op, s.args.get("event")) for s in steps if s.args.get("event")]
    assert edges == [("record_event", "event-4"), ("synchronize", "event-4")], edges  # made at :4
    # In the program's order: the record, the copy, the synchronize of the stale event, (the
    # fix's synchronize of the stream), the host's read.
    assert [(s.op, s.args.get("event"), s.only) for s in steps][-5:] == [
        ("record_event", "event-4", None), ("copy_to_host", None, None),
        ("synchronize", "event-4", None), ("synchronize", None, frozenset({"fixed"})),
        ("check", None, None)]
    results = _run(out, tmp_path / "runs")
    assert results["buggy"]["manifested"] >= 0.95 * TRIALS, results["buggy"]
    assert results["fixed"]["manifested"] == results["fixed"]["detected"] == 0


def test_two_streams_writing_the_same_bytes_become_a_check_of_what_they_hold(tmp_path):
    """A write against a write: the scenario checks the bytes hold the second write's at the
    end, which the delayed first write overwrites amplified, and the fix orders."""
    from tests.test_capture import BASE, S1, S2, _alloc, _op, _streams
    events = _streams() + [_alloc(BASE, 4096, "kv"),
                           _op(S1, "kernel:fill_", 10, w=[("d", BASE, 4096)]),
                           _op(S2, "kernel:copy_", 11, w=[("d", BASE, 4096)])]
    records, (finding,) = _traced(events, tmp_path / "trace.jsonl")
    made = reproducer(records, finding, program="prog")
    assert made.shape == "write then write"
    out = tmp_path / "waw.yaml"
    out.write_text(made.text)
    scenario = load_scenario(out)
    assert {s.name for s in scenario.streams} == {"s1", "s2"}
    assert scenario.steps[-1].op == "check" and scenario.steps[-1].args.get("lease") == "kv"
    results = _run(out, tmp_path / "runs")
    assert results["buggy"]["manifested"] >= 0.95 * TRIALS, results["buggy"]
    assert results["fixed"]["manifested"] == results["fixed"]["detected"] == 0

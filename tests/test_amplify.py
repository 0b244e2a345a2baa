"""`gpurace watch --amplify` without a GPU: what a delay names, which racing op it is planned
before (on the recorded captures of the real programs), which of a recording's ops a source would
queue it before, how the watched process says what it queued, and what the command refuses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.capture import amplify as A
from harness.capture.analysis import RunAnalysis
from harness.capture.events import iter_file
from harness.capture.translate import Translator
from harness.capture.watch import _failure_line
from harness.results.watched import WatchedRun

from tests.test_capture_recorded import CORPUS, PROGRAMS, ROOT
from tests.test_capture_recorded import _replay as _findings

BUGGY = sorted(CORPUS.glob("*-buggy.jsonl"))


def _race_lines(program: Path) -> set[int]:
    """The lines a program marks ``# RACE``: its racing ops."""
    return {n for n, text in enumerate(program.read_text().splitlines(), 1) if "# RACE" in text}


def test_a_site_is_file_and_line_and_says_what_is_wrong_otherwise():
    d = A.parse_site("tests/watch_programs/torch_views.py:68", 250.0)
    assert (d.path, d.line, d.us, d.kind) == ("tests/watch_programs/torch_views.py", 68, 250.0,
                                              None)
    assert A.parse_site("C:/x/serve.py:7").path == "C:/x/serve.py"  # the last colon splits
    for bad, words in (("serve.py", "not FILE:LINE"), ("serve.py:x", "not FILE:LINE"),
                       ("serve.py:0", "count from 1"), (":3", "not FILE:LINE")):
        with pytest.raises(ValueError, match=words):
            A.parse_site(bad)
    delays = (d, A.Delay("a.py", 3, 10.0, "kernel:mm"))
    assert A.decode(A.encode(delays)) == delays


def test_a_site_names_the_captured_file_by_its_path_or_its_tail(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    assert A.same_file("pkg/serve.py", "pkg/serve.py")
    assert A.same_file("pkg/serve.py", str(tmp_path / "pkg" / "serve.py"))
    assert A.same_file("pkg/serve.py", "serve.py")  # the tail of its path
    assert A.same_file("/elsewhere/pkg/serve.py", "pkg/serve.py")
    assert not A.same_file("pkg/myserve.py", "serve.py")  # a tail at a folder's edge only
    assert not A.same_file("other/serve.py", "pkg/serve.py")


@pytest.mark.parametrize("path", BUGGY, ids=lambda p: p.stem)
def test_auto_plans_a_delay_before_the_earlier_racing_op_of_each_pair(path):
    """On each real program's recorded capture: every racing pair whose earlier op is a
    stream's gets a delay at that op's line (one the program marks as racing) and of its kind,
    and a source replaying the capture would queue it before exactly those ops."""
    findings = _findings(path)
    targets = A.plan(findings, 500.0)
    program = PROGRAMS / (path.stem.rsplit("-", 1)[0] + ".py")
    assert targets, (findings, A.unplanned(findings))
    assert len(targets) + len(A.unplanned(findings)) >= 1
    for t in targets:
        first = min((t.finding["first"], t.finding["second"]), key=lambda op: op["seq"])
        assert t.delay.site == first["step"] and t.delay.kind == first["kind"]
        assert t.delay.us == 500.0 and t.stream == first["stream"] != "host"
    assert {t.delay.line for t in targets} & _race_lines(program), (
        [t.delay for t in targets], sorted(_race_lines(program)))
    # What the sources would ask the amplifier, op by op, as the capture has them.
    emitted: list[list] = []
    amp = A.Amplifier([t.delay for t in targets], emitted.append)
    delayed = []
    for event in iter_file(path):
        if event[0] == "op" and event[1] is not None:
            delay = amp.wants(event[5].get("site"), event[2])
            if delay is not None:
                amp.queued(delay, event[1])
                delayed.append((event[5]["site"], event[2]))
    assert delayed and all((site, kind) in {(t.delay.site, t.delay.kind) for t in targets}
                           for site, kind in delayed)
    amp.report()
    (kind, counts, failures), = emitted
    assert kind == "delays" and failures == []
    assert sum(c["queued"] for c in counts) == len(delayed)


def test_a_pair_that_begins_with_the_hosts_own_access_is_not_planned():
    host = {"seq": 3, "stream": "host", "kind": "host_write", "step": "a.py:5"}
    copy = {"seq": 9, "stream": "upload", "kind": "copy_htod", "step": "a.py:9"}
    f = {"first": host, "second": copy}
    assert A.plan([f]) == [] and A.unplanned([f]) == [f]
    g = {"first": copy | {"seq": 12}, "second": host | {"seq": 2}}  # the earlier by seq
    assert A.plan([g]) == []
    (t,) = A.plan([{"first": host | {"seq": 20}, "second": copy}])
    assert (t.delay.site, t.delay.kind, t.stream) == ("a.py:9", "copy_htod", "upload")


def test_one_delay_per_site_and_kind_however_many_pairs_begin_there():
    w = {"seq": 1, "stream": "prefill", "kind": "kernel:mm", "step": "a.py:5"}
    pairs = [{"first": w, "second": {"seq": s, "stream": "decode", "kind": "copy_dtod",
                                     "step": f"a.py:{s}"}} for s in (7, 8)]
    assert [t.second for t in A.plan(pairs)] == ["copy_dtod on decode at a.py:7"]


def test_a_delay_of_a_kind_waits_for_that_kind_only_and_a_bare_line_for_every_op():
    emitted: list[list] = []
    amp = A.Amplifier([A.Delay("a.py", 5, kind="kernel:mm"), A.Delay("b.py", 2)],
                      emitted.append)
    assert amp.wants("a.py:5", "kernel:mm") is not None
    assert amp.wants("a.py:5", "kernel:add") is None
    assert amp.wants("a.py:6", "kernel:mm") is None
    assert amp.wants("b.py:2", "copy_htod") == amp.wants("b.py:2", "kernel:x") is not None
    assert amp.wants(None, "kernel:mm") is None
    d = amp.wants("b.py:2", "copy_htod")
    amp.failed(d, "RuntimeError('no NVRTC')")
    assert amp.wants("b.py:2", "copy_htod") is None  # not asked for again
    amp.report()
    translator = Translator(lambda r: None, lambda b: None, lambda s: None)
    translator.feed(emitted)
    assert [d["line"] for d in translator.delays] == [5, 2]
    assert any("b.py:2: RuntimeError('no NVRTC')" in n for n in translator.notes)


def test_fails_when_finds_the_line_of_the_programs_output_that_says_it_failed(tmp_path):
    log = tmp_path / "program.log"
    log.write_text("work_s=0.01\nWRONG: request 3: decode read page 6 early (1 of 8)\nbye\n")
    assert _failure_line(log, "^WRONG") == "WRONG: request 3: decode read page 6 early (1 of 8)"
    assert _failure_line(log, "page \\d+ early") == \
        "WRONG: request 3: decode read page 6 early (1 of 8)"
    assert _failure_line(log, "^RIGHT") is None
    assert _failure_line(tmp_path / "gone.log", "x") is None


def _cli(tmp_path: Path, *words: str) -> subprocess.CompletedProcess[str]:
    prog = tmp_path / "prog.py"
    prog.write_text("print('hi')\n")
    return subprocess.run([sys.executable, "-m", "harness.cli", "watch", "--out",
                           str(tmp_path / "out"), *words, "--", sys.executable, str(prog)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("words, said", [
    (("--amplify", "auto", "--amplify", "prog.py:1"), "give auto alone"),
    (("--amplify", "prog.py"), "is not FILE:LINE"),
    (("--amplify", "nothere.py:3"), "no such file 'nothere.py'"),
    (("--amplify", "prog.py:0"), "lines count from 1"),
    (("--amplify", "auto", "--fails-when", "(unclosed"), "is not a regular expression"),
    (("--amplify", "auto", "--delay-us", "0"), "--delay-us"),
    (("--sweep",), "give --amplify auto, or the line to delay"),
    (("--amplify", "auto", "--sweep", "--sweep-us", "0,x"), "microseconds separated by commas"),
    (("--amplify", "auto", "--sweep", "--sweep-us", "-5,10"), "each delay from 0"),
])
def test_watch_refuses_a_bad_amplify_before_running_anything(tmp_path, words, said):
    done = _cli(tmp_path, *words)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr, done.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("run-*"))


def test_the_run_document_schema_takes_an_amplified_watch():
    import jsonschema

    from harness import schemas
    schema = schemas.load("run")
    watch = schema["properties"]["watch"]
    entry = {"variant": "amplified-1", "delays": [A.Delay("a.py", 5, 1000.0,
                                                          "kernel:mm").to_json()],
             "first": "kernel:mm on prefill at a.py:5", "second": "copy_dtod on decode at a.py:7",
             "stream": "prefill", "gap_us": 41.5, "trials": 20, "failed": 19,
             "interval": [0.76, 0.99], "queued": 160}
    run = {"index": 0, "variant": "amplified-1", "status": 1, "signal": None,
           "timed_out": False, "error": None, "ops": 10, "records": 12, "sources": {},
           "events": "e", "trace": "t", "log": "l"}
    validator = jsonschema.Draft202012Validator({**watch, "$defs": schema.get("$defs", {})})
    assert not list(validator.iter_errors({"command": "python a.py", "runs": [run],
                                           "amplified": [entry]}))
    assert list(validator.iter_errors({"command": "x", "runs": [],
                                       "amplified": [{**entry, "variant": "Amplified 1"}]}))
    assert re.fullmatch(r"[a-z0-9][a-z0-9_-]*", entry["variant"])


def test_a_sweep_gives_each_plan_one_curve_of_points_and_each_point_a_folder():
    from harness.capture.watch import points
    (target,) = A.plan(_findings(CORPUS / "torch_views-buggy.jsonl"))
    plain = points([((target.delay,), target)], ())
    assert [(p.variant, p.folder, p.us) for p in plain] == [
        ("amplified-1", "amplified-1", 1000.0)]
    swept = points([((target.delay,), target), ((A.Delay("b.py", 3),), None)], (0, 50, 1000))
    assert [(p.variant, p.folder, p.us) for p in swept] == [
        ("amplified-1", "amplified-1-0us", 0), ("amplified-1", "amplified-1-50us", 50),
        ("amplified-1", "amplified-1-1000us", 1000), ("amplified-2", "amplified-2-0us", 0),
        ("amplified-2", "amplified-2-50us", 50), ("amplified-2", "amplified-2-1000us", 1000)]
    assert all(d.us == p.us and d.site == target.delay.site and d.kind == "kernel:mm"
               for p in swept[:3] for d in p.delays)
    # A plan whose delay outlasts the sweep (a slow host's, three times its gap) ends its
    # curve there; the others' points stay the sweep's.
    slow = A.Delay("a.py", 7, 7500.0)
    swept = points([((slow,), None), ((A.Delay("b.py", 3),), None)], (0, 50))
    assert [(p.variant, p.us) for p in swept] == [
        ("amplified-1", 0), ("amplified-1", 50), ("amplified-1", 7500.0),
        ("amplified-2", 0), ("amplified-2", 50), ("amplified-2", 1000.0)]


def test_an_amplified_watch_writes_a_run_document_of_the_schema_and_its_window(tmp_path):
    """The writing end of `gpurace watch --amplify --sweep`: results of the shape the watch
    makes (a plain run that raced, and a plan's points), through the command's own writer."""
    import json

    import jsonschema

    from harness import schemas
    from harness.cli.runs import write_and_show
    from harness.cli.watch import _print_watch_summary
    from harness.capture.watch import points
    from harness.results.outcome import Outcome, TrialResult, VariantResult
    from harness.run.outputs import RunFolder
    from harness.results.rates import wilson
    from harness.gpu.nvml import health_snapshot
    from harness.results.watched import AmplifiedPlan, WatchResult
    (target,) = A.plan(_findings(CORPUS / "torch_views-buggy.jsonl"))
    folder = RunFolder.create(tmp_path)
    watched = VariantResult("torch_views", "watched", "clean", "torch_views.py", False, False,
                            None)
    watched.add(TrialResult(0, 0, Outcome.CLEAN, race=True, findings=[target.finding]))
    watched.judge()
    variants, plans = [watched], []
    for point, failed in zip(points([((target.delay,), target)], (0, 100, 1000)), (0, 3, 4)):
        v = VariantResult("torch_views", point.variant, "clean", "torch_views.py", False, True,
                          point.us, sweep=True)
        for i in range(4):
            v.add(TrialResult(i, 0, Outcome.CORRUPTION if i < failed else Outcome.CLEAN,
                              detail="the program's output matched --fails-when: WRONG"))
        v.judge()
        variants.append(v)
        plans.append(AmplifiedPlan(v.variant, tuple(d.to_json() for d in point.delays),
                                   target.first, target.second, target.stream, target.gap_us,
                                   4, failed, wilson(failed, 4), 8 * 4 if point.us else 0))
    result = WatchResult(program="torch_views", command="python torch_views.py",
                         folder=str(folder.path), run_id=folder.run_id,
                         device={"backend": "cuda"},
                         health={"before": health_snapshot(), "after": health_snapshot()},
                         results=tuple(variants), runs=(), amplified=tuple(plans))
    result = write_and_show(result, None, "text", show=_print_watch_summary)
    doc = json.loads((folder.path / "run.json").read_text())
    errors = list(jsonschema.Draft202012Validator(schemas.load("run")).iter_errors(doc))
    assert not errors, [e.message for e in errors]
    assert doc["exit_code"] == 1  # the race the plain run found; a sweep's points map it
    assert doc["plan"] is None  # a watch runs no scenario: nothing for shards to share
    assert doc["watch"]["amplified"][1]["failed"] == 3 and result.exit_code == 1
    rows = (folder.path / "window.csv").read_text().splitlines()
    assert [r.split(",")[2:5] for r in rows[1:]] == [["0", "4", "0"], ["100", "4", "3"],
                                                       ["1000", "4", "4"]]


def test_a_delay_outlasts_three_times_the_hosts_way_from_the_first_op_to_the_second(tmp_path):
    """Issue times in the capture (the sources' ``t``) reach the trace, and the plan lengthens
    a pair's delay to three times the host's gap between its ops where that is longer; a
    trace without them, or of another run, leaves --delay-us."""
    from harness.capture.watch import _issue_times
    from tests.test_capture import PINNED, S1, _alloc, _op, _streams

    def events(gap_ns: int) -> list[list]:
        copy = _op(S1, "copy_htod", 68, r=[("h", PINNED, 64)], w=[("d", 0x7000_0000, 64)])
        rewrite = _op(None, "host_write", 63, w=[("h", PINNED, 64)])
        copy[5]["t"], rewrite[5]["t"] = 5_000_000, 5_000_000 + gap_ns
        return _streams() + [_alloc(PINNED, 64, "ids", "h"), _alloc(0x7000_0000, 64, "dev"),
                             copy, rewrite]

    for gap_ns, planned in ((2_500_000, 7500.0), (100_000, 1000.0),
                            (10_000_000_000, A.PLANNED_MAX_US)):
        trace = tmp_path / f"trace-{gap_ns}.jsonl"
        analysis = RunAnalysis(trace, {"scenario": "p", "variant": "watched"})
        analysis.feed(events(gap_ns))
        analysis.close()
        findings = [f.to_json() for f in analysis.findings]
        issued = _issue_times([str(trace)])
        (t,) = A.plan(findings, 1000.0, issued)
        assert t.gap_us == gap_ns / 1000 and t.delay.us == planned
        assert t.delay.site == "prog.py:68" and t.delay.kind == "copy_htod"
        # The same findings against a trace of other ops (another run's): no gap, --delay-us.
        other = {seq: (when, "elsewhere.py:1") for seq, (when, _) in issued.items()}
        (u,) = A.plan(findings, 1000.0, other)
        assert u.gap_us is None and u.delay.us == 1000.0
    assert _issue_times([str(tmp_path / "gone.jsonl")]) == {}


def _watched_run(index: int, analysis_error: str = "") -> WatchedRun:
    """A watched run's record, for the lines the CLI says as each run ends."""
    return WatchedRun(index=index, label="", status=0, signal=None, timed_out=False,
                      error=None, ops=3, records=3, sources={}, events="e", trace="t",
                      log="l", start="fresh", duration_s=1.0, launch_s=0.1, capture={},
                      analysis_error=analysis_error)


def test_each_amplified_runs_line_says_its_plan_and_delay(capsys):
    from harness.cli.watch import _WatchHooks
    from harness.results.outcome import Outcome, TrialResult, VariantResult
    hooks = _WatchHooks(True)
    plain = VariantResult("p", "watched", "clean", "p.py", False, False, None)
    swept = VariantResult("p", "amplified-2", "clean", "p.py", False, True, 50.0, sweep=True)
    hooks.run_finished(plain, TrialResult(0, 0, Outcome.CLEAN, duration_s=1.5),
                       _watched_run(0))
    hooks.run_finished(swept, TrialResult(3, 0, Outcome.CORRUPTION, duration_s=2.0),
                       _watched_run(3))
    err = capsys.readouterr().err
    assert "run 1 of p: clean, no race" in err
    assert "run 4 of p amplified-2 (50 µs): corruption, no race" in err


def test_a_runs_line_never_says_no_race_when_the_analysis_failed(capsys):
    """The analysis of a run failed part way (gpurace's fault): its line says the races are
    unknown, or how many it found before it failed, never "no race"."""
    from harness.cli.watch import _WatchHooks
    from harness.results.outcome import Outcome, TrialResult, VariantResult
    hooks = _WatchHooks(True)
    plain = VariantResult("p", "watched", "clean", "p.py", False, False, None)
    hooks.run_finished(plain, TrialResult(0, 0, Outcome.CLEAN), _watched_run(0, "TypeError: x"))
    hooks.run_finished(plain, TrialResult(1, 0, Outcome.CLEAN, findings=[{"kind": "raw"}]),
                       _watched_run(1, "TypeError: x"))
    hooks.run_finished(plain, TrialResult(2, 0, Outcome.CLEAN), _watched_run(2))
    err = capsys.readouterr().err
    assert "run 1 of p: clean, races unknown: the analysis failed" in err
    assert "run 2 of p: clean, 1 race before the analysis failed" in err
    assert "run 3 of p: clean, no race" in err


def test_issue_times_are_read_from_a_trace_too_large_to_load(tmp_path, monkeypatch):
    """A real program's watched trace runs to tens of megabytes, past what load_trace checks
    and holds: the plan's issue times are read from it line by line all the same, the same
    as load_trace reads them from a small one; a trace cut mid-line is refused."""
    from harness import limits
    from harness.errors import TraceError
    from harness.traces.optrace import issue_times, load_trace
    from tests.test_capture import S1, _alloc, _op, _streams

    trace = tmp_path / "trace.jsonl"
    analysis = RunAnalysis(trace, {"scenario": "p", "variant": "watched"})
    ops = [_op(S1, "kernel:fill_", 10 + i, w=[("d", 0x7000_0000, 64)]) for i in range(200)]
    for i, op in enumerate(ops):
        op[5]["t"] = 1_000 * i
    analysis.feed(_streams() + [_alloc(0x7000_0000, 64, "x")] + ops)
    analysis.close()
    loaded = {int(r["seq"]): (r["t_issue_ns"], r.get("step")) for r in load_trace(trace).records
              if r.get("type") == "op" and "t_issue_ns" in r}
    assert len(loaded) == 200
    monkeypatch.setattr(limits, "TRACE_MAX_BYTES", 1024)
    with pytest.raises(TraceError):
        load_trace(trace)
    assert issue_times(trace) == loaded
    torn = tmp_path / "torn.jsonl"
    torn.write_text(trace.read_text() + '{"seq":900,"stream"')
    with pytest.raises(TraceError, match="the file ends mid-record"):
        issue_times(torn)


def test_a_kernel_another_source_launches_into_a_capture_is_the_graphs_for_its_delay():
    """A Triton kernel launched while a CUDA graph is captured gets no delay of its own (the
    spin kernel would be captured); it is one of the graph's ops, so a delay asked for at it is
    queued before the graph's replays. Only while the PyTorch source is installed."""
    from harness.capture.torch_graphs import Graphs, captured_elsewhere

    graphs = Graphs(cap=None)
    graphs.capturing.add(7)
    graphs.ops[7] = set()
    captured_elsewhere("prog.py:12", "kernel:scale")
    graphs.capturing.clear()
    captured_elsewhere("prog.py:30", "kernel:after")  # no capture: no graph's op
    assert graphs.ops == {7: {("prog.py:12", "kernel:scale")}}
    graphs.close()
    graphs.capturing.add(8)
    graphs.ops[8] = set()
    captured_elsewhere("prog.py:12", "kernel:scale")
    assert graphs.ops[8] == set()


def test_a_race_between_a_graphs_branches_is_delayed_inside_the_graph():
    """A pair inside one replay of a CUDA graph (a branch stream and the replay stream) gets a
    delay captured into the graph (a delay before the replay would hold back both); a pair
    between a replay and the program's other stream gets one before the replay."""
    from tests.test_capture import BASE, G, S1, S2, _captured, _op
    from tests.test_capture import _findings as replayed

    fork = [["event", 8, {}], ["record", 8, S1, "prog.py:50"], ["wait", 8, S2, "prog.py:50"],
            _op(S2, "kernel:fill_", 51, w=[("d", BASE + 4096, 64)]),
            _op(S1, "kernel:sum", 53, r=[("d", BASE + 4096, 64)]),
            ["event", 9, {}], ["record", 9, S2, "prog.py:54"], ["wait", 9, S1, "prog.py:54"]]
    inside = replayed(_captured(*fork) + [["graph_replay", G, S1, "prog.py:60"]])
    (target,) = A.plan(inside)
    assert (target.delay.site, target.delay.kind, target.delay.in_graph) == \
        ("prog.py:51", "kernel:fill_", True)
    assert target.delay.describe().endswith("before kernel:fill_ at prog.py:51 inside its "
                                            "CUDA graph")
    assert A.decode(A.encode([target.delay])) == (target.delay,)
    # In the watched process it is asked for only while the graph is captured.
    amp = A.Amplifier([target.delay], lambda event: None)
    assert amp.wants("prog.py:51", "kernel:fill_") is None
    assert amp.wants("prog.py:51", "kernel:fill_", in_graph=True) == target.delay
    # The same race run eagerly first (a warm-up before the capture) keeps a delay of its own.
    eager = [_op(S2, "kernel:fill_", 51, w=[("d", BASE + 4096, 64)]),
             _op(S1, "kernel:sum", 53, r=[("d", BASE + 4096, 64)])]
    graph = _captured(*fork)
    begin = next(i for i, event in enumerate(graph) if event[0] == "graph_begin")
    both = replayed(graph[:begin] + eager + graph[begin:]
                    + [["graph_replay", G, S1, "prog.py:60"]])
    assert sorted((t.delay.site, t.delay.in_graph) for t in A.plan(both)) == \
        [("prog.py:51", False), ("prog.py:51", True)]
    outside = replayed(_captured() + [["graph_replay", G, S2, "prog.py:30"],
                                      _op(S1, "copy_htod", 32, w=[("d", BASE, 4096)])])
    (target,) = A.plan(outside)
    assert (target.delay.site, target.delay.in_graph) == ("prog.py:21", False)

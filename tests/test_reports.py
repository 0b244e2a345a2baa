"""reports/: atomic files that survive SIGKILL, incident folders, Markdown and JUnit renderers."""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from reports.html import render_html
from reports import (
    REPORT_SCHEMA,
    ReportError,
    atomic_writer,
    list_incidents,
    load_report,
    remove_stale_temps,
    render_junit,
    render_markdown,
    write_atomic,
    write_incident,
)
from reports.atomic import current_umask

REPO = Path(__file__).resolve().parents[1]


def temps(folder: Path) -> list[Path]:
    """Every leftover temp file or folder under ``folder``."""
    return [p for p in folder.rglob(".*") if p.name.endswith(".tmp")]


def full_report(**changes: Any) -> dict[str, Any]:
    """A report as the harness writes it for a crashed CUDA trial."""
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA, "created": "2026-11-30T12:00:00Z",
        "scenario": {"name": "catalog-reactivation", "dangerous": True,
                     "path": "scenarios/catalog_reactivation.yaml",
                     "description": "a retained catalog row republished on the legacy stream"},
        "variant": {"name": "buggy", "expect": "reproduces",
                    "defects": {"release_fence": True, "publish_on_legacy_stream": True}},
        "trial": {"index": 3, "seed": 12345, "duration_s": 0.8, "worker_pid": 4242},
        "run_seed": 0, "backend": "cuda",
        "device": {"backend": "cuda", "name": "NVIDIA H200", "compute_capability": "9.0",
                   "driver_version": 13000},
        "health": {"before": None, "after": None, "note": ""},
        "outcome": "crash", "detail": "the CUDA context is dead: device-side assert",
        "cuda_error": "CUDA_ERROR_ASSERT", "step": "request 1", "request": 1,
        "xids": [{"xid": 43, "meaning": "GPU stopped processing (a kernel hit a device-side "
                  "assert or trap)", "class": "application", "source": "nvml",
                  "time": "2026-11-30T12:00:01Z", "pid": 4242, "line": None}],
        "xid_note": "",
        "kernel_log": ["NVRM: Xid (PCI:0000:00:06): 43, pid=4242, name=python3, channel 0xa"],
        "device_log": "kernels.cu:132: kv_read_table: block: [0,0,0] Assertion `row < n` failed.",
        "amplification": {"delay_us": 1000.0, "stream": "legacy_stream", "before": "activate"},
        "last_ops": [{"seq": seq, "stream": "stream", "kind": "copy_htod",
                      "reads": [[3, 0, 64]], "writes": [[5, 64 * seq, 64]], "step": "write-old",
                      "t_issue_ns": 123, "detail": {}} for seq in range(30)],
        "ops_total": 1234,
        "reproduce": {"command": "gpurace run scenarios/catalog_reactivation.yaml --backend cuda "
                                 "--dangerous --variant buggy --seed 0 --trial 3"},
    }
    report.update(changes)
    return report


def minimal_report(**changes: Any) -> dict[str, Any]:
    report = {"schema": REPORT_SCHEMA, "scenario": "release-fence", "variant": "fixed",
              "trial": 0, "outcome": "corruption"}
    report.update(changes)
    return report


# -- atomic writes --------------------------------------------------------------------------

def test_write_atomic_replaces_content_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    write_atomic(target, "first")
    write_atomic(target, b"second \xe2\x9c\x93")
    assert target.read_text(encoding="utf-8") == "second ✓"
    assert temps(tmp_path) == []
    # mkstemp's private 0600 would hide reports from the rest of the team.
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~current_umask()


def test_atomic_writer_commits_on_normal_exit(tmp_path: Path) -> None:
    target = tmp_path / "trace.jsonl"
    with atomic_writer(target) as f:
        f.write('{"op": 1}\n')
        assert not target.exists(), "the file must not appear before the block ends"
        f.write('{"op": 2}\n')
    assert target.read_text().splitlines() == ['{"op": 1}', '{"op": 2}']
    assert temps(tmp_path) == []


def test_atomic_writer_on_exception_leaves_neither_file_nor_temp(tmp_path: Path) -> None:
    target = tmp_path / "trace.jsonl"
    with pytest.raises(RuntimeError), atomic_writer(target, "wb") as f:
        f.write(b"half a trace")
        raise RuntimeError("worker died")
    assert list(tmp_path.iterdir()) == []
    # And an existing file keeps its old content.
    write_atomic(target, "old")
    with pytest.raises(RuntimeError), atomic_writer(target) as f:
        f.write("new")
        raise RuntimeError("worker died")
    assert target.read_text() == "old"
    assert temps(tmp_path) == []


def test_remove_stale_temps_sweeps_files_and_folders_recursively(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / ".report.json.x1.tmp").write_text("{")
    (tmp_path / "a" / "b" / ".trace.jsonl.x2.tmp").write_text("")
    stale_folder = tmp_path / ".incident-x3.tmp"
    stale_folder.mkdir()
    (stale_folder / "report.md").write_text("# half")
    (stale_folder / ".report.json.x4.tmp").write_text("")  # inside: goes with its folder
    keep = [tmp_path / "report.json", tmp_path / "a" / "notes.tmp", tmp_path / ".hidden"]
    for path in keep:
        path.write_text("keep")
    assert remove_stale_temps(tmp_path) == 3
    assert temps(tmp_path) == []
    assert all(path.exists() for path in keep)
    assert remove_stale_temps(tmp_path / "missing") == 0


def test_remove_stale_temps_spares_a_live_writers_temps(tmp_path: Path) -> None:
    old, fresh = tmp_path / ".a.json.1.tmp", tmp_path / ".b.json.2.tmp"
    old.write_text("")
    fresh.write_text("")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert remove_stale_temps(tmp_path, min_age_s=60) == 1
    assert not old.exists() and fresh.exists()


CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from reports import write_atomic, write_incident

    out = Path(sys.argv[1])
    # Serialized once, so the loop spends its time writing, where a kill hurts.
    body = json.dumps({"blob": ["x" * 1000] * 1000, "end": True})  # about 1 MB
    trace = ['{"seq": %d, "kind": "copy_htod", "pad": "%s"}' % (i, "y" * 200)
             for i in range(2000)]
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        write_atomic(out / "big.json", '{"i": %d, ' % i + body[1:])
        report = {"schema": "gpurace.report/1", "scenario": {"name": "kill"},
                  "variant": {"name": "buggy"}, "trial": {"index": i}, "outcome": "crash"}
        write_incident(out / "incidents", report, trace, {"worker.log": "w" * 100_000})
""")


def check_incident_complete(folder: Path) -> None:
    report = load_report(folder)
    assert sorted(report["files"]) == sorted(p.name for p in folder.iterdir())
    assert (folder / "report.md").read_text().startswith("# gpurace incident: kill (buggy)")
    assert len((folder / "trace.jsonl").read_text().splitlines()) == 2000
    assert len((folder / "worker.log").read_text()) == 100_000


def test_sigkill_at_any_moment_never_leaves_a_half_written_file(tmp_path: Path) -> None:
    rng = random.Random(210)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    big = tmp_path / "big.json"
    incidents_seen = swept = 0
    for _ in range(10):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert child.stdout is not None and child.stderr is not None
            assert child.stdout.readline() == b"ready\n", child.stderr.read().decode()
            time.sleep(rng.uniform(0.02, 0.2))
        finally:
            child.send_signal(signal.SIGKILL)
            child.communicate()
        assert child.returncode == -signal.SIGKILL, "the writer ended on its own: it failed"
        if big.exists():
            doc = json.loads(big.read_text())
            assert doc["end"] is True and len(doc["blob"]) == 1000
        folders = [p for p in (tmp_path / "incidents").glob("*") if not p.name.startswith(".")]
        for folder in folders:
            check_incident_complete(folder)
        assert all("error" not in s for s in list_incidents(tmp_path / "incidents"))
        incidents_seen = len(folders)
        swept += remove_stale_temps(tmp_path)
        assert temps(tmp_path) == []
    assert big.exists() and incidents_seen > 0, "the kills never let a write finish"
    assert swept > 0, "no kill landed mid-write: the test proved nothing"


# -- incident folders -----------------------------------------------------------------------

def test_write_incident_layout(tmp_path: Path) -> None:
    trace = tmp_path / "source-trace.jsonl"
    trace.write_text('{"schema": "gpurace.trace/1"}\n{"seq": 0}\n')
    root = tmp_path / "incidents"
    report = full_report()
    folder = write_incident(root, report, trace,
                            {"kernel-log.txt": "NVRM: Xid 43\n", "worker.log": "started\n"})
    assert folder.parent == root
    assert folder.name == "20261130-120000-catalog-reactivation-buggy-t3"
    assert report["files"] == ["report.json", "report.md", "report.html", "trace.jsonl",
                               "timeline.json", "timeline.svg", "kernel-log.txt", "worker.log"]
    assert "](timeline.svg)" in (folder / "report.md").read_text()
    assert (folder / "timeline.svg").read_text().startswith("<svg")
    assert sorted(p.name for p in folder.iterdir()) == sorted(report["files"])
    assert [p.name for p in root.iterdir()] == [folder.name], "no temp folder may remain"
    assert (folder / "trace.jsonl").read_text() == trace.read_text()
    assert (folder / "kernel-log.txt").read_text() == "NVRM: Xid 43\n"
    written = json.loads((folder / "report.json").read_text())
    assert written == report and written["trace"] == "trace.jsonl"
    assert (folder / "report.json").read_text().startswith('{\n  "schema"')  # indent 2
    assert (folder / "report.md").read_text() == render_markdown(report)
    assert (folder / "report.html").read_text() == render_html(report)


def test_write_incident_names_are_unique_and_traces_can_be_lines(tmp_path: Path) -> None:
    folders = [write_incident(tmp_path, full_report(), ['{"seq": 0}', '{"seq": 1}\n'])
               for _ in range(3)]
    names = [f.name for f in folders]
    base = "20261130-120000-catalog-reactivation-buggy-t3"
    assert names == [base, base + "-2", base + "-3"]
    assert (folders[0] / "trace.jsonl").read_text() == '{"seq": 0}\n{"seq": 1}\n'
    # Without a trace there is no trace file, and no claim of one.
    folder = write_incident(tmp_path, minimal_report(scenario={"name": "a/b"}), None)
    assert load_report(folder)["files"] == ["report.json", "report.md", "report.html"]
    assert "/" not in folder.name[16:] and folder.name.endswith("-a-b-fixed-t0")
    assert "created" in load_report(folder)


def test_write_incident_refuses_bad_input_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="schema"):
        write_incident(tmp_path, minimal_report(schema="gpurace.report/0"), None)
    with pytest.raises(ValueError, match="not allowed"):
        write_incident(tmp_path, minimal_report(), None, {"../escape.txt": "x"})
    with pytest.raises(ValueError, match="not allowed"):
        write_incident(tmp_path, minimal_report(), None, {"report.json": "x"})
    with pytest.raises(FileNotFoundError):
        write_incident(tmp_path, minimal_report(), tmp_path / "no-such-trace.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_list_incidents_sorts_and_survives_broken_folders(tmp_path: Path) -> None:
    late = write_incident(tmp_path, full_report(created="2026-12-01T08:00:00Z"), None)
    early = write_incident(tmp_path, minimal_report(created="2026-11-01T08:00:00Z"), None)
    broken = tmp_path / "20261115-000000-x-y-t0"
    broken.mkdir()
    (broken / "report.json").write_text('{"schema": "gpurace.report/1", ')
    foreign = tmp_path / "20261120-000000-x-y-t1"
    foreign.mkdir()
    (foreign / "report.json").write_text(json.dumps(minimal_report(schema="other/9")))
    (tmp_path / ".incident-abc.tmp").mkdir()
    (tmp_path / ".incident-abc.tmp" / "report.json").write_text("{}")
    (tmp_path / "not-an-incident").mkdir()

    listing = list_incidents(tmp_path)
    assert [Path(s["path"]).name for s in listing] == [early.name, broken.name, foreign.name,
                                                        late.name]
    assert listing[0] == {"path": str(early), "created": "2026-11-01T08:00:00Z",
                          "scenario": "release-fence", "variant": "fixed", "trial": 0,
                          "outcome": "corruption", "cuda_error": None, "xids": []}
    assert listing[3]["xids"] == [43] and listing[3]["cuda_error"] == "CUDA_ERROR_ASSERT"
    assert "not valid JSON" in listing[1]["error"]
    assert "schema is 'other/9'" in listing[2]["error"]
    assert list_incidents(tmp_path / "missing") == []


def test_load_report_takes_a_folder_or_a_file_and_explains_errors(tmp_path: Path) -> None:
    folder = write_incident(tmp_path, full_report(), None)
    assert load_report(folder) == load_report(folder / "report.json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "gpurace.run/1", "results": []}))
    with pytest.raises(ReportError) as err:
        load_report(wrong)
    message = str(err.value)
    assert "gpurace.run/1" in message and "expected 'gpurace.report/1'" in message
    assert "re-run the trial" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="has no report.json"):
        load_report(tmp_path / "empty")
    with pytest.raises(ReportError, match="does not exist"):
        load_report(tmp_path / "nothing.json")
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"schema": REPORT_SCHEMA, "scenario": "x"}))
    with pytest.raises(ReportError, match="missing required key.*variant, trial, outcome"):
        load_report(partial)
    assert issubclass(ReportError, ValueError)


# -- Markdown -------------------------------------------------------------------------------

def test_render_markdown_tells_the_whole_story(tmp_path: Path) -> None:
    report = full_report(files=["report.json", "report.md", "trace.jsonl"])
    text = render_markdown(report)
    assert text.startswith("# gpurace incident: catalog-reactivation (buggy) — crash\n")
    assert "CUDA_ERROR_ASSERT" in text
    assert "| 43 | GPU stopped processing (a kernel hit a device-side assert or trap) | " \
           "application | nvml | 4242 |" in text
    assert "NVIDIA H200" in text and "13.0" in text and "seed 12345" in text
    assert "```sh\ngpurace run scenarios/catalog_reactivation.yaml --backend cuda" in text
    assert "NVRM: Xid (PCI:0000:00:06): 43" in text
    assert "Assertion `row < n` failed." in text
    assert "1000 µs delay on legacy_stream before activate" in text
    # The last 20 ops of 30: seq 10..29, ranges abbreviated as buffer[start,end).
    assert "The last 20 of 1234 ops" in text
    assert "| 29 | stream | copy_htod | write-old | b3[0,64) | b5[1856,1920) |" in text
    assert "| 9 | stream" not in text and "| 10 | stream" in text
    assert "- `trace.jsonl`" in text


def test_render_markdown_without_xids_shows_the_note() -> None:
    note = "no Xids: the simulated device has no GPU"
    text = render_markdown(full_report(xids=[], xid_note=note))
    section = text.split("## GPU said\n\n", 1)[1]
    assert section.startswith(note)
    assert "No Xids reported." in render_markdown(full_report(xids=[], xid_note=""))
    decoded = {"xid": 31, "meaning": "GPU memory page fault", "class": "application"}
    assert "| 31 | GPU memory page fault | application |" in render_markdown(full_report(
        xids=[decoded]))
    assert "| 31 |" in render_markdown(full_report(xids=[31]))  # a bare number still shows


def test_render_markdown_of_a_minimal_report() -> None:
    text = render_markdown(minimal_report())
    assert text.startswith("# gpurace incident: release-fence (fixed) — corruption\n")
    assert "regression" not in text, "a bare variant name says nothing of its expectation"
    fixed = render_markdown(minimal_report(variant={"name": "fixed", "expect": "clean"}))
    assert "expected to run clean: this is a regression" in fixed
    assert "No Xids reported." in text and "No command was recorded" in text
    for absent in ("## Kernel log", "## Worker device log", "## Last ops", "## Files"):
        assert absent not in text


def test_render_markdown_keeps_code_blocks_and_tables_intact() -> None:
    log = "\n".join(f"tail {i}" for i in range(100)) + "\n```\nnot the end of the block\n"
    text = render_markdown(full_report(device_log=log, step="phase | 2", xids=[],
                                       xid_note="none"))
    assert "\n````\n" in text, "a fence longer than the log's own ``` is needed"
    assert "(last 40 of 102 lines)" in text and "tail 99" in text and "tail 61" not in text
    # A pipe in a table cell must not split the cell.
    assert "| ended at | phase \\| 2 (request 1) |" in text
    report = full_report(amplification=None)
    assert "none (no delay queued" in render_markdown(report)


# -- JUnit ----------------------------------------------------------------------------------

def result(scenario: str, variant: str, status: str, **changes: Any) -> dict[str, Any]:
    """One result of a gpurace.run/1 document."""
    item: dict[str, Any] = {
        "scenario": scenario, "variant": variant, "status": status,
        "expect": "reproduces" if variant == "buggy" else "clean", "trials": 200,
        "manifested": 0, "detected": 0,
        "outcomes": {"clean": 200, "corruption": 0, "crash": 0, "hang": 0},
        "reports": [], "reason": "", "path": f"scenarios/{scenario}.yaml", "dangerous": True,
        "delay_us": 1000.0, "min_rate": 0.9 if variant == "buggy" else 0.0, "sweep": False,
        "first_manifested": None, "crash_requests": [], "wall_s": 0.0,
    }
    item.update(changes)
    return item


def run_document() -> dict[str, Any]:
    crash = {"clean": 197, "corruption": 0, "crash": 3, "hang": 0}
    return {
        "schema": "gpurace.run/1", "backend": "cuda", "device": {"name": "NVIDIA H200"},
        "seed": 0, "wall_s": 12.5,
        "results": [
            result("cross-stream-race", "buggy", "pass", manifested=57, detected=57,
                   outcomes={"clean": 143, "corruption": 57, "crash": 0, "hang": 0},
                   wall_s=2.25),
            result("cross-stream-race", "fixed", "fail", manifested=3, outcomes=crash,
                   xids=[{"xid": 43, "class": "application", "trials": 3}],
                   reason="expected clean, but 3 of 200 trials crashed",
                   reports=["gpurace-reports/incidents/a", "gpurace-reports/incidents/b"],
                   wall_s=7.5, findings=[{
                       "buffer": "kv-arena", "page": 0, "trials": 3,
                       "missing": "nothing orders transfer's write before compute's write",
                       "first": {"seq": 9, "stream": "transfer", "kind": "copy_htod",
                                 "access": "write", "bytes": [0, 1024],
                                 "origin": "s.yaml:22:7"},
                       "second": {"seq": 14, "stream": "compute", "kind": "copy_htod",
                                  "access": "write", "bytes": [0, 1024],
                                  "site": "executor.py:328"}}],
                   first_manifested={"index": 17, "seed": 999, "outcome": "crash",
                                     "detail": "the CUDA context is dead",
                                     "cuda_error": "CUDA_ERROR_ASSERT"}),
            result("release-fence", "buggy", "skip", trials=0,
                   outcomes={"clean": 0, "corruption": 0, "crash": 0, "hang": 0},
                   reason="dangerous: pass --dangerous to run it"),
            result("cross-stream-race", "buggy", "pass", sweep=True, delay_us=100.0,
                   manifested=200, outcomes={"clean": 0, "corruption": 200, "crash": 0,
                                             "hang": 0}, wall_s=0.1254),
        ],
    }


def test_render_junit_structure_and_counts() -> None:
    xml = render_junit(run_document())
    assert xml.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    root = ET.fromstring(xml)
    assert root.tag == "testsuites" and root.get("name") == "gpurace"
    # No skipped count on testsuites (the schema has none there); times are the variants'.
    assert (root.get("tests"), root.get("failures"), root.get("skipped"),
            root.get("errors"), root.get("time")) == ("4", "1", None, "0", "9.875")
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["cross-stream-race", "release-fence"]
    assert (suites[0].get("tests"), suites[0].get("failures"), suites[0].get("skipped"),
            suites[0].get("time")) == ("3", "1", "0", "9.875")
    assert (suites[1].get("tests"), suites[1].get("failures"), suites[1].get("skipped"),
            suites[1].get("time")) == ("1", "0", "1", "0.000")
    cases = suites[0].findall("testcase")
    assert [c.get("name") for c in cases] == ["buggy", "fixed", "buggy@100us"]
    assert [c.get("time") for c in cases] == ["2.250", "7.500", "0.125"]
    assert {c.get("classname") for c in cases} == {"gpurace.cross-stream-race"}
    # A testcase has its class name, name and time, and nothing else.
    assert all(set(c.attrib) == {"classname", "name", "time"} for c in root.iter("testcase"))
    skipped = suites[1].find("testcase/skipped")
    assert skipped is not None and skipped.get("message") == "dangerous: pass --dangerous to " \
                                                              "run it"


def test_render_junit_failure_carries_counts_xids_and_first_trial() -> None:
    root = ET.fromstring(render_junit(run_document()))
    failures = root.findall(".//failure")
    assert len(failures) == 1
    failure = failures[0]
    assert failure.get("type") == "clean"
    assert failure.get("message") == "expected clean; crash 3 of 200 trials; " \
                                     "Xid 43 (application) x3"
    lines = (failure.text or "").splitlines()
    assert lines[:2] == ["expected clean, but 3 of 200 trials crashed",
                         "outcomes: crash 3 of 200 trials"]
    assert "first manifested: trial 17 (seed 999): crash: the CUDA context is dead " \
           "[CUDA_ERROR_ASSERT]" in lines
    # The detector's first finding, with its fix and the two ops, then the incidents.
    assert lines[-5:] == [
        "race (in 3/200 trials): nothing orders transfer's write before compute's write",
        "  first: seq 9 transfer copy_htod write bytes 0..1024 at s.yaml:22:7",
        "  second: seq 14 compute copy_htod write bytes 0..1024 at executor.py:328",
        "incident: gpurace-reports/incidents/a", "incident: gpurace-reports/incidents/b"]
    fatal = result("soak", "fixed", "fail", xids=[
        {"xid": 79, "class": "gpu-fatal"}, {"xid": 43, "class": "application"},
        {"xid": 154, "class": "unknown"}])
    message = ET.fromstring(render_junit({"results": [fatal]})).find(".//failure").get("message")
    assert message.endswith("Xid 79 (gpu-fatal), Xid 43 (application), Xid 154 (unknown)")
    # An expected reproduction that did not happen says how far off it was.
    lost = result("release-fence", "buggy", "fail", reason="stopped reproducing")
    message = ET.fromstring(render_junit({"results": [lost]})).find(".//failure").get("message")
    assert message.startswith("expected reproduces; clean 200 of 200 trials; manifested 0/200")


def test_render_junit_partial_reproduction_sweep_and_properties() -> None:
    root = ET.fromstring(render_junit(run_document()))
    partial, failed, swept, _skip = root.iter("testcase")
    out = partial.findtext("system-out") or ""
    assert out.splitlines()[0] == ("expect reproduces; 200 trials in 2.250 s; manifested 57; "
                                   "race detected 57; delay 1000 us; min rate 0.9; dangerous")
    assert "reproduced in 57/200 trials" in out
    assert "reproduced in 57" not in (swept.findtext("system-out") or "")
    assert "delay 100 us" in (swept.findtext("system-out") or "")
    # The scenario's file, the run's backend and seed are its suite's properties.
    suite = root.find("testsuite")
    props = [(p.get("name"), p.get("value")) for p in suite.findall("properties/property")]
    assert props == [("path", "scenarios/cross-stream-race.yaml"), ("dangerous", "true"),
                     ("backend", "cuda"), ("device", "NVIDIA H200"), ("seed", "0")]
    assert [child.tag for child in suite][0] == "properties"
    # A failure's incidents are in its failure text, not repeated in its output.
    assert [child.tag for child in failed] == ["failure", "system-out"]
    assert "incident:" not in (failed.findtext("system-out") or "")


def test_render_junit_of_an_empty_or_odd_run() -> None:
    root = ET.fromstring(render_junit({"schema": "gpurace.run/1", "results": []}))
    assert (root.get("tests"), root.get("failures"), root.findall("testsuite")) == ("0", "0", [])
    odd = copy.deepcopy(run_document())
    odd["results"][0]["status"] = "exploded"
    root = ET.fromstring(render_junit(odd))
    assert root.get("errors") == "1" and root.find(".//error") is not None


def test_reports_never_imports_the_engine() -> None:
    code = ("import sys, reports; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('harness', 'kvcore', 'cupy', 'pynvml')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.strip() == "[]"


def test_render_markdown_lists_race_findings() -> None:
    finding = {"missing": "nothing orders transfer_stream's write before stream's write",
               "count": 2,
               "first": {"seq": 5, "stream": "transfer_stream", "kind": "copy_htod",
                         "access": "write", "bytes": [0, 1024], "site": "x.py:3"},
               "second": {"seq": 8, "stream": "stream", "kind": "copy_htod",
                          "access": "write", "bytes": [0, 1024], "site": None}}
    text = render_markdown(full_report(findings=[finding]))
    assert "## Races found" in text and "nothing orders transfer_stream's write" in text
    assert "(2 op pairs)" in text and "issued at `x.py:3`" in text
    assert "## Races found" not in render_markdown(full_report(findings=[]))


def test_report_md_names_the_bugs_switched_on_not_the_pool_settings() -> None:
    """#29: "defects: release_fence=false, publish_on_legacy_stream=false,
    table_shadow_wait=true" read like fixes; the report names the bugs."""
    variant = {"name": "buggy", "expect": "reproduces", "bugs": ["release_fence"],
               "defects": {"release_fence": False, "publish_on_legacy_stream": False,
                           "table_shadow_wait": True}}
    text = render_markdown(full_report(variant=variant))
    assert "known bugs switched on: release_fence" in text and "release_fence=false" not in text
    fixed = render_markdown(full_report(variant={**variant, "bugs": []}))
    assert "no known bug switched on (the correct pool)" in fixed


def test_report_md_names_the_last_ops_buffers() -> None:
    ops = [{"seq": 7, "stream": "transfer", "kind": "copy_htod", "reads": [[6, 0, 4096]],
            "writes": [[3, 8192, 4096]]}]
    text = render_markdown(full_report(last_ops=ops, buffers={"3": "kv-arena", "6": "old"}))
    assert "old[0,4096)" in text and "kv-arena[8192,12288)" in text and "b3[" not in text
    assert "b3[8192,12288)" in render_markdown(full_report(last_ops=ops))  # an older report

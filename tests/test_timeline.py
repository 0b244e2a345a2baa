"""Pictures of incidents: every incident's timeline.json (a Chrome trace) and report.html (an
inline SVG of the last ops), and `gpurace trace export`, on the simulated device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from reports.timeline import UNTIMED, chrome_trace
from timeline_checks import check_chrome_trace, check_report_html

SEEDS = ["cross-stream-race", "release-fence", "catalog-reactivation", "stale-row-write",
         "store-before-write"]


@pytest.fixture(scope="module")
def incidents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One incident of each seed scenario's buggy variant on sim."""
    out = tmp_path_factory.mktemp("seeds")
    result = CliRunner().invoke(main, ["run", *SEEDS, "--backend", "sim", "--variant", "buggy",
                                       "--trials", "1", "--dangerous", "--format", "json",
                                       "--out", str(out)])
    doc = json.loads(result.stdout)
    return {r["scenario"]: Path(r["reports"][0]) for r in doc["results"]}


@pytest.mark.parametrize("scenario", SEEDS)
def test_each_seed_incident_has_a_timeline_with_its_races_marked(
        incidents: dict[str, Path], scenario: str) -> None:
    folder = incidents[scenario]
    report = json.loads((folder / "report.json").read_text())
    assert {"report.html", "timeline.json"} <= set(report["files"])
    doc = json.loads((folder / "timeline.json").read_text())
    seen = check_chrome_trace(doc, report["findings"])
    streams = {json.loads(line)["name"] for line in (folder / "trace.jsonl").open()
               if '"type":"stream"' in line}
    names = sorted(seen["tracks"].values())
    assert len(names) == 1 + len(streams) and "host" in names
    assert all(any(n.startswith(f"stream {s} (") for n in names) for s in streams), names
    assert doc["otherData"]["device_times"] is True  # sim: stream ops where they ran
    page = check_report_html(folder)
    md = (folder / "report.md").read_text()
    assert "[report.html](report.html)" in md and "[timeline.json](timeline.json)" in md
    # report.md shows the same picture as a file of its own
    assert "](timeline.svg)" in md
    import xml.etree.ElementTree as ET

    svg = ET.parse(folder / "timeline.svg").getroot()
    ns = "{http://www.w3.org/2000/svg}"
    assert {int(g.get("data-seq")) for g in svg.iter(f"{ns}g")
            if g.get("class") == "op race"} == page["marked"]


def test_the_release_races_are_the_ones_marked(incidents: dict[str, Path]) -> None:
    """cross-stream-race's incident: its one finding's two copies are the red slices, on the
    transfer and compute tracks, joined by a race arrow; the page marks the same two ops."""
    folder = incidents["cross-stream-race"]
    [finding] = json.loads((folder / "report.json").read_text())["findings"]
    seen = check_chrome_trace(json.loads((folder / "timeline.json").read_text()), [finding])
    first, second = (seen["slices"][finding[s]["seq"]] for s in ("first", "second"))
    assert seen["tracks"][first["tid"]].startswith("stream transfer")
    assert seen["tracks"][second["tid"]].startswith("stream compute")
    assert "write-old" in first["name"] and "write-new" in second["name"]
    assert check_report_html(folder)["marked"] == {finding["first"]["seq"],
                                                   finding["second"]["seq"]}


def test_trace_export_of_an_incident_is_its_timeline(incidents: dict[str, Path],
                                                     tmp_path: Path) -> None:
    folder = incidents["release-fence"]
    out = tmp_path / "new" / "t.json"
    result = CliRunner().invoke(main, ["trace", "export", str(folder), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 race marked" in result.stdout and "ui.perfetto.dev" in result.stdout
    assert json.loads(out.read_text()) == json.loads((folder / "timeline.json").read_text())


def test_ops_without_device_times_are_placed_by_issue_and_the_tracks_say_so(
        incidents: dict[str, Path]) -> None:
    """A GPU trace without --timeline has no device times: stream ops sit where the host
    issued them, in issue order on each track, and each stream's name says so."""
    records = [json.loads(line) for line in
               (incidents["cross-stream-race"] / "trace.jsonl").open()]
    for r in records:
        r.pop("t_start_ns", None)
        r.pop("t_end_ns", None)
    findings = json.loads((incidents["cross-stream-race"] / "report.json").read_text())[
        "findings"]
    doc = chrome_trace(records, findings)
    seen = check_chrome_trace(doc, findings)
    assert doc["otherData"]["device_times"] is False
    used = {x["tid"] for x in seen["slices"].values()}
    for tid, name in seen["tracks"].items():
        assert (UNTIMED in name) == (name != "host" and tid in used), name
    for track in {x["tid"] for x in seen["slices"].values()}:
        xs = sorted((x for x in seen["slices"].values() if x["tid"] == track),
                    key=lambda x: x["args"]["seq"])
        assert [x["ts"] for x in xs] == sorted(x["ts"] for x in xs)


def test_trace_export_draws_an_svg(incidents: dict[str, Path], tmp_path: Path) -> None:
    """FILE.svg: the trial's ops in issue order, a lane per track, the racing pair marked;
    a file of its own (its styles inside it); another suffix is refused."""
    import xml.etree.ElementTree as ET

    folder = incidents["cross-stream-race"]
    [finding] = json.loads((folder / "report.json").read_text())["findings"]
    out = tmp_path / "t.svg"
    result = CliRunner().invoke(main, ["trace", "export", str(folder), "-o", str(out)])
    assert result.exit_code == 0, result.output
    svg = ET.fromstring(out.read_text())
    ns = "{http://www.w3.org/2000/svg}"
    assert svg.find(f"{ns}style") is not None
    marked = {int(g.get("data-seq")) for g in svg.iter(f"{ns}g") if g.get("class") == "op race"}
    assert marked == {finding["first"]["seq"], finding["second"]["seq"]}
    ops = [json.loads(line) for line in (folder / "trace.jsonl").open()
           if '"type":"op"' in line]
    assert len([g for g in svg.iter(f"{ns}g") if "op" in (g.get("class") or "").split()]) \
        == len(ops)
    bad = CliRunner().invoke(main, ["trace", "export", str(folder), "-o", str(tmp_path / "t.x")])
    assert bad.exit_code == 2 and ".svg" in bad.stderr


def test_a_times_record_in_the_trace_puts_the_ops_where_they_ran(
        incidents: dict[str, Path]) -> None:
    """A GPU trace made with --timeline: its ops carry no device times but a times record
    after them does; the timeline takes them from it (as an incident's timeline.json is made
    from the raw trace lines)."""
    records = [json.loads(line) for line in
               (incidents["cross-stream-race"] / "trace.jsonl").open()]
    timed = []
    for r in records:
        if r.get("type") == "op" and "t_start_ns" in r:
            timed.append([r["seq"], r.pop("t_start_ns"), r.pop("t_end_ns")])
    assert timed
    stripped = chrome_trace(records)
    assert stripped["otherData"]["device_times"] is False
    doc = chrome_trace([*records, {"type": "times", "ops": timed}])
    assert doc["otherData"]["device_times"] is True
    original = chrome_trace([json.loads(line) for line in
                             (incidents["cross-stream-race"] / "trace.jsonl").open()])
    assert doc["traceEvents"] == original["traceEvents"]


def test_each_host_thread_has_its_own_track(tmp_path: Path) -> None:
    """cudf-22284's two task threads: their host ops sit on a track each (the op records
    carry the thread), the scenario's own thread on the host's; the page draws a lane each."""
    result = CliRunner().invoke(main, ["run", "cudf-22284", "--backend", "sim", "--variant",
                                       "buggy", "--trials", "1", "--dangerous", "--format",
                                       "json", "--out", str(tmp_path)])
    [folder] = [Path(p) for p in json.loads(result.stdout)["results"][0]["reports"]]
    report = json.loads((folder / "report.json").read_text())
    seen = check_chrome_trace(json.loads((folder / "timeline.json").read_text()),
                              report["findings"])
    names = {tid: name for tid, name in seen["tracks"].items()}
    assert {"host thread task-1", "host thread task-2"} <= set(names.values())
    ops = [json.loads(line) for line in (folder / "trace.jsonl").open() if '"type":"op"' in line]
    for op in ops:
        if op["stream"] == "host":
            thread = (op.get("detail") or {}).get("thread")
            track = names[seen["slices"][op["seq"]]["tid"]]
            assert track == (f"host thread {thread}" if thread else "host"), (op, track)
    assert any((op.get("detail") or {}).get("thread") == "task-2" for op in ops)
    lanes = check_report_html(folder)["lanes"]
    assert "host · task-1" in lanes or "host · task-2" in lanes

"""Incident pictures from the GPU (marker gpu): a race's timeline with --timeline (ops where
they ran, on the device's clock), and a crash's page and timeline without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from reports.timeline import UNTIMED
from timeline_checks import check_chrome_trace, check_report_html

pytestmark = pytest.mark.gpu


def _incidents(*args: str) -> list[Path]:
    result = CliRunner().invoke(main, ["run", *args, "--backend", "cuda", "--dangerous",
                                       "--insist", "--format", "json"])
    assert result.exit_code == 0, result.output
    [r] = json.loads(result.stdout)["results"]
    return [Path(p) for p in r["reports"]]


def test_a_timed_race_shows_the_delayed_write_landing_last(tmp_path: Path) -> None:
    """cross-stream-race, buggy, amplified, with --timeline: the incident's Chrome trace has
    device times, and on them the old page's delayed copy (transfer) starts after the new
    page's copy (compute) has ended: the race the check saw, on the GPU's clock."""
    folder = _incidents("cross-stream-race", "--variant", "buggy", "--trials", "2",
                        "--timeline", "--out", str(tmp_path))[0]
    report = json.loads((folder / "report.json").read_text())
    [finding] = report["findings"]
    doc = json.loads((folder / "timeline.json").read_text())
    assert doc["otherData"]["device_times"] is True
    seen = check_chrome_trace(doc, [finding])
    old, new = (seen["slices"][finding[s]["seq"]] for s in ("first", "second"))
    print(f"\nH200 timeline: write-new {new['ts']:.1f}+{new['dur']:.1f} us, write-old "
          f"{old['ts']:.1f}+{old['dur']:.1f} us")
    assert old["ts"] >= new["ts"] + new["dur"]
    check_report_html(folder)


def test_a_crash_page_renders_and_its_timeline_says_it_is_untimed(tmp_path: Path) -> None:
    """catalog-reactivation's device-side assert: report.html needs no network and marks the
    findings' ops; timeline.json places the stream ops by issue (no --timeline) and says so."""
    folder = _incidents("catalog-reactivation", "--variant", "buggy", "--trials", "1",
                        "--out", str(tmp_path))[0]
    report = json.loads((folder / "report.json").read_text())
    assert report["outcome"] == "crash"
    seen = check_report_html(folder)
    print(f"\ncatalog-reactivation page: lanes {seen['lanes']}, marked {sorted(seen['marked'])}")
    doc = json.loads((folder / "timeline.json").read_text())
    assert doc["otherData"]["device_times"] is False
    tracks = check_chrome_trace(doc, report["findings"])["tracks"]
    assert any(UNTIMED in name for name in tracks.values())


def test_the_seed_incidents_on_the_gpu_mark_their_races(tmp_path: Path) -> None:
    """Each seed scenario's buggy variant on the GPU: its incident's timeline.json obeys the
    format and marks every finding's pair, and its page does too."""
    from test_timeline import SEEDS

    result = CliRunner().invoke(main, ["run", *SEEDS, "--variant", "buggy", "--trials", "1",
                                       "--backend", "cuda", "--dangerous", "--insist",
                                       "--format", "json", "--out", str(tmp_path)])
    doc = json.loads(result.stdout)
    seen = {}
    for r in doc["results"]:
        [folder] = [Path(p) for p in r["reports"]]
        report = json.loads((folder / "report.json").read_text())
        check_chrome_trace(json.loads((folder / "timeline.json").read_text()),
                           report["findings"])
        seen[r["scenario"]] = (report["outcome"], sorted(check_report_html(folder)["marked"]))
    print(f"\nseed incidents on the GPU (outcome, marked ops): {seen}")
    assert set(seen) == set(SEEDS)
    assert any(marked for _, marked in seen.values())

"""Ticket replay on the simulated device: ninfer-210 with and without its defect, record and
replay round trips, bad tickets, and incident reproduction."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from harness.cli import main
from harness.lang.targets import SCENARIO_ROOT
from reports import load_report

REPO = Path(__file__).resolve().parents[1]
TICKET = str(SCENARIO_ROOT / "tickets" / "ninfer-210.jsonl")
DEFECT = ["--defect", "publish_on_legacy_stream", "--dangerous"]


def _replay(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["replay", *args, "--backend", "sim", "--format", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


def test_ninfer_210_without_the_defect_completes_clean(tmp_path: Path) -> None:
    code, doc = _replay(TICKET, "--trials", "3", "--out", str(tmp_path))
    [r] = doc["results"]
    assert r["variant"] == "as-recorded" and r["expect"] == "clean"
    assert (r["manifested"], r["detected"], r["outcomes"]["clean"]) == (0, 0, 3)
    assert code == 0


def test_ninfer_210_with_the_defect_is_detected_unamplified(tmp_path: Path) -> None:
    code, doc = _replay(TICKET, *DEFECT, "--no-amplify", "--trials", "3", "--out", str(tmp_path))
    [r] = doc["results"]
    assert r["detected"] == 3 and r["status"] == "pass" and code == 0
    [finding] = r["findings"][:1]
    assert finding["buffer"] == "exec-table" and finding["first"]["stream"] == "legacy"


def test_ninfer_210_with_the_defect_crashes_amplified(tmp_path: Path) -> None:
    code, doc = _replay(TICKET, *DEFECT, "--trials", "5", "--out", str(tmp_path))
    [r] = doc["results"]
    assert r["outcomes"]["crash"] == 5 and max(r["crash_requests"]) <= 3
    report = load_report(Path(r["reports"][0]))
    assert report["cuda_error"] == "CUDA_ERROR_ASSERT"
    argv = shlex.split(report["reproduce"]["command"])
    assert argv[:2] == ["gpurace", "replay"] and "publish_on_legacy_stream" in argv
    code2, again = _replay(*argv[2:], "--out", str(tmp_path / "again"))
    [rerun] = again["results"]
    assert rerun["outcomes"]["crash"] == 1 and rerun["crash_requests"] == [report["request"]]
    assert code == 0 and code2 == 0


def test_replay_with_a_defect_runs_on_sim_without_dangerous(tmp_path: Path) -> None:
    """--dangerous guards a GPU's context; the simulated device has none to crash."""
    code, doc = _replay(TICKET, "--defect", "publish_on_legacy_stream", "--out", str(tmp_path))
    [r] = doc["results"]
    assert r["status"] == "pass" and r["outcomes"]["crash"] == 1 and code == 0


def _ops(trace: str) -> list[str]:
    lines = Path(trace).read_text().splitlines()
    return [line for line in lines if '"type":"header"' not in line]  # the header names a pid


def test_record_then_replay_round_trips_exactly(tmp_path: Path) -> None:
    _, first = _replay(TICKET, "--record", "--seed", "4", "--out", str(tmp_path / "a"))
    _, second = _replay(TICKET, "--record", "--seed", "4", "--out", str(tmp_path / "b"))
    [a], [b] = first["results"][0]["traces"], second["results"][0]["traces"]
    assert len(_ops(a)) > 1000
    assert _ops(a) == _ops(b)
    _, other = _replay(TICKET, "--record", "--seed", "5", "--out", str(tmp_path / "c"))
    assert _ops(other["results"][0]["traces"][0]) != _ops(a)  # the seed moves device times
    check = CliRunner().invoke(main, ["check", a])
    assert check.exit_code == 0


def test_bad_ticket_is_a_line_numbered_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = Path(TICKET).read_text().splitlines()
    bad.write_text("\n".join(lines[:3]) + "\n" + lines[3][:40] + "\n")
    result = CliRunner().invoke(main, ["replay", str(bad), "--backend", "sim"])
    assert result.exit_code == 2 and f"{bad}:4:" in result.output
    assert "Traceback" not in result.output


def test_text_output_piped_to_a_log_keeps_whole_lines(tmp_path: Path) -> None:
    """A CI log is not a terminal: the table's names and each finding stay whole on their
    line instead of being cut to 80 columns."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "replay", TICKET, *DEFECT,
                           "--backend", "sim", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any("publish_on_legacy_stream" in ln and "reproduces" in ln for ln in lines)
    race = next(ln for ln in lines if "race" in ln and "nothing orders" in ln)
    assert "record an event on legacy" in race


def test_a_replays_summary_is_titled_as_a_replay(tmp_path) -> None:
    """#29: a replay's summary said "gpurace run on sim"."""
    from click.testing import CliRunner

    from harness.cli import main
    from harness.lang.targets import SCENARIO_ROOT
    result = CliRunner().invoke(main, ["replay", str(SCENARIO_ROOT / "tickets" /
                                                     "ninfer-210.jsonl"), "--backend", "sim",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    titles = [line for line in result.output.splitlines() if line.strip().startswith("gpurace ")]
    assert titles and titles[0].strip().startswith("gpurace replay on sim"), result.output

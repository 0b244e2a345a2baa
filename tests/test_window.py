"""The race window of a --sweep run: window.csv, the run JSON's window, window.png (matplotlib)
or a terminal rendering without it, the interpreter gap marked; and `gpurace report window`."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


def _sweep(out: Path, *extra: str) -> tuple[Path, dict, str]:
    result = CliRunner().invoke(main, ["run", "cross-stream-race", "--backend", "sim",
                                       "--sweep", "--dangerous", "--trials", "10",
                                       "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    [folder] = [p for p in out.iterdir() if p.name.startswith("run-")]
    return folder, json.loads((folder / "run.json").read_text()), result.stdout


def test_a_sweep_writes_its_window(tmp_path: Path) -> None:
    folder, doc, stdout = _sweep(tmp_path)
    window = doc["window"]
    sweeps = [r for r in doc["results"] if r["sweep"]]
    assert [(p["variant"], p["delay_us"], p["trials"], p["manifested"]) for p in
            window["points"]] == [(r["variant"], r["delay_us"], r["trials"], r["manifested"])
                                  for r in sweeps]
    assert all(p["interval"] == r["manifested_interval"] for p, r in
               zip(window["points"], sweeps))
    rows = list(csv.DictReader((folder / "window.csv").open()))
    assert [(r["variant"], float(r["delay_us"]), int(r["manifested"])) for r in rows] == \
        [(p["variant"], p["delay_us"], p["manifested"]) for p in window["points"]]
    assert (folder / "window.png").read_bytes()[:8] == PNG
    # The gap the host leaves between the delay's launch and the racing op: the buggy
    # variant manifests at the delays beyond it, and at none below.
    gap = window["interpreter_gap_us"]["cross-stream-race"]
    buggy = [p for p in window["points"] if p["variant"] == "buggy"]
    assert all((p["manifested"] == p["trials"]) == (p["delay_us"] > gap) for p in buggy), \
        (gap, buggy)
    assert "The race window" in stdout and "<- gap" in stdout and "window.png" in stdout


def test_without_matplotlib_a_sweep_has_its_csv_and_a_terminal_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    folder, doc, stdout = _sweep(tmp_path)
    assert not (folder / "window.png").exists() and (folder / "window.csv").exists()
    assert "pip install 'gpurace[plot]'" in stdout and "█" in stdout
    result = CliRunner().invoke(main, ["report", "window", str(folder), "-o",
                                       str(tmp_path / "w.png")])
    assert result.exit_code == 2 and "pip install 'gpurace[plot]'" in result.stderr


def test_report_window_draws_a_saved_sweep(tmp_path: Path) -> None:
    """A sweep made where there is no matplotlib is drawn elsewhere from its run.json, with
    the gap it measured there."""
    folder, doc, _ = _sweep(tmp_path / "run")
    run_json = tmp_path / "copied.json"
    run_json.write_text(json.dumps(doc))  # without the incidents beside it
    out = tmp_path / "pictures" / "window.png"
    result = CliRunner().invoke(main, ["report", "window", str(run_json), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == PNG and "2 curves, 14 points" in result.stdout
    plain = CliRunner().invoke(main, ["report", "window", str(tmp_path / "run"), "-o",
                                      str(out)])
    assert plain.exit_code == 2 and "pass a run's run.json" in plain.stderr
    # A FIFO is refused before anything reads it (a plain read would wait for a writer).
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    piped = CliRunner().invoke(main, ["report", "window", str(fifo), "-o", str(out)])
    assert piped.exit_code == 2 and "a pipe, not a file" in piped.stderr, piped.output


def test_the_window_and_the_table_say_one_interval_for_one_count() -> None:
    """#29: the summary table said 0-17% for 0/20 and the window [0-16%]."""
    from harness.results.rates import wilson
    from reports import percent_interval
    from reports.window import Point, Window, render_terminal
    low, high = wilson(0, 20)
    window = Window((Point("s", "buggy", 0.0, 20, 0, low, high),), {})
    assert percent_interval((low, high)) == "0-17%"
    assert render_terminal(window).rstrip().endswith("[0-17%]")

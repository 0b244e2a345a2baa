"""What a new user meets in the first hour on a machine without a GPU: dangerous scenarios run on
the simulated device, a summary readable at 80 to 120 columns that says what its counts mean
and calls expected reproductions expected, a misspelt name answered with the closest names,
every exit code in the help, and counts that read "1 trial"."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from harness.cli import main, output
from harness.lang.targets import resolve_targets
from harness.results.outcome import Status, VariantResult
from harness.run import runner as runner_module
from harness.results.exitcodes import ExitCode
from harness.results.run import RunResult
from harness.run.options import RunOptions
from harness.run.runner import Runner
from harness.words import counted
from reports import percent_interval

REPO = Path(__file__).resolve().parents[1]


def _gpurace(*args: str, columns: int = 120, cwd: Path | None = None
             ) -> subprocess.CompletedProcess[str]:
    """gpurace as a user runs it, in a terminal of ``columns`` columns (COLUMNS)."""
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd or REPO, timeout=300)


def _run_json(folder: Path) -> dict:
    [path] = folder.glob("run-*/run.json")
    return json.loads(path.read_text())


# -- 1. dangerous scenarios on the simulated device ------------------------------------------

def test_a_dangerous_scenario_runs_on_the_simulated_device_without_the_flag(
        tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "cross-stream-race", "--backend", "sim",
                                       "--trials", "2", "--format", "json",
                                       "--out", str(tmp_path)])
    doc = json.loads(result.stdout)
    assert [(r["variant"], r["status"], r["trials"]) for r in doc["results"]] == [
        ("buggy", "pass", 2), ("fixed", "pass", 2)]
    assert result.exit_code == 0


def test_on_a_gpu_a_dangerous_scenario_still_needs_the_flag(monkeypatch) -> None:
    """The guard protects a real GPU's CUDA context: on the cuda backend, without
    --dangerous, the variant is skipped before any worker starts."""
    monkeypatch.setattr(runner_module, "choose_backend", lambda requested: "cuda")
    [scenario] = resolve_targets(["cross-stream-race"])
    guarded = Runner(RunOptions(backend="cuda")).run_variant(scenario, "buggy")
    assert guarded.status is Status.SKIP and guarded.trials == 0
    assert "pass --dangerous" in guarded.reason


# -- 2. the summary at 80 to 120 columns -----------------------------------------------------

@pytest.mark.parametrize("columns", [80, 100, 120])
def test_the_summary_keeps_each_interval_whole(columns: int, tmp_path: Path) -> None:
    done = _gpurace("run", "release-fence", "--backend", "sim", "--trials", "20",
                    "--out", str(tmp_path), columns=columns)
    assert done.returncode == 0, done.stderr
    intervals = [percent_interval(r["manifested_interval"])
                 for r in _run_json(tmp_path)["results"]]
    assert intervals == ["83-100%", "0-17%"]
    for interval in intervals:
        assert interval in done.stdout, done.stdout
    assert "…" not in done.stdout, done.stdout  # no value (nor header) cut short


# -- 3 and 4. expected reproductions, and what the counts mean -------------------------------

def test_expected_reproductions_are_said_to_be_expected_and_the_counts_explained(
        tmp_path: Path) -> None:
    done = _gpurace("run", "release-fence", "--backend", "sim", "--trials", "3",
                    "--out", str(tmp_path))
    folder = Path(_run_json(tmp_path)["folder"])
    said = " ".join(done.stdout.split())
    assert f"reproduced as expected; 3 reports in {folder} (gpurace report list {folder})" \
        in said, done.stdout
    assert "incident" not in said
    assert len(list(folder.glob("*-release-fence-buggy-t*/report.json"))) == 3  # still kept
    assert said.count("manifested: trials that did not end clean (wrong data, a crash or a "
                      "hang)") == 1
    assert said.count("detected: trials in which the race detector found two conflicting "
                      "accesses with no happens-before order") == 1
    assert done.returncode == 0


def test_without_detection_only_manifested_is_explained(tmp_path: Path) -> None:
    done = _gpurace("run", "release-fence", "--backend", "sim", "--trials", "2", "--no-detect",
                    "--out", str(tmp_path))
    assert "manifested: trials that did not end clean" in done.stdout
    assert "detected: trials" not in done.stdout


def test_reports_of_a_failed_expectation_are_still_incidents(monkeypatch,
                                                            tmp_path: Path) -> None:
    text = io.StringIO()
    monkeypatch.setattr(output, "out", Console(file=text, width=200))
    variant = VariantResult(scenario="s", variant="fixed", expect="clean", path="s.yaml",
                            dangerous=False, amplified=True, delay_us=100.0,
                            status=Status.FAIL, reports=[str(tmp_path / "incident-0")])
    output.print_summary(RunResult(backend="sim", device={"backend": "sim"}, seed=0,
                                   folder=str(tmp_path), results=[variant]), tmp_path)
    said = text.getvalue()
    assert f"1 incident report (gpurace report list {tmp_path}):" in said
    assert "as expected" not in said


# -- 5. a misspelt name ----------------------------------------------------------------------

def test_a_misspelt_name_gets_the_closest_names_and_how_to_list_all(tmp_path: Path) -> None:
    done = _gpurace("run", "cross-stream-rce", cwd=tmp_path)
    assert done.returncode == 2
    assert "Did you mean cross-stream-race? `gpurace list` shows them all" in done.stderr
    # Not the ~38 names of every scenario.
    assert "megatron" not in done.stderr and "catalog" not in done.stderr, done.stderr


def test_a_name_like_none_says_only_how_to_list_all(tmp_path: Path) -> None:
    done = _gpurace("run", "zzzzzz", cwd=tmp_path)
    assert done.returncode == 2 and "Did you mean" not in done.stderr
    assert "`gpurace list` shows them all" in done.stderr


# -- 6. every exit code in the help ----------------------------------------------------------

def test_the_help_lists_every_exit_code_from_the_enum() -> None:
    shown = " ".join(CliRunner().invoke(main, ["--help"]).output.split())
    for code in ExitCode:
        assert f"{int(code)} {code.meaning}" in shown, code
    assert "4 the run's files were not all written" in shown


# -- 7. plurals ------------------------------------------------------------------------------

def test_counted_says_one_without_the_plural() -> None:
    assert [counted(n, "trial") for n in (0, 1, 2)] == ["0 trials", "1 trial", "2 trials"]
    assert counted(1, "race") == "1 race" and counted(3, "process", "processes") == \
        "3 processes"


def test_a_run_of_one_trial_says_1_trial(tmp_path: Path) -> None:
    done = _gpurace("run", "release-fence", "--backend", "sim", "--trials", "1", "--variant",
                    "buggy", "--out", str(tmp_path), columns=80)
    said = done.stdout + done.stderr
    assert re.search(r"\b1 trials\b", said) is None, said
    assert "start release-fence (buggy): 1 trial" in said  # the progress line
    assert "race detected in 1/1 trial" in said  # the summary
    assert "expects reproduces; 1 trial, delay 1000 us" in " ".join(said.split())  # its line

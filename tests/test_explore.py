"""Schedule exploration on the simulated device, and exact replay of the schedules it finds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.analyses.explore import Strategy, explore
from harness.lang.targets import resolve_targets
from kvcore.device.schedule import Schedule


def _explore(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["explore", *args, "--format", "json"])
    return result.exit_code, json.loads(result.stdout)


def test_exhaustive_finds_the_bad_order_for_buggy_and_none_for_fixed() -> None:
    code, doc = _explore("cross-stream-race", "--strategy", "exhaustive", "--bound", "2")
    by = {r["variant"]: r for r in doc["results"]}
    assert by["buggy"]["failing"] and by["buggy"]["stop"] == "exhausted"
    assert by["fixed"]["failing"] == [] and by["fixed"]["stop"] == "exhausted"
    assert code == 0 and doc["met"]
    # Holding back one op, the transfer-stream write, is the whole bug.
    assert any(len(Schedule.parse(f["token"]).held) == 1 for f in by["buggy"]["failing"])


def test_printed_token_replays_the_same_outcome_10_times_in_10(tmp_path: Path) -> None:
    _, doc = _explore("cross-stream-race", "--variant", "buggy", "--first")
    [found] = doc["results"][0]["failing"]
    result = CliRunner().invoke(main, [
        "run", "cross-stream-race", "--backend", "sim", "--dangerous", "--variant", "buggy",
        "--schedule", found["token"], "--trials", "10", "--no-detect", "--format", "json",
        "--out", str(tmp_path)])
    [r] = json.loads(result.stdout)["results"]
    assert r["outcomes"][found["outcome"]] == 10
    assert r["first_manifested"]["detail"] == found["detail"]


@pytest.mark.parametrize(("strategy", "extra"), [("random", ["--runs", "100"]),
                                                 ("pct", ["--depth", "1", "--runs", "50"])])
def test_random_and_pct_find_the_release_race(strategy: str, extra: list[str]) -> None:
    code, doc = _explore("release-fence", "--strategy", strategy, *extra)
    by = {r["variant"]: r for r in doc["results"]}
    assert by["buggy"]["failing"] and not by["fixed"]["failing"] and code == 0


def test_explore_is_deterministic() -> None:
    [scenario] = resolve_targets(["release-fence"])
    buggy = scenario.variant("buggy")
    a = explore(scenario, buggy, Strategy.PCT, depth=2, runs=40, seed=3)
    b = explore(scenario, buggy, Strategy.PCT, depth=2, runs=40, seed=3)
    assert a.to_json() == b.to_json()


def test_bad_schedule_and_workload_scenarios_are_usage_errors() -> None:
    bad = CliRunner().invoke(main, ["run", "release-fence", "--backend", "sim",
                                    "--schedule", "s2-1"])
    assert bad.exit_code == 2 and "not a schedule token" in bad.output
    workload = CliRunner().invoke(main, ["explore", "catalog-reactivation"])
    assert workload.exit_code == 2 and "exploration runs step scenarios" in workload.output
    assert "Traceback" not in bad.output + workload.output


def test_a_schedule_met_in_many_runs_is_listed_once_with_its_count() -> None:
    """#29: `explore --strategy pct` listed the same failing token six times; and the replay
    hint said --dangerous for a scenario that is not dangerous."""
    result = CliRunner().invoke(main, ["explore", "release-fence", "--variant", "buggy",
                                       "--strategy", "pct", "--runs", "50"])
    lines = [line.strip() for line in result.output.splitlines()]
    listed = [line.split()[0] for line in lines if line.startswith("s1-")]
    assert listed and len(listed) == len(set(listed)), lines
    assert any(" runs)  corruption" in line for line in lines), lines
    (hint,) = [line for line in lines if line.startswith("replay:")]
    assert "--dangerous" not in hint and "scenarios/release_fence.yaml" in hint


def test_a_built_in_scenario_of_an_installed_gpurace_is_named_by_its_name(monkeypatch,
                                                                         tmp_path) -> None:
    from harness.lang import targets
    installed = tmp_path / "site-packages" / "gpurace_scenarios"
    installed.mkdir(parents=True)
    (installed / "release_fence.yaml").write_text("")
    monkeypatch.setattr(targets, "SCENARIO_ROOT", installed)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # the user's folder: the installed package is elsewhere
    assert targets.shown_target(installed / "release_fence.yaml", "release-fence") == \
        "release-fence"
    assert targets.shown_target(work / "mine.yaml", "mine") == "mine.yaml"
    elsewhere = tmp_path / "theirs.yaml"
    assert targets.shown_target(elsewhere, "theirs") == str(elsewhere)


def test_the_replay_hint_of_a_dangerous_scenario_runs_on_the_simulator_as_printed() -> None:
    """The simulator runs a dangerous variant without --dangerous, so the hint leaves it out,
    and the command it prints replays the failing schedule."""
    found = CliRunner().invoke(main, ["explore", "cross-stream-race", "--variant", "buggy",
                                      "--strategy", "pct", "--runs", "20"])
    (hint,) = [line.strip() for line in found.output.splitlines()
               if line.strip().startswith("replay:")]
    assert "--dangerous" not in hint, hint
    argv = hint.split()[3:]  # after "replay: gpurace run"
    replayed = CliRunner().invoke(main, ["run", *argv, "--trials", "3", "--no-detect",
                                         "--format", "json"])
    assert replayed.exit_code in (0, 1), replayed.output
    doc = json.loads(replayed.output[replayed.output.index("{"):])
    assert doc["results"][0]["outcomes"].get("corruption") == 3, doc["results"][0]

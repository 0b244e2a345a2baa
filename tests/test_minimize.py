"""`gpurace minimize`: delta debugging from an incident (or a ticket) to a small scenario that
still fails, and passes when fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.analyses.minimize import ddmin
from harness.lang.targets import SCENARIO_ROOT
from harness.lang.scenario import load_scenario

TICKET = str(SCENARIO_ROOT / "tickets" / "ninfer-210.jsonl")


def _incident(tmp_path: Path, *args: str) -> Path:
    result = CliRunner().invoke(main, [*args, "--backend", "sim", "--trials", "1", "--format",
                                       "json", "--out", str(tmp_path / "run")])
    [r] = json.loads(result.stdout)["results"]
    return Path(r["reports"][0])


def _minimize(source: Path | str, output: Path, *extra: str) -> str:
    result = CliRunner().invoke(main, ["minimize", str(source), "-o", str(output), *extra])
    assert result.exit_code == 0, result.output
    return result.output


def _run(path: Path, tmp_path: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["run", str(path), "--backend", "sim", "--dangerous",
                                       "--format", "json", "--out", str(tmp_path / "check")])
    return result.exit_code, json.loads(result.stdout)


def test_ddmin_finds_a_one_minimal_subset() -> None:
    calls = []

    def fails(items: list[int]) -> bool:
        calls.append(items)
        return {3, 7} <= set(items)

    assert ddmin(list(range(10)), fails) == [3, 7]


def test_ninfer_210_crash_minimizes_to_a_short_scenario_that_still_fails(
        tmp_path: Path) -> None:
    incident = _incident(tmp_path, "replay", TICKET, "--defect", "publish_on_legacy_stream",
                         "--dangerous")
    output = tmp_path / "min.yaml"
    said = _minimize(incident, output)
    assert "118 requests -> 1" in said
    scenario = load_scenario(output)  # the strict loader accepts it
    assert len(scenario.steps) <= 15
    assert {s.op for s in scenario.steps} >= {"catalog", "activate", "read_table"}
    code, doc = _run(output, tmp_path)
    by = {r["variant"]: r for r in doc["results"]}
    assert by["buggy"]["outcomes"]["crash"] == by["buggy"]["trials"]
    assert by["buggy"]["first_manifested"]["cuda_error"] == "CUDA_ERROR_ASSERT"
    assert by["fixed"]["manifested"] == 0 and by["fixed"]["detected"] == 0
    assert code == 0


def test_a_race_found_without_manifesting_minimizes_by_its_finding(tmp_path: Path) -> None:
    incident = _incident(tmp_path, "replay", TICKET, "--defect", "publish_on_legacy_stream",
                         "--dangerous", "--no-amplify")
    output = tmp_path / "min.yaml"
    assert "races on exec-table" in _minimize(incident, output)
    code, doc = _run(output, tmp_path)
    by = {r["variant"]: r for r in doc["results"]}
    assert by["buggy"]["detected"] == by["buggy"]["trials"] and by["buggy"]["manifested"] == 0
    assert by["fixed"]["detected"] == 0 and code == 0
    assert len(load_scenario(output).steps) <= 15


def test_a_step_scenario_incident_minimizes_over_its_steps(tmp_path: Path) -> None:
    incident = _incident(tmp_path, "run", str(SCENARIO_ROOT / "cross_stream_race.yaml"),
                         "--dangerous", "--variant", "buggy")
    output = tmp_path / "min.yaml"
    _minimize(incident, output)
    original = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")
    small = load_scenario(output)
    # The seed's race is already 1-minimal: every step is needed for it to show.
    assert len(small.steps) <= len(original.steps)
    code, doc = _run(output, tmp_path)
    by = {r["variant"]: r for r in doc["results"]}
    assert by["buggy"]["outcomes"]["corruption"] == by["buggy"]["trials"]
    assert by["fixed"]["manifested"] == 0 and code == 0


def test_a_conversation_workload_incident_minimizes_to_one_request(tmp_path: Path) -> None:
    """catalog-reactivation (#210 as a workload) crashes; minimize finds how many requests it
    takes, then which of their steps."""
    incident = _incident(tmp_path, "run", "catalog-reactivation", "--dangerous", "--variant",
                         "buggy")
    output = tmp_path / "min.yaml"
    said = _minimize(incident, output)
    assert "requests: 100 -> 1" in said
    assert len(load_scenario(output).steps) <= 15
    code, doc = _run(output, tmp_path)
    by = {r["variant"]: r for r in doc["results"]}
    assert by["buggy"]["outcomes"]["crash"] == by["buggy"]["trials"] == 20
    assert by["fixed"]["outcomes"]["clean"] == 20 and by["fixed"]["detected"] == 0 and code == 0


def test_a_ticket_minimizes_with_the_defect_named(tmp_path: Path) -> None:
    output = tmp_path / "min.yaml"
    _minimize(TICKET, output, "--defect", "publish_on_legacy_stream")
    assert len(load_scenario(output).steps) <= 15


@pytest.mark.parametrize("args", [[TICKET], [str(SCENARIO_ROOT / "release_fence.yaml")]])
def test_nothing_to_minimize_is_a_usage_error(args: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["minimize", *args, "-o", str(tmp_path / "x.yaml")])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_a_fix_written_as_steps_survives_minimization(tmp_path: Path) -> None:
    """A zoo incident: minimize keeps the scenario's own variants, streams and variant-only
    steps, so what it writes still fails in the buggy variant and stays clean in the fixed
    one (the judge ran the fixed variant's steps, not the buggy ones without a defect)."""
    zoo = SCENARIO_ROOT / "zoo" / "trtllm_15546.yaml"
    incident = _incident(tmp_path, "run", str(zoo), "--variant", "buggy")
    output = tmp_path / "min.yaml"
    _minimize(incident, output)
    small = load_scenario(output)
    original = load_scenario(zoo)
    assert len(small.steps) < len(original.steps)
    assert [v.name for v in small.variants] == ["buggy", "fixed"]
    assert [(s.name, s.kind) for s in small.streams] == [("execution", "non-blocking")]
    fixed_only = [s.op for s in small.steps if s.only == frozenset({"fixed"})]
    assert {"host_free", "host_alloc"} <= set(fixed_only)
    code, doc = _run(output, tmp_path)
    by = {r["variant"]: r for r in doc["results"]}
    assert code == 0
    assert by["buggy"]["manifested"] == by["buggy"]["trials"]
    assert by["fixed"]["manifested"] == 0 and by["fixed"]["detected"] == 0


def test_a_poisoned_trial_is_minimized_with_poison(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidates of a trial that ran with --poison run with it too, from an incident or
    from its trace; and the minimized scenario still fails."""
    import harness.analyses.minimize as m

    seen: list[bool] = []
    real = m.sim_trial
    monkeypatch.setattr(m, "sim_trial",
                        lambda s, v, how: seen.append(how.poison) or real(s, v, how))
    incident = _incident(tmp_path, "run", "cross-stream-race", "--dangerous", "--variant",
                         "buggy", "--poison")
    _minimize(incident, tmp_path / "small.yaml")
    assert seen and all(seen)
    seen.clear()
    _minimize(incident / "trace.jsonl", tmp_path / "small2.yaml")
    assert seen and all(seen)
    seen.clear()
    plain = _incident(tmp_path / "plain", "run", "cross-stream-race", "--dangerous", "--variant",
                      "buggy")
    _minimize(plain, tmp_path / "small3.yaml")
    assert seen and not any(seen)

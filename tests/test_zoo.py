"""The zoo of real bugs, on the simulated device: each buggy variant is found on trial 1 without
amplification and manifests amplified; each fixed variant (the real fix, as steps) stays clean
and race-free; bounded exploration finds a failing ordering for every buggy variant and none
for a fixed one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.analyses.explore import Strategy, explore
from harness.lang.targets import SCENARIO_ROOT
from harness.lang.scenario import load_scenario, load_suite

ZOO = sorted((SCENARIO_ROOT / "zoo").glob("*.yaml"))
NAMES = [p.stem for p in ZOO]


def _run(tmp: Path, *args: str) -> dict[str, dict]:
    result = CliRunner().invoke(main, ["run", "zoo", "--dangerous", "--backend", "sim",
                                       "--format", "json", "--out", str(tmp), *args])
    assert result.exit_code in (0, 1), result.output
    doc = json.loads(result.stdout)
    return {f"{r['scenario']}/{r['variant']}": r for r in doc["results"]}


@pytest.fixture(scope="module")
def unamplified(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return _run(tmp_path_factory.mktemp("unamp"), "--no-amplify", "--trials", "1",
                "--variant", "buggy")


@pytest.fixture(scope="module")
def amplified(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return _run(tmp_path_factory.mktemp("amp"), "--trials", "50", "--variant", "buggy")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    names = sorted({v.name for p in ZOO for v in load_scenario(p).variants
                    if v.expect == "clean"})
    return _run(tmp_path_factory.mktemp("clean"), "--trials", "100",
                *[a for n in names for a in ("--variant", n)])


def test_the_zoo_is_at_least_eight_real_reports_each_citing_its_source() -> None:
    assert len(ZOO) >= 8
    suite = load_suite(SCENARIO_ROOT / "suites" / "zoo.yaml")
    assert sorted(suite.scenarios) == [p.resolve() for p in ZOO]
    for path in ZOO:
        head = path.read_text().split("apiVersion")[0]
        assert re.search(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+", head), path
        assert "fix" in head.lower(), f"{path.name}: say what the real fix was"
        scenario = load_scenario(path)
        assert "zoo" in scenario.tags
        expects = {v.name: v.expect for v in scenario.variants}
        assert expects["buggy"] == "reproduces" and expects["fixed"] == "clean"


def test_at_least_three_need_the_open_language() -> None:
    """Variant steps, declared streams, pinned buffers from the recycling pool, host waits on
    one event: what did not exist before the language was opened."""
    def new_features(path: Path) -> set[str]:
        s = load_scenario(path)
        found = {"declared streams"} if s.declared_streams else set()
        found |= {"variant steps" for st in s.steps if st.only is not None}
        found |= {"pinned pool" for st in s.steps if st.op in ("host_alloc", "host_free")}
        found |= {"host event wait" for st in s.steps
                  if st.op == "synchronize" and "event" in st.args}
        found |= {"variant stream kinds" for v in s.variants if v.streams}
        return found

    needing = {p.stem: new_features(p) for p in ZOO}
    assert sum(bool(f) for f in needing.values()) >= 3, needing
    assert set().union(*needing.values()) == {"declared streams", "variant steps",
                                               "pinned pool", "host event wait",
                                               "variant stream kinds"}


def test_every_buggy_variant_is_detected_on_trial_1_unamplified(
        unamplified: dict[str, dict]) -> None:
    """Except where the race lies in an interleaving of host threads that the threads rarely
    take (tag ``interleaving``): there trial 1 runs the order real threads run, and exploration
    finds the bug (the test below)."""
    for path in ZOO:
        scenario = load_scenario(path)
        r = unamplified[f"{scenario.name}/buggy"]
        if "interleaving" not in scenario.tags:
            assert (r["trials"], r["detected"], r["status"]) == (1, 1, "pass"), scenario.name


def test_every_buggy_variant_manifests_amplified(amplified: dict[str, dict]) -> None:
    shown = {}
    for path in ZOO:
        r = amplified[f"{load_scenario(path).name}/buggy"]
        shown[r["scenario"]] = f"{r['manifested']}/{r['trials']}"
        assert r["trials"] == 50 and r["manifested"] >= 0.95 * 50, r
    print("\nzoo buggy, amplified, sim:", shown)


def test_every_fixed_variant_is_clean_and_race_free(clean: dict[str, dict]) -> None:
    for path in ZOO:
        scenario = load_scenario(path)
        for variant in (v for v in scenario.variants if v.expect == "clean"):
            r = clean[f"{scenario.name}/{variant.name}"]
            assert (r["trials"], r["manifested"], r["detected"]) == (100, 0, 0), r


@pytest.mark.parametrize("path", ZOO, ids=NAMES)
def test_exploration_finds_the_bug_and_not_the_fix(path: Path) -> None:
    scenario = load_scenario(path)
    for variant in scenario.variants:
        e = explore(scenario, variant, Strategy.EXHAUSTIVE, bound=2)
        assert e.stop.name == "EXHAUSTED"
        assert bool(e.failing) == (variant.expect == "reproduces"), (variant.name, e.failing)


def test_the_findings_speak_the_scenarios_words(unamplified: dict[str, dict]) -> None:
    [f] = unamplified["mini-sglang-103/buggy"]["findings"]
    assert f["missing"] == (
        "nothing orders engine's read (copy_htod at step copy-plan-1) before the host's write "
        "(host_write at step plan-2) on pinned buffer staging; synchronize on the copy's event "
        "(record one on engine after copy-plan-1) before the host rewrites the buffer at "
        "plan-2, or write into a fresh buffer")
    zoo = SCENARIO_ROOT / "zoo"
    assert f["first"]["origin"] == f"{zoo / 'mini_sglang_103.yaml'}:35:7"
    assert f["second"]["origin"] == f"{zoo / 'mini_sglang_103.yaml'}:39:7"
    [f] = unamplified["cutorch-222/buggy"]["findings"]
    assert ("event barrier was recorded again at record-on-s2 on s2 before the wait at "
            "wait-barrier, and a wait uses only the latest record") in f["missing"]
    [f] = unamplified["cupy-8789/buggy"]["findings"]
    assert f["owner"] == "buffer next" and f["first_owner"] == "buffer obj" and f["reused"]

"""Shards and their merge: `gpurace run --shard K/N` runs a deterministic part of the trials with
the seeds one run gives them, and `gpurace merge` makes the parts that run, trial for trial; the
Wilson interval every rate carries; what a merge refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.results.outcome import Outcome, TrialResult, VariantResult
from harness.results.rates import wilson
from harness.lang.targets import SCENARIO_ROOT
from reports import percent_interval, render_junit

TARGETS = ("smoke", str(SCENARIO_ROOT / "zoo" / "cudf_22284.yaml"),
           str(SCENARIO_ROOT / "zoo" / "mini_sglang_103.yaml"))
TRIALS = "10"  # not a multiple of 3: the shards are uneven, and the split must still add up;
# enough that the thread race of cudf-22284 is found in some trials and not in others


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def run(out: Path, *extra: str, targets: tuple[str, ...] = TARGETS) -> tuple[dict, Path]:
    code, stdout, stderr = cli("run", *targets, "--backend", "sim", "--trials", TRIALS,
                               "--no-amplify", "--format", "json", "--out", str(out), *extra)
    assert code in (0, 1), stderr
    doc = json.loads(stdout)
    return doc, Path(doc["folder"]) / "run.json"


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One whole run and its three shards, as the same command but for --shard."""
    tmp = tmp_path_factory.mktemp("shards")
    whole, _ = run(tmp / "whole")
    shards = [run(tmp / f"shard-{k}", "--shard", f"{k}/3") for k in (1, 2, 3)]
    return {"tmp": tmp, "whole": whole, "shards": shards}


def _same(a: dict, b: dict) -> list[str]:
    differ = []
    for key in ("scenario", "variant", "status", "reason", "trials", "manifested",
                "manifested_interval", "detected", "reproduced", "not_clean", "outcomes",
                "digest", "xids"):
        if a[key] != b[key]:
            differ.append(f"{a['scenario']}/{a['variant']} {key}: {a[key]} != {b[key]}")
    firsts = [(r["first_manifested"] or {}) for r in (a, b)]
    if [(f.get("index"), f.get("seed"), f.get("detail")) for f in firsts].count(
            (firsts[0].get("index"), firsts[0].get("seed"), firsts[0].get("detail"))) != 2:
        differ.append(f"{a['scenario']}/{a['variant']} first manifested")
    if sorted(f["trials"] for f in a["findings"]) != sorted(f["trials"] for f in b["findings"]):
        differ.append(f"{a['scenario']}/{a['variant']} findings")
    return differ


def test_three_shards_merged_equal_one_run_trial_for_trial(campaign: dict,
                                                          tmp_path: Path) -> None:
    whole, shards = campaign["whole"], campaign["shards"]
    # Each trial ran in exactly one shard: the counts add up, and no shard ran them all.
    for i, result in enumerate(whole["results"]):
        parts = [doc["results"][i]["trials"] for doc, _ in shards]
        assert sum(parts) == result["trials"] == int(TRIALS) and max(parts) < int(TRIALS)
    paths = [str(p) for _, p in reversed(shards)]  # any order
    code, stdout, stderr = cli("merge", *paths, "--out", str(tmp_path / "merged"),
                               "--format", "json", "--junit", str(tmp_path / "merged.xml"))
    merged = json.loads(stdout)
    assert code == whole["exit_code"] == merged["exit_code"], stderr
    assert [r["digest"] for r in merged["results"]] == [r["digest"] for r in whole["results"]]
    differ = [d for a, b in zip(whole["results"], merged["results"]) for d in _same(a, b)]
    assert not differ, differ
    assert len(merged["results"]) == len(whole["results"]) > 3
    # A thread race found in some trials and not others (cudf-22284 unamplified, by the trial
    # seed's interleaving): which trial did what is in the digests, and they agree.
    assert any(0 < r["detected"] < r["trials"] for r in whole["results"])
    assert [s["index"] for s in merged["shards"]] == [1, 2, 3]
    assert merged["shard"] is None and merged["plan"] == whole["plan"]
    on_disk = json.loads((tmp_path / "merged" / "run.json").read_text())
    assert on_disk["results"] == merged["results"]
    assert (tmp_path / "merged.xml").read_text() == render_junit(merged)


def test_shards_partition_the_trials_and_keep_their_seeds(tmp_path: Path) -> None:
    """Every (scenario, variant, trial index, seed) of one run is made by exactly one shard,
    with the seed the whole run gives it."""
    from harness.results.hooks import RunHooks
    from harness.run.options import RunOptions
    from harness.run.runner import Runner
    from harness.lang.targets import resolve_targets

    class Made(RunHooks):
        def __init__(self) -> None:
            self.trials: list[tuple[str, str, int, int]] = []

        def trial_finished(self, result: VariantResult, trial: TrialResult) -> None:
            self.trials.append((result.scenario, result.variant, trial.index, trial.seed))

    def made(shard: tuple[int, int] | None) -> list[tuple[str, str, int, int]]:
        hooks = Made()
        options = RunOptions(backend="sim", trials=5, amplify=False, shard=shard,
                             out_dir=tmp_path / str(shard))
        Runner(options, hooks).run(resolve_targets(TARGETS[:2], ()))
        return hooks.trials

    whole = made(None)
    parts = [made((k, 4)) for k in (1, 2, 3, 4)]
    assert sorted(t for part in parts for t in part) == sorted(whole)
    assert len(whole) == len(set(whole)) == 5 * 4  # two variants each of two scenarios
    assert all(parts)  # 20 trials over 4 shards: every shard makes some


def test_a_merge_refuses_what_does_not_add_up(campaign: dict, tmp_path: Path) -> None:
    shards = [p for _, p in campaign["shards"]]

    def refused(*paths: Path) -> str:
        code, _, stderr = cli("merge", *map(str, paths), "--out", str(tmp_path / "m"))
        assert code == 2, stderr
        assert "Traceback" not in stderr and stderr.count("\n") == 1, stderr
        return stderr

    assert "shard 2 of 3 missing" in refused(shards[0], shards[2])
    assert "shard 1/3 is given twice" in refused(shards[0], shards[0], shards[1], shards[2])
    whole_path = Path(campaign["whole"]["folder"]) / "run.json"
    assert "not a shard" in refused(whole_path)

    def edited(change: dict, name: str) -> Path:
        doc = json.loads(shards[1].read_text())
        for key, value in change.items():
            doc[key] = value
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        return path

    interrupted = edited({"interrupted": "SIGINT"}, "interrupted.json")
    assert "shard 2/3 was interrupted" in refused(shards[0], interrupted, shards[2])
    lacking = edited({"results": [{"scenario": "x"}]}, "lacking.json")
    assert "without" in refused(shards[0], lacking, shards[2])
    wrong = json.loads(shards[1].read_text())
    wrong["results"][0]["trials"] = "many"
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    assert "wrong kind" in refused(shards[0], tmp_path / "wrong.json", shards[2])
    (tmp_path / "notjson.json").write_text("{")
    assert "not JSON" in refused(tmp_path / "notjson.json")
    assert "a folder" in refused(tmp_path)


def test_shards_of_other_plans_are_refused_and_say_what_differs(campaign: dict,
                                                               tmp_path: Path) -> None:
    shards = [p for _, p in campaign["shards"]]

    def merge(*paths: Path) -> str:
        code, _, stderr = cli("merge", *map(str, paths), "--out", str(tmp_path / "m"))
        assert code == 2 and "Traceback" not in stderr, stderr
        return stderr

    _, other_seed = run(tmp_path / "seed", "--shard", "2/3", "--seed", "5")
    assert "seeds (0, 5)" in merge(shards[0], other_seed, shards[2])
    _, undetected = run(tmp_path / "detect", "--shard", "2/3", "--no-detect")
    assert "different options" in merge(shards[0], undetected, shards[2])
    # The same scenario name from a file whose contents changed between the shards.
    copy = tmp_path / "cudf_22284.yaml"
    shutil.copy(TARGETS[1], copy)
    parts = [run(tmp_path / f"a{k}", "--shard", f"{k}/2", targets=(str(copy),))[1]
             for k in (1, 2)]
    copy.write_text(copy.read_text().replace("description:", "description: edited;", 1))
    changed = run(tmp_path / "b2", "--shard", "2/2", targets=(str(copy),))[1]
    assert "different contents of scenario cudf-22284" in merge(parts[0], changed)
    code, _, stderr = cli("merge", *map(str, parts), "--out", str(tmp_path / "ok"))
    # The two shards of the unchanged file do merge (1: unamplified, the buggy variant falls
    # short of its rate, as in one run).
    assert code in (0, 1) and "error" not in stderr, stderr


@pytest.mark.parametrize("value", ["0/3", "4/3", "a/b", "3", "1/0", "1/10001"])
def test_a_bad_shard_is_a_usage_error(value: str, tmp_path: Path) -> None:
    code, _, stderr = cli("run", "smoke", "--backend", "sim", "--shard", value, "--out",
                          str(tmp_path))
    assert code == 2 and "K/N" in stderr and "Traceback" not in stderr


def test_a_shard_takes_no_single_trial(tmp_path: Path) -> None:
    code, _, stderr = cli("run", "smoke", "--backend", "sim", "--shard", "1/2", "--trial", "0",
                          "--out", str(tmp_path))
    assert code == 2 and "--trial" in stderr


def test_a_variant_whose_trials_all_fall_elsewhere_says_so(tmp_path: Path) -> None:
    code, stdout, _ = cli("run", "smoke", "--backend", "sim", "--trials", "1", "--shard", "2/2",
                          "--format", "json", "--out", str(tmp_path))
    doc = json.loads(stdout)
    # Two variants of one trial each: places 0 and 1, so shard 2/2 runs the second only.
    assert [r["trials"] for r in doc["results"]] == [0, 1]
    assert doc["results"][0]["reason"] == "none of its trials falls in shard 2/2"
    assert doc["results"][0]["status"] == "skip" and code == 0


def test_wilson_intervals() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    low, high = wilson(50, 50)
    assert high == 1.0 and round(low, 4) == 0.9287
    low, high = wilson(0, 50)
    assert low == 0.0 and round(high, 4) == 0.0713
    low, high = wilson(25, 50)
    assert round(low, 4) == 0.3664 and round(high, 4) == 0.6336
    assert percent_interval(wilson(50, 50)) == "92-100%"
    assert percent_interval(wilson(0, 50)) == "0-8%"
    assert percent_interval(None) == ""


def test_rates_carry_their_interval_in_json_junit_and_the_summary(tmp_path: Path) -> None:
    result = VariantResult("s", "buggy", "reproduces", "s.yaml", False, True, 1.0)
    for i in range(4):
        result.add(TrialResult(i, i, Outcome.CORRUPTION if i else Outcome.CLEAN))
    result.judge()
    doc = result.to_json()
    assert doc["manifested_interval"] == [round(x, 6) for x in wilson(3, 4)]
    junit = render_junit({"schema": "gpurace.run/1", "backend": "sim", "seed": 0,
                          "run_id": "r", "results": [doc]})
    assert "manifested 3 (95% interval 30-96%)" in junit
    code, stdout, _ = cli("run", "smoke", "--backend", "sim", "--trials", "3", "--out",
                          str(tmp_path))
    assert code == 0 and "95% interval" in stdout and "43-100%" in stdout


def test_folded_results_add_up_in_any_split() -> None:
    """absorb is addition: two halves in either order give the whole, digest included."""
    trials = [TrialResult(i, 100 + i, Outcome.CORRUPTION if i % 3 else Outcome.CLEAN,
                          detail=f"d{i}", race=bool(i % 2)) for i in range(9)]

    def made(part: list[TrialResult]) -> VariantResult:
        r = VariantResult("s", "buggy", "reproduces", "s.yaml", False, True, 1.0)
        for t in part:
            r.add(t)
        r.judge()
        return r

    whole = made(trials).to_json()
    for left, right in ((trials[::2], trials[1::2]), (trials[5:], trials[:5])):
        merged = VariantResult.from_json(made(left).to_json())
        merged.absorb(VariantResult.from_json(made(right).to_json()))
        got = merged.to_json()
        for key in ("trials", "manifested", "detected", "reproduced", "not_clean", "outcomes",
                    "digest", "status", "manifested_interval"):
            assert got[key] == whole[key], key
        assert got["first_manifested"]["index"] == 1
    assert made(trials[:8]).digest != made(trials).digest

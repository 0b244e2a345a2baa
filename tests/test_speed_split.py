"""A run's worker taken apart (harness.speed.split), on the simulated device with its world
kept as a GPU's is: every kind runs the same trials (reissued where the scenario allows it, or
step by step), and says so; the figures themselves are the benchmark's, not asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.lang.scenario import load_scenario
from harness.speed.split import KINDS, split
from harness.lang.targets import SCENARIO_ROOT

REPO = Path(__file__).resolve().parents[1]
SCENARIO = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")


def test_every_kind_runs_the_same_reissued_trials():
    got = split(SCENARIO, "fixed", "sim", reissue=True, trials=100, block=50)
    assert got.reissued and got.trials == 100 and got.variant == "fixed"
    assert len(got.us) == len(KINDS) and all(us > 0 for us in got.us)
    assert got.manifested == (0,) * len(KINDS)
    assert [line.strip().split("  ")[0] for line in got.table().splitlines()] == list(KINDS)


def test_amplified_trials_go_wrong_alike_in_every_kind_step_by_step():
    got = split(SCENARIO, "buggy", "sim", reissue=False, trials=50, block=25, delay_us=1000)
    assert not got.reissued
    assert got.manifested == (50,) * len(KINDS)  # every amplified trial corrupt, whoever reads
    assert got.heading() == "buggy, delay 1000 us, step by step (went wrong: " \
        + "/".join(["50"] * len(KINDS)) + " of 50 each):"


def test_a_variant_that_cannot_be_reissued_says_so_when_asked():
    got = split(SCENARIO, "buggy", "sim", reissue=True, trials=50, block=25, delay_us=1000)
    assert got.asked and not got.reissued
    assert "delay 1000 us, step by step (asked to reissue; this variant cannot be)" \
        in got.heading()


def test_the_bench_takes_a_worker_apart_both_ways():
    out = subprocess.run([sys.executable, "-m", "harness.bench", "--split", "--backend", "sim",
                          "--trials", "100", "--variant", "fixed", "--delays", "0",
                          "--scenario", "release-fence"],
                         cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert "release-fence on sim" in out.stdout
    assert "fixed, delay 0 us, reissued" in out.stdout
    assert "fixed, delay 0 us, step by step (went wrong" in out.stdout
    assert out.stdout.count("+ recorder and detector") == 2
    assert out.stdout.count("a run's worker, whole") == 2

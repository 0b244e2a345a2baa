"""Where a trial's time goes (harness.speed.profile), on the simulated device: the parts of a
run's worker add up to its unprofiled trial, the built-ins' time goes to their callers, and a
worker without the detector spends nothing in it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.speed.inprocess import worker_here
from harness.lang.scenario import load_scenario
from harness.speed.profile import OTHER, _by_part, part_of, profile
from harness.lang.targets import SCENARIO_ROOT


@pytest.mark.parametrize("path, part", [
    ("/repo/harness/traces/flight.py", "flight recorder"),
    ("/repo/harness/traces/batching.py", "executor (steps, checks, world)"),
    ("/repo/harness/traces/ticket.py", "executor (steps, checks, world)"),
    ("/repo/harness/races/detector.py", "race detector"),
    ("/repo/kvcore/device/cuda.py", "CUDA device (kvcore's calls into CuPy)"),
    ("/repo/kvcore/pool.py", "device layer (reissue, op log, pool)"),
    ("/venv/site-packages/cupy/_core/core.py", "CuPy and the CUDA runtime"),
    ("/repo/tests/test_x.py", OTHER),
])
def test_each_file_belongs_to_its_part(path, part):
    assert part_of(path) == part


def test_a_built_in_s_time_goes_to_its_callers_as_they_called_it():
    detector = ("/r/harness/races/detector.py", 1, "f")
    recorder = ("/r/harness/traces/flight.py", 2, "g")
    builtin = ("~", 0, "<built-in method builtins.sorted>")
    stats = {detector: (1, 1, 1.0, 4.0, {}), recorder: (1, 1, 0.5, 1.5, {}),
             builtin: (2, 2, 4.0, 4.0, {detector: (1, 1, 3.0, 3.0), recorder: (1, 1, 1.0, 1.0)})}
    spent = _by_part(stats)
    assert spent == pytest.approx({"race detector": 1.0 + 3.0, "flight recorder": 0.5 + 1.0})


@pytest.mark.parametrize("detect", [True, False])
def test_a_worker_s_parts_add_up_to_its_trial(tmp_path: Path, detect: bool):
    scenario = load_scenario(SCENARIO_ROOT / "cross_stream_race.yaml")
    worker = worker_here(scenario, "fixed", "sim", 0, detect, tmp_path)
    got = profile(lambda i: worker.run(i, i), 200)
    parts = {p.name: p for p in got.parts}
    assert math.isclose(sum(p.us for p in got.parts), got.trial_us, rel_tol=1e-9)
    assert math.isclose(sum(p.share for p in got.parts), 1.0, rel_tol=1e-9)
    assert parts["flight recorder"].share > 0.02 and parts["executor (steps, checks, world)"]
    assert ("race detector" in parts and parts["race detector"].share > 0.02) == detect
    assert [p.us for p in got.parts] == sorted((p.us for p in got.parts), reverse=True)
    assert got.table().splitlines()[-1].strip().startswith("a trial, unprofiled")


def test_the_bench_profiles_a_named_scenario_step_by_step_and_in_a_worker():
    from harness.bench import measure_profile

    got = measure_profile("sim", 50, "fixed", 0.0, "cudf-22284")
    assert got["scenario"] == "cudf-22284"
    for where in ("worker", "stepped"):
        names = {p.name for p in got[where].parts}
        assert "executor (steps, checks, world)" in names and got[where].trial_us > 0
    assert "flight recorder" in {p.name for p in got["worker"].parts}
    assert "flight recorder" not in {p.name for p in got["stepped"].parts}

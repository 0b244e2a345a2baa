"""Reissued trials on the GPU (marker gpu): the calls and records of the step path, and how
often the seed's cross-stream race shows without amplification either way."""

from __future__ import annotations

import pytest

from harness.run.executor import TrialExecutor
from harness.results.outcome import Outcome
from harness.lang.targets import SCENARIO_ROOT
from test_reissue import recorded_trials, without_stamps

pytestmark = pytest.mark.gpu


def _trials(variant: str, reissue: bool, trials: int,
            path: str = "cross_stream_race.yaml") -> tuple[TrialExecutor, list]:
    """A scenario (cross-stream-race unless told) unamplified on the GPU: each trial's outcome
    and records (but their numbers and times)."""
    executor, got = recorded_trials(SCENARIO_ROOT / path, variant, "cuda", trials,
                                    without_stamps, amplify=False, reissue=reissue)
    return executor, [(r.outcome, records) for r, records in got]


def test_reissued_gpu_trials_make_the_calls_and_records_of_the_step_path() -> None:
    """cross-stream-race fixed, 50 trials each way: every one clean, the 48 after the capture
    reissued, and trial by trial the same records (but their numbers and times), the scrub's
    changing byte included."""
    stepped, want = _trials("fixed", False, 50)
    fast, got = _trials("fixed", True, 50)
    assert stepped.reissued == 0 and fast.reissued == 48
    assert {outcome for outcome, _ in want + got} == {Outcome.CLEAN}
    for index, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"trial {index}"


def test_the_unamplified_cross_stream_race_reissued_and_step_by_step() -> None:
    """The buggy variant unamplified, 200 trials each way: reissued trials issue the copies
    closer together (less of the harness between them), so the race may show where the step
    path hides it. Printed for the record. The capture is a trial step by step (the second:
    the first registers the pool's streams), so it is clean and every later trial reissued."""
    counts = {}
    for reissue in (False, True):
        executor, got = _trials("buggy", reissue, 200)
        counts[reissue] = sum(outcome is Outcome.CORRUPTION for outcome, _ in got)
        assert executor.reissued == (198 if reissue else 0)
    print(f"\ncross-stream-race buggy unamplified on the GPU: manifested step by step "
          f"{counts[False]}/200, reissued {counts[True]}/200")


@pytest.mark.parametrize("path", ["stale_row_write.yaml", "zoo/megatron_5715.yaml",
                                  "zoo/trtllm_15607.yaml", "zoo/cucascade_158.yaml",
                                  "zoo/lmcache_4830.yaml"])
def test_tables_catalogs_kernels_and_pinned_blocks_reissue_on_the_gpu(path: str) -> None:
    """A catalog's table row republished every trial (its entries' generations worked out
    again and stored live), counting kernels that follow a page list, pinned blocks a trial
    takes and gives back: the fixed variant, 30 trials each way, every one clean, the 28 after
    the capture reissued, and trial by trial the records of the step path (but their numbers
    and times)."""
    stepped, want = _trials("fixed", False, 30, path)
    fast, got = _trials("fixed", True, 30, path)
    assert stepped.reissued == 0 and fast.reissued == 28
    assert {outcome for outcome, _ in want + got} == {Outcome.CLEAN}
    for index, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"{path} trial {index}"


def test_a_gpu_run_says_how_many_trials_it_reissued(tmp_path) -> None:
    """Through the CLI: the fixed variant's run reissues all but its first two trials (the
    first makes the fence events, the second is captured) and says so in run.json, per trial
    and per variant; --no-reissue runs every trial step by step."""
    import json

    from click.testing import CliRunner

    from harness.cli import main

    counts = {}
    for flag in ("--reissue", "--no-reissue"):
        result = CliRunner().invoke(main, [
            "run", str(SCENARIO_ROOT / "cross_stream_race.yaml"), "--variant", "fixed",
            "--dangerous", "--backend", "cuda", "--trials", "20", "--no-amplify", "--format",
            "json",
            "--out", str(tmp_path / flag), flag])
        assert result.exit_code == 0, result.output
        [variant] = json.loads(result.stdout)["results"]
        counts[flag] = variant["reissued"]
    assert counts == {"--reissue": 18, "--no-reissue": 0}


def _run(tmp_path, name: str, *args: str) -> dict:
    import json

    from click.testing import CliRunner

    from harness.cli import main

    result = CliRunner().invoke(main, [
        "run", str(SCENARIO_ROOT / "cross_stream_race.yaml"), "--dangerous", "--backend",
        "cuda", "--format", "json", "--out", str(tmp_path / name), *args])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_a_gpu_worker_writes_reissued_trials_compactly_and_incidents_in_full(tmp_path) -> None:
    """The buggy variant unamplified, every trial racing (an incident each, the first ten):
    the worker's traces of reissued trials are program and run records, each loads strictly,
    `gpurace check` of it finds the race the worker found online; the incidents' copies are
    op lines only, the same ops."""
    from pathlib import Path

    from harness.races.detector import check_trace
    from harness.traces.optrace import load_trace

    doc = _run(tmp_path, "buggy", "--variant", "buggy", "--no-amplify", "--trials", "12",
               "--record")
    [variant] = doc["results"]
    assert variant["reissued"] == 10 and variant["detected"] == 12
    traces = sorted((tmp_path / "buggy").rglob("trial-0000*.jsonl"))
    compact = [t for t in traces if '"type":"run"' in t.read_text()]
    assert len(compact) == 10, traces
    for trace in compact:
        records = load_trace(trace).records
        assert check_trace(records).findings, trace
    incidents = [Path(r) / "trace.jsonl" for r in variant["reports"]]
    assert incidents and all('"type":"run"' not in t.read_text() for t in incidents)
    by_trial = {load_trace(t).header["trial"]: load_trace(t).ops for t in traces}
    for incident in incidents:
        kept = load_trace(incident)
        assert kept.ops == by_trial[kept.header["trial"]], incident


def test_a_gpu_sweep_keeps_its_window_s_gap(tmp_path) -> None:
    """A sweep's workers record every op's own issue time (a reissued trial's runs carry one
    each): the window plot's interpreter gap comes from the sweep's incidents."""
    from reports.window import trace_gaps

    doc = _run(tmp_path, "sweep", "--variant", "buggy", "--sweep", "--trials", "10")
    gaps = trace_gaps(doc["results"])
    assert gaps.get("cross-stream-race"), gaps
    print(f"\ncross-stream-race sweep on the GPU: interpreter gaps "
          f"{[round(g, 1) for g in gaps['cross-stream-race']]} µs")

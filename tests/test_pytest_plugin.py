"""The pytest plugin: scenario variants as test items, with pytest's own -k, -x, --junitxml
and -p no:gpurace."""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
import tracemalloc
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.gpu.probe import cuda_usable
from harness.lang.targets import SCENARIO_ROOT

pytest_plugins = ["pytester"]

SIM = ["--gpurace-backend", "sim", "-p", "no:cacheprovider", "-o", "addopts="]


@pytest.fixture
def scenarios(pytester: pytest.Pytester) -> Path:
    """The built-in scenarios (and the zoo), with few trials, in pytester's folder."""
    folder = pytester.path / "scenarios"
    shutil.copytree(SCENARIO_ROOT, folder, ignore=shutil.ignore_patterns("*.py", "tickets"))
    for path in folder.glob("**/*.yaml"):
        text = path.read_text()
        for trials in ("200", "100", "50", "20"):
            text = text.replace(f"trials: {trials}\n", "trials: 2\n")
        path.write_text(text)
    return folder


def test_every_variant_is_an_item_and_dangerous_ones_run_on_sim(pytester: pytest.Pytester,
                                                                scenarios: Path) -> None:
    result = pytester.runpytest_subprocess("--gpurace", str(scenarios), *SIM, "-rs")
    print("\n" + "\n".join(result.outlines[-8:]))
    # 5 seed scenarios with 2 variants, 24 zoo scenarios with 2 (pytorch-2702 has 3); the
    # dangerous ones (cross-stream-race, catalog-reactivation, onnxruntime-4829) too: the
    # simulated device has no CUDA context to crash.
    result.assert_outcomes(passed=59)


def test_a_skip_is_told_at_its_scenario_file(pytester: pytest.Pytester, scenarios: Path
                                             ) -> None:
    """Each skip is told at its scenario file, not at the plugin's line (#29): here every
    item skips, as --gpurace-backend cuda finds no GPU."""
    if cuda_usable()[0]:
        pytest.skip("needs a machine where the cuda backend cannot run")
    result = pytester.runpytest_subprocess(
        "--gpurace", str(scenarios / "cross_stream_race.yaml"), "--gpurace-backend", "cuda",
        "-p", "no:cacheprovider", "-o", "addopts=", "-rs")
    result.assert_outcomes(skipped=2)
    skips = [line for line in result.outlines if line.startswith("SKIPPED")]
    assert sum(int(line.split("[", 1)[1].split("]", 1)[0]) for line in skips) == 2
    assert not any("pytest_plugin.py" in line for line in skips)
    assert any("scenarios/cross_stream_race.yaml:1: --backend cuda" in line
               for line in skips), skips


def test_k_selects_and_junitxml_records_the_items(pytester: pytest.Pytester,
                                                  scenarios: Path) -> None:
    """The JUnit pytest writes of gpurace's items validates like any (xunit2)."""
    import xmlschema

    junit = pytester.path / "j.xml"
    result = pytester.runpytest_subprocess("--gpurace", str(scenarios / "zoo"), *SIM,
                                           "-k", "cupy or vllm or onnxruntime_4829",
                                           f"--junitxml={junit}", "-o", "junit_family=xunit2")
    result.assert_outcomes(passed=6)  # onnxruntime-4829, dangerous, runs on sim
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    assert sorted(c.get("name") for c in cases) == ["buggy"] * 3 + ["fixed"] * 3
    xsd = Path(__file__).resolve().parent / "schemas" / "junit-xunit2.xsd"
    xmlschema.XMLSchema(str(xsd)).validate(str(junit))


def test_a_failed_expectation_fails_with_the_summary_and_x_stops(pytester: pytest.Pytester,
                                                                 scenarios: Path) -> None:
    # A variant said to be clean that still has the release race: its test fails, and -x
    # stops before the next variant.
    target = scenarios / "release_fence.yaml"
    text = target.read_text().replace(
        "    buggy: {defects: {release_fence: false}, expect: reproduces, min_rate: 0.9}",
        "    unfixed: {defects: {release_fence: false}, expect: clean}\n"
        "    buggy: {defects: {release_fence: false}, expect: reproduces, min_rate: 0.9}")
    target.write_text(text)
    result = pytester.runpytest_subprocess("--gpurace", str(target), *SIM, "-x")
    result.assert_outcomes(failed=1)
    out = "\n".join(result.outlines)
    assert "release-fence (unfixed) expected clean: expected clean; 2 of 2 trials not clean" in out
    assert "race: nothing orders transfer's read (copy_dtoh at step read-old)" in out
    assert "incident: " in out and "release-fence-unfixed-t0" in out


def test_a_file_that_does_not_load_is_a_collection_error(pytester: pytest.Pytester) -> None:
    bad = pytester.path / "broken.gpurace.yaml"
    bad.write_text("apiVersion: gpurace/v1\nkind: Scenario\nmetadata: {name: x}\nspec: {}\n")
    result = pytester.runpytest_subprocess(*SIM)
    result.assert_outcomes(errors=1)
    assert any(f"{bad}:4:7: spec: the spec is missing the required key 'pool'" in line
               or "missing the required key" in line for line in result.outlines)


def test_files_named_gpurace_yaml_are_collected_and_the_plugin_can_be_turned_off(
        pytester: pytest.Pytester) -> None:
    text = (SCENARIO_ROOT / "release_fence.yaml").read_text().replace("trials: 100", "trials: 2")
    (pytester.path / "release.gpurace.yaml").write_text(text)
    (pytester.path / "other.yaml").write_text(text)  # not collected without --gpurace
    pytester.runpytest_subprocess(*SIM).assert_outcomes(passed=2)
    off = pytester.runpytest_subprocess("-p", "no:gpurace", "-p", "no:cacheprovider")
    assert off.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_poison_and_out_reach_the_runs(pytester: pytest.Pytester, scenarios: Path) -> None:
    """--gpurace-poison and --gpurace-out reach the runs; and an output folder named `reports`
    in the working directory (a plain folder, as a run makes it) does not hide gpurace's own
    `reports` package from the workers."""
    out = pytester.path / "reports"
    result = pytester.runpytest_subprocess("--gpurace", str(scenarios / "release_fence.yaml"),
                                           *SIM, "--gpurace-trials", "2", "--gpurace-poison",
                                           f"--gpurace-out={out}")
    result.assert_outcomes(passed=2)
    incidents = [json.loads(p.read_text()) for p in out.glob("run-*/*/report.json")]
    assert len(incidents) == 2  # the buggy variant's two trials
    assert all("--poison" in r["reproduce"]["argv"] for r in incidents)


def _recorded(name: str, most: int | None = None) -> list[list[object]]:
    """A capture's events as a program's sources emitted them (tests/capture_recorded*), the
    first ``most`` of them."""
    root = Path(__file__).parent
    path = root / "capture_recorded_real" / f"{name}.jsonl.gz"
    if not path.exists():
        path = root / "capture_recorded" / f"{name}.jsonl"
    opened = gzip.open(path, "rt") if path.suffix == ".gz" else path.open()
    with opened as lines:
        return [json.loads(line) for line in itertools.islice(lines, most) if line.strip()]


def test_the_in_process_watch_holds_its_events_within_a_bound() -> None:
    """--gpurace-watch holds a test's events for the analysis at its end, up to a bound past
    which it analyses what it holds. A watched test that runs long (a transformers generate
    loop, 10,000 events of its GPU capture: 2.2 MiB held whole), and the tests after it that
    are not watched, leave the suite's process holding no more than the bound (here 256 KiB)
    and what the analysis needs; the findings are those of the whole capture analysed at
    once, and a test within the bound is analysed only when it ends."""
    from harness.capture.analysis import RunAnalysis
    from harness.capture.in_process import InProcessWatch

    loop = _recorded("hf_generate-hybrid", 10_000)
    raced = _recorded("torch_item_side-buggy")
    watch = InProcessWatch(hold=256 << 10)
    tracemalloc.start()
    try:
        for where in ("outside a test", "inside a test"):
            if where == "inside a test":
                watch.start()
            before = tracemalloc.get_traced_memory()[0]
            for event in loop:
                watch._sink.emit(event)
            held = tracemalloc.get_traced_memory()[0] - before
            assert held < 2**20, (where, held)
    finally:
        tracemalloc.stop()
    assert watch.finish().ops > 2_000
    watch.start()
    for event in raced:
        watch._sink.emit(event)
    watch._sink.flush()  # a host wait of the test's: held, not yet analysed
    assert watch._out.analysis is not None and watch._out.analysis.translator.seq == 0
    got = watch.finish()
    whole = RunAnalysis(None, {})
    whole.feed(raced)
    whole.close()
    assert got.findings == [f.to_json() for f in whole.findings] and got.findings
    assert not got.failed


def test_a_fault_of_the_in_process_analysis_is_kept_not_raised() -> None:
    """An event the analysis cannot take, emitted in a watched test's op: the op and the
    flush return as they would, the piece ends with the fault in a line, and the next
    test is analysed afresh."""
    from harness.capture.in_process import InProcessWatch

    watch = InProcessWatch()
    watch.start()
    watch._sink.emit(["alloc", "d"])
    watch._sink.flush()  # the program's next host wait: the analysis meets the event here
    got = watch.finish()
    assert got.failed.startswith("TypeError") and " at " in got.failed and not got.findings
    watch.start()
    for event in _recorded("torch_item_side-buggy"):
        watch._sink.emit(event)
    again = watch.finish()
    assert again.findings and not again.failed

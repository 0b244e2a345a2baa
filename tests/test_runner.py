"""The runner and `gpurace run` on the simulated device: the three seed scenarios, both
variants, amplified and not; the watchdog; exit codes; the JSON contract."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.run.options import RunOptions
from harness.run.runner import Runner
from harness.lang.targets import SCENARIO_ROOT, resolve_targets

ALL = [str(SCENARIO_ROOT / n) for n in
       ("release_fence.yaml", "cross_stream_race.yaml", "catalog_reactivation.yaml")]


def _run(*args: str, tmp_path: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["run", *args, "--backend", "sim", "--format", "json",
                                       "--out", str(tmp_path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture(scope="module")
def amplified(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict]:
    return _run(*ALL, "--dangerous", tmp_path=tmp_path_factory.mktemp("amplified"))


def test_run_document_contract(amplified: tuple[int, dict]) -> None:
    code, doc = amplified
    assert doc["schema"] == "gpurace.run/1" and doc["backend"] == "sim"
    assert doc["device"]["name"].startswith("simulated")
    for r in doc["results"]:
        assert set(r) >= {"scenario", "variant", "status", "expect", "trials", "manifested",
                          "detected", "outcomes", "reports"}
        assert set(r["outcomes"]) == {"clean", "corruption", "crash", "hang"}
        assert sum(r["outcomes"].values()) == r["trials"]
        assert r["manifested"] == r["trials"] - r["outcomes"]["clean"]
    assert code == 0


def test_fixed_variants_stay_clean(amplified: tuple[int, dict]) -> None:
    _, doc = amplified
    fixed = [r for r in doc["results"] if r["variant"] == "fixed"]
    assert len(fixed) == 3
    for r in fixed:
        assert r["status"] == "pass" and r["manifested"] == 0, r


def test_buggy_variants_reproduce_amplified(amplified: tuple[int, dict]) -> None:
    _, doc = amplified
    buggy = {r["scenario"]: r for r in doc["results"] if r["variant"] == "buggy"}
    assert set(buggy) == {"release-fence", "cross-stream-race", "catalog-reactivation"}
    for r in buggy.values():
        assert r["status"] == "pass"
        assert r["manifested"] >= 0.99 * r["trials"], r
    assert buggy["release-fence"]["outcomes"]["corruption"] == buggy["release-fence"]["trials"]
    catalog = buggy["catalog-reactivation"]
    assert catalog["outcomes"]["crash"] == catalog["trials"]
    assert "CUDA_ERROR_ASSERT" == catalog["first_manifested"]["cuda_error"]
    assert max(catalog["crash_requests"]) <= 3


def test_cross_stream_race_hides_without_amplification(tmp_path: Path) -> None:
    code, doc = _run(ALL[1], "--dangerous", "--no-amplify", "--no-detect", "--variant", "buggy",
                     tmp_path=tmp_path)
    [r] = doc["results"]
    assert r["manifested"] <= 0.05 * r["trials"] and r["detected"] == 0
    assert r["status"] == "fail" and code == 1


def test_same_seed_same_trials(tmp_path: Path) -> None:
    """Every trial's index, seed, outcome and detail go into a variant's digest."""
    def digests(seed: int) -> list[str]:
        scenarios = resolve_targets([ALL[0]])
        result = Runner(RunOptions(backend="sim", seed=seed, trials=20,
                                   out_dir=tmp_path / str(seed))).run(scenarios)
        assert all(r.trials == 20 for r in result.results)
        return [r.digest for r in result.results]

    assert digests(3) == digests(3)
    assert digests(3) != digests(4)


def test_hung_worker_killed_and_run_goes_on(tmp_path: Path) -> None:
    hang = tmp_path / "hang.yaml"
    hang.write_text(
        "apiVersion: gpurace/v1\nkind: Scenario\n"
        "metadata: {name: hang, description: a kernel that never ends}\n"
        "spec:\n  pool: {pages: 2}\n  trials: 2\n  timeout: 1\n"
        "  variants: {fixed: {expect: clean}}\n"
        "  steps:\n    - {op: delay, stream: compute, us: .inf}\n    - {op: synchronize}\n")
    started = time.monotonic()
    code, doc = _run(str(hang), str(SCENARIO_ROOT / "release_fence.yaml"), "--trials", "2",
                     tmp_path=tmp_path)
    elapsed = time.monotonic() - started
    hung, after = doc["results"][0], doc["results"][1:]
    print(f"\nhang: {hung['first_manifested']['detail']}")
    assert hung["first_manifested"]["duration_s"] <= 1 + 2
    assert hung["outcomes"]["hang"] == 2 and hung["status"] == "fail"
    assert "killed" in hung["first_manifested"]["detail"]
    assert all(r["trials"] == 2 for r in after)  # the run went on
    assert elapsed < 2 * (1 + 2) + 10  # each hang ended within timeout + 2 s (+ worker starts)
    assert code == 1


def test_suite_by_name_and_list(tmp_path: Path) -> None:
    code, doc = _run("smoke", "--trials", "5", tmp_path=tmp_path)
    assert code == 0 and [r["scenario"] for r in doc["results"]] == ["release-fence"] * 2
    written = json.loads((Path(doc["folder"]) / "run.json").read_text())
    assert written["schema"] == "gpurace.run/1" and written["run_id"] == doc["run_id"]
    assert Path(doc["folder"]).parent == tmp_path
    listed = CliRunner().invoke(main, ["list", "--format", "json"])
    assert listed.exit_code == 0
    doc = json.loads(listed.stdout)
    assert doc["schema"] == "gpurace.list/1" and doc["broken"] == []
    names = {d["name"] for d in doc["documents"]}
    assert {"smoke", "zoo", "release-fence", "cross-stream-race", "catalog-reactivation",
            "mini-sglang-103"} <= names


@pytest.mark.parametrize(("args", "needle"), [
    (["no-such-scenario"], "no such file, folder, suite or scenario"),
    ([str(SCENARIO_ROOT / "release_fence.yaml"), "--variant", "nope"], "no variant nope"),
    (["--backend", "tpu", "smoke"], "Invalid value for '--backend'"),
])
def test_usage_errors_exit_2_without_traceback(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(main, ["run", *args])
    assert result.exit_code == 2
    assert needle in result.output
    assert "Traceback" not in result.output


def test_bad_scenario_file_through_cli(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: gpurace/v1\nkind: Scenario\nmetadata: {name: bad}\n"
                   "spec:\n  pool: {pages: 2}\n  variants: {fixed: {}}\n"
                   "  steps:\n    - {op: synchronize, stream: sideways}\n")
    result = CliRunner().invoke(main, ["run", str(bad), "--backend", "sim"])
    assert result.exit_code == 2
    assert f"{bad}:8:" in result.output and "spec.steps[0].stream" in result.output
    assert "Traceback" not in result.output


def test_sweep_maps_the_race_window(tmp_path: Path) -> None:
    code, doc = _run(ALL[1], "--dangerous", "--sweep", "--variant", "buggy", "--trials", "20",
                     tmp_path=tmp_path)
    rates = {r["delay_us"]: r["manifested"] / r["trials"] for r in doc["results"]}
    assert list(rates) == [0, 20, 50, 100, 200, 500, 1000]
    # A window, not a step at a fixed delay: the host's time between the racing steps moves it.
    points = list(rates.values())
    assert rates[0] <= 0.05 and rates[1000] == 1.0 and points == sorted(points)
    assert all(r["sweep"] for r in doc["results"])
    assert code == 0  # a map, not an expectation


def test_poison_leaves_every_fixed_variant_clean_and_is_in_the_record(tmp_path: Path) -> None:
    """--poison on every built-in scenario (the seed's and the zoo's): a correct pool never
    shows the poison, so every clean-expected variant stays clean and race-free; run.json, each
    incident's reproduce command and each kept trace say the run was poisoned."""
    targets = [*ALL, str(SCENARIO_ROOT / "zoo")]
    code, doc = _run(*targets, "--dangerous", "--poison", "--trials", "5", tmp_path=tmp_path)
    assert doc["poison"] is True
    clean = [r for r in doc["results"] if r["expect"] == "clean"]
    assert len(clean) >= 15
    for r in clean:
        assert (r["scenario"], r["outcomes"]["clean"], r["detected"]) == (r["scenario"], 5, 0)
    buggy = [r for r in doc["results"] if r["reports"]]
    assert buggy, "no incident to look at"
    report = json.loads((Path(buggy[0]["reports"][0]) / "report.json").read_text())
    assert "--poison" in report["reproduce"]["argv"]
    header = json.loads((Path(buggy[0]["reports"][0]) / "trace.jsonl").read_text()
                        .splitlines()[0])
    assert header["poison"] is True
    assert code == 0


def test_a_check_says_whose_bytes_it_found(tmp_path: Path) -> None:
    """A corruption names where the bytes it found came from: a buffer a step filled, the
    pool's poison, what a page held before the trial, a read-back buffer nothing landed in."""
    def detail(name: str, *args: str) -> str:
        _, doc = _run(name, "--dangerous", "--variant", "buggy", "--trials", "1", *args,
                      tmp_path=tmp_path)
        return doc["results"][0]["first_manifested"]["detail"]

    assert detail("release-fence").endswith(
        "found 0xCD (buffer fresh, filled at 7:host_fill)")
    assert detail("cross-stream-race", "--poison").endswith(
        "found 0xFF (the pool's poison: the page had been released)")
    assert detail("pytorch-2702").endswith(
        "found 0xA5 (what the page held before this trial: nothing wrote it yet)")
    assert detail("vllm-36013").endswith(
        "found 0x00 (buffer accepted-cpu as each trial starts it: nothing had landed in it yet)")


def test_a_summary_lists_ten_incidents_and_says_how_many_more_and_where(monkeypatch,
                                                                      tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from harness.cli import output
    from harness.results.outcome import VariantResult
    from harness.results.run import RunResult
    text = io.StringIO()
    monkeypatch.setattr(output, "out", Console(file=text, width=200))
    variant = VariantResult(scenario="s", variant="buggy", expect="reproduces", path="s.yaml",
                            dangerous=False, amplified=True, delay_us=100.0)
    variant.reports = [str(tmp_path / f"incident-{i:02d}") for i in range(13)]
    result = RunResult(backend="sim", device={"backend": "sim"}, seed=0,
                       folder=str(tmp_path), results=[variant])
    output.print_summary(result, tmp_path)
    lines = text.getvalue().splitlines()
    assert any(line.strip() == f"13 incident reports (gpurace report list {tmp_path}):"
               for line in lines)
    assert sum("incident-" in line for line in lines) == 10
    assert any(line.strip() == f"and 3 more in {tmp_path}" for line in lines)


def test_help_names_every_exit_code() -> None:
    shown = " ".join(CliRunner().invoke(main, ["--help"]).output.split())
    for code, words in ((0, "every expectation met"), (1, "an expectation failed"),
                        (2, "usage error"), (3, "internal error"), (77, "nothing could run"),
                        (130, "stopped by Ctrl-C"), (143, "stopped by SIGTERM")):
        assert f"{code} {words}" in shown


def test_record_says_where_it_kept_every_trials_trace(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "release-fence", "--backend", "sim", "--trials",
                                       "2", "--record", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (folder,) = tmp_path.glob("run-*")
    traces = sorted(folder.glob("workers/*/trial-*.jsonl"))
    assert len(traces) == 4  # two variants, two trials each
    said = " ".join(result.output.split())
    assert f"--record kept 4 trial traces: {folder / 'workers'}/*/trial-*.jsonl" in said


def test_a_line_to_a_log_is_never_wrapped(monkeypatch, capsys) -> None:
    """#29: output to a pipe was wrapped mid-word at 160 columns."""
    import io

    from harness.cli.output import _console
    monkeypatch.delenv("COLUMNS", raising=False)
    console = _console(io.StringIO())  # not a terminal: a log
    words = " ".join(f"word{i}" for i in range(60)) + " /a/very/long/path/" + "x" * 80
    console.print(words, highlight=False)
    assert capsys.readouterr().out == words + "\n"

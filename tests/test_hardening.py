"""What a run survives and what it leaves: workers that die with their parent, outcomes that
say what happened, Ctrl-C and SIGTERM that keep what finished, runs that share an --out and
nothing else, outputs checked before anything runs, and long runs that cost the same per trial."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.results.outcome import Outcome, TrialResult, VariantResult
from harness.run.outputs import RunFolder, sweep_dead_runs
from harness.run.options import RunOptions
from harness.run.runner import Runner
from harness.lang.targets import SCENARIO_ROOT, resolve_targets
from programs import hang_file
from reports import ReportError, write_atomic

REPO = Path(__file__).resolve().parent.parent


def _children(pid: int) -> set[int]:
    """Live processes descended from ``pid`` (from /proc): its children, and theirs (a worker
    is the child of the fork server, which is the run's)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    level = {pid}
    while level:
        level = {child for child, parent in parents.items() if parent in level} - found
        found |= level
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def _as_from_a_terminal() -> None:
    """Ctrl-C as a terminal delivers it: a shell that started this suite in the background
    (`cmd &`, nohup) leaves SIGINT ignored, and an ignored signal stays ignored across exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_hanging_run(tmp_path: Path) -> tuple[subprocess.Popen, set[int]]:
    """`gpurace run` of a hanging scenario as a child process, once its worker hangs."""
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run",
                             str(hang_file(tmp_path)), "--backend", "sim", "--out",
                             str(tmp_path / "out")], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_from_a_terminal)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = list((tmp_path / "out").glob("run-*/workers/*/trial-current.jsonl"))
        workers = _children(proc.pid)
        if logs and workers:
            time.sleep(0.3)  # the worker is in its trial, blocked in the hung kernel's wait
            return proc, _children(proc.pid)
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the hanging run did not start its worker in 60 s")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_no_worker_outlives_its_parent(tmp_path: Path, how: signal.Signals) -> None:
    proc, workers = _start_hanging_run(tmp_path)
    assert workers, "no worker to orphan"
    proc.send_signal(how)
    proc.wait(10)
    time.sleep(2)
    assert [pid for pid in workers if _alive(pid)] == []


def test_sigterm_and_ctrl_c_keep_what_finished(tmp_path: Path) -> None:
    for how, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        folder = tmp_path / how.name
        folder.mkdir()
        proc, _ = _start_hanging_run(folder)
        proc.send_signal(how)
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == code, stderr
        [run_json] = (folder / "out").glob("run-*/run.json")
        doc = json.loads(run_json.read_text())
        assert doc["interrupted"] == how.name and doc["exit_code"] == code
        [r] = doc["results"]
        assert r["trials"] == 0 and "interrupted by" in r["reason"]
        assert f"interrupted ({how.name})" in stderr


def test_a_worker_killed_from_outside_is_a_crash_that_names_the_signal(tmp_path: Path) -> None:
    runner = Runner(RunOptions(backend="sim", trials=1, out_dir=tmp_path))
    done: list = []
    thread = threading.Thread(target=lambda: done.append(
        runner.run(resolve_targets([str(hang_file(tmp_path))]))))
    thread.start()
    deadline = time.monotonic() + 60
    while not multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # into the trial
    [worker] = multiprocessing.active_children()
    os.kill(worker.pid, signal.SIGKILL)
    thread.join(30)
    [r] = done[0].results
    assert r.counts["crash"] == 1 and r.counts["hang"] == 0
    assert "was killed by SIGKILL" in r.first_manifested.detail
    assert "before it reported the trial" in r.first_manifested.detail


def test_a_hang_is_no_reproduction_unless_the_variant_expects_one() -> None:
    def judged(expect: str) -> VariantResult:
        r = VariantResult("s", "v", expect, "s.yaml", False, True, 1.0, min_rate=0.5)
        for i in range(4):
            r.add(TrialResult(i, i, Outcome.HANG, detail="no result"))
        r.judge()
        return r

    reproduces = judged("reproduces")
    assert reproduces.status.value == "fail" and reproduces.reproduced == 0
    assert "4 trials hung, which is not a reproduction" in reproduces.reason
    assert judged("hang").status.value == "pass"
    assert judged("clean").status.value == "fail"


def test_two_runs_on_one_out_share_nothing(tmp_path: Path) -> None:
    """Two concurrent runs of 300 trials on the same --out: both complete, each in its own
    folder, and every incident's trace is its own run's."""
    out = tmp_path / "shared"
    args = ["run", "release-fence", "--backend", "sim", "--trials", "300", "--no-detect",
            "--no-amplify", "--variant", "fixed", "--format", "json", "--out", str(out)]
    buggy = [a if a != "fixed" else "buggy" for a in args]
    buggy[buggy.index("--no-amplify")] = "--amplify"
    procs = [subprocess.Popen([sys.executable, "-m", "harness.cli", *argv], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in (buggy, buggy)]
    docs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr
        docs.append(json.loads(stdout))
    assert docs[0]["folder"] != docs[1]["folder"]
    for doc in docs:
        folder = Path(doc["folder"])
        assert json.loads((folder / "run.json").read_text())["run_id"] == doc["run_id"]
        [r] = doc["results"]
        assert r["trials"] == 300 and r["manifested"] == 300 and len(r["reports"]) == 3
        for report in r["reports"]:
            assert Path(report).parent == folder
            incident = json.loads((Path(report) / "report.json").read_text())
            trace = (Path(report) / "trace.jsonl").read_text().splitlines()
            header = json.loads(trace[0])
            assert header["trial"] == incident["trial"]["index"]
            assert header["pid"] == incident["trial"]["worker_pid"]
        assert all(Path(t).parent.parent == folder for t in r["traces"])


def test_outputs_are_checked_before_anything_runs(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = [
        (["--out", str(a_file)], f"Invalid value for '--out': Directory '{a_file}' is a file"),
        (["--out", str(a_file / "below")], f"--out {a_file / 'below'}: {a_file} is a file, "
                                            "not a folder"),
        (["--out", "/dev/null"], "--out /dev/null: it is a character device, not a folder"),
        (["--out", str(tmp_path / "o"), "--junit", str(fifo)],
         f"--junit {fifo}: it is a FIFO; gpurace writes regular files only"),
        (["--out", str(tmp_path / "o"), "--junit", str(a_file / "j.xml")],
         f"--junit {a_file / 'j.xml'}: {a_file} is a file, not a folder"),
    ]
    for extra, message in cases:
        result = CliRunner().invoke(main, ["run", "smoke", "--backend", "sim", "--trials", "1",
                                           *extra])
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()  # nothing ran, nothing was made


def test_junit_in_a_new_folder_is_written_after_a_passing_run(tmp_path: Path) -> None:
    junit = tmp_path / "new" / "deeper" / "j.xml"
    result = CliRunner().invoke(main, ["run", "smoke", "--backend", "sim", "--trials", "2",
                                       "--out", str(tmp_path / "o"), "--junit", str(junit)])
    assert result.exit_code == 0, result.output
    assert junit.read_text().startswith("<?xml")


def test_atomic_writes_follow_a_symlink_and_refuse_what_is_not_a_file(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path, Path("/dev/null")):
        with pytest.raises(ReportError, match="not a regular file"):
            write_atomic(path, "x")
    assert Path("/dev/null").is_char_device() and fifo.is_fifo()


def test_the_sweep_leaves_a_live_runs_temps_alone(tmp_path: Path) -> None:
    live = RunFolder.create(tmp_path)
    (live.path / ".report.json.abc.tmp").write_text("being written")
    dead = tmp_path / "run-20200101-000000-999999"
    dead.mkdir()
    (dead / "owner.json").write_text(json.dumps({"pid": 999_999_999, "started": 1}))
    (dead / ".report.json.def.tmp").write_text("left by a killed run")
    assert sweep_dead_runs(tmp_path) == 1
    assert (live.path / ".report.json.abc.tmp").exists()
    assert not (dead / ".report.json.def.tmp").exists()


def test_traces_are_kept_for_kept_incidents_only(tmp_path: Path) -> None:
    def run(*extra: str) -> dict:
        result = CliRunner().invoke(main, ["run", "release-fence", "--backend", "sim",
                                           "--variant", "buggy", "--trials", "10", "--format",
                                           "json", "--max-incidents", "2", *extra])
        return json.loads(result.stdout)

    doc = run("--out", str(tmp_path / "a"))
    [r] = doc["results"]
    assert r["manifested"] == 10 and len(r["reports"]) == 2
    assert sorted(r["traces"]) == sorted(f"{p}/trace.jsonl" for p in r["reports"])
    assert list(Path(doc["folder"]).glob("workers/*/trial-*.jsonl")) == []
    doc = run("--out", str(tmp_path / "b"), "--record")
    [r] = doc["results"]
    assert len(r["traces"]) == 10 and all("workers" in t for t in r["traces"])


def test_a_variant_result_keeps_counts_not_trials() -> None:
    """Every trial folds into running counts: the result holds the same few things after
    20,000 trials as after one, and the progress line costs the same at each."""
    r = VariantResult("s", "v", "reproduces", "s.yaml", False, True, 1.0)
    bad = TrialResult(0, 0, Outcome.CORRUPTION, detail="x", requests=None)
    for i in range(20_000):
        r.add(bad if i % 2 else TrialResult(i, i, Outcome.CLEAN))
    assert (r.trials, r.manifested, r.reproduced) == (20_000, 10_000, 10_000)
    assert r.first_manifested is bad
    kept = [v for v in vars(r).values() if isinstance(v, (list, dict))]
    assert max(len(v) for v in kept) <= len(Outcome)


def test_a_line_number_is_not_an_emoji_code(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    text = (SCENARIO_ROOT / "release_fence.yaml").read_text()
    lines = text.count("\n", 0, text.index("trials: 100")) + 1  # the line trials is on
    path.write_text(text.replace("trials: 100", "trials: 100" + "\n" * (100 - lines)
                                 + "  trails: 1"))
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(path), "--backend",
                           "sim"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"{path}:100:3: spec.trails" in proc.stderr and "💯" not in proc.stderr


def test_what_runs_trials_in_process_refuses_a_step_that_never_ends(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["explore", str(hang_file(tmp_path))])
    assert result.exit_code == 2
    assert "this step never ends (us: .inf), and exploration runs its trials in this " \
           "process" in result.output


def test_report_commands_read_only_a_report_sized_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    result = CliRunner().invoke(main, ["report", "show", str(fifo)])
    assert result.exit_code == 2 and "not a regular file" in result.output
    huge = tmp_path / "big" / "report.json"
    huge.parent.mkdir()
    with huge.open("wb") as file:
        file.truncate(9 << 20)
    result = CliRunner().invoke(main, ["report", "show", str(huge.parent)])
    assert result.exit_code == 2 and "is more than a report may have (8 MiB)" in result.output


@pytest.mark.parametrize(("option", "value"), [("--timeout", "2147484"),
                                               ("--delay-us", "1e300"),
                                               ("--trials", "10000000000")])
def test_run_options_are_bounded(option: str, value: str) -> None:
    result = CliRunner().invoke(main, ["run", "smoke", "--backend", "sim", option, value])
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output

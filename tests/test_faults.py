"""Faults of the machine, not of the input (#34): an output whose reader went away, a disk that
fills, a run folder removed mid-run.

`gpurace run zoo ... | head -2` went on to the end and exited 1 with no word, as if an
expectation had failed (click's answer to a closed pipe). Now a command whose standard output
is closed goes on to its own end, writes its files, and exits with its own code, quietly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.words import counted

ROOT = Path(__file__).resolve().parent.parent
INCIDENT_TRACE = ROOT / "tests" / "capture_recorded" / "torch_record_stream-buggy.jsonl"


def _closed_stdout(*args: str, cwd: Path) -> tuple[int, str]:
    """Run gpurace with its standard output a pipe nobody reads (closed before it writes)."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write is a broken pipe
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *args], stdout=write,
                            stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(write)
    _, stderr = proc.communicate(timeout=300)
    return proc.returncode, stderr


@pytest.mark.parametrize("args, code", [
    (["run", "release-fence", "--backend", "sim", "--trials", "2"], 0),
    (["run", "release-fence", "--backend", "sim", "--trials", "2", "--format", "json"], 0),
    (["explore", "release-fence", "--strategy", "pct", "--runs", "20"], 0),
    (["list"], 0),
    (["list", "--format", "json"], 0),
], ids=["run", "run-json", "explore", "list", "list-json"])
def test_a_closed_output_ends_with_the_commands_own_code_quietly(tmp_path, args, code):
    if args[0] == "run":
        args = [*args, "--out", str(tmp_path / "out")]
    got, stderr = _closed_stdout(*args, cwd=tmp_path)
    assert got == code, stderr[-2000:]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    if args[0] == "run":  # the run's files are written all the same
        (doc,) = (tmp_path / "out").glob("run-*/run.json")
        assert '"exit_code": 0' in doc.read_text()


def test_check_into_a_closed_output_still_says_its_races_by_its_code(tmp_path):
    from harness.capture.analysis import RunAnalysis
    from harness.capture.events import iter_file
    trace = tmp_path / "trace.jsonl"
    analysis = RunAnalysis(trace, {"scenario": "torch_record_stream", "variant": "watched"})
    analysis.feed(list(iter_file(INCIDENT_TRACE)))
    analysis.close()
    got, stderr = _closed_stdout("check", str(trace), cwd=tmp_path)
    assert got == 1 and "Traceback" not in stderr  # 1: races found, as with an open output


# --- A disk that fills, a folder that goes -------------------------------------------------
#
# Before: the first incident that did not fit ended the run with a traceback (OSError ENOSPC
# from reports/atomic.py), exit 1 and no run.json; a run folder removed mid-run ended in
# "internal error: the worker ... did not start ... run with --backend sim" (exit 3). Now the
# run goes on counting (or stops with --stop-on-write-error), says once what it could not
# write, writes run.json where it can and exits 4.


def _tiny_fs_works() -> bool:
    """Whether this machine lets an unprivileged process mount a tmpfs of its own (a user and
    mount namespace, as unshare -rm makes)."""
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs "
                               "/tmp"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_tiny_fs = pytest.mark.skipif(not _tiny_fs_works(), reason="no user and mount namespaces "
                                   "here (unshare -rm): a tiny file system cannot be made")


def _on_tiny_fs(size: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """gpurace with ``--out`` a file system of ``size`` bytes (a tmpfs in a mount namespace of
    its own) and the system's temp folder at ``tmp`` (where run.json falls back to). The tmpfs
    ends with the namespace: what the run left on it is copied to ``tmp/seen`` first."""
    out, seen = tmp / "out", tmp / "seen"
    out.mkdir()
    seen.mkdir()
    script = ('mount -t tmpfs -o size="$1" tmpfs "$2" || exit 99; out="$2"; seen="$3"; '
              'shift 3; "$@"; code=$?; cp -a "$out"/. "$seen"; exit $code')
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", size, str(out), str(seen), sys.executable,
         "-m", "harness.cli", *args, "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)})


def _run_doc(tmp: Path) -> dict:
    """The run's run.json: in its folder (as the tiny file system held it), or its fallback."""
    (path,) = [*(tmp / "seen").glob("run-*/run.json"),
               *(tmp / "gpurace-fallback").glob("run-*/run.json")]
    return json.loads(path.read_text())


@needs_tiny_fs
def test_a_full_disk_costs_files_never_trials(tmp_path):
    got = _on_tiny_fs("96k", tmp_path, "run", "release-fence", "--backend",
                      "sim", "--trials", "300", "--record")
    assert got.returncode == 4, got.stderr[-3000:]
    assert "Traceback" not in got.stderr
    notes = [line for line in got.stderr.splitlines() if "cannot write" in line]
    assert notes[0].startswith("note: cannot write ") and "(ENOSPC)" in notes[0]
    assert "the run goes on without it" in notes[0]
    assert len(notes) == len(set(notes)) <= 4  # each kind once, not once a trial
    doc = _run_doc(tmp_path)
    assert doc["exit_code"] == 4
    assert [r["trials"] for r in doc["results"]] == [300, 300]  # every trial counted
    lost = {f["what"]: f for f in doc["write_errors"]}
    assert "trace" in lost and lost["trace"]["count"] > 1
    # run.json fits in what a dropped trace left free, or goes to the fallback, said so.
    if not list((tmp_path / "seen").glob("run-*/run.json")):
        assert "run.json" in lost
        assert "run.json is at " + str(tmp_path / "gpurace-fallback") in got.stderr
    assert "exit 4 (write_failed)" in got.stdout
    # Nothing half-written under a final name: every kept trace ends with a whole line,
    # every incident folder has its seal.
    (folder,) = (tmp_path / "seen").glob("run-*")
    assert not list(folder.rglob(".*.tmp"))
    for trace in folder.glob("workers/*/trial-0*.jsonl"):
        assert trace.read_bytes().endswith(b"\n")
    for incident in folder.glob("20*-*"):
        assert (incident / "report.json").exists()


@needs_tiny_fs
def test_stop_on_write_error_ends_the_run_at_the_first(tmp_path):
    got = _on_tiny_fs("96k", tmp_path, "run", "release-fence", "--backend",
                      "sim", "--trials", "300", "--record", "--stop-on-write-error")
    assert got.returncode == 4, got.stderr[-3000:]
    assert "the run stops here (--stop-on-write-error)" in got.stderr
    doc = _run_doc(tmp_path)
    ran = [r["trials"] for r in doc["results"]]
    assert 0 < ran[0] < 300 and len(ran) == 1  # the variant in progress, kept as far as it got
    assert doc["results"][0]["reason"].startswith("stopped (")
    assert "No space left on device (ENOSPC)" in doc["results"][0]["reason"]
    assert f"after {counted(ran[0], 'trial')}" in doc["results"][0]["reason"]


def test_a_run_whose_folder_is_removed_ends_with_what_it_knows(tmp_path, monkeypatch):
    from harness.cli.runs import write_and_show
    from harness.faults.writes import FOLDER_GONE
    from harness.results.exitcodes import ExitCode
    from harness.results.hooks import RunHooks
    from harness.run.options import RunOptions
    from harness.run.runner import Runner
    from harness.lang.targets import resolve_targets

    class RemoveAfter(RunHooks):  # a cleanup job, 30 trials in
        seen = 0

        def trial_finished(self, result, trial):
            RemoveAfter.seen += 1
            if RemoveAfter.seen == 30:
                shutil.rmtree(runner.out_dir)

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    runner = Runner(RunOptions(backend="sim", trials=20, out_dir=tmp_path / "out"), RemoveAfter())
    result = runner.run(resolve_targets(("release-fence", "stale-row-write"), ()))
    # The first variant's 20 and the second's 10 before the folder went; its next worker
    # (the third variant's) is where the run finds the folder gone and stops.
    assert [r.trials for r in result.results] == [20, 20, 0]
    assert "stopped (the run's folder " in result.results[-1].reason
    assert result.exit_code is ExitCode.WRITE_FAILED
    assert [f.what for f in result.write_errors] == [FOLDER_GONE]
    result = write_and_show(result, None, "json")
    doc = json.loads((tmp_path / "tmp" / "gpurace-fallback" / result.run_id / "run.json")
                     .read_text())
    assert doc["exit_code"] == 4 and doc["write_errors"][0]["what"] == FOLDER_GONE
    assert not Path(result.folder).exists()  # not made again for run.json alone


def test_each_kind_of_lost_file_is_said_once_and_counted():
    from harness.faults.writes import WriteFaults, WriteStop
    said = []
    faults = WriteFaults(note=said.append)
    full = OSError(28, "No space left on device")
    for _ in range(5):
        faults.failed("incident", "/out/run-1", full)
    faults.failed("trace", "/out/run-1/workers/0001/trial-current.jsonl", full)
    faults.failed("incident", "/out/run-1", OSError(122, "Disk quota exceeded"))
    assert said == [
        "cannot write incident at /out/run-1: No space left on device (ENOSPC); the run goes "
        "on without it (--stop-on-write-error stops a run at the first)",
        "cannot write trace at /out/run-1/workers/0001/trial-current.jsonl: No space left on "
        "device (ENOSPC); the run goes on without it (--stop-on-write-error stops a run at "
        "the first)",
        "cannot write incident at /out/run-1: Disk quota exceeded (EDQUOT); the run goes on "
        "without it (--stop-on-write-error stops a run at the first)"]
    assert [(f.what, f.count) for f in faults.records] == [
        ("incident", 5), ("trace", 1), ("incident", 1)]
    faults.stop_if_due()  # without --stop-on-write-error nothing stops
    stopping = WriteFaults(stop=True)
    stopping.failed("incident", "/out/run-1", full)  # said, and due once the trial counts
    with pytest.raises(WriteStop, match=r"incident at /out/run-1: No space left on device"):
        stopping.stop_if_due()


def test_a_trace_the_disk_will_not_take_is_dropped_and_the_next_trial_tries_again(
        tmp_path, monkeypatch):
    from harness.traces.flight import CURRENT, FlightRecorder, TRACE_MAP_BYTES

    recorder = FlightRecorder(tmp_path)
    real = os.posix_fallocate
    full = {"on": True}

    def fallocate(fd, offset, size):  # the system call's answer on a full disk
        if full["on"]:
            raise OSError(28, "No space left on device")
        real(fd, offset, size)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    recorder.start_trial({"scenario": "s", "variant": "v", "trial": 0})
    assert recorder.error == "No space left on device (ENOSPC)"
    assert not (tmp_path / CURRENT).exists()  # no part of a trace left as if it were one
    recorder.flush()
    assert recorder.end_trial(0, keep=True) is None
    full["on"] = False
    recorder.start_trial({"scenario": "s", "variant": "v", "trial": 1})
    assert recorder.error == ""
    kept = recorder.end_trial(1, keep=True)
    assert kept and Path(kept).read_text().startswith('{"type":"header"')
    # A trace that outgrows its map on a disk that fills half way: dropped there, not SIGBUS.
    recorder.start_trial({"scenario": "s", "variant": "v", "trial": 2})
    full["on"] = True
    recorder._write("x" * TRACE_MAP_BYTES + "\n")
    assert recorder.error.endswith("(ENOSPC)") and recorder.end_trial(2, keep=True) is None


def test_a_worker_whose_log_cannot_be_made_runs_its_trials(tmp_path):
    from harness.results.exitcodes import ExitCode
    from harness.results.hooks import RunHooks
    from harness.run.options import RunOptions
    from harness.run.runner import Runner
    from harness.lang.targets import resolve_targets

    class LogIsAFolder(RunHooks):  # where the first worker's log goes, a folder: EISDIR
        def variant_started(self, result, trials):
            if result.variant == "buggy":
                (runner.log_dir / "0001-release-fence-buggy" / "worker.log").mkdir(
                    parents=True)

    runner = Runner(RunOptions(backend="sim", trials=10, out_dir=tmp_path), LogIsAFolder())
    result = runner.run(resolve_targets(("release-fence",), ()))
    assert [r.trials for r in result.results] == [10, 10]
    assert [r.status.value for r in result.results] == ["pass", "pass"]
    assert [(f.what, f.error) for f in result.write_errors] == [
        ("worker log", "Is a directory (EISDIR)")]
    assert result.exit_code is ExitCode.WRITE_FAILED


def test_run_json_goes_where_it_can_and_says_so(tmp_path, monkeypatch, capsys):
    from harness.cli.runs import write_and_show
    from harness.faults.writes import FOLDER_GONE
    from harness.results.exitcodes import ExitCode
    from harness.run.options import RunOptions
    from harness.run.runner import Runner
    from harness.lang.targets import resolve_targets

    result = Runner(RunOptions(backend="sim", trials=3, out_dir=tmp_path / "out")).run(
        resolve_targets(("release-fence",), ()))
    shutil.rmtree(result.folder)  # gone as the run ended
    nowhere = tmp_path / "file"
    nowhere.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(nowhere))  # and the fallback under a file
    result = write_and_show(result, None, "json")
    out, err = capsys.readouterr()
    doc = json.loads(out)  # --format json prints the whole document all the same
    assert doc["exit_code"] == 4 and result.exit_code is ExitCode.WRITE_FAILED
    assert [f["what"] for f in doc["write_errors"]] == [FOLDER_GONE, "run.json"]
    assert doc["write_errors"][1]["error"] == "Not a directory (ENOTDIR)"
    assert not Path(result.folder).exists()  # not made again for run.json alone
    assert "cannot write run.json at " + str(nowhere) in err.replace("\n", "")


# --- gpurace watch on a disk that fills: the program is never the one that pays ----------
#
# /dev/full answers every write with ENOSPC, as a full disk does.


def test_a_capture_whose_events_file_fills_stops_and_the_program_runs_on(capsys):
    from harness.capture.events import LOST, Sink

    sink = Sink(open("/dev/full", "w", encoding="utf-8"))  # noqa: SIM115
    sink.emit(["op", 1])
    sink.flush()  # a host wait of the program's: must not raise into it
    sink.emit(["op", 2])
    sink.flush()
    sink.close()
    assert sink.lost == "No space left on device (ENOSPC)"
    assert capsys.readouterr().err == f"{LOST}No space left on device (ENOSPC)\n"  # once


def test_the_watch_reads_what_the_capture_said_and_a_log_that_fills_costs_only_the_log():
    from harness.capture.events import LOST
    from harness.capture.launch import OutputLog

    log = OutputLog(Path("/dev/full"))
    cut = len(LOST) // 2  # the line split between two reads of the program's output
    log.write(b"starting\n" + LOST.encode()[:cut], errors=True)
    log.write(LOST.encode()[cut:] + b"No space left on device (ENOSPC)\nmore\n", errors=True)
    log.write(b"stdout goes on\n", errors=False)
    log.close()
    assert log.events_lost == "No space left on device (ENOSPC)"
    assert log.lost == "No space left on device (ENOSPC)"


def test_a_watched_runs_trace_that_does_not_fit_is_dropped_whole(tmp_path):
    from harness.capture.analysis import RunAnalysis
    from harness.capture.events import iter_file

    full = tmp_path / "trace.jsonl"
    full.symlink_to("/dev/full")
    analysis = RunAnalysis(full, {"scenario": "torch_record_stream", "variant": "watched"})
    analysis.feed(list(iter_file(INCIDENT_TRACE)))  # the detector runs all the same
    analysis.close()
    assert analysis.lost == "No space left on device (ENOSPC)"
    assert analysis.findings  # the recorded program's race, found online
    assert Path("/dev/full").exists()  # only a regular file of ours is ever removed


def test_a_watch_that_cannot_make_its_runs_files_ends_in_one_line_with_exit_4(
        tmp_path, monkeypatch):
    """Before the program starts: the run's own events file cannot be made (here a file
    stands where its folder goes), so nothing can be captured; no traceback, exit 4."""
    from harness.capture import watch as watchmod
    from harness.results.exitcodes import ExitCode
    from harness.results.hooks import RunHooks
    from harness.run.outputs import RunFolder

    made = RunFolder.create

    def folder_with_a_file_in_the_way(out: Path) -> RunFolder:
        folder = made(out)
        (folder.path / "watch").write_text("")
        return folder

    monkeypatch.setattr(watchmod.RunFolder, "create", folder_with_a_file_in_the_way)
    said = []

    class Hooks(RunHooks):
        def note(self, text):
            said.append(text)

    (tmp_path / "prog.py").write_text("print(1)\n")
    from harness.capture.launch import parse_command
    program = parse_command([sys.executable, str(tmp_path / "prog.py")])
    result = watchmod.watch(watchmod.WatchOptions(program, out_dir=tmp_path / "out"), Hooks())
    assert result.exit_code is ExitCode.WRITE_FAILED
    assert [f.what for f in result.write_errors] == ["capture events"]
    assert result.results[0].trials == 0
    assert said[-1].startswith("capture events ") and "the run stops here" in said[-1]


def test_a_run_folder_made_again_under_its_name_is_not_the_runs(tmp_path):
    """A folder removed and made again (a worker's folder made with its parents) may get the
    removed one's inode back; the run's owner record is what tells it is not the run's."""
    from harness.run.outputs import RunFolder

    folder = RunFolder.create(tmp_path)
    assert not folder.gone()
    shutil.rmtree(folder.path)
    assert folder.gone()
    (folder.path / "workers" / "0001-x").mkdir(parents=True)
    again = folder.path.stat()
    reused = RunFolder(folder.path, folder.run_id, (again.st_dev, again.st_ino))
    assert reused.gone() and folder.gone()


def test_a_watched_runs_trace_that_the_disk_refuses_is_a_write_error(tmp_path, monkeypatch):
    """The trace of a watched run that cannot be written (here /dev/full under its name) is
    dropped, the analysis goes on online, and the run says it among its write errors, exit 4.
    Needs an interpreter with PyTorch for the program (GPURACE_TEST_PYTHON); CI skips it."""
    from harness.capture import watch as watchmod
    from harness.results.exitcodes import ExitCode
    from tests.frameworks import python_with

    python = python_with("torch")
    if python is None:
        pytest.skip("no interpreter with PyTorch here (GPURACE_TEST_PYTHON)")
    made = watchmod.RunAnalysis

    def analysis_into_a_full_disk(trace, header, **kwargs):
        trace.symlink_to("/dev/full")
        return made(trace, header, **kwargs)

    monkeypatch.setattr(watchmod, "RunAnalysis", analysis_into_a_full_disk)
    (tmp_path / "prog.py").write_text("import torch\nprint(float(torch.ones(3).sum()))\n")
    from harness.capture.launch import parse_command
    program = parse_command([python, str(tmp_path / "prog.py")])
    result = watchmod.watch(watchmod.WatchOptions(program, out_dir=tmp_path / "out"))
    assert result.exit_code is ExitCode.WRITE_FAILED
    assert [f.what for f in result.write_errors] == ["trace"]
    assert result.results[0].outcomes()["clean"] == 1 and result.results[0].detected == 0

"""The watch's fork server without a GPU: it imports what it is asked to, forks a run of the
boot for each request with the run's output, folder and environment, and reports each run's
pid and exit status as a Popen would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.capture.events import iter_file
from harness.capture.forkserver import ForkServer

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="a fork server needs fork")


def test_a_forked_run_is_the_boot_run_as_a_fresh_interpreter_would_run_it(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("print('hi')\n")
    server = ForkServer(sys.executable, (), ENV, ["json", "no_such_module_here"])
    try:
        assert server.preloaded == ["json"]  # what will not import is the run's to say
        runs = []
        for n in range(2):
            events = tmp_path / f"events-{n}.jsonl"
            proc = server.start(["--events", str(events), "--", str(prog)],
                                {**ENV, "GPURACE_TEST_RUN": str(n)}, str(tmp_path))
            code = proc.wait(timeout=60)
            err = proc.stderr.read().decode()
            runs.append((proc.pid, code, err, list(iter_file(events))))
        fresh = subprocess.run([sys.executable, "-m", "harness.capture.boot", "--events",
                                str(tmp_path / "fresh.jsonl"), "--", str(prog)],
                               capture_output=True, text=True, env=ENV, cwd=tmp_path)
    finally:
        server.close()
    fresh_events = list(iter_file(tmp_path / "fresh.jsonl"))
    for pid, code, _, events in runs:
        # This interpreter has neither PyTorch nor CuPy: each run says so and exits 77, as the
        # fresh interpreter does, from its own process, in the run's folder.
        assert code == fresh.returncode == 77
        hello = events[0][1]
        assert hello["pid"] == pid and hello["cwd"] == str(tmp_path)
        assert [e[0] for e in events] == [e[0] for e in fresh_events] == ["hello", "exit"]
        assert events[-1][1]["error"] == fresh_events[-1][1]["error"]
    assert runs[0][0] != runs[1][0]


@pytest.mark.parametrize("fresh", [False, True])
def test_the_runs_after_the_first_fork_from_what_the_first_used_unless_fresh(tmp_path, fresh):
    from harness.capture.launch import Launcher, Program
    prog = tmp_path / "prog.py"
    prog.write_text("print('hi')\n")
    notes: list[str] = []
    launcher = Launcher(Program(sys.executable, str(prog), ()), {}, fresh, notes.append)
    hows, codes = [], []
    try:
        for n in range(3):
            proc, how = launcher.start(["--events", str(tmp_path / f"e{n}.jsonl"), "--",
                                        str(prog)])
            codes.append(proc.wait(timeout=60))
            proc.stdout.close()
            proc.stderr.close()
            hows.append(how)
            # What the run's capture switched on and imported: here nothing imports, so say
            # it as a run that used PyTorch would (the server then tries to import them).
            launcher.learn({"torch": "2.11"}, ["torch", "json"])
        server = launcher.server
    finally:
        launcher.close()
    assert codes == [77, 77, 77] and notes == []
    assert hows == (["fresh"] * 3 if fresh else ["fresh", "forked", "forked"])
    assert fresh or (server is not None and server.preloaded == ["json"] and not server.alive)


def test_a_library_that_kills_the_server_leaves_one_of_the_frameworks_only(tmp_path):
    from harness.capture.launch import Launcher, Program
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "exits_on_import.py").write_text("import os\nos._exit(3)\n")
    prog = tmp_path / "prog.py"
    prog.write_text("print('hi')\n")
    notes: list[str] = []
    launcher = Launcher(Program(sys.executable, str(prog), ()),
                        {"PYTHONPATH": str(tmp_path / "lib")}, False, notes.append)
    assert launcher.learning
    launcher.learn({"torch": "2.11"}, ["json", "exits_on_import"])
    assert not launcher.learning
    try:
        proc, how = launcher.start(["--events", str(tmp_path / "e.jsonl"), "--", str(prog)])
        assert proc.wait(timeout=60) == 77
        proc.stdout.close()
        proc.stderr.close()
        server = launcher.server
    finally:
        launcher.close()
    assert how == "forked" and server is not None and server.preloaded == []
    (note,) = notes
    assert note.startswith("the fork server of 2 library module(s) did not start") and \
        note.endswith("trying one of torch only"), note


def test_the_libraries_a_run_names_are_installed_and_standard_modules_not_the_programs(
        tmp_path, monkeypatch):
    from harness.capture.boot import _libraries
    (tmp_path / "programs_own_helper.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import programs_own_helper  # noqa: F401  (the program's own module, imported as it would)
    import json.decoder  # noqa: F401
    import yaml  # noqa: F401  (an installed package)
    names = _libraries()
    assert {"json", "json.decoder", "yaml"} <= set(names)
    assert "programs_own_helper" not in names and "__main__" not in names
    assert not any(n.split(".")[0] == "harness" for n in names)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_the_server_forks_with_one_thread(tmp_path):
    """A process that forks with threads running may hand its child a lock held for ever (and
    Python 3.12 and later warn at each such fork): the server hears of its children's ends
    through a signal, never a thread, so it has one thread while it forks, and each run ends
    reported."""
    prog = tmp_path / "prog.py"
    prog.write_text("print('hi')\n")
    server = ForkServer(sys.executable, (), ENV, ["json"])
    try:
        codes, threads = [], []
        for n in range(3):
            proc = server.start(["--events", str(tmp_path / f"e{n}.jsonl"), "--", str(prog)],
                                ENV, str(tmp_path))
            codes.append(proc.wait(timeout=60))
            proc.stdout.close()
            proc.stderr.close()
            status = Path(f"/proc/{server._proc.pid}/status").read_text()
            threads.append(int(status.split("Threads:")[1].split()[0]))
        assert server.alive
    finally:
        server.close()
    assert codes == [77, 77, 77] and threads == [1, 1, 1]


def test_a_library_s_own_threads_are_not_warned_of_into_the_watch_s_output(tmp_path, capfd):
    """A library that starts a thread when imported (a BLAS's pool does): Python 3.12 and
    later warn at a fork with threads running, and the server's standard error is the watch's;
    the server, which forks after imports by design, says nothing of it."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "starts_a_thread.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n")
    prog = tmp_path / "prog.py"
    prog.write_text("print('hi')\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path / "lib"), ENV["PYTHONPATH"]])}
    server = ForkServer(sys.executable, (), env, ["starts_a_thread"])
    try:
        assert server.preloaded == ["starts_a_thread"]
        proc = server.start(["--events", str(tmp_path / "e.jsonl"), "--", str(prog)], env,
                            str(tmp_path))
        assert proc.wait(timeout=60) == 77
        proc.stdout.close()
        proc.stderr.close()
    finally:
        server.close()
    assert "DeprecationWarning" not in capfd.readouterr().err

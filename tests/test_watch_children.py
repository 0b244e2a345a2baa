"""A watched program's Python children: each one that imports PyTorch or CuPy is watched into
an events file of its own and analysed on its own, its findings joining the run's with the
process named; a child that never imports a framework leaves no file.

The first test replays a recorded capture as a child's (CI, no PyTorch); one runs `gpurace
watch` on a program with a spawned multiprocessing worker and a Python subprocess on PyTorch for
the CPU (this interpreter or GPURACE_TEST_PYTHON), where no child uses CUDA; the last two check,
where Triton is installed, that a child's and the program's held events reach their files while
they sit idle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.capture.children import analyse_children, role_of
from harness.capture.events import CAPTURE_SCHEMA, iter_file
from tests.frameworks import python_with

ROOT = Path(__file__).resolve().parent.parent


def test_a_childs_findings_name_its_process(tmp_path: Path) -> None:
    """The recorded async all_reduce read before its wait, as a spawned worker's capture."""
    recorded = list(iter_file(ROOT / "tests" / "capture_recorded_cpu"
                              / "c10d_allreduce-buggy.jsonl"))
    hello = ["hello", {"schema": CAPTURE_SCHEMA, "pid": 4242, "parent": 4000,
                       "role": "a multiprocessing spawn worker"}]
    folder = tmp_path / "children"
    folder.mkdir()
    (folder / "child-4242.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in [hello, *recorded]))
    (children,) = analyse_children(folder)
    assert (children.pid, children.role, children.ops) == (4242,
                                                           "a multiprocessing spawn worker", 2)
    (finding,) = children.findings
    assert finding["missing"].startswith(
        "in child process 4242 (a multiprocessing spawn worker): nothing orders")
    assert children.to_json()["findings"] == 1
    assert analyse_children(tmp_path / "none") == []
    # A child whose sources started and saw nothing (a compile worker importing Triton).
    (folder / "child-4243.jsonl").write_text(json.dumps(hello) + "\n" + json.dumps(
        ["source", "triton", "3.8.0"]) + "\n")
    assert [c.pid for c in analyse_children(folder)] == [4242]


def test_a_long_running_child_is_analysed_as_it_runs_within_its_disk_budget(
        tmp_path: Path) -> None:
    """A child that serves for hours (an engine's core process): its events are read and
    analysed while it writes them, what was analysed is given back to the disk, and its trace
    is begun anew at quiet points, the part that held the race kept. The findings are those
    of the whole file analysed at the end, and the kept part finds the race alone."""
    from harness.capture.analysis import RunAnalysis
    from harness.capture.children import ChildWatch
    from harness.races.detector import check_trace
    from harness.traces.optrace import load_trace
    from tests.test_capture import _serving_steps
    from tests.test_trace_parts import START

    folder = tmp_path / "children"
    folder.mkdir()
    pid = os.getpid()  # a live process: followed until the end
    path = folder / f"child-{pid}.jsonl"
    hello = ["hello", {"schema": CAPTURE_SCHEMA, "pid": pid, "role": "a Python subprocess"}]
    steps = [_serving_steps(step, 1, racy=step in {30, 31}) for step in range(3000)]
    watch = ChildWatch(folder, {"scenario": "serve", "variant": "watched"}, disk_mb=1)
    watch.poll()  # no child yet
    with open(path, "w") as f:
        for line in [hello, *START[1:]]:
            f.write(json.dumps(line) + "\n")
        for k, step in enumerate(steps):
            f.write("".join(json.dumps(e) + "\n" for e in step))
            if k % 100 == 99:
                f.flush()
                watch.poll()
    size = path.stat().st_size
    assert size > 2 << 20  # twice what the child's budget lets it hold
    (followed,) = watch.followed()
    (child,) = watch.finish()

    whole = RunAnalysis(None, {})
    whole.feed([hello, *START[1:]])
    for step in steps:
        whole.feed(step)
    whole.close()
    (online,) = child.findings
    assert online["count"] == 2
    assert online["missing"] == (f"in child process {pid} (a Python subprocess): "
                                 + whole.findings[0].to_json()["missing"])
    assert child.ops == whole.translator.ops
    if followed.given:  # a file system with holes: what was analysed went back to the disk
        assert path.stat().st_blocks * 512 < size / 2
    # The trace began anew past its eighth of the budget; the part with the race is kept,
    # named as the child's trace, and is a trace of its own that finds the race.
    assert child.trace is not None and child.trace != str(folder / f"trace-child-{pid}.jsonl")
    (found,) = check_trace(load_trace(Path(child.trace)).records).findings
    assert found.count == 2
    assert load_trace(Path(child.trace)).header["scenario"] == f"serve-child-{pid}"
    assert any("kept within --disk-mb 1" in note and note.startswith(f"in child process {pid}")
               for note in child.notes), child.notes
    assert sum(p.stat().st_size for p in folder.glob("trace-*")) < (1 << 20) // 2


def test_a_child_that_has_ended_is_let_go_while_the_program_runs(tmp_path: Path) -> None:
    """A program that starts hundreds of children over hours (an evaluation subprocess per
    checkpoint): each child whose process is gone is analysed to its end and its files
    closed at once; one still running is followed on."""
    from harness.capture.backlog import mark_of
    from harness.capture.children import ChildWatch
    recorded = list(iter_file(ROOT / "tests" / "capture_recorded_cpu"
                              / "c10d_allreduce-buggy.jsonl"))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    folder = tmp_path / "children"
    folder.mkdir()
    for pid in (int(gone.stdout), os.getppid()):  # an ended process, and a live one
        hello = ["hello", {"schema": CAPTURE_SCHEMA, "pid": pid, "role": "a Python subprocess"}]
        (folder / f"child-{pid}.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in [hello, *recorded]))
    watch = ChildWatch(folder, {"scenario": "serve", "variant": "watched"}, disk_mb=64)
    watch.poll()
    (running,) = watch.followed()
    assert running.path.name == f"child-{os.getppid()}.jsonl"
    assert not mark_of(folder / f"child-{gone.stdout.strip()}.jsonl").exists()
    assert mark_of(running.path).exists()
    children = watch.finish()
    assert [c.pid for c in children] == sorted([int(gone.stdout), os.getppid()],
                                               key=lambda pid: f"child-{pid}.jsonl")
    assert all(len(c.findings) == 1 and c.trace for c in children)
    assert watch.followed() == [] and not list(folder.glob("*.read"))
    # A child whose analysis fails before its first op is kept, saying so.
    hello = ["hello", {"schema": CAPTURE_SCHEMA, "pid": int(gone.stdout), "role": "a worker"}]
    (folder / "child-1.jsonl").write_text(json.dumps(hello) + "\n" + '["alloc", "d"]\n')
    failed = [c for c in ChildWatch(folder).finish() if c.analysis_error]
    assert [(c.ops, c.analysis_error.split(":")[0]) for c in failed] == [(0, "TypeError")]
    assert "a fault of gpurace's" in failed[0].notes[-1]
    assert (folder / "child-1.jsonl.error.txt").is_file()


def test_a_child_runs_the_sitecustomize_ours_stands_in_front_of(tmp_path: Path) -> None:
    """A child of a watched program starts with the watch's sitecustomize first on its path;
    the interpreter's own (here one that says hello) still runs, and a child that imports no
    framework writes no events file."""
    from harness.capture.boot import CHILD_SITE, CHILDREN_ENV
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text(
        "import sys\nprint('own sitecustomize', file=sys.stderr)\n")
    env = {**os.environ, CHILDREN_ENV: str(tmp_path / "children"),
           "PYTHONPATH": os.pathsep.join([str(CHILD_SITE), str(ROOT), str(own)])}
    code = ("import sys; print(sys.modules['sitecustomize'].__file__); "
            "print(sorted(type(h).__name__ for h in sys.meta_path if 'Install' in "
            "type(h).__name__))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "own sitecustomize\n"
    # The child's capture waits for its import of a framework; the interpreter's own ran.
    assert done.stdout.splitlines() == [str(own / "sitecustomize.py"), "['Install']"]
    assert not (tmp_path / "children").exists()


@pytest.mark.parametrize(("argv", "role"), [
    (["py", "-B", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(4)",
      "--multiprocessing-fork"], "a multiprocessing spawn worker"),
    (["py", "-c", "from multiprocessing.forkserver import main; main(3)"],
     "the multiprocessing fork server"),
    (["py", "-c", "print(1)"], "a Python subprocess (python -c)"),
    (["py", "-m", "serve.worker", "--rank", "1"], "a Python subprocess (python -m serve.worker)"),
    (["py", "-u", "/srv/engine_core.py", "--port", "9"],
     "a Python subprocess (engine_core.py)"),
    (["py"], "a Python subprocess"),
])
def test_a_child_is_named_by_what_its_command_line_says_it_is(argv: list[str],
                                                              role: str) -> None:
    assert role_of(argv) == role


TORCH_PYTHON = python_with("torch")

_PROGRAM = r'''
import multiprocessing as mp
import subprocess
import sys

import torch


def work(n):
    return float((torch.ones(4) * n).sum())


if __name__ == "__main__":
    with mp.get_context("spawn").Pool(1) as pool:
        print("pool", sum(pool.map(work, range(3))))
    code = "import torch; print('sub', float(torch.arange(4.).sum()))"
    subprocess.run([sys.executable, "-c", code], check=True)
    subprocess.run([sys.executable, "-c", "print('plain')"], check=True)
    print("main", float(torch.ones(2).sum()))
'''


@pytest.mark.skipif(TORCH_PYTHON is None,
                    reason="no interpreter with PyTorch here (GPURACE_TEST_PYTHON)")
def test_children_that_never_touch_the_gpu_run_as_they_would_and_leave_nothing(
        tmp_path: Path) -> None:
    """A spawned pool worker and a subprocess that import PyTorch but never use CUDA (as a
    DataLoader worker must not): each runs as it would, pays for no source, and leaves no
    events file; tests/test_watch_gpu.py holds the children that do use the GPU."""
    prog = tmp_path / "prog.py"
    prog.write_text(_PROGRAM)
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "watch", "--format", "json", "--out",
         str(tmp_path / "out"), "--", TORCH_PYTHON, str(prog)],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    (run,) = doc["watch"]["runs"]
    assert "children" not in run, run["children"]
    assert not list(Path(run["events"]).parent.glob("children/child-*.jsonl"))
    assert doc["results"][0]["findings"] == []
    log = Path(run["log"]).read_text()
    assert "pool 12.0" in log and "sub 6.0" in log and "plain" in log and "main 2.0" in log


def test_a_child_knows_each_source_by_the_framework_that_switches_it_on() -> None:
    """A child waits for the frameworks by name, the sources' modules not loaded (its start
    costs no detector, no NumPy): the names must be the sources' own."""
    from harness.capture.source import REGISTERED, Deferred, load
    for name in REGISTERED:
        assert (Deferred(name).name, Deferred(name).module) == (load(name).name,
                                                                load(name).module)
    done = subprocess.run(
        [sys.executable, "-c", "import sys; import harness.capture.children as c; "
         "print(sorted(m for m in sys.modules if m.startswith(('kvcore', 'numpy', "
         "'harness.races.findings', 'harness.capture.torch'))))"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


TRITON_PYTHON = python_with("triton")


@pytest.mark.skipif(TRITON_PYTHON is None,
                    reason="no interpreter with Triton here (GPURACE_TEST_PYTHON)")
def test_a_child_queues_the_delays_its_watched_parent_queues(tmp_path: Path) -> None:
    """--amplify's delays are handed down with the events folder: a child that starts a
    source (here Triton's, at its import) counts them as the program does, in its own file;
    a parent without delays hands none down. The backlog bound is handed down the same way,
    and a child whose bound is garbled runs unbounded."""
    from harness.capture.amplify import Delay, encode
    from harness.capture.boot import (BACKLOG_ENV, CHILD_SITE, CHILDREN_ENV, DELAYS_ENV,
                                      hand_down)
    delays = encode([Delay("serve.py", 41, 250.0, "copy_htod")])
    env = {**os.environ, CHILDREN_ENV: str(tmp_path / "children"), DELAYS_ENV: delays,
           BACKLOG_ENV: "a lot", "PYTHONPATH": os.pathsep.join([str(CHILD_SITE), str(ROOT)])}
    done = subprocess.run([TRITON_PYTHON, "-c", "import triton"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (child,) = (tmp_path / "children").glob("child-*.jsonl")
    (said,) = [e for e in iter_file(child) if e[0] == "delays"]
    assert said[1] == [{"path": "serve.py", "line": 41, "us": 250.0, "kind": "copy_htod",
                        "in_graph": False, "queued": 0, "streams": []}]
    before = dict(os.environ)
    try:
        hand_down(str(tmp_path / "events.jsonl"), delays, 1 << 30)
        assert os.environ[DELAYS_ENV] == delays and os.environ[BACKLOG_ENV] == str(1 << 30)
        hand_down(str(tmp_path / "events.jsonl"))
        assert DELAYS_ENV not in os.environ and BACKLOG_ENV not in os.environ
    finally:
        os.environ.clear()
        os.environ.update(before)


@pytest.mark.skipif(TRITON_PYTHON is None,
                    reason="no interpreter with Triton here (GPURACE_TEST_PYTHON)")
def test_a_childs_last_events_reach_its_file_while_it_waits_for_other_work(
        tmp_path: Path) -> None:
    """A pool worker does its last GPU work, then waits on its task queue until the pool ends
    it with SIGTERM (``Pool.__exit__``): no host wait comes to write what it held, and no exit
    handler runs. Its events must reach the file while it waits. Here a child started by
    Triton's import emits an event, then sleeps; the event is in its file before the test
    kills it, and after."""
    import signal
    import time

    from harness.capture.boot import CHILD_SITE, CHILDREN_ENV
    env = {**os.environ, CHILDREN_ENV: str(tmp_path / "children"),
           "PYTHONPATH": os.pathsep.join([str(CHILD_SITE), str(ROOT)])}
    code = ("import sys, time, triton\n"
            "(hook,) = [h for h in sys.meta_path if type(h).__name__ == 'Install']\n"
            "hook.sink.emit(['note', 'the last work before the queue'])\n"
            "print('waiting', flush=True)\n"
            "time.sleep(120)\n")
    child = subprocess.Popen([TRITON_PYTHON, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert child.stdout is not None and child.stdout.readline() == "waiting\n"
        path = tmp_path / "children" / f"child-{child.pid}.jsonl"

        def said() -> bool:
            return path.is_file() and any(
                e == ["note", "the last work before the queue"] for e in iter_file(path))

        deadline = time.monotonic() + 30
        while not said() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert said(), "the child's last event was still held when it was killed"
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGTERM and said()


@pytest.mark.skipif(TRITON_PYTHON is None,
                    reason="no interpreter with Triton here (GPURACE_TEST_PYTHON)")
def test_a_hung_programs_last_events_are_in_its_run(tmp_path: Path) -> None:
    """The watched program itself, once it uses the GPU (here: Triton's source starts at its
    import), writes what it holds when it goes quiet: a program that hangs outside the device
    (a lock, a queue) and that the watch ends as hung keeps its last events in the run."""
    prog = tmp_path / "hangs.py"
    prog.write_text("import sys, time, triton\n"
                    "(hook,) = [h for h in sys.meta_path if type(h).__name__ == "
                    "'InstallOnImport']\n"
                    "hook.sink.emit(['note', 'the last work before the hang'])\n"
                    "time.sleep(600)\n")
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "watch", "--format", "json", "--timeout", "8",
         "--out", str(tmp_path / "out"), "--", TRITON_PYTHON, str(prog)],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    doc = json.loads(done.stdout)
    (run,) = doc["watch"]["runs"]
    assert doc["results"][0]["outcomes"]["hang"] == 1, doc["results"][0]["outcomes"]
    assert ["note", "the last work before the hang"] in list(iter_file(Path(run["events"])))

"""`gpurace watch` on real programs, on a GPU: every buggy program of tests/watch_programs found
on its first unamplified run, every fixed twin clean over 20 runs, and the bad ends of a program
(a raise, a dead CUDA context, a hang, a fork) each told as what it was.

With GPURACE_RECORD_DIR set, each program's capture events (buggy and fixed, first run) are
copied there: the recorded sequences that tests/test_capture_recorded.py replays without a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.capture.events import iter_file

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = sorted(p for p in (ROOT / "tests" / "watch_programs").glob("*.py")
                  if p.name != "conftest.py")
FIXED_RUNS = 20


def _framework_ok() -> bool:
    code = "import torch; assert torch.cuda.is_available(); import cupy; cupy.zeros(1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _framework_ok(), reason="needs PyTorch and CuPy on a GPU")]


def watch(out: Path, *command: str, runs: int = 1, timeout: float = 300.0,
          ) -> tuple[int, dict, str]:
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "watch", "--format", "json", "--out", str(out),
         "--runs", str(runs), "--timeout", str(timeout), "--", *command],
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1800)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = {}
    return done.returncode, doc, done.stderr


def _record(doc: dict, name: str) -> None:
    """The first run's events as NAME.jsonl, and each of its watched children's as
    NAME.child-K.jsonl (a child's race is in its own file only)."""
    where = os.environ.get("GPURACE_RECORD_DIR")
    if where and doc.get("watch"):
        Path(where).mkdir(parents=True, exist_ok=True)
        run = doc["watch"]["runs"][0]
        shutil.copy(run["events"], Path(where) / f"{name}.jsonl")
        for k, child in enumerate(run.get("children") or ()):
            shutil.copy(child["events"], Path(where) / f"{name}.child-{k}.jsonl")


def _summary(doc: dict) -> str:
    result = doc["results"][0]
    return (f"{result['scenario']}: outcomes {result['outcomes']}, detected "
            f"{result['detected']}/{result['trials']}: "
            + " | ".join(f["missing"] for f in result["findings"]))


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict[str, tuple[int, dict, str]]:
    """Every program watched at once (one GPU holds them all): buggy once, fixed 20 times."""
    out = tmp_path_factory.mktemp("watch")
    jobs = [(p, version) for p in PROGRAMS for version in ("buggy", "fixed")]

    def one(job: tuple[Path, str]) -> tuple[str, tuple[int, dict, str]]:
        prog, version = job
        flags = ["--fixed"] if version == "fixed" else []
        got = watch(out / f"{prog.stem}-{version}", sys.executable, str(prog), *flags,
                    runs=1 if version == "buggy" else FIXED_RUNS)
        if got[1]:
            _record(got[1], f"{prog.stem}-{version}")
        return f"{prog.stem}-{version}", got

    with ThreadPoolExecutor(max_workers=12) as pool:
        found = dict(pool.map(one, jobs))
    for name, (code, doc, err) in sorted(found.items()):
        print(f"\n{name}: exit {code}; " + (_summary(doc) if doc else err[-800:]))
    return found


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_the_buggy_program_is_found_on_its_first_unamplified_run(verdicts, prog):
    code, doc, err = verdicts[f"{prog.stem}-buggy"]
    assert doc, err[-2000:]
    result = doc["results"][0]
    assert result["trials"] == 1 and result["detected"] == 1, _summary(doc)
    assert code == 1
    for finding in result["findings"]:
        # Both sides named by the program's own line.
        for side in ("first", "second"):
            assert finding[side]["step"] and finding[side]["step"].startswith(
                "tests/watch_programs/"), finding


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_the_fixed_twin_is_clean_in_every_run(verdicts, prog):
    code, doc, err = verdicts[f"{prog.stem}-fixed"]
    assert doc, err[-2000:]
    result = doc["results"][0]
    assert result["trials"] == FIXED_RUNS, _summary(doc)
    assert result["detected"] == 0 and result["outcomes"]["clean"] == FIXED_RUNS, \
        _summary(doc)
    assert code == 0


def _program(tmp_path: Path, text: str) -> Path:
    prog = tmp_path / "prog.py"
    prog.write_text(text)
    return prog


def test_a_program_that_raises_is_a_crash_with_its_traceback(tmp_path):
    prog = _program(tmp_path, "import torch\nx = torch.ones(4, device='cuda')\n"
                              "raise ValueError('bad batch ' + str(int(x.sum().item())))\n")
    code, doc, err = watch(tmp_path / "out", sys.executable, str(prog))
    result = doc["results"][0]
    assert code == 1 and result["outcomes"]["crash"] == 1
    assert "ValueError: bad batch 4" in result["first_manifested"]["detail"]
    (incident,) = result["reports"]
    assert "ValueError: bad batch 4" in (Path(incident) / "traceback.txt").read_text()
    assert json.loads((Path(incident) / "report.json").read_text())["outcome"] == "crash"


def test_a_program_whose_cuda_context_dies_is_a_crash_with_the_cuda_error(tmp_path):
    # An index out of bounds: a device-side assert, a context-level fault in the program's
    # own process (the watching process and the GPU are untouched).
    prog = _program(tmp_path, "import torch\nx = torch.zeros(4, device='cuda')\n"
                              "i = torch.tensor([1 << 20], device='cuda')\n"
                              "print(x[i].sum().item())\n")
    code, doc, err = watch(tmp_path / "out", sys.executable, str(prog))
    result = doc["results"][0]
    assert code == 1 and result["outcomes"]["crash"] == 1, err[-2000:]
    assert "device-side assert" in (result["first_manifested"]["cuda_error"] or ""), result
    trace = Path(result["first_manifested"]["trace"])
    assert '"kind":"kernel:index"' in trace.read_text()  # the ops before the fault are kept


def test_a_program_that_hangs_is_killed_at_the_timeout_and_told_as_a_hang(tmp_path):
    # Its last op (the mul) has no host wait after it: it is written once the program goes
    # quiet, so it is kept too.
    prog = _program(tmp_path, "import time, torch\nx = torch.ones(4, device='cuda')\n"
                              "torch.cuda.synchronize()\ny = x * 2\ntime.sleep(600)\n")
    code, doc, err = watch(tmp_path / "out", sys.executable, str(prog), timeout=15)
    result = doc["results"][0]
    assert code == 1 and result["outcomes"]["hang"] == 1
    run = doc["watch"]["runs"][0]
    assert run["timed_out"] is True
    assert run["records"] >= 2  # what it did before it hung is kept
    ops = [e[5]["op"] for e in iter_file(Path(run["events"])) if e[0] == "op"]
    assert ops[-1] == "mul", ops


def test_spawned_workers_that_use_the_gpu_are_watched_each_on_its_own(tmp_path):
    # Each worker takes CUDA up in its initializer (as one loading its model would), and
    # neither takes a task before both did (the barrier): else one still starting may be
    # handed no task and ended by the pool's exit before it used the GPU (seen on an H100,
    # one worker of two listed). The pool's exit (SIGTERM) comes after the workers went
    # quiet, so each one's last op is written by then.
    prog = _program(tmp_path, "import multiprocessing as mp, time, torch\n"
                              "def init(barrier):\n"
                              "    torch.zeros(1, device='cuda')\n"
                              "    barrier.wait()\n"
                              "def work(n):\n"
                              "    return float((torch.ones(4, device='cuda') * n).sum())\n"
                              "if __name__ == '__main__':\n"
                              "    x = torch.ones(4, device='cuda')\n"
                              "    spawn = mp.get_context('spawn')\n"
                              "    with spawn.Pool(2, init, (spawn.Barrier(2),)) as pool:\n"
                              "        print(sum(pool.map(work, range(8))))\n"
                              "        time.sleep(0.5)\n"
                              "    print(x.sum().item())\n")
    code, doc, err = watch(tmp_path / "out", sys.executable, str(prog))
    assert code == 0, err[-2000:]
    children = doc["watch"]["runs"][0]["children"]
    assert [c["role"] for c in children] == ["a multiprocessing spawn worker"] * 2, children
    assert doc["results"][0]["findings"] == []


def test_a_race_in_a_python_subprocess_is_found_and_names_its_process(tmp_path):
    """An engine core in a process of its own (vLLM V1's shape): the watch programs' buggy
    wait_stream program run as a subprocess of the watched one."""
    child = ROOT / "tests" / "watch_programs" / "torch_wait_stream.py"
    prog = _program(tmp_path, "import subprocess, sys\n"
                              f"subprocess.run([sys.executable, {str(child)!r}])\n")
    code, doc, err = watch(tmp_path / "out", sys.executable, str(prog))
    (child_run,) = doc["watch"]["runs"][0]["children"]
    assert child_run["role"] == "a Python subprocess (torch_wait_stream.py)"
    findings = doc["results"][0]["findings"]
    assert findings and child_run["findings"] == len(findings), findings
    assert all(f["missing"].startswith(f"in child process {child_run['pid']} ")
               for f in findings)


@pytest.mark.parametrize("fixed", [False, True], ids=["buggy", "fixed"])
def test_torchrun_is_watched_as_a_command_and_its_rank_as_a_child(tmp_path, fixed):
    """`gpurace watch -- torchrun ...` as a user types it: the console script runs with the
    interpreter its #! line names, and the rank it starts (a Python subprocess) is watched on
    its own. The rank is an engine program: a functional all-gather read before its
    wait_tensor, on one NCCL rank; its fixed twin stays clean."""
    prog = ROOT / "tests" / "engine_programs" / "nccl_functional_before_wait.py"
    torchrun = shutil.which("torchrun") or shutil.which(
        "torchrun", path=str(Path(sys.executable).parent))
    assert torchrun, "no torchrun beside this interpreter"
    code, doc, err = watch(tmp_path / "out", torchrun, "--nproc-per-node", "1", str(prog),
                           *(["--fixed"] if fixed else []))
    (child,) = doc["watch"]["runs"][0]["children"]
    assert child["role"] == "a Python subprocess (nccl_functional_before_wait.py)", child
    findings = doc["results"][0]["findings"]
    if fixed:
        assert code == 0 and findings == [], err[-2000:]
        return
    assert code == 1 and findings and child["findings"] == len(findings), err[-2000:]
    assert all(f["missing"].startswith(f"in child process {child['pid']} ") for f in findings)


def test_pytest_gpurace_watch_fails_a_racing_test_with_the_finding(tmp_path):
    (tmp_path / "test_streams.py").write_text(
        "import torch\n"
        "def test_side_stream_reads_before_the_write_is_done():\n"
        "    x = torch.zeros(1 << 20, device='cuda')\n"
        "    torch.cuda.synchronize()\n"
        "    side = torch.cuda.Stream()\n"
        "    x.add_(1)\n"
        "    with torch.cuda.stream(side):\n"
        "        y = x * 2\n"
        "    torch.cuda.synchronize()\n"
        "def test_ordered():\n"
        "    x = torch.zeros(1 << 20, device='cuda')\n"
        "    side = torch.cuda.Stream()\n"
        "    x.add_(1)\n"
        "    side.wait_stream(torch.cuda.current_stream())\n"
        "    with torch.cuda.stream(side):\n"
        "        y = x * 2\n"
        "    torch.cuda.synchronize()\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "harness.pytest_plugin", "--gpurace-watch", "test_streams.py"],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed, 1 passed" in done.stdout
    assert "race: nothing orders" in done.stdout and "test_streams.py:6" in done.stdout and \
        "test_streams.py:8" in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize("name", ["torch_views", "cupy_stream_race"])
def test_runs_forked_from_the_fork_server_are_runs_of_the_program(name, tmp_path):
    """Six runs of a fixed twin, forked after the first and all fresh, side by side: every run
    clean and race-free either way; the cost of a run, start-up included, printed for both:
    a fresh run's, a forked run's once the server is up, and the server's start (once)."""
    prog = ROOT / "tests" / "watch_programs" / f"{name}.py"
    runs = {}
    for how in ("forked", "fresh"):
        done = subprocess.run(
            [sys.executable, "-m", "harness.cli", "watch", "--format", "json", "--out",
             str(tmp_path / how), "--runs", "6", *(["--fresh"] if how == "fresh" else []),
             "--", sys.executable, str(prog), "--fixed"],
            capture_output=True, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900)
        doc = json.loads(done.stdout)
        result = doc["results"][0]
        assert done.returncode == 0 and result["outcomes"]["clean"] == 6, done.stderr[-2000:]
        assert result["detected"] == 0
        runs[how] = doc["watch"]["runs"]
        starts = [r["start"] for r in runs[how]]
        assert starts == (["fresh"] + ["forked"] * 5 if how == "forked" else ["fresh"] * 6)
        assert all(0 <= r["launch_s"] <= r["duration_s"] for r in runs[how])
    fresh = [r["duration_s"] for r in runs["fresh"]]
    forked = [r["duration_s"] for r in runs["forked"][2:]]  # after the run that made the server
    server = runs["forked"][1]["launch_s"]
    print(f"\n{name}: a run, start-up included: fresh {sum(fresh) / len(fresh):.2f} s (mean of "
          f"six), forked {sum(forked) / len(forked):.2f} s (mean of four; the server's start "
          f"{server:.2f} s, once)")


_SOAK = """
import torch
side = torch.cuda.Stream()
pinned = torch.zeros(1 << 16, pin_memory=True)
total = 0.0
for step in range(30_000):
    x = torch.full((1024,), float(step), device="cuda")
    y = x * 2 + 1
    if step == 20_000:  # once: the side stream reads x with no wait for the fill
        with torch.cuda.stream(side):
            z = x.sum()
        torch.cuda.synchronize()
    total += float(y[0])  # .item(): the host waits for the stream, every step
print("answer", total)
"""


def test_a_long_run_stays_within_its_disk_and_keeps_the_race(tmp_path):
    """A 30,000-step loop under --disk-mb 4: the events analysed are given back to the disk,
    the trace begins anew at quiet points, and the part with the one race is kept and checks
    to that race on its own."""
    prog = _program(tmp_path, _SOAK)
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "watch", "--format", "json", "--disk-mb", "4",
         "--out", str(tmp_path / "out"), "--", sys.executable, str(prog)],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=900)
    doc = json.loads(done.stdout)
    result, run = doc["results"][0], doc["watch"]["runs"][0]
    assert done.returncode == 1 and result["detected"] == 1, done.stderr[-2000:]
    [finding] = result["findings"]
    assert finding["second"]["stream"] != finding["first"]["stream"]
    notes = " ".join(doc["watch_notes"])
    assert "kept within --disk-mb 4" in notes and "trace-part-" in notes, notes
    events = Path(run["events"])
    assert events.stat().st_blocks * 512 < events.stat().st_size // 2  # given back
    [trace] = result["traces"]
    assert "trace-part-" in trace
    checked = subprocess.run([sys.executable, "-m", "harness.cli", "check", trace],
                             capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert checked.returncode == 1 and "1 race" in checked.stdout, checked.stdout[-2000:]
    print(f"\nsoak: {run['ops']:,} ops, events {events.stat().st_size / 2**20:.1f} MiB "
          f"({events.stat().st_blocks * 512 / 2**20:.1f} MiB on disk), "
          f"{len(list(Path(run['trace']).parent.glob('trace*.jsonl')))} trace file(s); "
          f"{[n for n in doc['watch_notes'] if 'waited' in n] or 'the program never waited'}")

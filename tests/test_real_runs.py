"""The real-program runner and benchmark's own logic, without a GPU or PyTorch: programs' last
lines read, gpurace's tracebacks told from a program's, the capture's stats event read, and a
fake corpus (plain Python programs written here) run bare and benched.

    python -m pytest -q tests/test_real_runs.py
"""

from __future__ import annotations

import importlib.util
import json
import sys
import traceback
from pathlib import Path
from types import ModuleType

import pytest

from harness.capture.bench import CSAN
from harness.capture.events import Sink
from tests.real_runs import (ROOT, ProgramRun, Said, WatchedRun, capture_stats,
                             gpurace_tracebacks, load_corpus, problems, run_bare, said)

CORPUS = '''
from typing import NamedTuple

class Entry(NamedTuple):
    name: str
    script: str
    args: tuple[str, ...]
    needs: tuple[str, ...]
    library: str

CORPUS = (
    Entry("sums", "sums.py", ("--n", "5"), ("json",), "stdlib"),
    Entry("cannot", "cannot.py", (), (), "stdlib"),
    Entry("needy", "sums.py", (), ("no_such_module_for_gpurace",), "none"),
)
'''
SUMS = '''
import argparse, time
parser = argparse.ArgumentParser()
parser.add_argument("--n", type=int, default=3)
parser.add_argument("--iters", type=int, default=2)
opts = parser.parse_args()
print("answer=warm-up, not the last")
start, worst = time.perf_counter(), 0.0
for _ in range(opts.iters):
    t = time.perf_counter()
    sum(range(1000 * opts.n))
    worst = max(worst, time.perf_counter() - t)
print(f"answer={opts.n * 7}")
print(f"step_max_s={worst}")
print(f"work_s={time.perf_counter() - start}")
'''
CANNOT = 'import sys\nprint("needs a backend not built here", file=sys.stderr)\nsys.exit(77)\n'


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    for name, text in (("corpus.py", CORPUS), ("sums.py", SUMS), ("cannot.py", CANNOT)):
        (tmp_path / name).write_text(text)
    return tmp_path / "corpus.py"


def _bench() -> ModuleType:
    """tests/real_programs/bench.py, imported by its path (it is a script)."""
    path = ROOT / "tests" / "real_programs" / "bench.py"
    spec = importlib.util.spec_from_file_location("gpurace_real_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _traceback(frames: list[tuple[str, int, str, str]], exception: str) -> str:
    return ("Traceback (most recent call last):\n"
            + "".join(traceback.StackSummary.from_list(frames).format()) + exception + "\n")


LAUNCH = [(str(ROOT / "harness" / "capture" / "boot.py"), 170, "main", "runpy.run_path(p)"),
          ("<frozen runpy>", 291, "run_path", "")]
CAPTURE = (str(ROOT / "harness" / "capture" / "torch_source.py"), 625, "__torch_dispatch__",
           "return func(*args)")
TORCH_OP = ("/venv/site-packages/torch/_ops.py", 865, "__call__", "return self._op(*args)")


def test_a_programs_last_lines_are_its_answer_and_timings():
    text = "answer=1\nstep_max_s=0.5\nwork_s=2\nnoise\nanswer=two words \nwork_s=oops\n"
    assert said(text) == Said("two words", 0.5, None)
    assert said("nothing said") == Said()


def test_a_programs_own_traceback_is_not_gpuraces():
    own = _traceback([*LAUNCH, ("prog.py", 3, "<module>", "f()")], "ValueError: bad batch")
    assert gpurace_tracebacks(f"out\n{own}more out\n") == []


def test_an_exception_raised_in_gpuraces_code_is_gpuraces():
    ours = _traceback([*LAUNCH, ("prog.py", 3, "<module>", "x + y"), TORCH_OP, CAPTURE],
                      "KeyError: 7")
    ignored = "Exception ignored in: <function Hook.__del__>\n" + _traceback(
        [CAPTURE], "AttributeError: 'NoneType' object has no attribute 'x'")
    assert gpurace_tracebacks(ours + ignored, bare=ours) == [ours.strip(), ignored.split(
        "\n", 1)[1].strip()]


def test_an_exception_through_the_capture_is_the_programs_when_bare_raises_it_too():
    through = _traceback([*LAUNCH, ("prog.py", 3, "<module>", "x + y"), CAPTURE, TORCH_OP],
                         "RuntimeError: The size of tensor a (3) must match")
    bare = _traceback([("prog.py", 3, "<module>", "x + y"), TORCH_OP],
                      "RuntimeError: The size of tensor a (3) must match")
    assert gpurace_tracebacks(through, bare=bare) == []
    assert gpurace_tracebacks(through, bare="") == [through.strip()]


def test_the_capture_stats_are_the_sources_last_stats_event(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = Sink.to_path(path)
    torch_stats = {"source": "torch", "ops": 12, "own_ns": 3000, "max_own_ns": 900,
                   "max_site": "prog.py:4", "failures": {"storage": 2}}
    for event in (["hello", {"pid": 1}], ["stats", {**torch_stats, "ops": 1}],
                  ["stats", torch_stats], ["stats", {"source": "cupy", "ops": 5}],
                  ["exit", {"status": 0}]):
        sink.emit(event)
    sink.close()
    with open(path, "a") as f:
        f.write('["stats", {"source": "torch", "ops"')  # a torn last line
    assert capture_stats(path) == torch_stats
    assert capture_stats(path, "cupy")["ops"] == 5
    assert capture_stats(path, "other") is None


def _watched(bare: ProgramRun, **changed: object) -> WatchedRun:
    """A watched run that matches ``bare`` but for ``changed``."""
    run = WatchedRun(0, {"results": []}, bare.out + bare.err, bare.said, status=bare.code)
    for key, value in changed.items():
        setattr(run, key, value)
    return run


def test_a_bare_run_of_a_corpus_entry_says_its_answer_and_problems_name_what_differs(corpus):
    sums, cannot, _ = load_corpus(corpus)
    bare = run_bare(sums, sys.executable, corpus, iters=3)
    assert bare.code == 0 and bare.said.answer == "35" and bare.said.work_s is not None
    assert problems(bare, _watched(bare)) == []
    race = "race: nothing orders side's read (kernel:mm at prog.py:9) before ..."
    found = problems(bare, _watched(bare, detected=1, findings=[race]))
    assert len(found) == 1 and race in found[0]
    found = problems(bare, _watched(bare, said=Said("36"), status=1))
    assert any("exit status: bare 0, watched 1" in p for p in found)
    assert any("'35'" in p and "'36'" in p for p in found)
    assert "no run document" in problems(bare, _watched(bare, doc={}))[0]
    # A program over a library that races: the watch must report it; its answer may differ.
    assert problems(bare, _watched(bare, detected=1, findings=[race], said=Said("36")),
                    "race") == []
    assert "no finding" in problems(bare, _watched(bare), "race")[0]
    skipped = run_bare(cannot, sys.executable, corpus)
    assert skipped.code == 77 and skipped.why() == "needs a backend not built here"


def test_the_bench_rows_its_rounds_and_skips_what_cannot_run(corpus):
    bench = _bench()
    sums, cannot, needy = load_corpus(corpus)
    bare = [run_bare(sums, sys.executable, corpus) for _ in range(3)]
    stats = {"source": "torch", "ops": 100, "own_ns": 50_000, "max_own_ns": 40_000,
             "max_site": "sums.py:9", "failures": {}}
    watched = [_watched(b, said=Said(b.said.answer, 0.002, b.said.work_s + 0.001),
                        stats=stats) for b in bare]
    stopped = ProgramRun(1, "", f"{CSAN}\n...", Said())
    row = bench.summarize({"entry": "sums", "library": "stdlib"}, bare, [stopped], watched)
    base = sorted(b.said.work_s for b in bare)[1]
    assert row["work_s"]["bare"] == base
    assert row["ratio"]["watched"] == round((base + 0.001) / base, 3)
    assert row["gpurace_us_per_op"] == pytest.approx(10.0, abs=1e-3)  # 1 ms over 100 ops
    assert row["capture"]["own_us_per_op"] == 0.5 and row["capture"]["max_own_ms"] == 0.04
    assert "sanitizer" not in row["ratio"]
    assert row["notes"] == ["sanitizer: CSAN race reported, stopped (1/1)"]
    line = bench.table_row(row)
    assert line.startswith("| sums | stdlib |") and "0.04 (sums.py:9)" in line
    assert "| stopped: CSAN report |" in line
    missing = {"no_such_module_for_gpurace": "ModuleNotFoundError"}
    assert "no_such_module_for_gpurace" in bench.bench_entry(
        needy, sys.executable, corpus, None, 3, missing, 60)["skipped"]
    assert bench.bench_entry(cannot, sys.executable, corpus, None, 3, {}, 60)["skipped"] == \
        "exits 77 bare: needs a backend not built here"
    table = bench.table([row], "the machine")
    assert table.splitlines()[2] == line and table.splitlines()[-1] == "machine: the machine"


def test_the_bench_leaves_what_its_budget_does_not_fit_and_resumes_there(corpus, tmp_path,
                                                                         capsys):
    bench = _bench()
    out, table = tmp_path / "rows.json", tmp_path / "table.md"
    common = ["--corpus", str(corpus), "--repeats", "1", "--json", str(out),
              "--markdown", str(table), "--only", "sums", "cannot"]
    assert bench.main([*common, "--budget", "0"]) == 0  # the first entry always starts
    first = json.loads(out.read_text())
    assert [row["entry"] for row in first["rows"]] == ["sums"] and first["left"] == ["cannot"]
    assert bench.main([*common, "--resume"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [row["entry"] for row in rows] == ["sums", "cannot"]
    assert rows[0] == first["rows"][0]  # kept as measured, not measured again
    assert rows[1]["skipped"].startswith("exits 77 bare")
    assert table.read_text().splitlines()[-1] == f"machine: {first['machine']}"
    with pytest.raises(SystemExit):  # other settings do not compare with these rows
        bench.main([*common, "--resume", "--repeats", "2"])
    capsys.readouterr()

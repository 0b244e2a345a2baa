"""The capture translator and the detector on capture event sequences, without a GPU.

Each sequence is what a source says a program did (harness.capture.events); these are written
by hand to pin one CUDA rule each. The sequences recorded from the real programs on a GPU are
replayed in test_capture_recorded.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.capture.analysis import Followed, RunAnalysis
from harness.capture.events import Sink, read_events
from harness.capture.translate import WINDOW, Translator
from harness.races.detector import check_trace
from harness.traces.optrace import load_trace
from tests.frameworks import python_with

ROOT = Path(__file__).resolve().parent.parent
BASE = 0x7F00_0000_0000
PINNED = 0x5500_0000_0000
S1, S2 = 0x11, 0x22


def _streams(*, blocking: bool = False) -> list[list]:
    return [["stream", S1, {"blocking": blocking, "legacy": False, "name": "s1"}],
            ["stream", S2, {"blocking": blocking, "legacy": False, "name": "s2"}]]


def _alloc(addr: int, n: int, name: str, space: str = "d") -> list:
    return ["alloc", space, addr, n, {"what": f"tensor float32[{n // 4}]", "name": name,
                                      "site": "prog.py:3"}]


def _op(sid: int | None, kind: str, line: int, *, r=(), w=()) -> list:
    return ["op", sid, kind, [list(x) for x in r], [list(x) for x in w],
            {"site": f"prog.py:{line}", "op": kind}]


def _findings(events: list[list], tmp_path: Path | None = None) -> list[dict]:
    analysis = RunAnalysis(tmp_path / "trace.jsonl" if tmp_path else None,
                           {"scenario": "prog", "variant": "watched"})
    analysis.feed(events)
    analysis.close()
    return [f.to_json() for f in analysis.findings]


def test_two_streams_without_an_event_race_and_the_finding_speaks_the_programs_words():
    events = _streams() + [_alloc(BASE, 4096, "kv"),
                           _op(S1, "kernel:fill_", 10, w=[("d", BASE, 4096)]),
                           _op(S2, "kernel:sum", 11, r=[("d", BASE + 1024, 64)])]
    (f,) = _findings(events)
    assert (f["first"]["stream"], f["first"]["step"], f["first"]["access"]) == \
        ("s1", "prog.py:10", "write")
    assert (f["second"]["stream"], f["second"]["step"], f["second"]["access"]) == \
        ("s2", "prog.py:11", "read")
    assert f["second"]["bytes"] == [(BASE + 1024) % WINDOW, (BASE + 1088) % WINDOW]
    assert f["owner"] == "tensor kv float32[1024] made at prog.py:3"
    assert "tensor kv float32[1024] made at prog.py:3 (device memory)" in f["missing"]
    assert "record an event on s1 after prog.py:10 and make s2 wait on it" in f["missing"]


def test_an_event_recorded_after_the_write_and_waited_for_orders_them():
    events = _streams() + [_alloc(BASE, 4096, "kv"),
                           _op(S1, "kernel:fill_", 10, w=[("d", BASE, 4096)]),
                           ["event", 7, {"site": "prog.py:4"}],
                           ["record", 7, S1, "prog.py:12"], ["wait", 7, S2, "prog.py:13"],
                           _op(S2, "kernel:sum", 14, r=[("d", BASE, 4096)])]
    assert _findings(events) == []


def test_a_stale_record_is_named_as_such():
    events = _streams() + [_alloc(BASE, 4096, "kv"), ["record", 7, S1, "prog.py:9"],
                           _op(S1, "kernel:fill_", 10, w=[("d", BASE, 4096)]),
                           ["wait", 7, S2, "prog.py:13"],
                           _op(S2, "kernel:sum", 14, r=[("d", BASE, 4096)])]
    (f,) = _findings(events)
    assert "the wait at prog.py:13 used event #1's record at prog.py:9, issued before " \
        "prog.py:10, so it covers nothing of it: record event #1 after prog.py:10" \
        in f["missing"]


def test_disjoint_bytes_of_one_storage_do_not_race():
    events = _streams() + [_alloc(BASE, 8192, "kv"),
                           _op(S1, "kernel:fill_", 10, w=[("d", BASE, 4096)]),
                           _op(S2, "kernel:fill_", 11, w=[("d", BASE + 4096, 4096)])]
    assert _findings(events) == []


def _freed_and_reused(streams: list[int]) -> list[list]:
    return _streams() + [
        _alloc(BASE, 4096, "x"),
        _op(S1, "kernel:fill_", 10, w=[("d", BASE, 4096)]),
        ["event", 1, {}], ["record", 1, S1, "prog.py:11"], ["wait", 1, S2, "prog.py:11"],
        _op(S2, "kernel:sum", 12, r=[("d", BASE, 4096)]),
        ["free", "d", BASE, {"site": "prog.py:13", "streams": streams}],
        _alloc(BASE, 2048, "y"),
        _op(S1, "kernel:fill_", 15, w=[("d", BASE, 2048)])]


def test_a_block_freed_while_another_stream_reads_it_races_its_next_owner():
    (f,) = _findings(_freed_and_reused([]))
    assert f["reused"] and f["first_owner"].startswith("tensor x") and \
        f["owner"].startswith("tensor y")
    assert (f["first"]["step"], f["second"]["step"]) == ("prog.py:12", "prog.py:15")
    assert "gave it back at prog.py:13 and it was handed out again" in f["missing"]


def test_record_stream_defers_the_reuse_until_the_reading_stream_is_done():
    assert _findings(_freed_and_reused([S2])) == []


def test_the_legacy_stream_orders_blocking_streams_and_not_non_blocking_ones():
    def publish(blocking: bool) -> list[list]:
        return [["stream", 0, {"legacy": True}],
                ["stream", S2, {"blocking": blocking, "legacy": False, "name": "reader"}],
                _alloc(PINNED, 64, "shadow", "h"), _alloc(BASE, 64, "table"),
                _op(0, "copy_htod", 20, r=[("h", PINNED, 64)], w=[("d", BASE, 64)]),
                _op(S2, "kernel:index_select", 21, r=[("d", BASE, 64)])]
    (f,) = _findings(publish(False))
    assert f["first"]["stream"] == "the legacy default stream" and f["first"]["kind"] == \
        "copy_htod"
    assert "reader is a non-blocking stream" in f["missing"]
    assert _findings(publish(True)) == []


def test_the_host_rewriting_pinned_memory_under_a_queued_copy_races_it():
    def rewrite(synced: bool) -> list[list]:
        return _streams() + [_alloc(PINNED, 256, "staging", "h"), _alloc(BASE, 256, "dev"),
                             _op(S1, "copy_htod", 30, r=[("h", PINNED, 256)],
                                 w=[("d", BASE, 256)]),
                             *([["record", 3, S1, "prog.py:31"],
                                ["sync_event", 3, "prog.py:32"]] if synced else []),
                             _op(None, "host_write", 33, w=[("h", PINNED, 256)])]
    (f,) = _findings(rewrite(False))
    assert f["second"]["stream"] == "host" and f["space"] == "host"
    assert "pinned host memory" in f["missing"] and "before the host rewrites" in f["missing"]
    assert _findings(rewrite(True)) == []


def test_the_host_reading_a_non_blocking_copys_result_before_a_synchronize_races_it():
    def read(synced: bool) -> list[list]:
        return _streams() + [_alloc(PINNED, 256, "out", "h"), _alloc(BASE, 256, "dev"),
                             _op(S1, "copy_dtoh", 40, r=[("d", BASE, 256)],
                                 w=[("h", PINNED, 256)]),
                             *([["sync_stream", S1, "prog.py:41"]] if synced else []),
                             _op(None, "host_read", 42, r=[("h", PINNED, 256)])]
    (f,) = _findings(read(False))
    assert (f["first"]["kind"], f["second"]["kind"]) == ("copy_dtoh", "host_read")
    assert _findings(read(True)) == []


def test_a_query_that_saw_not_ready_orders_nothing():
    events = _streams() + [_alloc(PINNED, 64, "out", "h"), _alloc(BASE, 64, "dev"),
                           _op(S1, "copy_dtoh", 50, r=[("d", BASE, 64)], w=[("h", PINNED, 64)]),
                           ["record", 9, S1, "prog.py:51"], ["query", 9, False, "prog.py:52"],
                           _op(None, "host_read", 53, r=[("h", PINNED, 64)])]
    (f,) = _findings(events)
    assert "saw it not ready" in f["missing"]
    events[-2] = ["query", 9, True, "prog.py:52"]
    assert _findings(events) == []


def test_a_synchronous_copy_orders_the_host_after_it():
    events = _streams() + [_alloc(PINNED, 64, "out", "h"), _alloc(BASE, 64, "dev"),
                           ["op", S1, "copy_dtoh", [["d", BASE, 64]], [["h", PINNED, 64]],
                            {"site": "prog.py:60", "sync": True}],
                           _op(None, "host_read", 61, r=[("h", PINNED, 64)])]
    assert _findings(events) == []


def test_a_span_across_a_window_is_an_access_in_each():
    records = []
    t = Translator(records.append, lambda info: None, lambda info: None)
    t.feed(_streams() + [_op(S1, "kernel:fill_", 1, w=[("d", 3 * WINDOW - 16, 32)])])
    (op,) = [r for r in records if r.kind == "kernel:fill_"]
    assert [(a.offset, a.length) for a in op.writes] == [(WINDOW - 16, 16), (0, 16)]
    assert op.writes[0].buffer != op.writes[1].buffer


def test_a_kernel_name_becomes_an_identifier_and_an_unknown_stream_is_announced():
    records, streams = [], []
    t = Translator(records.append, lambda info: None, streams.append)
    t.feed([_op(0x99, "aten::add_.Tensor", 1, w=[("d", BASE, 4)])])
    assert records[-1].kind == "kernel:aten__add__Tensor"
    assert [(s.name, s.blocking, s.legacy) for s in streams] == [("stream 0x99", False, False)]


def test_the_trace_reads_back_to_the_same_findings(tmp_path):
    events = _freed_and_reused([]) + _streams()[:0]
    online = _findings(events, tmp_path)
    trace = load_trace(tmp_path / "trace.jsonl")
    checked = check_trace(trace.records)
    offline = [f.to_json() for f in checked.findings]
    assert online and offline == online


def test_a_sink_writes_whole_lines_and_a_reader_leaves_a_torn_one(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = Sink.to_path(path)
    sink.emit(["sync_device", "a.py:1"])
    sink.flush()
    with open(path, "a") as f:
        f.write('["op", 1')  # a writer killed mid-line
    events, offset = read_events(path)
    assert events == [["sync_device", "a.py:1"]] and offset == len(json.dumps(
        ["sync_device", "a.py:1"], separators=(",", ":"))) + 1


def test_a_capture_file_is_read_a_batch_at_a_time_and_a_long_line_whole(tmp_path,
                                                                          monkeypatch):
    """A long run's capture file is gigabytes: it is read about READ_MAX bytes at a time,
    every batch whole lines, and all the batches are every event in order; a line longer
    than READ_MAX is read whole, not split or skipped."""
    import harness.capture.events as E
    recorded = ROOT / "tests" / "capture_recorded" / "torch_record_stream-buggy.jsonl"
    path = tmp_path / "events.jsonl"
    long_note = ["note", "x" * 5000]
    path.write_bytes(recorded.read_bytes() + (json.dumps(long_note) + "\n").encode())
    everything, end = read_events(path, limit=1 << 30)
    assert end == path.stat().st_size and everything[-1] == long_note
    monkeypatch.setattr(E, "READ_MAX", 1024)
    got, offsets = [], []
    for events, offset in E.batches(path):
        got += events
        offsets.append(offset)
    assert got == everything and offsets[-1] == end
    assert len(offsets) > 10 and offsets == sorted(set(offsets))
    assert list(E.iter_file(path)) == everything


def test_after_the_program_ends_its_events_are_analysed_in_batches_with_progress(
        tmp_path, monkeypatch):
    """What a program leaves when it ends (a long run's may be gigabytes) is analysed a
    batch at a time, saying how far it got, to the same findings as one whole read."""
    import harness.capture.events as E
    from harness.capture import watch
    from harness.results.hooks import RunHooks
    recorded = ROOT / "tests" / "capture_recorded" / "torch_record_stream-buggy.jsonl"
    whole = RunAnalysis(None, {})
    whole.feed(read_events(recorded, limit=1 << 30)[0])
    whole.close()

    class Notes(RunHooks):
        def __init__(self) -> None:
            self.said: list[str] = []

        def note(self, text: str) -> None:
            self.said.append(text)

    monkeypatch.setattr(E, "READ_MAX", 2048)
    monkeypatch.setattr(watch, "PROGRESS_S", 0.0)
    hooks = Notes()
    batched = RunAnalysis(None, {})
    ended = "run 1: the program ended; analysing the events it left"
    watch._analyse_the_rest(Followed(recorded, batched), ended, hooks)
    batched.close()
    assert [f.to_json() for f in batched.findings] == [f.to_json() for f in whole.findings]
    assert whole.findings and batched.translator.ops == whole.translator.ops
    assert len(hooks.said) > 3 and all(
        text.startswith(ended + ": ") for text in hooks.said)
    watch._analyse_the_rest(Followed(tmp_path / "never-written.jsonl", batched), ended, hooks)


def _serving_steps(first: int, count: int, racy: bool = False) -> list[list[Any]]:
    """A serving loop's steps, as a capture says them: a tensor made on the legacy stream,
    read on a side stream after an event, the side stream's result read back after another,
    the tensor freed, and the host waiting for the step (the events made once, reused).
    ``racy``: the side stream reads without the first wait."""
    side = 5
    events: list[list[Any]] = []
    for i in range(first, first + count):
        meta = {"site": "serve.py:4", "op": "fill", "source": "torch", "t": i}
        events += [
            ["alloc", "d", 0x10000, 4096, {"what": "tensor float32[1024]", "site": "serve.py:3",
                                            "source": "torch", "stream": 0}],
            ["op", 0, "kernel:fill", [], [["d", 0x10000, 4096]], meta],
            ["record", "ready", 0, "serve.py:5"],
            *([] if racy else [["wait", "ready", side, "serve.py:6"]]),
            ["op", side, "kernel:mul", [["d", 0x10000, 4096]], [["d", 0x20000, 4096]], meta],
            ["record", "done", side, "serve.py:8"], ["wait", "done", 0, "serve.py:9"],
            ["op", 0, "kernel:add", [["d", 0x20000, 4096]], [["d", 0x30000, 4096]], meta],
            ["free", "d", 0x10000, {"site": "serve.py:11", "streams": [], "source": "torch"}],
            ["sync_stream", 0, "serve.py:12"]]
    return events


@pytest.mark.parametrize("racy", [False, True], ids=["clean", "racy"])
def test_a_long_watched_run_keeps_no_more_state_for_each_step_it_adds(racy: bool) -> None:
    """A serving loop watched for hours: what the watching side keeps must not grow with
    every free it made (each tensor given back is remembered, to name a reused block's
    first owner, only until the host has waited for all the streams, after which no access
    made before can race one to come), nor, where the loop races at every step, with each
    race (one finding, counted; not every racing op and pair). 3,000 more steps must add
    under 128 KiB. Measured: 59,712 bytes clean and 54,392 racy (the bounded lists of
    recent records and waits); 1 MB clean when every free was kept, 677 KB racy when every
    racing op and pair was."""
    import gc
    import tracemalloc
    analysis = RunAnalysis(None, {})
    analysis.feed([["hello", {"schema": "gpurace.capture/1", "pid": 1}],
                   ["stream", 0, {"blocking": False, "legacy": True}],
                   ["stream", 5, {"blocking": not racy, "legacy": False}],
                   ["event", "ready", {"site": "serve.py:1"}],
                   ["event", "done", {"site": "serve.py:2"}],
                   ["alloc", "d", 0x20000, 8192, {"what": "tensor float32[2048]"}]])
    analysis.feed(_serving_steps(0, 300, racy))
    analysis.findings  # noqa: B018 - the first race is found before the measure
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for first in range(300, 3300, 500):
            analysis.feed(_serving_steps(first, 500, racy))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert analysis.translator.ops == 3300 * 3
    assert [f.count for f in analysis.findings] == ([3300] if racy else [])
    assert grown < 128 * 1024, f"{grown} bytes more after 3,000 more steps"


def test_an_event_handle_made_again_at_its_line_keeps_its_name():
    """``wait_stream`` makes an event at every call, and CUDA hands back the same few
    handles: an event made again at the line that made it keeps its name (what is kept of
    events stays one per handle), a new line's gets the next number free (skipping one the
    program gave), and an event made again is waited for as never recorded until it is."""
    said: list[tuple[str, str]] = []

    def record(r: Any) -> None:
        if r.records or r.waits:
            said.append((r.kind, r.records or r.waits))

    translator = Translator(record, lambda info: None, lambda info: None)
    events: list[list[Any]] = [["stream", 0, {"legacy": True}],
                               ["event", 77, {"name": "made at serve.py:9 #2"}],
                               ["record", 77, 0, "serve.py:8"]]
    for i in range(4):
        events += [["event", 1000 + i % 2, {"site": "serve.py:9"}],
                   ["record", 1000 + i % 2, 0, "serve.py:9"]]
    events += [["event", 1000, {"site": "serve.py:9"}], ["wait", 1000, 0, "serve.py:10"],
               ["sync_event", 1000, "serve.py:11"], ["record", 1000, 0, "serve.py:12"],
               ["wait", 1000, 0, "serve.py:13"]]
    translator.feed(events)
    first, second = "made at serve.py:9", "made at serve.py:9 #3"
    assert said == [("event_record", "made at serve.py:9 #2"),
                    ("event_record", first), ("event_record", second),
                    ("event_record", first), ("event_record", second),
                    ("event_wait", "made at serve.py:9 #4"),
                    ("sync_event", "made at serve.py:9 #4"),
                    ("event_record", first), ("event_wait", first)]


def test_a_wait_on_an_event_made_again_before_its_record_orders_nothing():
    """The handle's earlier event was recorded after a write; the event made again with it
    is waited for before it is recorded: CUDA takes it as complete, so the read races."""
    events = _streams() + [
        ["alloc", "d", 0x1000, 256, {"what": "tensor", "site": "p.py:1"}],
        ["event", 9, {"site": "p.py:2"}],
        ["op", S1, "kernel:fill", [], [["d", 0x1000, 256]], {"site": "p.py:3"}],
        ["record", 9, S1, "p.py:4"], ["wait", 9, S2, "p.py:5"],
        ["op", S2, "kernel:sum", [["d", 0x1000, 256]], [], {"site": "p.py:6"}],
        ["record", 10, S2, "p.py:6"], ["wait", 10, S1, "p.py:6"],
        ["event", 9, {"site": "p.py:2"}],
        ["op", S1, "kernel:fill", [], [["d", 0x1000, 256]], {"site": "p.py:7"}],
        ["wait", 9, S2, "p.py:8"],
        ["op", S2, "kernel:sum", [["d", 0x1000, 256]], [], {"site": "p.py:9"}]]
    found = _findings(events)
    assert [(f["first"]["step"], f["second"]["step"]) for f in found] == [("p.py:7", "p.py:9")]


def _importable(name: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {name}"],
                          capture_output=True).returncode == 0


def _gpurace(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env={**__import__("os").environ,
                                                   "PYTHONPATH": str(ROOT)})


@pytest.mark.skipif(_importable("torch") or _importable("cupy"),
                    reason="this interpreter has PyTorch or CuPy")
def test_watch_without_pytorch_or_cupy_says_what_to_install_and_exits_77(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("print('ran')\n")
    done = _gpurace("watch", "--out", str(tmp_path / "out"), "--", sys.executable,
                    str(prog), cwd=tmp_path)
    assert done.returncode == 77
    assert "ran" not in done.stdout and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and "cannot import PyTorch (torch) nor CuPy" in line \
        and "install torch, or cupy-cuda13x" in line


@pytest.mark.parametrize("command, words", [
    ((), "Missing argument"),
    (("python", "nothere.py"), "nothere.py: no such file"),
    (("python", "-c", "print(1)"), "python -c is not watched"),
    (("python", "-m"), "python -m needs a module name"),
    (("ls", "-l"), "ls: not a Python program"),
])
def test_watch_refuses_what_it_cannot_run_with_one_line(tmp_path, command, words):
    done = _gpurace("watch", "--out", str(tmp_path / "out"), "--", *command, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(_importable("torch") or _importable("cupy"),
                    reason="this interpreter has PyTorch or CuPy")
def test_pytest_gpurace_watch_without_pytorch_or_cupy_warns_and_runs_the_tests(tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--gpurace-watch", "test_plain.py"], capture_output=True,
                          text=True, cwd=tmp_path,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout
    assert "1 passed" in done.stdout
    assert "neither PyTorch nor CuPy imports here; tests run unwatched" in done.stdout


def test_a_command_keeps_the_interpreters_flags_and_the_programs_arguments(tmp_path):
    from harness.capture.launch import parse_command
    prog = tmp_path / "serve.py"
    prog.write_text("")
    got = parse_command(["python3", "-X", "dev", "-u", str(prog), "--port", "1"])
    assert (got.python, got.flags, got.target, got.args, got.module) == \
        ("python3", ("-X", "dev", "-u"), str(prog), ("--port", "1"), False)
    assert got.argv == ["python3", "-X", "dev", "-u", str(prog), "--port", "1"]
    module = parse_command(["python", "-m", "pkg.serve", "-v"])
    assert (module.target, module.args, module.module, module.name) == \
        ("pkg.serve", ("-v",), True, "pkg.serve")


def _script(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_a_script_run_as_a_command_runs_with_the_python_its_first_line_names(tmp_path,
                                                                            monkeypatch):
    """`gpurace watch -- torchrun ...`, `-- accelerate launch ...`, `-- ./serve.py`: an
    installed console script or a script of the program's own runs with the interpreter its
    #! line names (that environment has PyTorch), found on the PATH as a shell finds it."""
    import shutil

    from harness.capture.launch import parse_command
    from harness.errors import WatchError
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    python = venv / "python3.12"
    _script(venv / "torchrun", f"#!{python}\nimport sys\nfrom torch.distributed.run import "
            "main\nsys.exit(main())\n")
    monkeypatch.setenv("PATH", f"{venv}{os.pathsep}{os.environ.get('PATH', '')}")
    got = parse_command(["torchrun", "--nproc-per-node", "2", "train.py"])
    assert (got.python, got.target, got.args, got.flags, got.name) == \
        (str(python), str(venv / "torchrun"), ("--nproc-per-node", "2", "train.py"), (),
         "torchrun")
    # pip's form where the interpreter's path is too long for a #! line
    trampoline = "#!/bin/sh\n'''exec' \"/very/long/bin/python\" \"$0\" \"$@\"\n' '''\n"
    long = _script(tmp_path / "accelerate", trampoline + "import sys\n")
    assert parse_command([str(long), "launch", "t.py"]).python == "/very/long/bin/python"
    # a script of the program's own, through env, with a flag
    own = _script(tmp_path / "serve.py", "#!/usr/bin/env python3\nprint(1)\n")
    assert parse_command([str(own)]).python == (shutil.which("python3") or "python3")
    flagged = _script(tmp_path / "serve2", f"#!{python} -u\nprint(1)\n")
    assert parse_command([str(flagged), "-x"]).argv == [str(python), "-u", str(flagged), "-x"]
    # a .py without a #! line, or one named bare here, runs with this interpreter, as before
    plain = tmp_path / "plain.py"
    plain.write_text("print(1)\n")
    assert parse_command([str(plain)]).python == sys.executable
    monkeypatch.chdir(tmp_path)
    assert parse_command(["serve.py"]).python == sys.executable
    with pytest.raises(WatchError, match="not a Python program .its #! line names '/bin/bash'"):
        parse_command([str(_script(tmp_path / "run.sh", "#!/bin/bash\necho hi\n"))])
    with pytest.raises(WatchError, match="nor a command on the PATH"):
        parse_command(["no-such-command-here"])
    with pytest.raises(WatchError, match="no such file"):
        parse_command([str(tmp_path / "gone" / "serve.py")])


TORCH_PYTHON = python_with("torch")


@pytest.mark.skipif(TORCH_PYTHON is None, reason="no interpreter with PyTorch here")
def test_an_installed_command_is_watched_with_its_own_interpreter(tmp_path):
    """A console script whose #! names an interpreter with PyTorch (this one has none) is
    watched in that interpreter, and prints what it prints bare; the watch leaves nothing of
    its own in the temporary folder."""
    (tmp_path / "bin").mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    tool = _script(tmp_path / "bin" / "tool", f"#!{TORCH_PYTHON}\nimport torch\n"
                   "print('tool', float(torch.ones(3).sum()))\n")
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "watch", "--format", "json", "--out",
         str(tmp_path / "out"), "--", "tool"], capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(scratch),
             "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"},
        timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    (run,) = doc["watch"]["runs"]
    assert "tool 3.0" in Path(run["log"]).read_text()
    assert doc["watch"]["command"] == f"{TORCH_PYTHON} {tool}"  # as it ran
    assert not list(scratch.glob("gpurace-*"))  # the program's link to the capture, gone


@pytest.mark.skipif(TORCH_PYTHON is None, reason="no interpreter with PyTorch here")
def test_a_watch_stopped_by_sigterm_keeps_the_runs_that_ended_and_stops_the_program(tmp_path):
    import os
    import signal
    import time
    prog = tmp_path / "prog.py"
    marker = tmp_path / "pid"
    # Each run notes its pid; the first ends at once, the second sleeps until it is stopped.
    prog.write_text(f"import os, sys, time\nopen({str(marker)!r}, 'a').write(str(os.getpid())"
                    " + '\\n')\nimport torch\nif len(open(" + repr(str(marker)) +
                    ").read().split()) > 1:\n    time.sleep(600)\n")
    watch = subprocess.Popen([sys.executable, "-m", "harness.cli", "watch", "--runs", "3",
                              "--out", str(tmp_path / "out"), "--", TORCH_PYTHON, str(prog)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not marker.exists()
                                           or len(marker.read_text().split()) < 2):
        time.sleep(0.2)
    time.sleep(1.0)
    watch.send_signal(signal.SIGTERM)
    out, err = watch.communicate(timeout=60)
    assert watch.returncode == 143, err
    second = int(marker.read_text().split()[1])
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)  # the sleeping program went with the watch
    (doc_path,) = (tmp_path / "out").glob("run-*/run.json")
    doc = json.loads(doc_path.read_text())
    assert doc["interrupted"] == "SIGTERM" and doc["results"][0]["trials"] == 1
    assert doc["results"][0]["outcomes"]["clean"] == 1
    import jsonschema

    from harness import schemas
    errors = list(jsonschema.Draft202012Validator(schemas.load("run")).iter_errors(doc))
    assert not errors, [e.message for e in errors]


_DISPATCH_PROBE = r'''
import io, json, sys
import torch
from harness.capture import events as E, torch_source as T
buf = io.StringIO()
sink = E.Sink(buf)
stop = T.install(sink)
x = torch.zeros(16)
cap = stop.capture
cap.pinned[x.untyped_storage().data_ptr()] = {}  # x's bytes are pinned memory from here on
y = x[4:8]                  # a view: no bytes touched
y.fill_(3)                  # the host writes bytes 16..32 of x
col = x.view(4, 4)[:, 1]    # a strided view
w = col * 2                 # the host reads four runs of 4 bytes
m = torch.mm(torch.ones(2, 3), torch.ones(3, 2))   # pageable: not memory gpurace watches
x.copy_(torch.arange(16.))  # the host writes all of x
listed = x.tolist()         # and reads it
stop()
sink.flush()
base = x.untyped_storage().data_ptr()
out = []
for line in buf.getvalue().splitlines():
    e = json.loads(line)
    if e[0] == "op":
        out.append([e[2], [[s[1] - base, s[2]] for s in e[3]], [[s[1] - base, s[2]] for s in e[4]],
                    e[5]["op"], e[5]["site"]])
print(json.dumps(out))
'''


@pytest.mark.skipif(TORCH_PYTHON is None, reason="no interpreter with PyTorch here")
def test_the_dispatch_mode_reads_each_ops_bytes_from_its_schema(tmp_path):
    """The PyTorch source's dispatch mode on CPU tensors, one storage taken for pinned memory:
    views touch nothing, a written argument is written, a strided view is its runs of bytes,
    pageable tensors are not memory, and each op is at the program's line."""
    import os
    probe = tmp_path / "probe.py"
    probe.write_text(_DISPATCH_PROBE)
    done = subprocess.run([TORCH_PYTHON, str(probe)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    ops = json.loads(done.stdout.strip().splitlines()[-1])
    assert ops == [
        ["host_write", [], [[16, 16]], "fill_", "probe.py:12"],
        ["host_read", [[4, 4], [20, 4], [36, 4], [52, 4]], [], "mul", "probe.py:14"],
        ["host_write", [], [[0, 64]], "copy_", "probe.py:16"],
        ["host_read", [[0, 64]], [], "host read", "probe.py:17"],
    ]


def test_of_one_streams_unordered_writes_only_the_latest_is_the_race():
    """Ordering the read after a stream's latest write orders it after all the stream did
    before: the earlier writes (a temporary that had the bytes before) are no race of their
    own, and are not reported."""
    events = _streams() + [_alloc(BASE, 4096, "tmp"),
                           _op(S1, "kernel:eq", 20, w=[("d", BASE, 4096)]),
                           ["free", "d", BASE, {"site": "prog.py:20"}],
                           _alloc(BASE, 8, "count"),
                           _op(S1, "kernel:sum", 21, w=[("d", BASE, 8)]),
                           _op(S2, "copy_dtoh", 22, r=[("d", BASE, 8)])]
    (f,) = _findings(events)
    assert (f["first"]["step"], f["second"]["step"]) == ("prog.py:21", "prog.py:22")
    assert f["owner"].startswith("tensor count") and not f["reused"]


def test_a_watched_runs_incident_is_a_report_of_the_schema(tmp_path):
    """The incident of a watched run that raced, as `gpurace watch` writes it: report.json
    valid against the report schema (no pool settings: a program has none), its trace beside
    it, `gpurace check` on it finding the race the report names."""
    import jsonschema

    from harness import schemas
    from harness.capture.launch import Program
    from harness.capture.watch import ProgramEnd, WatchOptions, _incident
    from harness.results.outcome import Outcome, TrialResult
    trace = tmp_path / "trace.jsonl"
    log = tmp_path / "program.log"
    log.write_text("work_s=0.01\n")
    findings = _findings(_freed_and_reused([]), tmp_path)
    program = Program("python3", "prog.py", ("--fixed",))
    trial = TrialResult(index=0, seed=0, outcome=Outcome.CLEAN, race=True, trace=str(trace),
                        findings=findings, duration_s=1.5, worker_pid=4321)
    end = ProgramEnd(0, None, None, None, False, 1.5, "")
    folder = _incident(tmp_path / "out", WatchOptions(program=program), trial,
                       {"end": end, "run": {"log": str(log)}, "notes": ["a note"]})
    report = json.loads((folder / "report.json").read_text())
    errors = list(jsonschema.Draft202012Validator(schemas.load("report")).iter_errors(report))
    assert not errors, [e.message for e in errors]
    assert report["reproduce"]["argv"] == ["gpurace", "watch", "--", "python3", "prog.py",
                                           "--fixed"]
    assert (folder / "notes.txt").read_text() == "a note\n"
    assert "known bugs" not in (folder / "report.md").read_text()
    # The last ops' buffers by name (#29: report.md said b12 and b4).
    assert set(report["buffers"].values()) == {"device memory"}
    assert "device memory[" in (folder / "report.md").read_text()
    again = check_trace(load_trace(folder / "trace.jsonl").records).findings
    assert [f.to_json() for f in again] == findings


def test_the_default_streams_are_named_alike_whichever_source_saw_them():
    streams = []
    t = Translator(lambda record: None, lambda info: None, streams.append)
    t.feed([["stream", 0, {"legacy": True, "name": "legacy", "source": "cupy"}],
            ["stream", 2, {"blocking": True, "name": "per-thread", "source": "cupy"}],
            ["stream", 0x30, {"blocking": False, "name": "side", "source": "cupy"}]])
    assert [s.name for s in streams] == ["the legacy default stream",
                                         "the per-thread default stream", "side"]


def _offload_then_prefetch(*, waited: bool) -> list[list]:
    """transformers 5.17's offloaded cache, as the PyTorch source says it: layer 0's K is copied
    off the device into a new pinned block on the compute stream (S1), a block of another
    layer is handed out again by the host allocator in between, and the prefetch stream (S2)
    copies layer 0's pinned block back before anything orders it after the first copy. With
    ``waited``, S2 waits for an event recorded after the first copy (the fix)."""
    k0, h0, h1, back = BASE, PINNED, PINNED + 0x10000, BASE + 0x10000
    events = _streams() + [
        _alloc(k0, 4096, "k0"), _op(S1, "kernel:cat", 10, w=[("d", k0, 4096)]),
        # An earlier step's block h1, copied off the device and back, its events done.
        _alloc(h1, 4096, "h1", space="h"),
        ["event", "host-allocator-1", {"name": "of the pinned memory allocator"}],
        _op(S1, "copy_dtoh", 79, r=[("d", k0, 4096)], w=[("h", h1, 4096)]),
        ["record", "host-allocator-1", S1, "prog.py:79"],
        # Layer 0 offloaded into h0 on S1.
        _alloc(h0, 4096, "h0", space="h"),
        _op(S1, "copy_dtoh", 80, r=[("d", k0, 4096)], w=[("h", h0, 4096)]),
        ["record", 99, S1, "prog.py:80"],
        # h1 handed out again: the host waits for h1's copy only, not for h0's.
        ["sync_event", "host-allocator-1", "prog.py:81"],
        ["free", "h", h1, {"site": "prog.py:81", "streams": []}],
        _alloc(h1, 4096, "h1 again", space="h"),
        _alloc(back, 4096, "k0 back")]
    if waited:
        events.append(["wait", 99, S2, "prog.py:84"])
    events.append(_op(S2, "copy_htod", 85, r=[("h", h0, 4096)], w=[("d", back, 4096)]))
    return events


def test_a_pinned_block_handed_out_again_orders_only_its_own_copies():
    """The host allocator's reuse of one pinned block waits for the events recorded after that
    block's copies, not for all the streams did: the offload of another block into pinned
    memory, read back on the prefetch stream with no event between, still races."""
    (f,) = _findings(_offload_then_prefetch(waited=False))
    assert (f["first"]["step"], f["second"]["step"]) == ("prog.py:80", "prog.py:85")
    assert f["owner"].startswith("tensor h0")
    assert _findings(_offload_then_prefetch(waited=True)) == []


def test_an_emitted_event_is_written_as_it_was_and_a_held_one_as_it_is_at_the_flush():
    """The sink keeps an emitted event as its JSON line (a string, which Python's collector
    does not track: no full collections over the program's heap for held events), so a later
    change to the list is not written; a held event (a tensor named at the next op) is."""
    import gc
    import io
    out = io.StringIO()
    sink = Sink(out)
    emitted = ["note", "as it was"]
    held = ["alloc", "d", 1, 8, {"name": None}]
    sink.emit(emitted)
    sink.hold(held)
    emitted[1] = "changed"
    held[4]["name"] = "kv"
    assert not any(gc.is_tracked(e) for e in sink._events if e is not held)
    sink.flush()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == [["note", "as it was"], ["alloc", "d", 1, 8, {"name": "kv"}]]


def test_what_a_source_could_not_read_is_said_once_a_kind_and_counted():
    """The PyTorch source's failures: each kind a note when first met and a count at the end;
    past twenty kinds (a message with an address in it), the rest are counted together."""
    from harness.capture.source import KINDS_KEPT, Failures
    notes: list[list] = []
    guard = Failures(notes.append, "the PyTorch source")
    for _ in range(3):
        guard.failed("the arguments of aten.add.Tensor", RuntimeError("no storage\nmore"))
    assert len(notes) == 1 and "aten.add.Tensor: RuntimeError: no storage" in notes[0][1]
    assert guard.summary() == ["the PyTorch source could not read the arguments of "
                               "aten.add.Tensor: RuntimeError: no storage (3 times); those "
                               "ops ran unwatched"]
    for i in range(KINDS_KEPT + 5):
        guard.failed("a free", ValueError(f"at {i:#x}"))
    assert len(guard.counts) == KINDS_KEPT + 1 and len(notes) == KINDS_KEPT + 1
    assert sum(guard.counts.values()) == 3 + KINDS_KEPT + 5


class _Recorded:
    """A source, as the boot's import hook sees one: its framework's name, and what starting
    it does (here, noted)."""

    name = title = "fw"

    def __init__(self, module: str) -> None:
        self.module = module
        self.started = 0

    def available(self) -> str:
        return "1.0"

    def install(self, sink: Sink, amplifier: object = None) -> object:
        self.started += 1
        return lambda: None


def test_a_framework_only_looked_for_is_not_taken_for_imported(tmp_path, monkeypatch):
    """A library that asks whether the framework is installed (importlib.util.find_spec, as
    transformers does) before the program imports it must not use up the wait: the source
    starts when the framework's module is executed, once."""
    import importlib.util
    import io

    from harness.capture.boot import InstallOnImport
    (tmp_path / "gpurace_fw_probe.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = _Recorded("gpurace_fw_probe")
    hook = InstallOnImport(Sink(io.StringIO()), (source,))  # type: ignore[arg-type]
    monkeypatch.setattr(sys, "meta_path", [hook, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "gpurace_fw_probe", raising=False)
    assert importlib.util.find_spec("gpurace_fw_probe") is not None
    assert source.started == 0 and "gpurace_fw_probe" not in sys.modules
    import gpurace_fw_probe  # noqa: F401
    assert source.started == 1
    importlib.reload(sys.modules["gpurace_fw_probe"])
    assert source.started == 1


@pytest.mark.skipif(TORCH_PYTHON is None, reason="no interpreter with PyTorch here")
def test_a_program_that_looks_for_torch_before_importing_it_is_watched(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("import importlib.util\nassert importlib.util.find_spec('torch')\n"
                    "import torch\nprint(float(torch.ones(2).sum()))\n")
    done = subprocess.run([sys.executable, "-m", "harness.cli", "watch", "--format", "json",
                           "--out", str(tmp_path / "out"), "--", TORCH_PYTHON, str(prog)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(done.stdout)["watch"]["runs"][0]
    assert "torch" in run["sources"], run["sources"]


def test_a_site_is_the_frames_line_wherever_its_code_came_from():
    """Sites are remembered per instruction and code object: many functions made and dropped
    one after another (whose code objects may take the same ids), two lines of one function,
    and the end of a long function each give the line the frame is at."""
    from harness.capture.sites import site_of

    def here() -> str | None:
        return site_of(sys._getframe(1))

    for n in range(50):  # each exec'd function dropped before the next is made
        body = "".join(f"    x{i} = {i}\n" for i in range(n)) + "    return here()\n"
        space: dict[str, object] = {"here": here}
        exec(compile(f"def f():\n{body}", f"/made/f{n}.py", "exec"), space)
        assert space["f"]() == f"/made/f{n}.py:{n + 2}"  # type: ignore[operator]
    space = {"here": here}
    exec(compile("def g(a):\n    if a:\n        return here()\n    return here()\n",
                 "/made/g.py", "exec"), space)
    g: Any = space["g"]
    assert [g(1), g(0), g(1)] == ["/made/g.py:3", "/made/g.py:4", "/made/g.py:3"]
    long = "".join(f"    x{i} = {i}\n" for i in range(3000))
    exec(compile(f"def h():\n{long}    return here()\n", "/made/h.py", "exec"), space)
    assert space["h"]() == "/made/h.py:3002"  # type: ignore[operator]


# CUDA graphs: a capture runs nothing; each replay issues the body on the replay stream.
G = 0x6000


def _captured(*body: list) -> list[list]:
    """Streams, a static input and output, and graph G captured on s1 reading the input."""
    return _streams() + [
        _alloc(BASE, 4096, "static_in"), _alloc(BASE + 4096, 4096, "static_out"),
        ["graph_begin", G, S1, "prog.py:20"],
        _op(S1, "kernel:mul", 21, r=[("d", BASE, 4096)], w=[("d", BASE + 4096, 4096)]),
        *body,
        ["graph_end", G, "prog.py:22"]]


def test_a_replay_reads_its_static_input_while_another_stream_rewrites_it():
    def program(waits: bool) -> list[list]:
        edge = [["event", 5, {}], ["record", 5, S2, "prog.py:31"],
                ["wait", 5, S1, "prog.py:31"]] if waits else []
        return _captured() + [["graph_replay", G, S2, "prog.py:30"], *edge,
                              _op(S1, "copy_htod", 32, w=[("d", BASE, 4096)])]
    (f,) = _findings(program(False))
    assert (f["first"]["stream"], f["first"]["step"], f["first"]["access"]) == \
        ("s2", "prog.py:21", "read")
    assert (f["second"]["stream"], f["second"]["step"]) == ("s1", "prog.py:32")
    assert f["owner"].startswith("tensor static_in")
    assert _findings(program(True)) == []


def test_a_capture_runs_nothing_and_replays_on_one_stream_are_ordered():
    # At capture time s2 rewrites the input with no edge to s1: nothing ran on s1 then.
    events = _captured() + [_op(S2, "kernel:fill_", 23, w=[("d", BASE, 4096)]),
                            ["event", 6, {}], ["record", 6, S2, "prog.py:24"],
                            ["wait", 6, S1, "prog.py:24"],
                            ["graph_replay", G, S1, "prog.py:25"],
                            ["graph_replay", G, S1, "prog.py:26"]]
    assert _findings(events) == []
    analysis = RunAnalysis(None, {})
    analysis.feed(events)
    analysis.close()
    assert any(note.startswith("1 CUDA graph made at prog.py:20: 1 op seen in capture, "
                               "issued again at each of 2 replays on the replay stream")
               for note in analysis.translator.notes), analysis.translator.notes


def test_a_stream_forked_into_a_capture_is_part_of_the_graph():
    # s2 waits for an event recorded inside the capture: its work is the graph's, run at each
    # replay on a branch stream of the replay stream's; s2 reading the output afterwards with
    # no edge races the replay's last write there (s2's own captured add, replayed there).
    fork = [["event", 8, {}], ["record", 8, S1, "prog.py:40"], ["wait", 8, S2, "prog.py:40"],
            _op(S2, "kernel:add", 41, r=[("d", BASE, 4096)], w=[("d", BASE + 4096, 64)]),
            ["event", 9, {}], ["record", 9, S2, "prog.py:42"], ["wait", 9, S1, "prog.py:42"],
            ["free", "d", BASE, {"site": "prog.py:43"}]]  # kept by the graph's pool
    events = _captured(*fork) + [
        ["graph_replay", G, S1, "prog.py:44"],
        _op(S2, "kernel:sum", 45, r=[("d", BASE + 4096, 64)])]
    found = {(f["first"]["step"], f["second"]["step"]) for f in _findings(events)}
    assert found == {("prog.py:41", "prog.py:45")}
    assert all(f["first"]["stream"] == "s1's graph branch s2" for f in _findings(events))
    # The program's s1 after the replay is ordered after the branch by the captured join.
    joined = _captured(*fork) + [["graph_replay", G, S1, "prog.py:44"],
                                 _op(S1, "kernel:sum", 45, r=[("d", BASE + 4096, 64)])]
    assert _findings(joined) == []


def test_a_graphs_branches_race_where_no_captured_edge_orders_them():
    """A branch forked off the capture writes what the capturing stream reads before the join:
    in the graph the two are unordered, whatever order the capture saw them in; with the join
    before the read, they are ordered. A replay again is ordered after the last one's
    branches."""
    def graph(joined_first: bool) -> list[list]:
        join = [["event", 9, {}], ["record", 9, S2, "prog.py:52"], ["wait", 9, S1, "prog.py:52"]]
        read = [_op(S1, "kernel:sum", 53, r=[("d", BASE + 4096, 64)])]
        body = [["event", 8, {}], ["record", 8, S1, "prog.py:50"], ["wait", 8, S2, "prog.py:50"],
                _op(S2, "kernel:fill_", 51, w=[("d", BASE + 4096, 64)]),
                *(join + read if joined_first else read + join)]
        return _captured(*body) + [["graph_replay", G, S1, "prog.py:60"],
                                   ["graph_replay", G, S1, "prog.py:61"]]

    found = _findings(graph(joined_first=False))
    assert {(f["first"]["step"], f["second"]["step"]) for f in found} == \
        {("prog.py:51", "prog.py:53")}
    assert {(f["first"]["stream"], f["second"]["stream"]) for f in found} == \
        {("s1's graph branch s2", "s1")}
    assert _findings(graph(joined_first=True)) == []
    analysis = RunAnalysis(None, {})
    analysis.feed(graph(joined_first=True))
    analysis.close()
    assert any("2 replays on the replay stream and 1 branch stream of its own, ordered by "
               "the captured forks and joins" in note for note in analysis.translator.notes)


def test_a_wait_for_a_modules_import_ends_when_it_is_executed(tmp_path, monkeypatch):
    """after_import calls back once the module's code has run (not when it is merely looked
    up), at once for a module imported already, and never after its wait is cancelled."""
    import importlib.util

    from harness.capture.imports import after_import
    for name in ("gpurace_later_a", "gpurace_later_b"):
        (tmp_path / f"{name}.py").write_text("LOADED = True\n")
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    seen: list[str] = []
    after_import("gpurace_later_a", lambda: seen.append(str(sys.modules["gpurace_later_a"])))
    cancel = after_import("gpurace_later_b", lambda: seen.append("b"))
    assert importlib.util.find_spec("gpurace_later_a") is not None and seen == []
    import gpurace_later_a  # noqa: F401
    assert len(seen) == 1 and "gpurace_later_a" in seen[0]
    cancel()
    import gpurace_later_b  # noqa: F401
    after_import("gpurace_later_b", lambda: seen.append("now"))
    assert seen[1:] == ["now"]


def test_torch_compiles_generated_code_is_not_the_programs():
    from harness.capture.sites import is_program_code
    space: dict[str, Any] = {}
    exec(compile("def call(): pass\n", "/tmp/torchinductor_me/ab/cab12.py", "exec"), space)
    exec(compile("def mine(): pass\n", "/home/me/serve.py", "exec"), space)
    assert not is_program_code(space["call"].__code__)
    assert is_program_code(space["mine"].__code__)


def test_a_replays_ops_are_issued_at_the_replays_time():
    """The host's clock of a replayed op is the replay's (--amplify sizes its delays by the
    time between a racing pair's ops), not its capture's."""
    records = []
    translator = Translator(records.append, lambda info: None, lambda info: None)
    captured = _captured()
    captured[5][5]["t"] = 1_000  # the op's clock at capture
    translator.feed(captured + [["graph_replay", G, S2, "prog.py:30", 9_000_000]])
    (mul,) = [r for r in records if r.kind == "kernel:mul"]
    assert (mul.stream, mul.t_issue_ns, mul.step) == ("s2", 9_000_000, "prog.py:21")


class _Held:
    def __init__(self, key: int) -> None:
        self.key = key


def test_a_frames_values_are_named_in_one_pass_by_its_own_scope():
    """names_in names a function's values from its locals (the first name of a value wins,
    private names are skipped, a value that cannot be asked is left out); module-level code
    is named from the module's globals."""
    from harness.capture.sites import names_in

    def key(held: _Held) -> int:
        if held.key < 0:
            raise RuntimeError("a storage freed")
        return held.key

    def body() -> dict[Any, str]:
        _hidden, first, again, broken = _Held(1), _Held(2), _Held(2), _Held(-1)  # noqa: F841
        other = 3  # noqa: F841 - not of the types asked for
        return names_in(sys._getframe(), frozenset({_Held}), key)

    assert body() == {2: "first"}
    space: dict[str, Any] = {"names_in": names_in, "sys": sys, "_Held": _Held, "key": key}
    exec(compile("kv = _Held(7)\nfound = names_in(sys._getframe(), frozenset({_Held}), key)\n",
                 "/made/top.py", "exec"), space)
    assert space["found"] == {7: "kv"}
    assert names_in(None, frozenset({_Held}), key) == {}

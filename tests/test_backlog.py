"""A watched process runs at most its backlog ahead of the watch (harness.capture.backlog): its
sink waits at a write while the watch's mark says it is too far behind, loses nothing by it,
says what the waits cost in a note, and never waits again for a watch that stopped reading."""

from __future__ import annotations

import threading
from pathlib import Path

from harness.capture import backlog as B
from harness.capture.analysis import Followed, RunAnalysis, Shares
from harness.capture.backlog import Backlog, ReadMark, mark_of
from harness.capture.events import Sink, iter_file, read_events

LIMIT = 16 << 10


def _emit_steps(sink: Sink, steps: int, after_flush=None) -> None:
    for step in range(steps):
        for k in range(20):
            sink.emit(["sync_stream", 0, f"serve.py:{step * 20 + k}"])
        sink.flush()  # as at a host wait
        if after_flush is not None:
            after_flush()


def test_a_process_waits_for_a_slow_watch_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = Sink.to_path(path, Backlog(path, LIMIT))
    done = threading.Event()
    read = {"offset": 0, "events": 0}

    def watch() -> None:  # reads 4 KiB at a time, slowly: the process outruns it
        mark = ReadMark(path)
        while True:
            events, read["offset"] = read_events(path, read["offset"], limit=4 << 10)
            read["events"] += len(events)
            mark.say(read["offset"])
            if done.is_set() and not events and read["offset"] == path.stat().st_size:
                mark.close()
                return
            threading.Event().wait(0.002)

    ahead = []
    reader = threading.Thread(target=watch)
    reader.start()
    _emit_steps(sink, 600, lambda: ahead.append(sink.written - read["offset"]))
    sink.close()
    done.set()
    reader.join(timeout=60)
    assert not reader.is_alive()
    assert sink.written > 10 * LIMIT
    # After every write, the watch had read all but the limit (the waits let it catch up).
    assert max(ahead) <= LIMIT
    notes = [e[1] for e in iter_file(path) if e[0] == "note"]
    assert len(notes) == 1 and notes[0].startswith("the process waited "), notes
    assert read["events"] == 600 * 20 + 1  # every event, and the note
    assert not mark_of(path).exists() and sink.backlog is None


def test_a_watch_that_stops_reading_is_waited_for_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(B, "STALL_S", 0.2)
    path = tmp_path / "events.jsonl"
    ReadMark(path).say(0)  # the watch read nothing, and will read no more
    backlog = Backlog(path, 4096)
    sink = Sink.to_path(path, backlog)
    _emit_steps(sink, 50)
    assert backlog.stalled and backlog.waits == 1 and backlog.limit == 0
    note = backlog.note()
    assert "read nothing for 0.2 s once" in note and "ran on without waiting" in note
    sink.close()
    assert len(list(iter_file(path))) == 50 * 20 + 1


def test_a_watch_with_no_mark_yet_is_waited_for_as_one_that_stalled(tmp_path: Path,
                                                                  monkeypatch) -> None:
    """No mark file (the watch has not read once): the process waits STALL_S at most, then
    runs on; a garbled mark reads as no news."""
    monkeypatch.setattr(B, "STALL_S", 0.1)
    path = tmp_path / "events.jsonl"
    backlog = Backlog(path, 1000)
    backlog.wrote(5000)
    assert backlog.stalled and backlog.read == 0
    mark_of(path).write_text("not a number")
    other = Backlog(path, 1000)
    other.wrote(5000)
    assert other.stalled and other.read == 0


def test_the_watch_says_its_mark_as_it_follows_and_removes_it_at_the_end(
        tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = Sink.to_path(path)
    _emit_steps(sink, 10)
    sink.close()
    followed = Followed(path, RunAnalysis(None, {}), backlog=1 << 20)
    followed.poll()
    assert Backlog(path, 1)._look() == followed.offset == path.stat().st_size
    for _ in followed.rest():
        pass
    assert not mark_of(path).exists()
    unmarked = Followed(path, RunAnalysis(None, {}))
    unmarked.poll()
    assert not mark_of(path).exists()  # only a bounded run's watch says where it is


def test_disk_mb_is_shared_a_half_for_the_trace_and_a_quarter_each_for_the_events() -> None:
    shares = Shares.of(4096)
    assert shares.part * 4 + shares.keep + shares.backlog == 4096 << 20
    assert Shares.of(0) == (0, 0, 0)


def test_the_watch_knows_how_far_behind_the_program_it_is(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = Sink.to_path(path)
    _emit_steps(sink, 10)
    followed = Followed(path, RunAnalysis(None, {}))
    assert followed.behind() == sink.written > 0
    followed.poll()
    assert followed.behind() == 0
    _emit_steps(sink, 1)
    assert followed.behind() == sink.written - followed.offset > 0
    sink.close()
    assert Followed(tmp_path / "none.jsonl", RunAnalysis(None, {})).behind() == 0


def test_a_watch_behind_the_program_reads_on_without_a_pause(tmp_path: Path) -> None:
    """Past READ_MAX unread after a read, the watch says it is behind (its loop then reads
    again at once); once caught up, it pauses between reads again."""
    from harness.capture.events import READ_MAX
    path = tmp_path / "events.jsonl"
    sink = Sink.to_path(path)
    while sink.written < 2 * READ_MAX + (1 << 20):
        _emit_steps(sink, 500)
    sink.close()
    followed = Followed(path, RunAnalysis(None, {}))
    said = [followed.poll() for _ in range(4)]
    assert said[:2] == [True, False] and followed.behind() == 0
    # A process allowed 1 MiB ahead waits there: this watch reads on from half of it, where
    # the unbounded one paused (1 MiB and more left after two reads).
    bounded = Followed(path, RunAnalysis(None, {}), backlog=1 << 20)
    assert [bounded.poll() for _ in range(4)] == [True, True, False, False]


def test_a_signal_handler_that_emits_while_the_process_waits_does_not_deadlock(
        tmp_path: Path) -> None:
    """A program's SIGALRM (SIGTERM, in a trainer that saves a checkpoint) handler runs its own
    CUDA work while the capture waits for the watch: its events are written, in order."""
    import subprocess
    import sys
    code = f"""
import signal
from pathlib import Path
from harness.capture import backlog as B
from harness.capture.backlog import Backlog, ReadMark
from harness.capture.events import Sink
B.STALL_S = 1.0
path = Path({str(tmp_path / "events.jsonl")!r})
ReadMark(path).say(0)  # a watch that reads nothing: the flush below waits STALL_S
sink = Sink.to_path(path, Backlog(path, 10))
def handler(signum, frame):
    sink.emit(["note", "handler"])
    sink.flush()
signal.signal(signal.SIGALRM, handler)
sink.emit(["note", "before"])
signal.setitimer(signal.ITIMER_REAL, 0.2)
sink.flush()
sink.emit(["note", "after"])
sink.close()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, env={"PYTHONPATH": str(Path(__file__).parent.parent)})
    assert done.returncode == 0, done.stderr
    notes = [e[1] for e in iter_file(tmp_path / "events.jsonl") if e[0] == "note"]
    assert notes[:3] == ["before", "handler", "after"], notes


def test_a_fault_of_the_analysis_stops_the_analysis_only(tmp_path: Path, monkeypatch) -> None:
    """An event the translator cannot take (a newer source's shape, or a bug of gpurace's):
    the races found before it stay, nothing more is fed, and the file is still read on (the
    process's wait for the watch, and the disk's share, go on as they would)."""
    import json

    from harness.capture import events as events_module
    from tests.test_capture import _serving_steps
    from tests.test_trace_parts import START
    path = tmp_path / "events.jsonl"
    lines = [*START, *_serving_steps(0, 3, racy=True)]
    bad_at = sum(len(json.dumps(e)) + 1 for e in lines)
    lines += [["alloc", "d"], *_serving_steps(3, 3, racy=True)]
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    followed = Followed(path, RunAnalysis(None, {}), backlog=1 << 20)
    followed.poll()
    assert followed.failed.startswith("TypeError") and followed.failed_at == 0
    assert followed.offset == path.stat().st_size and followed.behind() == 0
    assert Backlog(path, 1)._look() == followed.offset  # the process is not held back
    # Read a few lines at a time, as a program writes them: the races before it are found.
    monkeypatch.setattr(events_module, "READ_MAX", 200)
    small = Followed(path, RunAnalysis(None, {}))
    while not small.failed:
        small.poll()
    for _ in small.rest():
        pass
    small.close()
    assert small.failed.startswith("TypeError") and small.failed_at >= bad_at - 400
    (finding,) = small.findings()
    assert finding.count == 3  # the three racy steps before the bad event, none after
    assert "a fault of gpurace's" in small.failure_note()
    small.write_failure()
    text = (tmp_path / "events.jsonl.error.txt").read_text()
    assert text.startswith("TypeError") and "Traceback" in text


def test_a_line_that_is_not_an_event_is_a_fault_of_the_reading_not_the_programs(
        tmp_path: Path) -> None:
    """A damaged line in an events file: the reader says where, fails the analysis as any
    fault of its own, and reads on past it, while the program goes on writing."""
    from harness.capture.events import NotEvents
    path = tmp_path / "events.jsonl"
    sink = Sink.to_path(path)
    _emit_steps(sink, 5)
    with open(path, "a") as f:
        f.write('["sync_stream", 0, "serve.py:1"\n')  # torn in the middle, then written on
    _emit_steps(sink, 5)
    sink.close()
    try:
        read_events(path)
    except NotEvents as exc:
        assert exc.after == path.stat().st_size and "not an event's JSON" in str(exc)
    else:
        raise AssertionError("a line that is not JSON was read as an event")
    for follow in (lambda f: f.poll(), lambda f: list(f.rest())):
        followed = Followed(path, RunAnalysis(None, {}))
        follow(followed)
        assert followed.failed.startswith("NotEvents") and followed.failed_at == 0
        assert followed.offset == path.stat().st_size
    gone = Followed(tmp_path / "gone.jsonl", RunAnalysis(None, {}))
    assert gone.poll() is False and gone.failed.startswith("FileNotFoundError")
    assert list(Followed(tmp_path / "gone.jsonl", RunAnalysis(None, {})).rest()) == []


def test_a_signal_handler_inside_a_flush_neither_deadlocks_nor_reorders() -> None:
    """A handler that runs its own CUDA work lands in the middle of a flush, on the flushing
    thread (as a SIGTERM checkpoint may): its events wait for the next write, after the
    ones being written, in the order they happened. Run apart, since the old sink hung."""
    import subprocess
    import sys
    code = """
import io, json
from harness.capture.events import Sink
class Out(io.StringIO):
    def write(self, text):
        if not getattr(self, "once", False):
            self.once = True
            sink.emit(["note", "handler"])  # what a signal handler would do here
            sink.flush()
        return super().write(text)
out = Out()
sink = Sink(out)
sink.emit(["note", "before"])
sink.flush()
sink.emit(["note", "after"])
sink.flush()
print(json.dumps([json.loads(line)[1] for line in out.getvalue().splitlines()]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, env={"PYTHONPATH": str(Path(__file__).parent.parent)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == '["before", "handler", "after"]'


def test_a_child_forked_while_another_thread_holds_the_sink_runs_on() -> None:
    """A forked child's capture is off, but its sources still hand the sink their events. A
    thread of the parent (one of the program's, or the sink's own writer) may hold the sink's
    lock at the fork: the child, which has no such thread, must not wait for it forever. Run
    apart, since the old sink hung there."""
    import subprocess
    import sys
    code = """
import os, sys, threading
from harness.capture.boot import watch_forks
from harness.capture.events import Sink
sink = Sink.to_path(os.devnull)
take, holding, release = threading.Event(), threading.Event(), threading.Event()
def hold():
    take.wait()
    with sink._lock:
        holding.set()
        release.wait()
threading.Thread(target=hold, daemon=True).start()
def grab():  # called after the watch's own handler: the lock is held at the very fork
    take.set()
    holding.wait()
os.register_at_fork(before=grab)
watch_forks(sink)
pid = os.fork()
if pid == 0:
    sink.emit(["op", 1, "k", [], [], {}])  # an op of the child's, its capture off
    os._exit(7)
release.set()
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                          text=True, timeout=60,
                          env={"PYTHONPATH": str(Path(__file__).parent.parent)})
    assert done.returncode == 0 and done.stdout.strip() == "7", done.stderr

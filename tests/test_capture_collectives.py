"""torch.distributed's collectives under the PyTorch source: each runs on its process group's
own stream, and the program is ordered after it only by its wait (``Work.wait``,
``synchronize``, a completed ``is_completed``). A tensor read before that wait races with the
collective, as in pytorch/pytorch#188655 (an async all_reduce's gradient read by the default
stream while NCCL still wrote it).

On PyTorch for the CPU (this interpreter or GPURACE_TEST_PYTHON) the programs below run on one
gloo rank, their tensor taken for pinned memory (a CPU build cannot pin): gloo runs the
collective on a thread of its own, and its ``wait`` blocks the host, so the host's read before
it races as a stream's would. tests/capture_recorded_cpu/ holds what they captured there
(GPURACE_RECORD_DIR records them again), which CI replays without PyTorch. On a GPU,
tests/test_engine_programs_gpu.py runs the same shapes on one NCCL rank under `gpurace watch`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from harness.capture.analysis import RunAnalysis
from harness.capture.events import iter_file
from harness.races.kinds import COLLECTIVE, FUNCTIONAL_COLLECTIVE
from tests.frameworks import python_with, run_printing_json

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "capture_recorded_cpu"
SHAPES = ("buggy", "fixed", "blocking", "polled", "from_cpp", "future", "coalesced",
          "no_work")


def _findings(events: list[list]) -> list[dict]:
    analysis = RunAnalysis(None, {})
    analysis.feed(events)
    analysis.close()
    return [f.to_json() for f in analysis.findings]


def _check(shape: str, findings: list[dict], events: list[list]) -> None:
    """What each program must come to: the collective on its group's stream, and a race only
    where the host read before the wait."""
    ops = [e for e in events if e[0] == "op"]
    name = "allreduce_coalesced" if shape == "coalesced" else "allreduce"
    assert [op[2] for op in ops] == [COLLECTIVE + name, "host_read"], ops
    if shape == "from_cpp":
        # Issued from C++, whose wait no source sees: in the program's order, said so.
        assert ops[0][1] is None and findings == [], findings
        assert any(e[0] == "note" and "issued from PyTorch's C++ code" in e[1] for e in events)
        return
    streams = {e[1]: e[2]["name"] for e in events if e[0] == "stream"}
    assert streams[ops[0][1]] == "gloo stream of group 0 (default_pg)"
    assert ops[0][3] == ops[0][4] and ops[0][3], "all_reduce reads and writes its tensor"
    if shape == "future":
        # The future's wait is not seen: ordered from get_future() on, and said so.
        assert any(e[0] == "note" and "Work.get_future" in e[1] for e in events)
    if shape != "buggy":
        assert findings == [], findings
        return
    assert len(findings) == 1, findings
    race = findings[0]
    assert race["first"]["kind"] == COLLECTIVE + "allreduce"
    assert race["first"]["access"] == "write"
    assert race["second"]["stream"] == "host" and race["second"]["access"] == "read"
    assert "call wait() on the work that allreduce" in race["missing"], race["missing"]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_recorded_collective_is_ordered_only_by_its_wait(shape: str) -> None:
    path = RECORDED / f"c10d_allreduce-{shape}.jsonl"
    events = list(iter_file(path))
    _check(shape, _findings(events), events)


@pytest.mark.parametrize("recording, kind", [
    ("c10d_allreduce-buggy", "kernel:c10d.allreduce"),
    ("c10d_functional-before_wait", "kernel:c10d.functional.all_reduce"),
    ("c10d_functional-gathered_before_wait",
     "kernel:c10d.functional.all_gather_into_tensor_out")])
def test_a_recorded_collective_race_minimizes_to_a_scenario_that_reproduces(
        tmp_path: Path, recording: str, kind: str) -> None:
    """`gpurace minimize` of the buggy capture: a scenario whose buggy variant manifests on the
    simulated device and whose fixed one (the host waits for the group's stream) does not,
    the group's stream named as the program's finding names it."""
    from click.testing import CliRunner

    from harness.cli import main
    trace = tmp_path / "trace.jsonl"  # as a watched run writes it (the recording has no hello)
    analysis = RunAnalysis(trace, {"scenario": "prog", "variant": "watched"})
    analysis.feed(list(iter_file(RECORDED / f"{recording}.jsonl")))
    analysis.close()
    out = tmp_path / "race.yaml"
    made = CliRunner().invoke(main, ["minimize", str(trace), "-o", str(out)])
    assert made.exit_code == 0, made.output
    assert "buggy manifested 5/5 (race found 5/5), fixed 0/5 (found 0/5)" in made.output
    text = out.read_text()
    assert "streams: {gloo-stream-of-group-0-default_pg: non-blocking}" in text
    assert kind in text


TORCH_PYTHON = python_with("torch.distributed")
needs_torch = pytest.mark.skipif(TORCH_PYTHON is None,
                                 reason="no interpreter with PyTorch here (GPURACE_TEST_PYTHON)")

# One gloo rank; each shape watched on its own, its events written to OUT/<shape>.jsonl.
_PROGRAM = r'''
import json, os, socket, sys
import torch
import torch.distributed as dist
from harness.capture import events as E, torch_source as T

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
dist.init_process_group("gloo", rank=0, world_size=1)


def buggy(grad):  # the sum before the wait
    work = dist.all_reduce(grad, async_op=True)
    total = float(grad.sum())
    work.wait()
    return total


def fixed(grad):
    work = dist.all_reduce(grad, async_op=True)
    work.wait()
    return float(grad.sum())


def blocking(grad):
    dist.all_reduce(grad)
    return float(grad.sum())


def polled(grad):
    work = dist.all_reduce(grad, async_op=True)
    while not work.is_completed():
        pass
    return float(grad.sum())


def from_cpp(grad):  # the process group's own method: C++ issues it, and waits unseen
    work = dist.distributed_c10d._get_default_group().allreduce([grad])
    total = float(grad.sum())
    work.wait()
    return total


def future(grad):  # a DDP comm hook's way: the work's future, waited on
    fut = dist.all_reduce(grad, async_op=True).get_future()
    fut.wait()
    return float(grad.sum())


def coalesced(grad):  # one Work for the block
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(grad)
    cm.wait()
    return float(grad.sum())


def no_work(grad):
    # A coalesced block whose end hands back no Work, as NCCL's blocking one does from
    # PyTorch 2.8 on (it ran on the current stream): gloo has no such block, so the source
    # is told the block's start and end as ProcessGroup._start/_end_coalescing tell it.
    pg = dist.distributed_c10d._get_default_group()
    stop.capture.collectives.coalescing_started(pg)
    work = dist.all_reduce(grad, async_op=True)
    stop.capture.collectives.coalescing_ended(pg, None)
    total = float(grad.sum())
    work.wait()  # gloo's own Work, which a blocking NCCL block would not have
    return total


answers = {}
for name in sys.argv[2:]:
    sink = E.Sink.to_path(os.path.join(sys.argv[1], name + ".jsonl"))
    stop = T.install(sink)
    grad = torch.ones(256)
    stop.capture.pinned[grad.untyped_storage().data_ptr()] = {}  # as pin_memory() makes it
    answers[name] = globals()[name](grad)
    stop()
    sink.close()
dist.destroy_process_group()
print(json.dumps(answers))
'''


@needs_torch
def test_collectives_on_one_gloo_rank_race_only_before_their_wait(tmp_path: Path) -> None:
    """The shapes live: the answers are PyTorch's (256, one rank), the buggy one races,
    the others do not; the source's roles for c10d's schemas are right."""
    assert TORCH_PYTHON is not None
    got, stderr = run_printing_json(TORCH_PYTHON, _PROGRAM, tmp_path, str(tmp_path), *SHAPES)
    assert got == {shape: 256.0 for shape in SHAPES}
    assert stderr == ""
    for shape in SHAPES:
        path = tmp_path / f"{shape}.jsonl"
        events = list(iter_file(path))
        _check(shape, _findings(events), events)
        where = os.environ.get("GPURACE_RECORD_DIR")
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(where) / f"c10d_allreduce-{shape}.jsonl")


# torch.distributed's functional collectives on one gloo rank, as torch.compile's code and
# DTensor issue them (pytorch/pytorch#152252 shows such code): each shape watched on its own.
_FUNCTIONAL = r'''
import json, os, socket, sys
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from harness.capture import events as E, torch_source as T

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
dist.init_process_group("gloo", rank=0, world_size=1)
F = torch.ops._c10d_functional
GROUP = dist.group.WORLD.group_name


def before_wait(grad, _):  # torch.compile's code, its wait placed after a use
    F.all_reduce_(grad, "sum", GROUP)
    total = float(grad.sum())
    F.wait_tensor(grad)
    return total


def waited(grad, _):
    F.all_reduce_(grad, "sum", GROUP)
    F.wait_tensor(grad)
    return float(grad.sum())


def input_rewritten(grad, _):  # all_reduce runs on a copy: its input is free at once
    out = F.all_reduce(grad, "sum", GROUP)
    grad.mul_(2)
    F.wait_tensor(out)
    return float(out.sum())


def gathered_before_wait(grad, shard):  # all_gather reads its input on the group's stream
    F.all_gather_into_tensor_out(shard, 1, GROUP, out=grad)
    total = float(grad.sum())
    F.wait_tensor(grad)
    return total


def async_tensor(grad, _):  # eager: an AsyncCollectiveTensor waits at its first use
    out = funcol.all_reduce(grad, "sum", dist.group.WORLD)
    return float(out.sum())


answers = {}
for name in sys.argv[2:]:
    sink = E.Sink.to_path(os.path.join(sys.argv[1], name + ".jsonl"))
    stop = T.install(sink)
    grad, shard = torch.ones(256), torch.ones(256)
    for t in (grad, shard):  # as pin_memory() makes them
        stop.capture.pinned[t.untyped_storage().data_ptr()] = {}
    answers[name] = globals()[name](grad, shard)
    stop()
    sink.close()
dist.destroy_process_group()
print(json.dumps(answers))
'''
FUNCTIONAL_SHAPES = ("before_wait", "waited", "input_rewritten", "gathered_before_wait",
                     "async_tensor")


FUNCTIONAL_RACES = {"before_wait": ("all_reduce", 17),
                    "gathered_before_wait": ("all_gather_into_tensor_out", 37)}
"""The shapes that race: the collective, and the program's line that issues it."""


def _check_functional(shape: str, events: list[list]) -> None:
    """A functional collective runs on its group's stream and is waited for by wait_tensor of
    its result: a read of the result before that wait races (an in-place all_reduce's, an
    all_gather's output), nothing else does: all_reduce works on a copy of its input, so
    rewriting the input at once is safe, and an AsyncCollectiveTensor waits by itself."""
    findings = _findings(events)
    collective = next(e for e in events if e[0] == "op" and e[2].startswith(COLLECTIVE))
    streams = {e[1]: e[2]["name"] for e in events if e[0] == "stream"}
    assert streams[collective[1]] == "gloo stream of group 0 (default_pg)"
    if shape not in FUNCTIONAL_RACES:
        assert findings == [], findings
        return
    name, line = FUNCTIONAL_RACES[shape]
    (race,) = findings
    assert race["first"]["kind"] == FUNCTIONAL_COLLECTIVE + name
    assert race["first"]["access"] == "write"
    assert race["first"]["step"] == f"prog.py:{line}"
    assert race["second"]["stream"] == "host" and race["second"]["access"] == "read"
    assert f"wait for the result of {name} at prog.py:{line}" in race["missing"]
    assert "wait_tensor" in race["missing"]


@pytest.mark.parametrize("shape", FUNCTIONAL_SHAPES)
def test_a_recorded_functional_collective_is_ordered_only_by_wait_tensor(shape: str) -> None:
    _check_functional(shape, list(iter_file(RECORDED / f"c10d_functional-{shape}.jsonl")))


@needs_torch
def test_functional_collectives_on_one_gloo_rank_race_only_before_wait_tensor(
        tmp_path: Path) -> None:
    """The shapes live: the answers are PyTorch's, and each capture comes to what its
    recording does."""
    assert TORCH_PYTHON is not None
    got, stderr = run_printing_json(TORCH_PYTHON, _FUNCTIONAL, tmp_path, str(tmp_path),
                                    *FUNCTIONAL_SHAPES)
    assert got == {shape: 256.0 for shape in FUNCTIONAL_SHAPES}
    assert stderr == ""
    for shape in FUNCTIONAL_SHAPES:
        path = tmp_path / f"{shape}.jsonl"
        _check_functional(shape, list(iter_file(path)))
        where = os.environ.get("GPURACE_RECORD_DIR")
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(where) / f"c10d_functional-{shape}.jsonl")


_ROLES = r'''
import json
import torch, torch.distributed
from harness.capture.torch_collectives import roles
from harness.capture.torch_ops import Plan
out = {}
for name in ("allreduce_", "_allgather_base_", "allgather_", "_reduce_scatter_base_",
             "send", "recv_", "alltoall_base_"):
    func = getattr(torch.ops.c10d, name).default
    out[name] = [[r.name, r.read, r.written] for r in roles(Plan(func))]
print(json.dumps(out))
'''


@needs_torch
def test_the_roles_of_c10d_arguments_come_from_their_names(tmp_path: Path) -> None:
    assert TORCH_PYTHON is not None
    got, _ = run_printing_json(TORCH_PYTHON, _ROLES, tmp_path)
    assert got["allreduce_"] == [["tensors", True, True], ["sparse_indices", True, True]]
    assert got["_allgather_base_"] == [["output_tensor", False, True],
                                       ["input_tensor", True, False]]
    assert got["allgather_"] == [["output_tensors", False, True], ["input_tensors", True, False]]
    assert got["_reduce_scatter_base_"] == [["output_tensor", False, True],
                                            ["input_tensor", True, False]]
    assert got["send"] == [["tensors", True, False]]
    assert got["recv_"] == [["tensors", False, True]]
    assert got["alltoall_base_"] == [["output", False, True], ["input", True, False]]


# What the dispatcher hands a mode for a blocking and a non-blocking collective: NCCL runs the
# blocking one (async_op=False) on the current stream since PyTorch 2.8, and the source says it
# there (one gloo rank here, which runs both on its own thread; the flag is the op's argument).
_BLOCKING = r'''
import json, os, socket
import torch, torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from harness.capture.torch_collectives import blocking, shape_of
from harness.capture.torch_ops import Plan
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
dist.init_process_group("gloo", rank=0, world_size=1)
seen = []
class Seen(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            has = any(a.name == "async_op" for a in func._schema.arguments)
            seen.append([func.__name__, has and blocking(shape_of(Plan(func), func), args, kwargs)])
        return func(*args, **kwargs)
x, out = torch.ones(4), torch.empty(4)
with Seen():
    dist.all_reduce(x)
    dist.all_reduce(x, async_op=True).wait()
    dist.all_gather_into_tensor(out, x)
    dist.broadcast(x, 0, async_op=True).wait()
dist.destroy_process_group()
print(json.dumps(seen))
'''


@needs_torch
def test_a_blocking_collective_is_told_from_its_async_op_argument(tmp_path: Path) -> None:
    assert TORCH_PYTHON is not None
    got, _ = run_printing_json(TORCH_PYTHON, _BLOCKING, tmp_path)
    assert got == [["allreduce_.default", True], ["allreduce_.default", False],
                   ["_allgather_base_.default", True], ["broadcast_.default", False]]


@pytest.mark.parametrize("prog", sorted((ROOT / "tests" / "engine_programs").glob("*.py")),
                         ids=lambda p: p.stem)
def test_an_engine_program_names_its_racing_lines_and_its_fix(prog: Path) -> None:
    """The lines a GPU program's docstring names (tests/test_engine_programs_gpu.py holds the
    findings to them) are its launch, its read, and its fix."""
    import re
    text = prog.read_text()
    race = re.search(r"\(line (\d+)\) and .* \(line (\d+)\)\. The fix is line (\d+)\.",
                     " ".join(text.split()))
    assert race, "the docstring names the racing lines and the fix"
    # As the GPU test reads them: each "(line N)" on one line of the file.
    assert {int(n) for n in re.findall(r"\(line (\d+)\)", text)} == {
        int(race.group(1)), int(race.group(2))}
    lines = text.splitlines()
    launch, read, fix = (lines[int(n) - 1] for n in race.groups())
    launched = {"nccl": ("async_op=True", "functional."), "triton": ("[grid](",),
                "graph": ("static_out.copy_(", "static_shared.copy_("),
                "cupy": (".data.copy_",), "child": (".copy_(",)}
    # The graph's: its captured op; a functional collective's: the op, with no Work.
    assert any(word in launch for word in launched[prog.stem.split("_")[0]]), launch
    assert ("wait" in fix or "synchronize" in fix) and "wait" not in read


_LET_GO = r'''
import gc, io, json, os, socket, weakref
import torch
import torch.distributed as dist
from harness.capture import events as E, torch_source as T

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
dist.init_process_group("gloo", rank=0, world_size=1)
stop = T.install(E.Sink(io.StringIO()))
grad = torch.ones(64)
stop.capture.pinned[grad.untyped_storage().data_ptr()] = {}
first = weakref.ref(dist.all_reduce(grad, async_op=True))  # the program lets it go at once
kept = dist.all_reduce(grad, async_op=True)
gc.collect()
followed = len(stop.capture.collectives.issued)
kept.wait()
print(json.dumps({"first_gone": first() is None, "followed": followed,
                  "after_wait": len(stop.capture.collectives.issued)}))
stop()
dist.destroy_process_group()
'''


@needs_torch
def test_the_source_keeps_no_work_alive_that_the_program_let_go(tmp_path: Path) -> None:
    """A Work (and the tensors it holds) lives as long as the program keeps it: the source
    follows it weakly once the program has it, and forgets it when it goes or is waited on."""
    assert TORCH_PYTHON is not None
    got, _ = run_printing_json(TORCH_PYTHON, _LET_GO, tmp_path)
    assert got == {"first_gone": True, "followed": 1, "after_wait": 0}


def test_a_race_found_in_a_child_process_minimizes_from_the_runs_incident(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A race the program's child found (an engine core in a process of its own) is in no
    trace of the program's own process: its incident keeps the child's capture
    (child-PID.jsonl), and `gpurace minimize INCIDENT` makes the scenario from it, leaving
    nothing in the temporary folder (the op trace it made of the capture)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    from click.testing import CliRunner

    from harness.capture.children import analyse_children
    from harness.capture.launch import Program
    from harness.capture.watch import ProgramEnd, WatchOptions, _incident
    from harness.cli import main
    from harness.results.outcome import Outcome, TrialResult
    children = tmp_path / "run" / "children"
    children.mkdir(parents=True)
    hello = ["hello", {"pid": 4242, "role": "a Python subprocess (core.py)",
                       "argv": ["python", "core.py"]}]
    (children / "child-4242.jsonl").write_text("".join(
        json.dumps(e) + "\n" for e in [hello, *iter_file(RECORDED / "c10d_allreduce-buggy.jsonl")]))
    (child,) = analyse_children(children)
    assert child.findings and child.findings[0]["missing"].startswith(
        "in child process 4242 (a Python subprocess (core.py)): ")
    trace = tmp_path / "run" / "trace.jsonl"  # the program's own process: no race
    analysis = RunAnalysis(trace, {"scenario": "prog", "variant": "watched"})
    analysis.feed([])
    analysis.close()
    log = tmp_path / "run" / "program.log"
    log.write_text("")
    trial = TrialResult(index=0, seed=0, outcome=Outcome.CLEAN, race=True, trace=str(trace),
                        findings=child.findings, duration_s=1.0, worker_pid=4241)
    folder = _incident(tmp_path / "out", WatchOptions(program=Program("python", "prog.py", ())),
                       trial, {"end": ProgramEnd(0, None, None, None, False, 1.0, ""),
                               "run": {"log": str(log), "children": [child.to_json()]},
                               "notes": []})
    assert (folder / "child-4242.jsonl").exists()
    out = tmp_path / "race.yaml"
    made = CliRunner().invoke(main, ["minimize", str(folder), "-o", str(out)])
    assert made.exit_code == 0, made.output
    assert "buggy manifested 5/5 (race found 5/5), fixed 0/5 (found 0/5)" in made.output
    assert "kernel:c10d.allreduce" in out.read_text()
    # The child's capture named alone: its op trace is made, read, and removed.
    from harness.capture.reproducer import watched_source
    alone = watched_source(children / "child-4242.jsonl")
    assert alone is not None and alone.findings
    assert list(scratch.iterdir()) == []


def test_a_trace_too_large_to_load_is_checked_and_minimized_as_a_stream(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real program's watched trace runs past the 8 MiB a trace is loaded whole: `gpurace
    check` reads it a line at a time, and `gpurace minimize` twice (the races, then the pair's
    window), to the same answer and the same scenario as the whole trace gives."""
    from click.testing import CliRunner

    from harness import limits
    from harness.capture import reproducer
    from harness.cli import main
    from harness.cli import traces as cli_traces
    trace = tmp_path / "trace.jsonl"
    analysis = RunAnalysis(trace, {"scenario": "prog", "variant": "watched"})
    analysis.feed(list(iter_file(RECORDED / "c10d_allreduce-buggy.jsonl")))
    analysis.close()

    def both() -> tuple[str, str]:
        checked = CliRunner().invoke(main, ["check", "--format", "json", str(trace)])
        assert checked.exit_code == 1, checked.output
        out = tmp_path / f"race-{len(list(tmp_path.glob('race-*')))}.yaml"
        made = CliRunner().invoke(main, ["minimize", str(trace), "-o", str(out)])
        assert made.exit_code == 0, made.output
        assert "buggy manifested 5/5" in made.output
        return checked.output, out.read_text()

    whole = both()
    small = trace.stat().st_size // 4
    for owner in (limits, cli_traces, reproducer):
        monkeypatch.setattr(owner, "TRACE_MAX_BYTES", small)
    from harness.errors import TraceError
    from harness.traces.optrace import load_trace
    with pytest.raises(TraceError):
        load_trace(trace)  # too large to load whole now
    assert both() == whole

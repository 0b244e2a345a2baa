"""`gpurace watch` on the programs of tests/engine_programs, on a GPU: what real engines launch
beyond ATen ops (NCCL collectives on one rank, Triton kernels of their own, CUDA graph
replays, CuPy's raw MemoryPointer copies, child processes). Each buggy program is found on its
first unamplified run, at the lines its docstring names; each fixed twin is clean in every run;
``--amplify auto`` makes each buggy answer wrong; each buggy run's incident shrinks to a
scenario that reproduces on the GPU.

The programs run side by side (one GPU holds them all; GPURACE_ENGINE_PARALLEL at a time, 8 by
default): each buggy one watched once and its fixed twin GPURACE_FIXED_RUNS times (20), then
each buggy one amplified over GPURACE_AMPLIFY_TRIALS runs (20) and its incident minimized. With
GPURACE_RECORD_DIR set, each program's capture events (buggy and fixed, first run, with its
children's) are copied there, to be committed beside the CPU suite's recordings.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from harness.races.kinds import COLLECTIVE
from tests.test_watch_gpu import _record, watch

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = sorted((ROOT / "tests" / "engine_programs").glob("*.py"))
FIXED_RUNS = int(os.environ.get("GPURACE_FIXED_RUNS", "20"))  # fewer for a quick look
AMPLIFY_TRIALS = int(os.environ.get("GPURACE_AMPLIFY_TRIALS", "20"))
PARALLEL = int(os.environ.get("GPURACE_ENGINE_PARALLEL", "8"))

# What each kind of program needs here, as code that fails where it is missing.
NEEDS = {
    "nccl": "import torch, torch.distributed as d; assert torch.cuda.is_available(); "
            "assert d.is_nccl_available()",
    "triton": "import torch, triton; assert torch.cuda.is_available()",
    "graph": "import torch; assert torch.cuda.is_available()",
    "cupy": "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0",
    "child": "import torch; assert torch.cuda.is_available()",
}


def _can(kind: str) -> bool:
    return subprocess.run([sys.executable, "-c", NEEDS[kind]],
                          capture_output=True).returncode == 0


CAN = {kind: _can(kind) for kind in NEEDS}
pytestmark = pytest.mark.gpu
RUNNABLE = [p for p in PROGRAMS if CAN[p.stem.split("_")[0]]]

AMPLIFIED = [p for p in PROGRAMS if not p.stem.startswith("nccl_")]
"""The programs whose racing op a delay can be queued before. Not yet a collective's: it runs
on the process group's own NCCL stream, which PyTorch does not hand out, and a delay on the
current stream, which the collective waits for, delays the racing read as much."""

T = TypeVar("T")


def _side_by_side(job: Callable[[Path], T], programs: Sequence[Path]) -> dict[str, T]:
    """``job`` of each program, PARALLEL at a time; by program name."""
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        return dict(zip((p.stem for p in programs), pool.map(job, programs)))


def _needs(prog: Path) -> None:
    kind = prog.stem.split("_")[0]
    if not CAN[kind]:
        pytest.skip(f"needs {kind} on a GPU")


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, dict[str, tuple[int, dict, str]]]:
    """Each program that can run here: its buggy version watched once, its fixed twin
    FIXED_RUNS times (program -> "buggy" or "fixed" -> exit, run document, stderr)."""
    out = tmp_path_factory.mktemp("engine")

    def one(prog: Path) -> dict[str, tuple[int, dict, str]]:
        got = {}
        for version, flags, runs in (("buggy", (), 1), ("fixed", ("--fixed",), FIXED_RUNS)):
            got[version] = watch(out / f"{prog.stem}-{version}", sys.executable, str(prog),
                                 *flags, runs=runs)
            if got[version][1]:
                _record(got[version][1], f"{prog.stem}-{version}")
        return got

    return _side_by_side(one, RUNNABLE)


@pytest.fixture(scope="module")
def amplified(tmp_path_factory: pytest.TempPathFactory, watched: dict[str, Any]
              ) -> dict[str, tuple[dict, dict]]:
    """Each buggy program watched with ``--amplify auto`` over AMPLIFY_TRIALS runs (the NCCL
    ones left out), and its first watched run's incident shrunk by ``gpurace minimize`` and
    run on the GPU (program -> amplified run document, shrunk scenario's results)."""
    from tests.test_amplify_gpu import _shrunk

    out = tmp_path_factory.mktemp("amplified")

    def one(prog: Path) -> tuple[dict, dict]:
        doc: dict = {}
        if prog in AMPLIFIED:
            done = subprocess.run(
                [sys.executable, "-m", "harness.cli", "watch", "--format", "json", "--out",
                 str(out / prog.stem), "--trials", str(AMPLIFY_TRIALS), "--amplify", "auto",
                 "--", sys.executable, str(prog)],
                capture_output=True, text=True, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1800)
            doc = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {
                "error": done.stderr[-2000:]}
        buggy = watched[prog.stem]["buggy"][1]
        shrunk = _shrunk(prog.stem, buggy, out) if buggy else {"error": "no run document"}
        return doc, shrunk

    return _side_by_side(one, RUNNABLE)


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_the_buggy_program_is_found_first_time_at_the_lines_it_names(watched, prog):
    _needs(prog)
    code, doc, err = watched[prog.stem]["buggy"]
    assert doc, err[-2000:]
    result = doc["results"][0]
    assert result["trials"] == 1 and result["detected"] == 1, result
    named = {int(n) for n in re.findall(r"\(line (\d+)\)", prog.read_text())}
    lines = {int(f[side]["step"].rsplit(":", 1)[1]) for f in result["findings"]
             for side in ("first", "second")}
    assert lines == named, (sorted(lines), sorted(named))
    if prog.stem.startswith("nccl_"):
        assert all(f["first"]["kind"].startswith(COLLECTIVE) for f in result["findings"])
        # The fix named: the work's wait, or a functional collective's wait_tensor.
        assert any("call wait() on the work" in f["missing"] or "wait_tensor" in f["missing"]
                   for f in result["findings"])


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_the_fixed_twin_is_clean_in_every_run(watched, prog):
    _needs(prog)
    code, doc, err = watched[prog.stem]["fixed"]
    assert doc, err[-2000:]
    result = doc["results"][0]
    assert result["trials"] == FIXED_RUNS and result["detected"] == 0, result
    assert code == 0


@pytest.mark.parametrize("prog", AMPLIFIED, ids=[p.stem for p in AMPLIFIED])
def test_amplified_the_buggy_programs_answer_is_wrong(amplified, prog):
    """--amplify auto (a delay before the earlier op of each racing pair; for a replayed
    graph's op, before the replay, or inside the graph for a race between its branches) makes
    the buggy program's answer wrong in at least 95% of its runs: the race the watch found is
    the one that breaks the program."""
    _needs(prog)
    doc = amplified[prog.stem][0]
    assert doc.get("watch"), doc.get("error")
    best = max((a["failed"] / a["trials"] for a in doc["watch"]["amplified"]), default=0.0)
    print(f"\n{prog.stem}: amplified " + "; ".join(
        f"{a['failed']}/{a['trials']} {a['queued']}" for a in doc["watch"]["amplified"]))
    assert best >= 0.95, doc["watch"]["amplified"]


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_the_buggy_programs_incident_shrinks_to_a_scenario_that_reproduces(amplified, prog):
    """`gpurace minimize` of the buggy run's incident (a child's race from the child's own
    events): a scenario that reproduces amplified in at least 95% of its trials on the GPU,
    and is clean fixed."""
    _needs(prog)
    shrunk = amplified[prog.stem][1]
    assert "error" not in shrunk, shrunk
    buggy, fixed = shrunk["buggy"], shrunk["fixed"]
    print(f"\n{prog.stem}: {shrunk['steps']} steps, amplified {buggy['manifested']}/"
          f"{buggy['trials']}, fixed {fixed['manifested']}/{fixed['trials']} detected "
          f"{fixed['detected']}")
    assert buggy["manifested"] >= 0.95 * buggy["trials"], buggy
    assert fixed["manifested"] == 0 and fixed["detected"] == 0, fixed

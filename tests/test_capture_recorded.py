"""The capture of the real programs, replayed without a GPU.

tests/capture_recorded/ holds the capture events each program of tests/watch_programs wrote on
an H200 (PyTorch 2.11, CuPy 14.2) under `gpurace watch` (`make test-gpu-watch` with
GPURACE_RECORD_DIR set records them again): the PyTorch dispatch mode's ops, PyTorch's GPU trace
callbacks, CuPy's hooks, as the sources said them. Replayed through the translator and the
detector, each buggy program's race is found, at the lines its docstring names, and no fixed
twin's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.capture.analysis import RunAnalysis
from harness.capture.events import iter_file

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "capture_recorded"
PROGRAMS = ROOT / "tests" / "watch_programs"
RECORDED = sorted(CORPUS.glob("*.jsonl"))


def _replay(path: Path) -> list[dict]:
    analysis = RunAnalysis(None, {})
    analysis.feed(list(iter_file(path)))
    analysis.close()
    return [f.to_json() for f in analysis.findings]


def test_every_program_has_its_recording():
    programs = sorted(p.stem for p in PROGRAMS.glob("*.py") if p.name != "conftest.py")
    recorded = {p.stem for p in RECORDED}
    assert programs, "no watch programs"
    missing = [f"{name}-{v}" for name in programs for v in ("buggy", "fixed")
               if f"{name}-{v}" not in recorded]
    assert not missing, f"record them on a GPU (GPURACE_RECORD_DIR): {missing}"


@pytest.mark.parametrize("path", [p for p in RECORDED if p.stem.endswith("-buggy")],
                         ids=lambda p: p.stem)
def test_a_recorded_buggy_program_races_at_the_lines_it_names(path):
    findings = _replay(path)
    assert findings, "the race was not found in the recording"
    program = PROGRAMS / (path.stem.rsplit("-", 1)[0] + ".py")
    named = {int(n) for n in re.findall(r"\(line (\d+)\)", program.read_text())}
    lines = {int(f[side]["step"].rsplit(":", 1)[1]) for f in findings
             for side in ("first", "second") if f[side]["step"]}
    # Every finding names the program's own lines, and one of them is a line its
    # docstring says races.
    assert all(f[side]["step"].startswith("tests/watch_programs/") for f in findings
               for side in ("first", "second")), findings
    assert not named or lines & named, (sorted(lines), sorted(named))


@pytest.mark.parametrize("path", [p for p in RECORDED if p.stem.endswith("-fixed")],
                         ids=lambda p: p.stem)
def test_a_recorded_fixed_twin_is_clean(path):
    assert _replay(path) == []

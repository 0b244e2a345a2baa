"""The capture of the watch programs and the engine programs, replayed without a GPU.

tests/capture_recorded/ holds the capture events each program of tests/watch_programs wrote on
an H200 (PyTorch 2.11, CuPy 14.2) under `gpurace watch` (`make test-gpu-watch` with
GPURACE_RECORD_DIR set records them again): the PyTorch dispatch mode's ops, PyTorch's GPU trace
callbacks, CuPy's hooks, as the sources said them. tests/capture_recorded_engine/ holds those of
tests/engine_programs (NCCL collectives, Triton kernels, CUDA graph replays, CuPy's raw
MemoryPointer copies, child processes; `pytest -m gpu tests/test_engine_programs_gpu.py` with
GPURACE_RECORD_DIR): a program's file ``NAME-buggy.jsonl`` or ``NAME-fixed.jsonl``, and each
watched child's beside it, ``NAME-buggy.child-K.jsonl``, each analysed alone as the watch does.
Replayed through the translator and the detector, each buggy program's race is found, at the
lines its docstring names, and no fixed twin's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

from harness.capture.analysis import RunAnalysis
from harness.capture.events import iter_file

ROOT = Path(__file__).resolve().parent.parent


class Corpus(NamedTuple):
    recorded: Path  # the recordings
    programs: Path  # the programs they are of
    every_line: bool  # each buggy recording's findings name exactly the lines its program does


CORPUS = ROOT / "tests" / "capture_recorded"
PROGRAMS = ROOT / "tests" / "watch_programs"
CORPORA = (Corpus(CORPUS, PROGRAMS, False),
           Corpus(ROOT / "tests" / "capture_recorded_engine", ROOT / "tests" / "engine_programs",
                  True))
RECORD = "record them on a GPU (GPURACE_RECORD_DIR)"


class Recording(NamedTuple):
    corpus: Corpus
    name: str  # NAME-buggy or NAME-fixed
    files: tuple[Path, ...]  # the program's events, then its children's

    @property
    def program(self) -> Path:
        return self.corpus.programs / (self.name.rsplit("-", 1)[0] + ".py")


def _recordings(corpus: Corpus) -> list[Recording]:
    mains = sorted(p for p in corpus.recorded.glob("*.jsonl") if ".child-" not in p.name)
    return [Recording(corpus, p.stem, (p, *sorted(corpus.recorded.glob(f"{p.stem}.child-*.jsonl"))))
            for p in mains]


RECORDINGS = [r for corpus in CORPORA for r in _recordings(corpus)]


def _replay(path: Path) -> list[dict]:
    """The findings of one recording, analysed alone."""
    analysis = RunAnalysis(None, {})
    analysis.feed(list(iter_file(path)))
    analysis.close()
    return [f.to_json() for f in analysis.findings]


def _replay_all(recording: Recording) -> list[dict]:
    """A program's findings: its recording's and each of its children's, each alone."""
    return [finding for path in recording.files for finding in _replay(path)]


def _id(recording: Recording) -> str:
    return f"{recording.corpus.programs.name}/{recording.name}"


@pytest.mark.parametrize("corpus", CORPORA, ids=lambda c: c.programs.name)
def test_every_program_has_its_recording(corpus):
    programs = sorted(p.stem for p in corpus.programs.glob("*.py") if p.name != "conftest.py")
    recorded = {r.name for r in _recordings(corpus)}
    assert programs, f"no programs in {corpus.programs}"
    missing = [f"{name}-{v}" for name in programs for v in ("buggy", "fixed")
               if f"{name}-{v}" not in recorded]
    if corpus.every_line and len(missing) == 2 * len(programs):
        pytest.skip(f"{corpus.recorded.name} holds no recording yet: {RECORD}")
    assert not missing, f"{RECORD}: {missing}"


@pytest.mark.parametrize("recording", [r for r in RECORDINGS if r.name.endswith("-buggy")],
                         ids=_id)
def test_a_recorded_buggy_program_races_at_the_lines_it_names(recording):
    findings = _replay_all(recording)
    assert findings, "the race was not found in the recording"
    named = {int(n) for n in re.findall(r"\(line (\d+)\)", recording.program.read_text())}
    lines = {int(f[side]["step"].rsplit(":", 1)[1]) for f in findings
             for side in ("first", "second") if f[side]["step"]}
    # Every finding names the program's own lines, and one of them is a line its
    # docstring says races (an engine program's: exactly those lines).
    folder = f"tests/{recording.corpus.programs.name}/"
    assert all(f[side]["step"].startswith(folder) for f in findings
               for side in ("first", "second")), findings
    if recording.corpus.every_line:
        assert lines == named, (sorted(lines), sorted(named))
    else:
        assert not named or lines & named, (sorted(lines), sorted(named))


@pytest.mark.parametrize("recording", [r for r in RECORDINGS if r.name.endswith("-fixed")],
                         ids=_id)
def test_a_recorded_fixed_twin_is_clean(recording):
    assert _replay_all(recording) == []

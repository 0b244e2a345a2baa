"""The capture of the corpus of real programs (tests/real_programs), replayed without a GPU.

    python -m pytest -q tests/test_capture_recorded_real.py

tests/capture_recorded_real/ holds the capture events each corpus program wrote on a GPU under
`gpurace watch` (``NAME.jsonl.gz``), and a word for each entry that exited 77 there
(``NAME.exit77.txt``), or why its recording is pending (``NAME.pending.txt``, replayed as a
skip that says so); `GPURACE_RECORD_DIR=tests/capture_recorded_real make test-gpu-real`
records them again (GPURACE_REAL_ITERS=2 keeps them small). Replayed through the translator and
the detector as tests/test_capture_recorded.py replays its own, each is a whole run of its
program (ops, and an exit) with no finding where its library is correct (exit 0), and a finding
where it races (the corpus entry's ``expect``); and every entry of the corpus has its recording.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from harness.capture.analysis import RunAnalysis
from tests.real_runs import (CANNOT_RUN_SUFFIX, CORPUS_FILE, PENDING_SUFFIX, RACE, ROOT,
                             load_corpus)

FOLDER = ROOT / "tests" / "capture_recorded_real"
RECORDED = sorted(FOLDER.glob("*.jsonl.gz"))
CANNOT_RUN = sorted(FOLDER.glob(f"*{CANNOT_RUN_SUFFIX}"))
# An entry whose recording is older than a change to its capture, or broken by what the change
# fixed: NAME.pending.txt says which, until a GPU records it again.
PENDING = sorted(FOLDER.glob(f"*{PENDING_SUFFIX}"))
RECORD = "record them on a GPU: GPURACE_RECORD_DIR=tests/capture_recorded_real make test-gpu-real"


class Replayed(NamedTuple):
    """What a recording's replay saw: its ops, the translator's notes, the program's end, and
    the findings (as JSON)."""

    ops: int
    notes: list[str]
    exit: dict[str, Any] | None
    findings: list[dict[str, Any]]


def _replay(path: Path) -> Replayed:
    """As tests/test_capture_recorded.py replays a recording, through the translator and the
    detector."""
    analysis = RunAnalysis(None, {})
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        analysis.feed([json.loads(line) for line in lines if line.strip()])
    analysis.close()
    translator = analysis.translator
    return Replayed(translator.ops, list(translator.notes), translator.exit,
                    [f.to_json() for f in analysis.findings])


@pytest.fixture(scope="module")
def replays() -> Iterator[dict[Path, Future[Replayed]]]:
    """Every recording's replay, started at once in as many processes as the machine has
    cores (the replays are most of this file's time, and each is one core's work); each test
    waits for its own, and those no test asked for are dropped unstarted."""
    workers = max(1, min(len(RECORDED), os.cpu_count() or 1))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield {path: pool.submit(_replay, path) for path in RECORDED}
        pool.shutdown(cancel_futures=True)


def _name(path: Path) -> str:
    for suffix in (CANNOT_RUN_SUFFIX, PENDING_SUFFIX, ".jsonl.gz"):
        if path.name.endswith(suffix):
            return path.name[:-len(suffix)]
    return path.stem


@pytest.mark.parametrize(
    "path", [*RECORDED, *(pytest.param(p, id=_name(p), marks=pytest.mark.skip(
        reason=f"recording pending: {p.read_text().strip()}")) for p in PENDING)]
    or [pytest.param(None, id="none-recorded", marks=pytest.mark.skip(
        reason=f"no recordings in {FOLDER.relative_to(ROOT)} yet: {RECORD}"))],
    ids=_name)
def test_a_recorded_real_program_is_a_whole_run_clean_or_racing_as_expected(path, replays):
    replayed = replays[path].result()
    # A recording of nothing would be clean too: it must hold the program's ops and its end.
    assert replayed.ops > 0, f"{path.name}: no op recorded (notes: {replayed.notes})"
    assert replayed.exit is not None, f"{path.name}: the program's end is not recorded"
    findings = replayed.findings
    expect = {entry.name: getattr(entry, "expect", "clean") for entry in load_corpus()}
    if expect.get(_name(path)) == RACE:
        assert findings, f"{path.name}: its library's race was not found in the recording"
        return
    assert replayed.exit.get("status") == 0, \
        f"{path.name}: the program did not end with exit 0: {replayed.exit}"
    assert findings == [], "\n".join(f["missing"] for f in findings)


@pytest.mark.xfail(not (RECORDED or CANNOT_RUN), strict=False, reason=RECORD)
def test_every_corpus_entry_that_can_run_has_its_recording():
    entries = load_corpus()
    assert entries, f"no corpus at {CORPUS_FILE}"
    have = {_name(p) for p in RECORDED + CANNOT_RUN + PENDING}
    missing = [entry.name for entry in entries if entry.name not in have]
    assert not missing, f"{RECORD}; on a machine where these import and run: {missing}"


def test_every_recording_is_of_a_corpus_entry_and_names_one_entry():
    listed = [entry.name for entry in load_corpus()]
    twice = sorted({name for name in listed if listed.count(name) > 1})
    assert not twice, f"corpus entries share a name (and so a recording): {twice}"
    names = set(listed)
    stale = [p.name for p in RECORDED + CANNOT_RUN if _name(p) not in names]
    assert not stale, f"recordings of no corpus entry (renamed or removed?): {stale}"

"""`gpurace watch` on the corpus of real programs (tests/real_programs), on a GPU: each program
runs bare and then watched, and the watch must leave it as it was and find nothing in it.

    make test-gpu-real                                           (on a GPU machine)
    PYTHONPATH=. python -m pytest -q -s -m gpu tests/test_real_programs_gpu.py -k NAME

For each corpus entry: the same exit status bare and watched, the same ``answer=`` line, no
finding in the watched run, and no traceback through gpurace's own code on its stderr. An entry
whose ``needs`` do not import here is skipped naming the module; one that exits 77 bare (this
variant cannot run here) is skipped with what it said. What the capture failed to read (its
``stats`` event's ``failures``) is printed, and is no failure by itself. Entries run four at a
time (the programs that use NCCL bind port 0, so each gets a port of its own); the module ends
with one line per entry.

With GPURACE_RECORD_DIR set, each watched run's capture events are copied there as NAME.jsonl.gz,
and an entry that exits 77 leaves NAME.exit77.txt saying why: what
tests/test_capture_recorded_real.py replays without a GPU.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.real_runs import (CANNOT_RUN, CANNOT_RUN_SUFFIX, CORPUS_FILE, PENDING_SUFFIX,
                             ProgramRun, WatchedRun, load_corpus, missing_need, probe, problems,
                             run_bare, run_watched, stats_line)

ENTRIES = load_corpus(CORPUS_FILE)
# Programs at once on the one GPU (more would crowd a small card's memory); a big card can take
# more: GPURACE_REAL_PARALLEL.
PARALLEL = int(os.environ.get("GPURACE_REAL_PARALLEL", "4"))
# Timed iterations for every program (its own default where unset): a recording of a short run
# is small enough to keep, GPURACE_REAL_ITERS=2.
ITERS = int(os.environ.get("GPURACE_REAL_ITERS", "0")) or None
TIMEOUT_S = 900.0  # a run's limit: a real program under capture may take minutes

pytestmark = pytest.mark.gpu


@dataclass
class Verdict:
    """An entry's two runs, or why it did not run here."""

    entry: Any
    skip: str | None = None
    bare: ProgramRun | None = None
    watched: WatchedRun | None = None


def _no_cuda() -> str | None:
    """Why this interpreter cannot run the corpus, or None."""
    code = "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["?"])[-1]
    return f"needs PyTorch with CUDA on a GPU ({last})"


def _selected(request: pytest.FixtureRequest) -> list[Any]:
    """The entries this session runs (``-k`` picks some), in the corpus's order."""
    names = {item.callspec.params["entry"].name for item in request.session.items
             if getattr(item, "module", None) is request.module
             and getattr(item, "callspec", None) and item.callspec.params.get("entry")}
    return [entry for entry in ENTRIES if entry.name in names]


def _record(name: str, watched: WatchedRun | None = None, cannot: str | None = None) -> None:
    """The recording folder's copy of an entry's events, or its word that the entry exits 77
    here; whichever is written replaces the other and the word that it was pending (a
    re-recording keeps the folder true)."""
    where = os.environ.get("GPURACE_RECORD_DIR")
    if not where:
        return
    folder = Path(where)
    folder.mkdir(parents=True, exist_ok=True)
    events, marker = folder / f"{name}.jsonl.gz", folder / f"{name}{CANNOT_RUN_SUFFIX}"
    (folder / f"{name}{PENDING_SUFFIX}").unlink(missing_ok=True)
    if cannot is not None:
        events.unlink(missing_ok=True)
        marker.write_text(cannot + "\n")
    elif watched is not None and watched.doc and watched.events is not None:
        marker.unlink(missing_ok=True)
        # Gzipped: a transformers run's capture is megabytes of JSON lines.
        with open(watched.events, "rb") as src, gzip.open(events, "wb") as dst:
            shutil.copyfileobj(src, dst)


def _verdict(entry: Any, missing: dict[str, str], out: Path) -> Verdict:
    why = missing_need(entry, missing)
    if why:
        return Verdict(entry, skip=why)
    bare = run_bare(entry, sys.executable, CORPUS_FILE, ITERS, timeout=TIMEOUT_S)
    if bare.code == CANNOT_RUN:
        said = f"exits {CANNOT_RUN} bare (cannot run here): {bare.why()}"
        _record(entry.name, cannot=said)
        return Verdict(entry, skip=said)
    watched = run_watched(entry, sys.executable, out / entry.name, CORPUS_FILE, ITERS,
                          timeout=TIMEOUT_S)
    _record(entry.name, watched)
    return Verdict(entry, bare=bare, watched=watched)


def _summary(verdict: Verdict) -> str:
    name = verdict.entry.name
    if verdict.skip:
        return f"{name}: skipped: {verdict.skip}"
    bare, watched = verdict.bare, verdict.watched
    assert bare is not None and watched is not None
    same = "same" if bare.said.answer == watched.said.answer else "DIFFERENT"
    return (f"{name}: exit {bare.code} bare, {watched.status} watched (watch {watched.code}); "
            f"answer {same}; {len(watched.findings)} finding(s); {stats_line(watched.stats)}")


@pytest.fixture(scope="module")
def verdicts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[dict[str, Verdict]]:
    """Every selected entry run bare and then watched, four entries at a time."""
    why = _no_cuda()
    if why:
        pytest.skip(why)
    chosen = _selected(request)
    missing, machine = probe(sys.executable, [n for e in chosen for n in e.needs])
    out = tmp_path_factory.mktemp("real")
    def one(entry: Any) -> Verdict:
        verdict = _verdict(entry, missing, out)
        print(f"\n{_summary(verdict)}", flush=True)  # as each ends: a run cut short says these
        return verdict

    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        found = {v.entry.name: v for v in pool.map(one, chosen)}
    yield found
    print(f"\nreal programs under gpurace watch, on {machine}:")
    for entry in chosen:
        print(_summary(found[entry.name]))


@pytest.mark.parametrize(
    "entry", ENTRIES or [pytest.param(None, id="no-corpus", marks=pytest.mark.skip(
        reason=f"no corpus yet: {CORPUS_FILE} is not there"))],
    ids=lambda entry: entry.name)
def test_a_real_program_runs_watched_as_it_runs_bare_and_clean(verdicts, entry):
    verdict = verdicts[entry.name]
    if verdict.skip:
        pytest.skip(f"{entry.name}: {verdict.skip}")
    assert verdict.bare is not None and verdict.watched is not None
    failures = (verdict.watched.stats or {}).get("failures")
    if failures:  # what the capture could not read: told, not failed
        print(f"\n{entry.name}: the capture failed to read {failures}")
    found = problems(verdict.bare, verdict.watched, getattr(entry, "expect", "clean"))
    assert not found, "\n".join([*found, stats_line(verdict.watched.stats)])

"""The real-program benchmark: each program of the corpus (tests/real_programs/corpus.py) bare,
under PyTorch's CUDA sanitizer (``TORCH_CUDA_SANITIZER=1``) and under ``gpurace watch``.

    make bench-real                                              (on a GPU machine)
    python tests/real_programs/bench.py --repeats 3 --only NAME --json out.json --markdown out.md

Each program times its own loop after one warm-up iteration and says so in its last lines
(``step_max_s=``, its longest iteration; ``work_s=``, the loop), so process start, imports and
the CUDA context, which no tool changes, are left out. For each entry, one at a time (timings
share the GPU with nothing else), ``--repeats`` rounds of bare, sanitizer, watched, in that
order round by round; the median of each tool's ``work_s`` is kept. Real programs have no fixed
twin: they are meant to be clean, so a sanitizer report, a finding, an exit that is not 0 or an
answer that differs is marked in the row's notes. The sanitizer stops a program at its first
report (its time is then not counted). The capture's own account of a watched run is its
``stats`` event: the ops it handled over the whole run (set-up and warm-up included, so the
per-op figures are a floor), the time it spent in its own code, and its longest op and where.

Runs share one compiled-bytecode cache (``PYTHONPYCACHEPREFIX``, a folder under the system's
temp folder unless it is set): a fresh interpreter that compiles PyTorch's modules from source
spends seconds on it, outside the timed loop but inside the benchmark's wall time.

The rows go to ``--json`` after each entry (a stopped run keeps what it measured), the Markdown
table to stdout and ``--markdown``; its last line names the machine. Each entry costs
``3 x --repeats`` program starts (imports, the CUDA context, set-up: seconds each), so the
whole corpus takes longer than one sitting may allow: ``--budget SECONDS`` starts no entry that
the longest so far says would end past it, and ``--resume`` (with the same ``--json``) goes on
from the entries measured, on the same machine, with the same settings:

    python tests/real_programs/bench.py --json real.json --markdown real.md --budget 480
    python tests/real_programs/bench.py --json real.json --markdown real.md --budget 480 --resume

Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: this checkout's harness and tests
    sys.path.insert(0, str(ROOT))

from tests.real_runs import (CANNOT_RUN, CORPUS_FILE, ProgramRun,  # noqa: E402
                             WatchedRun, load_corpus, missing_need, probe, run_bare,
                             run_sanitized, run_watched)

COLUMNS = ("entry", "library", "bare work_s ms", "sanitizer × bare", "gpurace × bare",
           "bare step_max ms", "watched step_max ms", "capture max own ms (site)",
           "capture ops (whole run: set-up and warm-up too)",
           "gpurace µs/op (watched − bare work_s, over those ops)", "capture µs/op (own/ops)",
           "notes")


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def _notes(bare: list[ProgramRun], sanitized: list[ProgramRun],
           watched: list[WatchedRun]) -> list[str]:
    """What in the rounds was not a clean run, counted."""
    notes = []

    def count(what: str, hits: int, runs: int) -> None:
        if hits:
            notes.append(f"{what} ({hits}/{runs})")

    count("bare exit not 0", sum(r.code != 0 for r in bare), len(bare))
    count("sanitizer: CSAN race reported, stopped", sum(r.csan for r in sanitized),
          len(sanitized))
    count("sanitizer exit not 0 without a report",
          sum(r.code != 0 and not r.csan for r in sanitized), len(sanitized))
    count("the watch wrote no run document", sum(not w.doc for w in watched), len(watched))
    count("watched exit not 0", sum(bool(w.doc) and w.status != 0 for w in watched),
          len(watched))
    count("gpurace findings", sum(bool(w.detected or w.findings) for w in watched),
          len(watched))
    count("no stats event", sum(w.doc != {} and w.stats is None for w in watched),
          len(watched))
    answers = {r.said.answer for r in bare if r.code == 0}
    if len(answers) > 1:
        notes.append(f"bare answers differ run to run: {sorted(map(str, answers))}")
    watched_answers = {w.said.answer for w in watched if w.status == 0}
    if answers and watched_answers - answers:
        notes.append(f"watched answer {sorted(map(str, watched_answers - answers))} is not "
                     f"bare's {sorted(map(str, answers))}")
    return notes


def _capture(watched: list[WatchedRun]) -> dict[str, Any]:
    """The capture's account over the watched rounds: its worst op of any round, the median
    of ops and of own time per op, the most of each failure seen in one round."""
    stats = [w.stats for w in watched if w.stats and w.stats.get("ops")]
    if not stats:
        return {}
    worst = max(stats, key=lambda s: s.get("max_own_ns", 0))
    failures: dict[str, int] = {}
    for s in stats:
        for what, n in (s.get("failures") or {}).items():
            failures[what] = max(failures.get(what, 0), int(n))
    return {"ops": int(statistics.median(s["ops"] for s in stats)),
            "own_us_per_op": round(statistics.median(
                s.get("own_ns", 0) / s["ops"] / 1e3 for s in stats), 3),
            "max_own_ms": round(worst.get("max_own_ns", 0) / 1e6, 3),
            "max_site": worst.get("max_site"), "failures": failures}


def summarize(row: dict[str, Any], bare: list[ProgramRun], sanitized: list[ProgramRun],
              watched: list[WatchedRun]) -> dict[str, Any]:
    """An entry's row from its rounds: the medians of the runs that ended well, the ratios to
    bare, the capture's account, and notes on every run that did not end well."""
    work = {"bare": _median([r.said.work_s for r in bare if r.code == 0]),
            "sanitizer": _median([r.said.work_s for r in sanitized
                                  if r.code == 0 and not r.csan]),
            "watched": _median([w.said.work_s for w in watched if w.status == 0])}
    row["work_s"] = work
    row["rounds_work_s"] = {"bare": [r.said.work_s for r in bare],
                            "sanitizer": [r.said.work_s for r in sanitized],
                            "watched": [w.said.work_s for w in watched]}
    row["step_max_s"] = {"bare": _median([r.said.step_max_s for r in bare if r.code == 0]),
                         "watched": _median([w.said.step_max_s for w in watched
                                             if w.status == 0])}
    base = work["bare"]
    row["ratio"] = {tool: round(work[tool] / base, 3) for tool in ("sanitizer", "watched")
                    if base and work[tool] is not None}
    row["capture"] = capture = _capture(watched)
    if base is not None and work["watched"] is not None and capture.get("ops"):
        row["gpurace_us_per_op"] = round((work["watched"] - base) * 1e6 / capture["ops"], 3)
    row["sanitizer"] = {"runs": len(sanitized), "csan": sum(r.csan for r in sanitized),
                        "failed": sum(r.code != 0 and not r.csan for r in sanitized)}
    row["notes"] = _notes(bare, sanitized, watched)
    row["why"] = _why(bare, sanitized, watched)
    return row


def _why(bare: list[ProgramRun], sanitized: list[ProgramRun], watched: list[WatchedRun]
         ) -> dict[str, str]:
    """Each tool's first run that did not end well, in its last line (for the JSON rows)."""
    why = {}
    for tool, runs in (("bare", bare), ("sanitizer", sanitized)):
        bad = [r for r in runs if r.code != 0]
        if bad:
            why[tool] = f"exit {bad[0].code}: {bad[0].why()}"
    bad_watch = [w for w in watched if not w.doc or w.status != 0 or w.findings]
    if bad_watch:
        w = bad_watch[0]
        why["watched"] = (f"watch exit {w.code}, program exit {w.status}: "
                          + ("; ".join(w.findings[:3]) or w.err.strip()[-500:]))
    return why


def bench_entry(entry: Any, python: str, corpus: Path, iters: int | None, repeats: int,
                missing: dict[str, str], timeout: float) -> dict[str, Any]:
    """One entry's rounds, alternated tool by tool, and its row."""
    row: dict[str, Any] = {"entry": entry.name, "library": entry.library}
    why = missing_need(entry, missing)
    if why:
        return {**row, "skipped": why}
    bare: list[ProgramRun] = []
    sanitized: list[ProgramRun] = []
    watched: list[WatchedRun] = []
    for round_ in range(repeats):
        bare.append(run_bare(entry, python, corpus, iters, timeout))
        if round_ == 0 and bare[0].code == CANNOT_RUN:
            return {**row, "skipped": f"exits {CANNOT_RUN} bare: {bare[0].why()}"}
        sanitized.append(run_sanitized(entry, python, corpus, iters, timeout))
        with tempfile.TemporaryDirectory(prefix="gpurace-bench-real-") as tmp:
            # The run's folder goes with it: a real program's events file can be large.
            watched.append(run_watched(entry, python, Path(tmp), corpus, iters, timeout))
    return summarize(row, bare, sanitized, watched)


def _cell(value: Any, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.3g}{suffix}" if isinstance(value, float) else f"{value}{suffix}"


def _sanitizer_cell(row: dict[str, Any]) -> str:
    """The sanitizer's ratio, or why it has none: it stopped the program at a report, or the
    program failed under it (its rounds, counted, are in the notes)."""
    if "sanitizer" in row["ratio"]:
        return _cell(row["ratio"]["sanitizer"], "x")
    said = row.get("sanitizer", {})
    if said.get("csan"):
        return "stopped: CSAN report"
    return "failed" if said.get("failed") else "-"


def table_row(row: dict[str, Any]) -> str:
    """An entry's row of the Markdown table."""
    if "skipped" in row:
        cells = [row["entry"], row["library"], *["-"] * (len(COLUMNS) - 3),
                 f"skipped: {row['skipped']}"]
    else:
        capture = row["capture"]
        ratio = row["ratio"]
        top = _cell(capture.get("max_own_ms"))
        if capture.get("max_site"):
            top += f" ({capture['max_site']})"
        notes = list(row["notes"])
        if capture.get("failures"):
            notes.append(f"capture failed to read {capture['failures']}")
        cells = [row["entry"], row["library"], _cell(_ms(row["work_s"]["bare"])),
                 _sanitizer_cell(row), _cell(ratio.get("watched"), "x"),
                 _cell(_ms(row["step_max_s"]["bare"])),
                 _cell(_ms(row["step_max_s"]["watched"])), top, _cell(capture.get("ops")),
                 _cell(row.get("gpurace_us_per_op")), _cell(capture.get("own_us_per_op")),
                 "; ".join(notes) or "-"]
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def table(rows: list[dict[str, Any]], machine: str) -> str:
    """The Markdown table, its last line naming the machine."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += [table_row(row) for row in rows]
    return "\n".join([*lines, "", f"machine: {machine}"]) + "\n"


class Plan(NamedTuple):
    """What one call measures and how."""

    python: str
    corpus: Path
    iters: int | None
    repeats: int
    timeout: float
    budget: float | None  # seconds this call may take, or None
    order: tuple[str, ...] = ()  # the corpus's names in its order: the table's rows follow it


def bench(entries: list[Any], plan: Plan, done: list[dict[str, Any]], missing: dict[str, str],
          machine: str, keep: Callable[[list[dict[str, Any]], str, list[str]], None]
          ) -> tuple[list[dict[str, Any]], list[str]]:
    """Every entry, one at a time, after the rows ``done`` already holds; ``keep`` gets all
    the rows so far (in the corpus's order) after each. With a budget, an entry that the
    longest one so far says would end past it is left, with those after it, for the next call
    (the second item names them)."""
    began = time.monotonic()
    print(table([], machine).split("\n\n")[0], file=sys.stderr, flush=True)
    order = {name: i for i, name in enumerate(plan.order)}
    rows, longest = list(done), 0.0
    for index, entry in enumerate(entries):
        if plan.budget is not None and index > 0 and \
                time.monotonic() - began + longest > plan.budget:
            return rows, [e.name for e in entries[index:]]
        started = time.monotonic()
        row = bench_entry(entry, plan.python, plan.corpus, plan.iters, plan.repeats, missing,
                          plan.timeout)
        longest = max(longest, time.monotonic() - started)
        rows.append(row)
        rows.sort(key=lambda r: order.get(r["entry"], len(order)))
        print(table_row(row), file=sys.stderr, flush=True)
        keep(rows, machine, [])
    return rows, []


def _keeper(opts: argparse.Namespace) -> Callable[[list[dict[str, Any]], str, list[str]], None]:
    def keep(rows: list[dict[str, Any]], machine: str, left: list[str]) -> None:
        if opts.json:
            opts.json.write_text(json.dumps(
                {"machine": machine, "repeats": opts.repeats, "iters": opts.iters,
                 "rows": rows, "left": left}, indent=2) + "\n")
        if opts.markdown:
            opts.markdown.write_text(table(rows, machine))
    return keep


def _done(opts: argparse.Namespace, parser: argparse.ArgumentParser, machine: str
          ) -> list[dict[str, Any]]:
    """The rows an earlier call wrote to --json, kept with --resume where it measured the
    same way on this machine (rows of other settings or another machine would not compare)."""
    if not opts.resume:
        return []
    if opts.json is None:
        parser.error("--resume: give the --json of the calls before")
    if not opts.json.is_file():
        return []
    earlier = json.loads(opts.json.read_text())
    was = (earlier.get("repeats"), earlier.get("iters"), earlier.get("machine"))
    if was != (opts.repeats, opts.iters, machine):
        parser.error(f"--resume: {opts.json} was measured with --repeats {was[0]} --iters "
                     f"{was[1]} on {was[2]}; this call: --repeats {opts.repeats} --iters "
                     f"{opts.iters} on {machine}")
    return list(earlier.get("rows", []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/real_programs/bench.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the three tools")
    parser.add_argument("--iters", type=int, help="passed on to each program (default: its "
                                                  "own)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these entries alone")
    parser.add_argument("--json", type=Path, help="the rows, rewritten after each entry")
    parser.add_argument("--markdown", type=Path, help="the table, rewritten after each entry")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows --json holds and bench only the entries it lacks")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="start no entry that would end past this; --resume goes on")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=600.0, help="a run's limit, seconds")
    parser.add_argument("--corpus", type=Path, default=CORPUS_FILE, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.repeats < 1:
        parser.error("--repeats: at least 1")
    # Every run's imports are outside the timed loop, but they are most of its wall time where
    # the packages hold no compiled bytecode: one cache for all the runs, unless one is set.
    os.environ.setdefault("PYTHONPYCACHEPREFIX",
                          str(Path(tempfile.gettempdir()) / "gpurace-bench-real-pycache"))
    entries = list(load_corpus(opts.corpus))
    if not entries:
        parser.error(f"no corpus at {opts.corpus}")
    order = tuple(e.name for e in entries)
    if opts.only:
        unknown = sorted(set(opts.only) - {e.name for e in entries})
        if unknown:
            parser.error(f"--only: no entry {unknown}; the corpus has "
                         f"{[e.name for e in entries]}")
        entries = [e for e in entries if e.name in opts.only]
    missing, machine = probe(opts.python, [n for entry in entries for n in entry.needs])
    done = _done(opts, parser, machine)
    measured = {row["entry"] for row in done}
    plan = Plan(opts.python, opts.corpus, opts.iters, opts.repeats, opts.timeout, opts.budget,
                order)
    keep = _keeper(opts)
    rows, left = bench([e for e in entries if e.name not in measured], plan, done, missing,
                       machine, keep)
    if left:
        keep(rows, machine, left)
        print(f"left for the next call (--resume goes on): {' '.join(left)}", file=sys.stderr)
    print(table(rows, machine), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

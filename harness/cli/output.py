"""How the commands print: standard output that its reader may close early, the consoles,
errors as messages with their exit codes, a run's summary and a race finding in words.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from harness.results.outcome import Status, VariantResult
from reports import ReportError, percent_interval
from harness.results.exitcodes import ExitCode
from harness.results.run import RunResult
from harness.words import counted


class _Output:
    """The command's standard output, which its reader may close early (``gpurace run ... |
    head -2``). From then on what is printed goes nowhere and the command goes on to its own
    end and exit code: the run's files are written, and a closed pipe never reads as a failed
    expectation (click's own handling exits 1)."""

    closed = False

    def write(self, text: str) -> int:
        if not self.closed:
            try:
                sys.stdout.write(text)
            except BrokenPipeError:
                self.close()
        return len(text)

    def flush(self) -> None:
        if not self.closed:
            try:
                sys.stdout.flush()
            except BrokenPipeError:
                self.close()

    def isatty(self) -> bool:
        return not self.closed and sys.stdout.isatty()

    def fileno(self) -> int:
        return sys.stdout.fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stdout, "encoding", None) or "utf-8"

    def close(self) -> None:
        """The reader went away. Python flushes stdout once more as it exits: the descriptor
        is pointed at /dev/null so that flush has nothing to fail on."""
        self.closed = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass  # not a real descriptor (a test's captured output)


OUTPUT = _Output()


def _echo(text: str, nl: bool = True) -> None:
    """``click.echo`` through :data:`OUTPUT`."""
    OUTPUT.write(text + ("\n" if nl else ""))
    OUTPUT.flush()


def _console(stream: TextIO | _Output) -> Console:
    """A console for ``stream``. Piped into a CI log or a file, rich would assume 80 columns,
    truncate the results table's headers and wrap every finding; logs are wide, so there a
    line keeps its width unless COLUMNS says otherwise."""
    wide = not stream.isatty() and "COLUMNS" not in os.environ
    # No emoji codes: a message's "file:100:3" must not print as "file💯3". In a log a line is
    # never wrapped (soft wrap): a wrap at 160 columns cut words and paths in two.
    return Console(stderr=stream is sys.stderr, file=stream if stream is OUTPUT else None,
                   width=160 if wide else None, emoji=False, soft_wrap=wide)


err = _console(sys.stderr)
out = _console(OUTPUT)

_STATUS_STYLE = {Status.PASS: "green", Status.FAIL: "bold red", Status.SKIP: "yellow"}


def _fail(exc: BaseException) -> None:
    """Print an error the way a user can act on it (no traceback) and exit with its code."""
    code = ExitCode.USAGE if isinstance(exc, ReportError) else getattr(
        exc, "exit_code", ExitCode.INTERNAL)
    prefix = "error" if code != ExitCode.INTERNAL else "internal error"
    # escape: a message may quote a file's text ("[buffer, offset, length]"), not markup.
    err.print(f"[bold red]{prefix}:[/] {escape(str(exc))}", highlight=False, markup=True,
              soft_wrap=True)
    sys.exit(int(code))


def print_finding(f: dict) -> None:
    # `count` is how many op pairs of this shape one trace held; across a run the summary
    # keeps the first trial's, so say so rather than print a bare multiplier.
    pairs = int(f.get("count", 1))
    more = f" ({pairs} op pairs{' in the first trial' if 'trials' in f else ''})" \
        if pairs > 1 else ""
    # soft_wrap: a finding is one line in a log, whole for grep, however wide.
    out.print(f"  race{more}: {escape(f['missing'])}", highlight=False, soft_wrap=True)
    for side in ("first", "second"):
        op = f[side]
        # The scenario's line when a scenario issued it; the Python line for API users.
        where = f" at {op['origin']}" if op.get("origin") else (
            f" issued at {op['site']}" if op.get("site") else "")
        out.print(f"    {side}: seq {op['seq']} {op['stream']} {op['kind']} "
                  f"{op['access']} bytes {op['bytes'][0]}..{op['bytes'][1]}{where}",
                  highlight=False, soft_wrap=True)


def _log(line: str) -> None:
    """One progress line in a log: plain, whole, flushed at once."""
    err.print(line, highlight=False, markup=False, soft_wrap=True)
    err.file.flush()


INCIDENTS_LISTED = 10
"""Incident folders a summary lists by name; it says how many more there are, and where."""

COLUMNS_EXPLAINED = ("manifested: trials that did not end clean (wrong data, a crash or a "
                     "hang)", "detected: trials in which the race detector found two "
                     "conflicting accesses with no happens-before order")
"""What the summary's two counts mean, said once under them: new users read them as one."""


def _summary_table(title: str, rows: list[tuple[VariantResult, str, str]], detect: bool,
                   compact: bool) -> Table:
    """The summary as a table. Every column but the outcomes keeps its values and header
    whole (no_wrap, at least as wide as the header's longest line), so the table's measured
    minimum is the width it needs without cutting a value ("98-100%" as "98-1…").
    ``compact`` puts the two-word headers on two lines, for a narrower terminal."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    two = "\n" if compact else " "
    delay, interval = f"delay{two}us", f"95%{two}interval"
    numeric = (delay, "trials", "manifested", interval, "detected")
    for column in ("scenario", "variant", "expect", delay, "trials", "manifested", interval,
                   *(("detected",) if detect else ()), "outcomes", "status"):
        whole = column != "outcomes"
        table.add_column(column, justify="right" if column in numeric else "left",
                         no_wrap=whole,
                         min_width=max(map(len, column.split("\n"))) if whole else None)
    for r, counts, status in rows:
        table.add_row(r.scenario, r.variant, r.expect,
                      "-" if r.delay_us is None else f"{r.delay_us:g}", str(r.trials),
                      str(r.manifested), percent_interval(r.interval),
                      *((str(r.detected),) if detect else ()), counts, status)
    return table


def _fits(table: Table) -> bool:
    """Whether ``table`` fits the terminal with every value whole. Measured unbounded: rich
    clamps a measurement to the width it is given, which would hide that it does not fit."""
    return Measurement.get(out, out.options.update_width(10_000), table).minimum <= out.width


def print_summary(result: RunResult, out_dir: Path, recorded: bool = False,
                  command: str = "run") -> None:
    device = result.device.get("name", result.backend)
    lanes = f", {len(result.lanes)} devices side by side" if len(result.lanes) > 1 else ""
    title = f"gpurace {command} on {result.backend} ({device}{lanes}), seed {result.seed}"
    detect = any(r.detected for r in result.results)
    rows = []
    for r in result.results:
        counts = ", ".join(f"{k} {v}" for k, v in r.outcomes().items() if v) or "-"
        status = "map" if r.sweep and r.status is not Status.SKIP else r.status.value
        rows.append((r, counts, f"[{_STATUS_STYLE[r.status]}]{status}[/]"))
    # A table too wide for the terminal would cut its values: then its headers on two lines,
    # and below that (a CI log of 80 columns) a line per variant, which wraps between words.
    table = next((t for t in (_summary_table(title, rows, detect, compact)
                              for compact in (False, True)) if _fits(t)), None)
    if table is None:
        out.print(title, highlight=False)
        for r, counts, status in rows:
            delay = "" if r.delay_us is None else f", delay {r.delay_us:g} us"
            found = f", detected {r.detected}" if detect else ""
            out.print(f"  {escape(r.scenario)} ({escape(r.variant)}) {status}: expects "
                      f"{r.expect}; {counted(r.trials, 'trial')}{delay}; manifested "
                      f"{r.manifested} ({percent_interval(r.interval)}){found}; {counts}",
                      highlight=False)
    else:
        out.print(table)
    if any(r.trials for r in result.results):
        for line in COLUMNS_EXPLAINED[:2 if detect else 1]:
            out.print("  " + line, highlight=False)
    dangerous = [r for r in result.results if r.status is Status.SKIP and r.dangerous]
    if dangerous:
        names = sorted({r.scenario for r in dangerous})
        out.print(f"  skipped {counted(len(dangerous), 'dangerous variant')} "
                  f"({', '.join(names)}): they can crash the CUDA context; pass --dangerous "
                  "to run them", highlight=False)
    for r in result.results:
        findings = r.finding_summary(1)
        if findings and not r.sweep:
            out.print(f"  {r.scenario} ({r.variant}): race detected in {r.detected}/"
                      f"{counted(r.trials, 'trial')}", highlight=False)
            print_finding(findings[0])
    for r in result.results:
        if r.reason and not r.sweep and r not in dangerous:
            out.print(f"  {r.scenario} ({r.variant}) {r.status.value}: {escape(r.reason)}",
                      highlight=False)
        first = r.first_manifested
        if first is not None and r.status is Status.FAIL:
            out.print(f"    first: trial {first.index} (seed {first.seed}) "
                      f"{first.outcome.value}: {escape(first.detail)}", highlight=False)
    incidents = [p for r in result.results for p in r.reports]
    if incidents:
        # Reports of reproductions that were expected are no incident to be alarmed by.
        expected = not any(r.status is Status.FAIL for r in result.results) and all(
            r.status is Status.PASS and r.expect != "clean" for r in result.results if r.reports)
        what = (f"reproduced as expected; {counted(len(incidents), 'report')} in {out_dir}"
                if expected else counted(len(incidents), "incident report"))
        out.print(f"  {what} (gpurace report list {out_dir}):", highlight=False)
        for path in incidents[:INCIDENTS_LISTED]:
            out.print(f"    {path}", highlight=False)
        if len(incidents) > INCIDENTS_LISTED:
            out.print(f"    and {len(incidents) - INCIDENTS_LISTED} more in {result.folder}",
                      highlight=False)
    if recorded:
        traces = sorted(Path(result.folder).glob("workers/*/trial-*.jsonl"))
        out.print(f"  --record kept {counted(len(traces), 'trial trace')}: "
                  f"{Path(result.folder) / 'workers'}/*/trial-*.jsonl (gpurace check FILE "
                  "reads one)", highlight=False, soft_wrap=True)
    for gap in result.watch_gaps:
        out.print(f"[bold yellow]xid watch:[/] {escape(gap)}", highlight=False)
    for fault in result.write_errors:
        times = f" ({fault.count} times)" if fault.count > 1 else ""
        out.print(f"[bold red]not written:[/] {escape(fault.what)}{times}: "
                  f"{escape(fault.path)}: {escape(fault.error)}", highlight=False)
    for retired in [] if result.stopped else result.retired:  # when all stopped, it says so
        out.print(f"[bold red]retired:[/] {escape(retired)}")
    if result.stopped:
        out.print(f"[bold red]stopped:[/] {escape(result.stopped)}")
    out.print(f"exit {int(result.exit_code)} ({result.exit_code.name.lower()}), "
              f"{result.wall_s:.1f} s", highlight=False)

"""`gpurace watch`: a user's own PyTorch or CuPy program run under capture, its races found,
and with --amplify, --sweep and --fails-when made to show.
"""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from harness.limits import DELAY_MAX_US, DISK_MAX_MB, TIMEOUT_MAX_S, TRIALS_MAX
from harness.results.hooks import RunHooks
from harness.results.outcome import TrialResult, VariantResult
from harness.results.watched import AmplifiedPlan, WatchedRun, WatchResult
from harness.run.outputs import check_file, check_folder, sweep_dead_runs
from harness.cli.app import main
from harness.cli.options import format_option, junit_option, out_option
from harness.cli.output import _log, print_finding, err, out
from harness.cli.runs import stop_on_sigterm, write_and_show
from harness.words import counted


@main.command("watch", context_settings={"ignore_unknown_options": True,
                                         "allow_interspersed_args": False})
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option("--runs", type=click.IntRange(min=1, max=TRIALS_MAX), default=1, show_default=True,
              help="Run the program this many times, each in a fresh process (a fixed program "
                   "must stay clean in every run).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1, max=TIMEOUT_MAX_S),
              default=600.0, show_default=True,
              help="Seconds a run of the program may take before it is killed (a hang).")
@click.option("--sources", type=click.Choice(["auto", "torch", "cupy", "torch,cupy"]),
              default="auto", show_default=True,
              help="What to capture with: PyTorch's dispatcher and trace callbacks, CuPy's "
                   "hooks, or each that the program's interpreter can import.")
@out_option("Folder for the run: run.json, the incidents, each run's events, op trace and "
            "output.")
@junit_option("Also write the run as JUnit XML here.")
@format_option("json: the run document on stdout (the program's own output then goes to "
               "stderr).")
@click.option("--amplify", "amplify", multiple=True, metavar="auto|FILE:LINE",
              help="Make the race show. auto: after the plain runs, run the program --trials "
                   "times for each racing pair they found, with a delay queued on the stream of "
                   "the pair's earlier op just before it. FILE:LINE (repeatable): delay every "
                   "op that line issues, in --trials runs and no plain ones.")
@click.option("--delay-us", type=click.FloatRange(min=0, min_open=True, max=DELAY_MAX_US),
              default=1000.0, show_default=True,
              help="Microseconds each delay holds its stream (with --amplify).")
@click.option("--trials", type=click.IntRange(min=1, max=TRIALS_MAX), default=20,
              show_default=True, help="Runs of the program with each amplified pair's delay, "
                                      "each in a fresh process.")
@click.option("--sweep", "sweep", is_flag=True,
              help="With --amplify: map each pair's race window, --trials runs at each delay of "
                   "--sweep-us; window.csv (and window.png, with matplotlib) go into the run's "
                   "folder, as `gpurace run --sweep` draws a scenario's.")
@click.option("--sweep-us", default="0,20,50,100,200,500,1000", show_default=True,
              metavar="US,US,...", help="The delays of --sweep, in microseconds (0: the program "
                                        "as it is); each pair's own planned delay is run too.")
@click.option("--fresh", is_flag=True,
              help="Start every run as a fresh interpreter. By default the runs after the "
                   "first fork from a process that has imported the framework the first used "
                   "(PyTorch's import is most of a short program's start), CUDA untouched.")
@click.option("--fails-when", metavar="REGEX",
              help="A run whose output (stdout or stderr) matches this regular expression "
                   "gave a wrong answer (corruption), whatever its exit status; otherwise a run "
                   "failed when it exited non-zero, raised, died or hung.")
@click.option("--disk-mb", type=click.IntRange(min=0, max=DISK_MAX_MB), default=4096,
              show_default=True, metavar="MB",
              help="About the most disk a run's events and op trace take (0: no limit). Past "
                   "it, the events already analysed are given back to the disk, the program "
                   "waits at its host waits while the watch is a quarter of it behind, and "
                   "the trace begins anew where no earlier access can race a later one (a host "
                   "wait for every stream), keeping the first parts that held a race. Each "
                   "watched child process's files have as much again. A soak of hours writes "
                   "tens of megabytes a second.")
def watch_cmd(command: Sequence[str], runs: int, timeout_s: float, sources: str,
              out_dir: Path, junit: Path | None, fmt: str, amplify: tuple[str, ...],
              delay_us: float, trials: int, sweep: bool, sweep_us: str, fresh: bool,
              fails_when: str | None, disk_mb: int) -> None:
    """Run your own PyTorch or CuPy program and find its stream races on the first run.

    \b
        gpurace watch -- python serve.py --requests 8
        gpurace watch --runs 20 -- python -m mypkg.serve
        gpurace watch --format json -- python tests/watch_programs/torch_record_stream.py
        gpurace watch -- torchrun --nproc-per-node 2 train.py
        gpurace watch --amplify auto --trials 50 -- python serve.py
        gpurace watch --amplify serve.py:41 --fails-when WRONG -- python serve.py

    The program runs as it would alone (its output, its exit status), in a process of its
    own, with capture on: every CUDA op's byte ranges on its stream, pinned host memory read
    and written by copies and by the host, the caching allocator's blocks across free and
    reuse (record_stream included), events, queries and synchronizes of each kind, and the
    legacy default stream. The race detector reads that as the program runs; each race is told
    in the program's words (both sides' file:line, the tensor, the streams) with the fix that
    fits, and written as an incident with its op trace (`gpurace check` reads it again).

    A race found is in the program's order whether or not its answers showed it. --amplify
    makes it show: a delay (a spin kernel) queued on one racing op's stream lets the other op
    go first, and the run document says, per racing pair, how many of --trials runs then
    failed, with the Wilson 95% interval.

    \b
    Exit 0: every run ended well with no race; 1: a race was found, or the program raised,
    exited non-zero, died or hung; 2: bad input; 3: the watch's own analysis failed part way
    (a fault of gpurace's: the program ran on, and the notes say where); 77: the program's
    interpreter has neither PyTorch nor CuPy.
    """
    from harness.capture.launch import parse_command
    from harness.capture.watch import WatchOptions, watch

    program = parse_command(command)
    auto, delays = _amplify_sites(amplify, delay_us)
    sweep_delays = _sweep_delays(sweep_us) if sweep else ()
    if sweep and not amplify:
        raise click.BadParameter("a sweep maps the window of a delayed op: give --amplify "
                                 "auto, or the line to delay (FILE:LINE)", param_hint="--sweep")
    if fails_when is not None:
        try:
            re.compile(fails_when)
        except re.error as exc:
            raise click.BadParameter(f"{fails_when!r} is not a regular expression ({exc})",
                                     param_hint="--fails-when") from None
    check_folder(out_dir, "--out")
    if junit is not None:
        check_file(junit, "--junit")
    sweep_dead_runs(out_dir)
    hooks = _WatchHooks(fmt == "text")
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        result = watch(WatchOptions(program=program, runs=runs, timeout_s=timeout_s,
                                    out_dir=out_dir, sources=sources,
                                    quiet_program=fmt == "json", amplify_auto=auto,
                                    delays=delays, delay_us=delay_us, trials=trials,
                                    fails_when=fails_when, sweep=sweep_delays,
                                    fresh=fresh, disk_mb=disk_mb), hooks)
    finally:
        signal.signal(signal.SIGTERM, previous)
    result = write_and_show(result, junit, fmt, show=_print_watch_summary)
    if result.interrupted:
        err.print(f"interrupted ({result.interrupted}): the program was stopped; "
                  f"{Path(result.folder) / 'run.json'} keeps the runs that finished",
                  highlight=False)
    sys.exit(int(result.exit_code))


def _amplify_sites(words: tuple[str, ...], delay_us: float) -> tuple[bool, tuple[Any, ...]]:
    """--amplify's words: auto, or the program's lines to delay (each a file that exists)."""
    from harness.capture.amplify import parse_site

    if "auto" in words:
        if len(words) > 1:
            raise click.BadParameter("auto plans the delays itself: give auto alone, or the "
                                     "lines to delay (FILE:LINE, repeated)",
                                     param_hint="--amplify")
        return True, ()
    delays = []
    for word in words:
        try:
            delay = parse_site(word, delay_us)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--amplify") from None
        if not Path(delay.path).is_file():
            raise click.BadParameter(f"{word}: no such file {delay.path!r} (give the path as "
                                     "a finding names the line, from this folder)",
                                     param_hint="--amplify")
        delays.append(delay)
    return False, tuple(delays)


def _sweep_delays(text: str) -> tuple[float, ...]:
    """--sweep-us: distinct delays in µs, ascending, each from 0 to the delay limit."""
    try:
        values = sorted({float(w) for w in text.split(",") if w.strip()})
    except ValueError:
        raise click.BadParameter(f"{text!r}: give microseconds separated by commas "
                                 "(0,50,200,1000)", param_hint="--sweep-us") from None
    if not values or values[0] < 0 or values[-1] > DELAY_MAX_US:
        raise click.BadParameter(f"{text!r}: each delay from 0 to {DELAY_MAX_US:g} µs",
                                 param_hint="--sweep-us")
    return tuple(values)


class _WatchHooks(RunHooks):
    """One line as each run of the watched program ends, and the notes as they come."""

    def __init__(self, text: bool) -> None:
        self.text = text

    def run_finished(self, result: VariantResult, trial: TrialResult, run: WatchedRun) -> None:
        if self.text:
            races = f", {counted(len(trial.findings), 'race')}" if trial.findings else ", no race"
            if run.analysis_error:  # what the analysis read before it failed is all it says
                races = (f", {counted(len(trial.findings), 'race')} before the analysis failed"
                         if trial.findings else ", races unknown: the analysis failed")
            which = f" {result.variant} ({result.delay_us:g} µs)" if result.amplified else ""
            _log(f"gpurace watch: run {trial.index + 1} of {result.scenario}{which}: "
                 f"{trial.outcome.value}{races}, {counted(trial.ops_total, 'op')}, "
                 f"{trial.duration_s:.2f} s")

    def note(self, text: str) -> None:
        if self.text:
            _log(f"gpurace watch: note: {text}")


def _print_watch_summary(result: WatchResult) -> None:
    plans = iter(result.amplified or ())  # in the amplified variants' order
    for variant in result.results:
        if variant.amplified:
            _print_amplified(variant, next(plans))
        else:
            _print_watched(result, variant)
    out.print(f"  run.json: {Path(result.folder) / 'run.json'}", highlight=False)
    out.print(f"exit {int(result.exit_code)} ({result.exit_code.name.lower()}), "
              f"{result.wall_s:.1f} s", highlight=False)


def _print_amplified(variant: VariantResult, plan: AmplifiedPlan) -> None:
    lo, hi = plan.interval
    delays = "; ".join(f"{d['us']:g} µs before {d['kind'] + ' at ' if d['kind'] else ''}"
                       f"{d['path']}:{d['line']}" for d in plan.delays)
    against = f" against {plan.second}" if plan.second else ""
    out.print(f"gpurace watch: {variant.variant}: {delays}{against}: failed "
              f"{plan.failed}/{plan.trials} (95% {lo:.2f}-{hi:.2f}), "
              f"{counted(plan.queued, 'delay')} queued, outcomes "
              + ", ".join(f"{k} {v}" for k, v in variant.outcomes().items() if v),
              highlight=False, soft_wrap=True)
    _print_first_and_incidents(variant)


def _print_first_and_incidents(variant: VariantResult) -> None:
    first = variant.first_manifested
    if first is not None:
        out.print(f"  run {first.index + 1}: {first.outcome.value}: {escape(first.detail)}",
                  highlight=False, soft_wrap=True)
    for path in variant.reports:
        out.print(f"  incident: {path}", highlight=False)


def _print_watched(result: WatchResult, variant: VariantResult) -> None:
    out.print(f"gpurace watch: {result.command}: {counted(variant.trials, 'run')}, "
              f"{variant.detected} with races, outcomes "
              + ", ".join(f"{k} {v}" for k, v in variant.outcomes().items() if v),
              highlight=False, soft_wrap=True)
    for f in variant.finding_summary():
        print_finding(f)
        out.print(f"    in {f['trials']} of {counted(variant.trials, 'run')}", highlight=False)
    _print_first_and_incidents(variant)

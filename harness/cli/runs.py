"""`gpurace run`, `gpurace replay` and `gpurace merge`: trials of scenarios and tickets, the
progress while they run, and the run's files and summary after.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import kvcore
from harness.errors import GpuBusyError, ScenarioError
from harness.limits import TRIALS_MAX
from harness.run.merge import merge_runs
from harness.run.replay import replay_scenario
from harness.lang.model import Scenario
from harness.gpu.probe import other_gpu_users
from harness.results.outcome import Status, TrialResult, VariantResult
from reports import render_junit, write_atomic
from harness.faults.writes import FOLDER_GONE, WriteFaults, fallback_folder
from harness.run.outputs import check_file, check_folder, sweep_dead_runs
from reports.window import Window, plot_png, render_terminal, sweep_window, trace_gaps
from harness.results.hooks import RunHooks
from harness.results.run import RunResult
from harness.results.watched import WatchResult
from harness.run.options import RunOptions
from harness.run.runner import Interrupted, Runner
from harness.lang.targets import resolve_targets
from harness.cli.app import main
from harness.cli.options import (PATH_OPTION, format_option, junit_option, run_options,
                                 shared_run_options)
from harness.cli.output import _echo, _log, print_summary, err, out
from harness.words import counted

Done = TypeVar("Done", RunResult, WatchResult)
"""What a command's run came to: a run of scenarios (run, replay, merge) or a watch."""


@main.command("run")
@click.argument("targets", nargs=-1, required=True)
@click.option("--trials", type=click.IntRange(min=1, max=TRIALS_MAX),
              help="Trials per variant (default: each scenario's own).")
@click.option("--variant", "variants", multiple=True,
              help="Run only this variant (repeatable), e.g. --variant buggy.")
@click.option("--sweep", is_flag=True,
              help="Map the race window: run each variant at every delay of its scenario's "
                   "amplify.sweep list (a map, so its points do not fail the run).")
@click.option("--schedule", help="Replay a schedule token from `gpurace explore` (sim): every "
                                  "trial runs that ordering of the unordered ops.")
@PATH_OPTION
@shared_run_options
def run_cmd(targets: Sequence[str], trials: int | None, variants: Sequence[str], sweep: bool,
            schedule: str | None, paths: Sequence[Path], **shared: Any) -> None:
    """Run scenarios: TARGETS are scenario files, folders of them, suite files, or names
    (`gpurace run smoke`, `gpurace run cross-stream-race --dangerous`, `gpurace run zoo
    --dangerous`). Names are looked up in the working tree, --path and GPURACE_PATH folders,
    then the built-in scenarios (`gpurace list`)."""
    options, how = run_options(shared, trials=trials, variants=tuple(variants), sweep=sweep,
                               schedule=schedule)
    scenarios = resolve_targets(targets, tuple(paths))
    check_variants(scenarios, variants)
    _execute(scenarios, options, **how)


def _execute(scenarios: Sequence[Scenario], options: RunOptions, *, insist: bool,
             command: str = "run",
             junit: Path | None, fmt: str) -> None:
    """Run, write run.json (and JUnit), print, and exit with the run's code: run and replay."""
    out_dir = options.out_dir or Path("gpurace-reports")
    # Before anything runs: a run that cannot write its results should not start.
    check_folder(out_dir, "--out")
    if junit is not None:
        check_file(junit, "--junit")
    runner = Runner(options, None)
    if runner.backend == "cuda" and options.dangerous and any(s.dangerous for s in scenarios):
        _refuse_busy_gpu(insist, [gpu for _, gpu in runner.lanes])
    sweep_dead_runs(out_dir)  # what killed earlier runs left half-written, and only that
    hooks = _ProgressHooks(fmt == "text" and err.is_terminal,
                           every_s=float(os.environ.get("GPURACE_PROGRESS_S", "30")))
    runner.hooks = hooks
    # SIGTERM stops the run as Ctrl-C does: what finished is written, the workers die.
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        with hooks:
            result = runner.run(scenarios)
    finally:
        signal.signal(signal.SIGTERM, previous)
    result = write_and_show(result, junit, fmt, show=lambda r: print_summary(
        r, Path(r.folder), recorded=options.record, command=command))
    if result.interrupted:
        done = sum(r.trials for r in result.results)
        err.print(f"interrupted ({result.interrupted}): {Path(result.folder) / 'run.json'} "
                  f"keeps the {counted(done, 'trial')} that finished", highlight=False)
    sys.exit(int(result.exit_code))


def write_and_show(result: Done, junit: Path | None, fmt: str,
                   show: Callable[[Done], None] | None = None) -> Done:
    """Write the run's run.json (and JUnit) in its folder, and print it (``show``: the
    summary; a table of variants by default): run, replay, merge, watch. Returns the result
    with the files this lost added to its own, whose exit code the command exits with."""
    faults = WriteFaults(note=lambda text: err.print(f"[yellow]note:[/] {escape(text)}",
                                                     highlight=False), ended=True)
    lost = list(result.write_errors)

    def document() -> dict[str, Any]:
        nonlocal result
        result = result.with_write_errors(lost + faults.records)  # the run's, then its own
        doc = result.to_json()
        if window.points:
            doc["window"] = window.to_json()
        return doc

    folder = Path(result.folder)
    results = [r.to_json() for r in result.results]
    window = sweep_window(results, trace_gaps(results))
    picture = None
    if window.points:
        try:
            write_atomic(folder / "window.csv", window.csv())
            picture = _plot_window(window, folder / "window.png")
        except OSError as exc:
            faults.failed("the race window", folder / "window.csv", exc)
    if junit is not None:
        try:
            junit.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(junit, render_junit(document()))
        except OSError as exc:
            faults.failed("the JUnit file", junit, exc)
    # run.json last, so that it lists what else was lost; into the run's folder, else a
    # folder of its own under the system's temp folder.
    written = None
    # A run folder that was removed is not made again: the run's other files are not there.
    gone = not folder.is_dir() or any(f.what == FOLDER_GONE for f in lost)
    if gone and not any(f.what == FOLDER_GONE for f in lost):
        faults.failed(FOLDER_GONE, folder, "removed while the run ran")
    for place in [fallback_folder(result.run_id or "run")] if gone else [
            folder, fallback_folder(result.run_id or "run")]:
        try:
            write_atomic(place / "run.json", json.dumps(document(), indent=2) + "\n")
            written = place / "run.json"
            break
        except OSError as exc:
            faults.failed("run.json", place / "run.json", exc)
    if written is not None and written.parent != folder:
        err.print(f"[yellow]note:[/] run.json is at {escape(str(written))}, not in the run's "
                  "folder", highlight=False)
    final = document()
    if fmt == "json":
        _echo(json.dumps(final, indent=2))
    else:
        if show is not None:
            show(result)
        else:
            assert isinstance(result, RunResult)  # a watch brings its own summary
            print_summary(result, Path(result.folder))
        if window.points:
            out.print("\nThe race window (manifested against the injected delay):\n"
                      + escape(render_terminal(window)), highlight=False)
            out.print(escape(f"  {Path(result.folder) / 'window.csv'}" + (
                f", {picture}" if picture else " (pip install 'gpurace[plot]' for window.png)")),
                highlight=False)
    return result


def _plot_window(window: Window, path: Path) -> Path | None:
    """window.png, where matplotlib is installed."""
    try:
        plot_png(window, path)
    except ImportError:
        return None
    return path


def stop_on_sigterm(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@main.command("merge")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Folder for the merged run.json.")
@junit_option("Also write the merged run as JUnit XML here.")
@format_option("json: the merged gpurace.run/1 document on stdout.")
def merge_cmd(runs: Sequence[Path], out_dir: Path, junit: Path | None, fmt: str) -> None:
    """Merge the run.json files of a sharded run (`gpurace run ... --shard K/N`, K = 1..N,
    each its own machine or array task) into the one run they add up to: the same counts,
    rates, intervals and digests one run of all the trials gives, and its exit code (0 every
    expectation met, 1 one failed). Shards of different gpurace versions, seeds, backends,
    options or scenario contents are refused (exit 2).

    \b
    gpurace run zoo --shard 1/3 --out shards/1     (and 2/3, 3/3 elsewhere)
    gpurace merge shards/*/run-*/run.json --out merged --junit merged/junit.xml
    """
    check_folder(out_dir, "--out")
    if junit is not None:
        check_file(junit, "--junit")
    result = merge_runs(runs, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = write_and_show(result, junit, fmt)
    sys.exit(int(result.exit_code))


@main.command("replay")
@click.argument("ticket", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--defect", "defects", multiple=True,
              type=click.Choice(list(kvcore.Defects.names())),
              help="Switch on one of kvcore's known bugs (repeatable), named for the pool "
                   "setting it breaks: publish_on_legacy_stream (publishes go to the legacy "
                   "stream: ninfer #210), release_fence (a release without a fence), "
                   "table_shadow_wait (a publish rewrites the pinned shadow without waiting). "
                   "Needs --dangerous.")
@click.option("--trials", type=click.IntRange(min=1, max=TRIALS_MAX), default=1,
              show_default=True, help="How many times to replay the whole ticket.")
@shared_run_options
def replay_cmd(ticket: Path, defects: Sequence[str], trials: int, **shared: Any) -> None:
    """Replay a recorded ticket (a gpurace.ticket/1 request trace) against the pool: its lanes
    run like an engine's batch slots, each conversation's pages stay retained and are
    re-activated every turn. With --defect publish_on_legacy_stream, ninfer-210 crashes."""
    scenario = replay_scenario(ticket, tuple(defects))
    options, how = run_options(shared, trials=trials)
    _execute([scenario], options, command="replay", **how)


def check_variants(scenarios: Sequence[Scenario], wanted: Sequence[str]) -> None:
    known = {v.name for s in scenarios for v in s.variants}
    unknown = [v for v in wanted if v not in known]
    if unknown:
        raise ScenarioError("--variant", f"no variant {', '.join(unknown)} in these scenarios; "
                                         f"they have {', '.join(sorted(known))}")


def _refuse_busy_gpu(insist: bool, lanes: Sequence[str | None]) -> None:
    """Refuse dangerous work on a GPU (each lane's) that other processes use, unless told."""
    pids: list[int] = []
    for visible in lanes:
        users, note = other_gpu_users(visible)
        pids += users
        if note:
            err.print(f"[yellow]note:[/] could not check for other GPU users ({note})")
    pids = sorted(set(pids))
    if pids and not insist:
        raise GpuBusyError(f"processes {', '.join(map(str, pids))} are using the GPU; a "
                           "dangerous trial may crash their work. Pass --insist if they are "
                           "yours.")


class _ProgressHooks(RunHooks):
    """Progress while a run runs. On a terminal, a bar per variant with live outcome counts.
    Elsewhere (a CI log), lines: one as each variant starts and ends, and one every
    ``every_s`` seconds on a long variant (trials done, outcome counts, rate), so a 40-minute
    soak is not silent."""

    def __init__(self, live: bool, *, every_s: float = 30.0) -> None:
        self.live = live
        self.every_s = every_s
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                                 transient=False, disable=not live)
        self.task = None
        self.planned = 0
        self.started = self.said = 0.0

    def __enter__(self) -> _ProgressHooks:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)  # type: ignore[arg-type]

    def variant_started(self, result: VariantResult, trials: int) -> None:
        self.planned, self.started = trials, time.monotonic()
        self.said = self.started
        if self.live:
            self.task = self.progress.add_task(self._label(result), total=trials)
        else:
            _log(f"start {result.scenario} ({result.variant}): {counted(trials, 'trial')}")

    def trial_finished(self, result: VariantResult, trial: TrialResult) -> None:
        if self.live:
            if self.task is not None:
                self.progress.update(self.task, advance=1, description=self._label(result))
            return
        now = time.monotonic()
        if now - self.said >= self.every_s:
            self.said = now
            rate = result.trials / max(now - self.started, 1e-9)
            _log(f"  {result.scenario} ({result.variant}): {result.trials}/"
                 f"{counted(self.planned, 'trial')}, {self._counts(result)}, "
                 f"{rate:.1f} trials/s")

    def variant_finished(self, result: VariantResult) -> None:
        if not self.live and result.status is Status.SKIP:
            _log(f"skip {result.scenario} ({result.variant}): {result.reason}")
        elif not self.live:
            took = time.monotonic() - self.started if result.trials else 0.0
            _log(f"done {result.scenario} ({result.variant}): {result.status.value}, "
                 f"{counted(result.trials, 'trial')} ({self._counts(result)}), "
                 f"{took:.1f} s")

    def note(self, text: str) -> None:
        err.print(f"[yellow]note:[/] {escape(text)}", highlight=False)

    @staticmethod
    def _counts(result: VariantResult) -> str:
        return ", ".join(f"{k} {v}" for k, v in result.outcomes().items() if v) or "none ran"

    @classmethod
    def _label(cls, result: VariantResult) -> str:
        return f"{result.scenario} ({result.variant}) {cls._counts(result)}"

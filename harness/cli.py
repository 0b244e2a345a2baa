"""The gpurace command line: the only module that parses argv or prints.

    gpurace list                         what scenarios and suites there are
    gpurace run smoke                    the safe suite on the best backend here
    gpurace run scenarios/ --dangerous   every scenario, dangerous ones too (GPU you may crash)
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import click
from rich import box
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import kvcore
from harness.errors import GpuBusyError, HarnessError, ScenarioError, TargetError
from harness import schemas, vocabulary
from harness.limits import (
    DELAY_MAX_US,
    GPUS_MAX,
    RUN_MAX_BYTES,
    SHARDS_MAX,
    SPARES_MAX,
    TIMEOUT_MAX_S,
    TRIALS_MAX,
)
from harness.detector import check_trace
from harness.doctor import diagnose
from harness.inputs import Unreadable, read_input
from harness.explore import Strategy, explore
from harness.traces.optrace import load_trace
from harness.merge import merge_runs
from harness.minimize import minimize, write_minimized
from harness.replay import replay_scenario

from harness.model import Scenario, Suite
from harness.gpu.probe import other_gpu_users
from harness.outcome import Status, TrialResult, VariantResult
from reports import (
    ReportError,
    list_incidents,
    load_report,
    percent_interval,
    render_junit,
    render_markdown,
    write_atomic,
)
from harness.faults.writes import FOLDER_GONE, WriteFaults, fallback_folder
from harness.outputs import check_file, check_folder, sweep_dead_runs
from reports.timeline import chrome_trace, svg_timeline
from reports.window import Window, plot_png, render_terminal, sweep_window, trace_gaps
from harness.runner import (
    ExitCode,
    Interrupted,
    RunHooks,
    RunOptions,
    RunResult,
    Runner,
)
from harness.targets import PATH_VARIABLE, catalog, resolve_targets, shown_target



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


_OUTPUT = _Output()


def _echo(text: str, nl: bool = True) -> None:
    """``click.echo`` through :data:`_OUTPUT`."""
    _OUTPUT.write(text + ("\n" if nl else ""))
    _OUTPUT.flush()


def _console(stream: TextIO | _Output) -> Console:
    """A console for ``stream``. Piped into a CI log or a file, rich would assume 80 columns,
    truncate the results table's headers and wrap every finding; logs are wide, so there a
    line keeps its width unless COLUMNS says otherwise."""
    wide = not stream.isatty() and "COLUMNS" not in os.environ
    # No emoji codes: a message's "file:100:3" must not print as "file💯3". In a log a line is
    # never wrapped (soft wrap): a wrap at 160 columns cut words and paths in two.
    return Console(stderr=stream is sys.stderr, file=stream if stream is _OUTPUT else None,
                   width=160 if wide else None, emoji=False, soft_wrap=wide)


err = _console(sys.stderr)
out = _console(_OUTPUT)

LIST_SCHEMA = "gpurace.list/1"
CHECK_SCHEMA = "gpurace.check/1"

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


class _Commands(click.Group):
    """The command group: the one place an error of gpurace's own (a bad scenario or trace,
    a device that cannot run, a report that cannot be read) becomes a message and an exit
    code instead of a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (HarnessError, kvcore.KVCoreError, ReportError) as exc:
            _fail(exc)
        except BrokenPipeError:  # output click wrote itself (help) to a closed pipe
            _OUTPUT.close()
            sys.exit(128 + signal.SIGPIPE)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpurace")
def main() -> None:
    """gpurace: reproduce, detect and report GPU races in a paged KV page pool.

    Scenarios are YAML files (scenarios/*.yaml, the zoo of real bugs in scenarios/zoo/); each
    has variants (the buggy way and the fixed way: kvcore's defects switched, or steps that
    run in some variants only) and states what each must do: stay clean, or reproduce the
    race. A delay queued on the producer stream (amplification) makes a race that hides for
    50 requests show on the first trial; a happens-before detector finds it even when it does
    not show. `gpurace steps` lists what a scenario's steps can say.

    \b
    Exit codes: 0 every expectation met, 1 an expectation failed, 2 usage error or invalid
    input, 3 internal error, 77 nothing could run here, 130 stopped by Ctrl-C, 143 stopped
    by SIGTERM (what finished is kept).
    """


class _ShardType(click.ParamType):
    """``K/N``: the K-th of N parts of a run's trials (1 <= K <= N)."""

    name = "K/N"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, int]:
        if isinstance(value, tuple):
            return value
        k, slash, n = str(value).partition("/")
        if slash and k.strip().isdigit() and n.strip().isdigit() \
                and 1 <= int(k) <= int(n) <= SHARDS_MAX:
            return int(k), int(n)
        self.fail(f"{value!r} is not K/N with 1 <= K <= N <= {SHARDS_MAX}: for the first of "
                  "three shards, say 1/3", param, ctx)


class _GpusType(click.ParamType):
    """``all``, a count ``N``, or ordinals ``0,2``."""

    name = "all|N|I,J"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        text = str(value).strip()
        if text == "all":
            return text
        parts = text.split(",")
        if all(p.strip().isdigit() for p in parts):
            numbers = [int(p) for p in parts]
            if len(parts) == 1 and 1 <= numbers[0] <= GPUS_MAX:
                return str(numbers[0])
            if len(parts) > 1 and len(set(numbers)) == len(numbers) \
                    and max(numbers) < GPUS_MAX:
                return ",".join(map(str, numbers))
        self.fail(f"{value!r}: say all, a count from 1 to {GPUS_MAX}, or GPU numbers such as "
                  "0,2 (each once)", param, ctx)


_SHARED_RUN_OPTIONS = [
    click.option("--dangerous", is_flag=True,
                 help="Run what may crash the CUDA context (dangerous scenarios, a replay with "
                      "a defect): it crashes a worker process, and the GPU and this process "
                      "survive. Without it, those are skipped."),
    click.option("--insist", is_flag=True,
                 help="Run dangerous work even while other processes use the GPU."),
    click.option("--backend", type=click.Choice(list(kvcore.device.BACKENDS)), default="auto",
                 show_default=True, help="cuda: the GPU through CuPy; sim: the simulated "
                                         "device; auto: the GPU when one is usable."),
    click.option("--seed", type=int, default=0, show_default=True,
                 help="Seed of the one RNG all trial seeds come from; the same seed replays."),
    click.option("--amplify/--no-amplify", default=True, show_default=True,
                 help="Queue the scenario's delay before the step under test (for a replay: "
                      "on the legacy stream before each activation, where #210's publish "
                      "went)."),
    click.option("--delay-us", type=click.FloatRange(min=0, max=DELAY_MAX_US),
                 help="Override the amplifying delay (microseconds)."),
    click.option("--detect/--no-detect", default=True, show_default=True,
                 help="Run the race detector in every trial: it finds unordered conflicting "
                      "accesses whether or not the race manifested."),
    click.option("--trial", "trial", type=click.IntRange(min=0, max=TRIALS_MAX - 1),
                 help="Run only this trial index, with the seed it had in the full run: what "
                      "an incident's reproduce command uses."),
    click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1, max=TIMEOUT_MAX_S),
                 help="Seconds a trial may take before the watchdog kills its worker (default: "
                      "the scenario's own; 120 for a replay)."),
    click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
                 default=Path("gpurace-reports"), show_default=True,
                 help="Folder for the run: each run writes run.json, its incidents and its "
                      "workers' logs into a folder of its own below it."),
    click.option("--junit", "junit", type=click.Path(dir_okay=False, path_type=Path),
                 help="Also write JUnit XML here: a testcase per scenario variant."),
    click.option("--poison", is_flag=True,
                 help="Fill every released page with a poison byte as soon as the pool's "
                      "ordering allows: a stale reader sees poison, not plausible data. A "
                      "correct pool never shows it; without its release fence it lands at once."),
    click.option("--timeline", is_flag=True,
                 help="On the GPU, time every stream op with CUDA events, so an incident's "
                      "timeline.json shows when each op ran on the device, not only where the "
                      "host issued it. It costs trial rate; a trial that crashed its context "
                      "keeps issue times. The simulated device times its ops anyway."),
    click.option("--reissue/--no-reissue", default=True, show_default=True,
                 help="On the GPU, once a trial of a step-list scenario ends clean, capture its "
                      "device calls and issue them again in later trials, as an engine replays "
                      "a captured graph: the same copies, launches, waits and checks, without "
                      "the harness's bookkeeping between them (a trial costs less than half). "
                      "--no-reissue runs every trial step by step."),
    click.option("--record", is_flag=True,
                 help="Keep every trial's op trace (JSON Lines), not only the traces of the "
                      "incidents kept; `gpurace check` reads them."),
    click.option("--max-incidents", type=click.IntRange(min=0), default=3, show_default=True,
                 help="Incident folders written per variant; further bad trials are counted."),
    click.option("--stop-on-write-error", is_flag=True,
                 help="Stop the run at the first file it cannot write (a full disk, a quota, "
                      "a read-only file system), keeping the trials that finished. Without "
                      "it the run says once what it could not write and goes on counting "
                      "trials. Either way it exits 4 and run.json's write_errors says what "
                      "was lost; a run whose folder is removed stops at once."),
    click.option("--spares", type=click.IntRange(min=0, max=SPARES_MAX),
                 help="Once a variant's workers start dying (a CUDA fault kills its worker), "
                      "keep this many spare workers made and waiting, so a crash costs a "
                      "hand-over rather than a worker start; 0 starts each worker when needed. "
                      "Default: 4 on the simulated device, 0 on a GPU, where each spare is a "
                      "CUDA context alive while a crashed one is torn down: fast crash soaks "
                      "with spares twice left an H200 needing a reset (Xid 119). Use them on "
                      "GPUs you can reset."),
    click.option("--gpus", type=_GpusType(),
                 help="Run on several GPUs at once: all, the first N, or those numbered (0,2). "
                      "Each gets its own workers (pinned with CUDA_VISIBLE_DEVICES) and takes "
                      "the next trials when it is free; Xids are told apart by GPU, and one "
                      "that reports a fatal Xid is retired while the others go on (exit 1). "
                      "On the simulated device: N devices side by side. Default: one GPU."),
    click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
                 show_default=True,
                 help="ray: every worker is a Ray actor asking for one GPU (install "
                      "gpurace[ray]); results, incidents and exit codes are a local run's. "
                      "--gpus N runs N actors side by side."),
    click.option("--address",
                 help="With --executor ray: the cluster to join (ray://host:10001, or auto); "
                      "without it a local Ray instance starts. --out must be on storage the "
                      "cluster's nodes share."),
    click.option("--shard", type=_ShardType(),
                 help="Run only the K-th of N parts of the trials (K/N, e.g. 2/3), with the "
                      "seeds the whole run gives them: N machines or array tasks with the same "
                      "command but for K run together exactly what one run would, and "
                      "`gpurace merge` makes their run.json files one."),
    click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
                 show_default=True, help="json: one gpurace.run/1 document on stdout."),
]


def _shared_run_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options `run` and `replay` share, declared once."""
    for option in reversed(_SHARED_RUN_OPTIONS):
        command = option(command)
    return command


def _run_options(shared: dict[str, Any], **own: Any) -> tuple[RunOptions, dict[str, Any]]:
    """RunOptions from the shared options and a command's own; and what _execute takes."""
    how = {k: shared.pop(k) for k in ("insist", "junit", "fmt")}
    if shared.get("shard") and shared.get("trial") is not None:
        raise click.UsageError("--trial runs one trial of the whole run; it takes no --shard")
    if shared.get("address") and shared.get("executor") != "ray":
        raise click.UsageError("--address names a Ray cluster: add --executor ray")
    return RunOptions(**shared, **own), how


_PATH_OPTION = click.option(
    "--path", "paths", multiple=True, type=click.Path(file_okay=False, path_type=Path),
    help="A folder of scenarios to look names up in (repeatable), after the working tree and "
         f"before the built-in ones; {PATH_VARIABLE} (':'-separated) adds more.")


@main.command("list")
@_PATH_OPTION
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def list_cmd(paths: Sequence[Path], fmt: str) -> None:
    """List the scenarios and suites gpurace knows: the built-in ones, and those of --path and
    GPURACE_PATH folders (run them by name). Files that do not load are listed with their
    error, and make the exit code 2."""
    listed = catalog(tuple(paths))
    if fmt == "json":
        _echo(json.dumps({"schema": LIST_SCHEMA,
                          "documents": [_describe(d) for d in listed.documents],
                          "broken": [{"path": str(p), "error": e}
                                     for p, e in listed.broken]}, indent=2))
    else:
        table = Table(title="scenarios and suites", show_lines=False)
        for column in ("name", "kind", "dangerous", "variants", "description"):
            table.add_column(column, overflow="fold")
        for doc in listed.documents:
            d = _describe(doc)
            table.add_row(d["name"], d["kind"], "yes" if d.get("dangerous") else "",
                          ", ".join(d.get("variants", [])), d["description"])
        out.print(table)
        for path, error in listed.broken:
            err.print(f"[bold red]cannot load[/] {escape(str(path))}: {escape(error)}",
                      highlight=False, soft_wrap=True)
    if listed.broken:
        sys.exit(int(ExitCode.USAGE))


@main.command("schema")
@click.argument("name", required=False)
def schema_cmd(name: str | None) -> None:
    """Print the JSON Schema (draft 2020-12) of a document gpurace writes or reads: run,
    report, trace-record, ticket-record, list, check, explore, or scenario (scenario and suite
    YAML, for editors: point yaml-language-server at it). Without NAME, list the names."""
    if name is None:
        _echo("\n".join(schemas.names()))
        return
    if name not in schemas.names():
        raise TargetError(f"no schema {name!r}; gpurace has {', '.join(schemas.names())}")
    _echo(schemas.text(name), nl=False)


@main.command("steps")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def steps_cmd(fmt: str) -> None:
    """The step vocabulary of scenario files: every op, its keys (required ones marked *), and
    what it does. Any step may also carry `id`, `only` or `unless` (a variant name or a list)
    to run in some variants only, and `thread` (a host thread's name: consecutive steps with a
    thread run as concurrent threads)."""
    ops = {op: {"keys": {k: {"holds": vocabulary.IN_WORDS[key.holds], "required": key.required}
                         for k, key in spec.keys.items()}, "does": spec.doc}
           for op, spec in vocabulary.OPS.items()}
    if fmt == "json":
        _echo(json.dumps(ops, indent=2))
        return
    table = Table(title="scenario steps", box=box.SIMPLE_HEAD)
    for column in ("op", "keys", "what it does"):
        table.add_column(column)
    for op, spec in ops.items():
        keys = ", ".join(f"{k}{'*' if v['required'] else ''}: {v['holds']}"
                         for k, v in spec["keys"].items())
        table.add_row(op, keys or "-", spec["does"])
    out.print(table)


def _describe(doc: Scenario | Suite) -> dict:
    if isinstance(doc, Suite):
        return {"name": doc.name, "kind": "suite", "path": str(doc.path),
                "description": doc.description,
                "scenarios": [str(p) for p in doc.scenarios]}
    return {"name": doc.name, "kind": "scenario", "path": str(doc.path),
            "description": doc.description, "dangerous": doc.dangerous,
            "variants": [v.name for v in doc.variants]}


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
@_PATH_OPTION
@_shared_run_options
def run_cmd(targets: Sequence[str], trials: int | None, variants: Sequence[str], sweep: bool,
            schedule: str | None, paths: Sequence[Path], **shared: Any) -> None:
    """Run scenarios: TARGETS are scenario files, folders of them, suite files, or names
    (`gpurace run smoke`, `gpurace run cross-stream-race --dangerous`, `gpurace run zoo
    --dangerous`). Names are looked up in the working tree, --path and GPURACE_PATH folders,
    then the built-in scenarios (`gpurace list`)."""
    options, how = _run_options(shared, trials=trials, variants=tuple(variants), sweep=sweep,
                                schedule=schedule)
    scenarios = resolve_targets(targets, tuple(paths))
    _check_variants(scenarios, variants)
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
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        with hooks:
            result = runner.run(scenarios)
    finally:
        signal.signal(signal.SIGTERM, previous)
    _write_and_show(result, junit, fmt, show=lambda r: _print_summary(
        r, Path(r.folder), recorded=options.record, command=command))
    if result.interrupted:
        done = sum(r.trials for r in result.results)
        err.print(f"interrupted ({result.interrupted}): {Path(result.folder) / 'run.json'} "
                  f"keeps the {done} trials that finished", highlight=False)
    sys.exit(int(result.exit_code))


def _write_and_show(result: RunResult, junit: Path | None, fmt: str,
                    show: Callable[[RunResult], None] | None = None) -> None:
    """Write the run's run.json (and JUnit) in its folder, and print it (``show``: the
    summary; a table of variants by default): run, replay, merge, watch."""
    faults = WriteFaults(note=lambda text: err.print(f"[yellow]note:[/] {escape(text)}",
                                                     highlight=False), ended=True)
    lost = list(result.write_errors)

    def document() -> dict[str, Any]:
        result.write_errors = lost + faults.records  # the run's, then its own files'
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
            _print_summary(result, Path(result.folder))
        if window.points:
            out.print("\nThe race window (manifested against the injected delay):\n"
                      + escape(render_terminal(window)), highlight=False)
            out.print(escape(f"  {Path(result.folder) / 'window.csv'}" + (
                f", {picture}" if picture else " (pip install 'gpurace[plot]' for window.png)")),
                highlight=False)


def _plot_window(window: Window, path: Path) -> Path | None:
    """window.png, where matplotlib is installed."""
    try:
        plot_png(window, path)
    except ImportError:
        return None
    return path


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@main.command("merge")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Folder for the merged run.json.")
@click.option("--junit", "junit", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the merged run as JUnit XML here.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: the merged gpurace.run/1 document on stdout.")
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
    _write_and_show(result, junit, fmt)
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
@_shared_run_options
def replay_cmd(ticket: Path, defects: Sequence[str], trials: int, **shared: Any) -> None:
    """Replay a recorded ticket (a gpurace.ticket/1 request trace) against the pool: its lanes
    run like an engine's batch slots, each conversation's pages stay retained and are
    re-activated every turn. With --defect publish_on_legacy_stream, ninfer-210 crashes."""
    scenario = replay_scenario(ticket, tuple(defects))
    options, how = _run_options(shared, trials=trials)
    _execute([scenario], options, command="replay", **how)


def _check_variants(scenarios: Sequence[Scenario], wanted: Sequence[str]) -> None:
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


@main.group("report")
def report_group() -> None:
    """Incident reports: list them, show one; a sweep's race window as a picture."""


@report_group.command("window")
@click.argument("run", type=click.Path(exists=True, path_type=Path))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the PNG.")
def report_window(run: Path, output: Path) -> None:
    """Draw the race window of a `--sweep` run (its run.json, or its folder) as a PNG: the
    rate against the injected delay per variant, with Wilson 95% intervals and the measured
    interpreter gap, as `run --sweep` draws it where matplotlib is installed. For a sweep made
    on a machine without it (pip install 'gpurace[plot]' here)."""
    check_file(output, "--output")
    path = run / "run.json" if run.is_dir() else run
    try:
        # Through the one reader, as merge reads run documents: a pipe, a device or an
        # oversized file is refused before it is read.
        document = json.loads(read_input(path, RUN_MAX_BYTES, "a run document"))
        saved = document.get("window") or {}
        gaps = {k: [float(v)] for k, v in (saved.get("interpreter_gap_us") or {}).items()}
        window = sweep_window(document["results"], gaps or trace_gaps(document["results"]))
    except (Unreadable, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ReportError(f"{path}: not a gpurace run document ({exc}); pass a run's "
                          "run.json or folder") from None
    if not window.points:
        raise ReportError(f"{path}: no sweep in this run; run it with `gpurace run --sweep`")
    try:
        plot_png(window, output)
    except ImportError:
        raise ReportError("matplotlib is not installed: pip install 'gpurace[plot]'") from None
    out.print(f"{output}: {len(window.curves())} curve(s), {len(window.points)} points",
              highlight=False)


@report_group.command("list")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path),
                default=Path("gpurace-reports"))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def report_list(folder: Path, fmt: str) -> None:
    """List the incidents under FOLDER (a run's --out, default gpurace-reports)."""
    if not folder.is_dir():
        raise ReportError(f"{folder}: no such folder; pass a run's --out folder")
    items = list_incidents(folder)
    if fmt == "json":
        _echo(json.dumps(items, indent=2))
        return
    if not items:
        out.print(f"no incidents under {folder}")
        return
    for item in items:
        if "error" in item:
            out.print(f"[red]unreadable[/] {escape(str(item['path']))}: {escape(item['error'])}")
            continue
        xids = ", ".join(f"Xid {x}" for x in item.get("xids") or []) or "no Xids"
        out.print(f"{item['path']}\n    {item.get('created', '')}  {item.get('scenario')} "
                  f"({item.get('variant')}) trial {item.get('trial')}: {item.get('outcome')}"
                  f" {item.get('cuda_error') or ''} ({xids})", highlight=False)


@report_group.command("show")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown",
              show_default=True)
def report_show(path: Path, fmt: str) -> None:
    """Show one incident (its folder or its report.json): what to paste into a ticket."""
    report = load_report(path)
    if fmt == "json":
        _echo(json.dumps(report, indent=2))
    elif out.is_terminal:
        out.print(Markdown(render_markdown(report)))
    else:
        _echo(render_markdown(report))


@main.command("explore")
@click.argument("target")
@click.option("--variant", "variants", multiple=True, help="Explore only this variant.")
@click.option("--strategy", type=click.Choice([s.value for s in Strategy]),
              default="exhaustive", show_default=True,
              help="exhaustive: every set of at most --bound choices (a held-back op, or a "
                   "switch of host threads); random: each op held back with probability 1/n, "
                   "each thread decision switched with probability 1/d; pct: --depth random "
                   "choices.")
# Exhaustive exploration tries every set of up to --bound ops: C(n, 4) is already 10^6 for
# 80 ops, so larger bounds are pct's job.
@click.option("--bound", type=click.IntRange(min=1, max=4), default=2, show_default=True)
@click.option("--depth", type=click.IntRange(min=1, max=16), default=1, show_default=True)
@click.option("--runs", type=click.IntRange(min=1, max=1_000_000), default=200,
              show_default=True,
              help="Schedules to try with random and pct.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--first", is_flag=True, help="Stop at the first failing schedule.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def explore_cmd(target: str, variants: Sequence[str], strategy: str, bound: int, depth: int,
                runs: int, seed: int, first: bool, fmt: str) -> None:
    """Explore orderings of a scenario's unordered ops, and interleavings of its host threads,
    on the simulated device. Each failing schedule is printed as a token (s1-3.7: ops 3 and 7
    held back; ~2.1: at thread decision 2, switch to thread 1) that `gpurace run TARGET
    --backend sim --schedule TOKEN` replays exactly. Exit 0 when every variant did what it
    expects (a buggy one fails in some schedule, a fixed one in none), 1 otherwise."""
    scenarios = resolve_targets([target])
    _check_variants(scenarios, variants)
    found = []
    for scenario in scenarios:
        for variant in scenario.variants:
            if not variants or variant.name in variants:
                found.append((scenario, variant, explore(
                    scenario, variant, Strategy(strategy), bound=bound, depth=depth,
                    runs=runs, seed=seed, first=first)))
    met = all(bool(e.failing) == (v.expect != "clean") for _, v, e in found)
    if fmt == "json":
        _echo(json.dumps({"schema": "gpurace.explore/1", "met": met,
                          "results": [e.to_json() for _, _, e in found]}, indent=2))
    else:
        for scenario, variant, e in found:
            verdict = "as expected" if bool(e.failing) == (variant.expect != "clean") \
                else "[bold red]NOT as expected[/]"
            threads = f" and {e.decisions} thread decisions" if e.decisions else ""
            out.print(f"{e.scenario} ({e.variant}, expects {variant.expect}): {e.tried} "
                      f"schedules over {e.ops} ops{threads}, {len(e.failing)} failing; "
                      f"{e.stop.value}; {verdict}")
            # Random and PCT runs meet one failing schedule many times: each is listed once.
            seen: dict[str, list[Any]] = {}
            for t in e.failing:
                seen.setdefault(t.token, [t, 0])[1] += 1
            for t, times in list(seen.values())[:10]:
                again = f" ({times} runs)" if times > 1 else ""
                out.print(f"  {t.token}{again}  {t.outcome.value}: {escape(t.detail)}",
                          highlight=False)
            if len(seen) > 10:
                out.print(f"  and {len(seen) - 10} more failing schedules (--format json "
                          "lists them)", highlight=False)
            if e.failing:
                dangerous = " --dangerous" if scenario.dangerous else ""
                out.print(f"  replay: gpurace run {shown_target(scenario.path, scenario.name)}"
                          " --backend sim --variant "
                          f"{variant.name}{dangerous} --schedule {e.failing[0].token}",
                          highlight=False)
    sys.exit(0 if met else 1)


@main.command("minimize")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the minimized scenario (YAML).")
@click.option("--defect", "defects", multiple=True,
              type=click.Choice(list(kvcore.Defects.names())),
              help="For a ticket SOURCE: the defect that makes it fail (repeatable).")
@click.option("--amplify/--no-amplify", default=None,
              help="Keep the amplification (default: as the incident had it).")
@click.option("--finding", "finding_number", type=click.IntRange(min=1), default=1,
              show_default=True, help="For a watched run: which of its races (as its summary "
                                      "lists them) to write.")
def minimize_cmd(source: Path, output: Path, defects: Sequence[str],
                 amplify: bool | None, finding_number: int) -> None:
    """Shrink a failure to the smallest scenario that still fails. SOURCE is an incident folder
    (or its report.json), an op trace (a trial-*.jsonl that --record kept, or an incident's
    trace.jsonl), or a ticket with --defect. Delta debugging over the requests, then over the
    kvcore steps they perform, on the simulated device; the scenario written to --output runs
    with `gpurace run`.

    A watched program's race (its incident folder from `gpurace watch`, its trace.jsonl, or a
    run's capture events, watch/run-001/events.jsonl) becomes the scenario of the racing pair
    and what orders or fails to order it, in the program's names, with a fixed variant that
    carries the suggested fix and the delay `--amplify` would queue."""
    from harness.capture.reproducer import reproducer, watched_source

    watched = watched_source(source)
    if watched is not None:
        if defects:
            raise click.BadParameter("a watched run has no kvcore defects to switch on",
                                     param_hint="--defect")
        if not watched.findings:
            raise click.UsageError(f"{source}: the watched run found no race: nothing to write")
        if finding_number > len(watched.findings):
            raise click.BadParameter(f"the run found {len(watched.findings)} race(s)",
                                     param_hint="--finding")
        made = reproducer(watched.records, watched.findings[finding_number - 1],
                          program=watched.program, command=watched.command)
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(output, made.text)
        except OSError as exc:
            raise click.FileError(str(output), hint=str(exc)) from None
        out.print(f"{output}: scenario {made.name}, {made.steps} steps: {made.shape}, "
                  f"{made.finding['missing'].split(';')[0]}", highlight=False, soft_wrap=True)
        _check_reproducer(output)
        return
    result = minimize(source, defects=tuple(defects), amplify=amplify,
                      progress=lambda text: err.print(f"  {escape(text)}"))
    write_minimized(result, output)
    kept = (f"{result.requests_from} requests -> {result.requests_kept}, "
            if result.requests_from is not None else "")
    out.print(f"{output}: {result.steps} steps ({kept}{result.steps_from} steps -> "
              f"{result.steps}; {result.tries} trial runs); it {result.failure.describe()}",
              highlight=False)


def _check_reproducer(path: Path, trials: int = 5) -> None:
    """A few trials of a written reproducer on the simulated device: said, and a warning when
    it does not do what it was written for."""
    from harness.minimize import HowRun, sim_trial
    from harness.outcome import Outcome
    from harness.scenario import load_scenario

    scenario = load_scenario(path)
    variants = {v.name: v for v in scenario.variants}
    got = {}
    for name, amplified in (("buggy", True), ("fixed", True)):
        runs = [sim_trial(scenario, variants[name], HowRun(amplified, None, seed))
                for seed in range(trials)]
        got[name] = (sum(o is not Outcome.CLEAN for o, _ in runs), sum(bool(f) for _, f in runs))
    (b, bf), (f, ff) = got["buggy"], got["fixed"]
    out.print(f"  on the simulated device, amplified: buggy manifested {b}/{trials} (race found "
              f"{bf}/{trials}), fixed {f}/{trials} (found {ff}/{trials}); `gpurace run {path}` "
              "runs it on the GPU", highlight=False, soft_wrap=True)
    if b < trials or f or ff:
        err.print("[yellow]warning:[/] the scenario does not show this race as it should on the "
                  "simulated device; the race detector's finding above is still the program's",
                  highlight=False)


@main.command("check")
@click.argument("trace", type=click.Path(exists=True, dir_okay=True, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def check_cmd(trace: Path, fmt: str) -> None:
    """Run the race detector over a recorded op trace (a trace.jsonl, or an incident folder):
    exit 1 when it finds races, 0 when none."""
    path = _trace_file(trace)
    trace_file = load_trace(path)
    findings = check_trace(trace_file.records).findings
    header = trace_file.header
    if fmt == "json":
        _echo(json.dumps({"schema": CHECK_SCHEMA, "trace": str(path),
                          "scenario": header.get("scenario"),
                          "variant": header.get("variant"),
                          "findings": [f.to_json() for f in findings]}, indent=2))
    else:
        what = f" ({header['scenario']}, variant {header.get('variant', '?')})" \
            if header.get("scenario") else ""
        out.print(f"{path}{what}: {len(trace_file.ops)} ops, {len(findings)} race(s)",
                  highlight=False)
        for f in findings:
            _print_finding(f.to_json())
    sys.exit(1 if findings else 0)


def _trace_file(trace: Path) -> Path:
    """TRACE as `check` and `trace export` take it: a trace.jsonl, or an incident folder."""
    if not trace.is_dir():
        return trace
    if not (trace / "trace.jsonl").exists():
        raise click.BadParameter(f"{trace} is a folder without a trace.jsonl: give an "
                                 "incident folder (gpurace report list shows them) or a trace "
                                 "file", param_hint="TRACE")
    return trace / "trace.jsonl"


@main.group("trace")
def trace_group() -> None:
    """Recorded op traces as pictures."""


@trace_group.command("export")
@click.argument("trace", type=click.Path(exists=True, dir_okay=True, path_type=Path))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write it: FILE.json for a Chrome trace, FILE.svg for a picture.")
def trace_export_cmd(trace: Path, output: Path) -> None:
    """Write an op trace (a trace.jsonl, or an incident folder) as a timeline. FILE.json: a
    Chrome trace, the Trace Event Format that https://ui.perfetto.dev and chrome://tracing
    open: a track for the host and one per stream, every op a slice (its step and byte ranges
    in its args), arrows from an event's record to the waits on it, and each racing pair that
    `gpurace check` finds marked red and joined (an incident folder has one already:
    timeline.json). FILE.svg: the same ops as boxes in issue order, a lane per stream, the
    racing pairs red (what report.html shows of the last ops)."""
    check_file(output, "--output")
    if output.suffix not in (".json", ".svg"):
        raise click.BadParameter("name a .json (Chrome trace) or .svg (picture) file",
                                 param_hint="--output")
    trace_file = load_trace(_trace_file(trace))
    findings = [f.to_json() for f in check_trace(trace_file.records).findings]
    if output.suffix == ".svg":
        write_atomic(output, svg_timeline(trace_file.ops, findings) + "\n")
        out.print(f"{output}: {len(trace_file.ops)} ops, {len(findings)} race(s) marked",
                  highlight=False)
        return
    document = chrome_trace(trace_file.records, findings)
    write_atomic(output, json.dumps(document, separators=(",", ":"), default=str) + "\n")
    timed = "device times" if document["otherData"]["device_times"] else \
        "stream ops placed where the host issued them (no device times in the trace)"
    out.print(f"{output}: {len(trace_file.ops)} ops, {len(findings)} race(s) marked; "
              f"{timed}. Open it in https://ui.perfetto.dev", highlight=False)


def _print_finding(f: dict) -> None:
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
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("gpurace-reports"), show_default=True,
              help="Folder for the run: run.json, the incidents, each run's events, op trace "
                   "and output.")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the run as JUnit XML here.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: the run document on stdout (the program's own "
                                      "output then goes to stderr).")
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
def watch_cmd(command: Sequence[str], runs: int, timeout_s: float, sources: str,
              out_dir: Path, junit: Path | None, fmt: str, amplify: tuple[str, ...],
              delay_us: float, trials: int, sweep: bool, sweep_us: str, fresh: bool,
              fails_when: str | None) -> None:
    """Run your own PyTorch or CuPy program and find its stream races on the first run.

    \b
        gpurace watch -- python serve.py --requests 8
        gpurace watch --runs 20 -- python -m mypkg.serve
        gpurace watch --format json -- python tests/watch_programs/torch_record_stream.py
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
    exited non-zero, died or hung; 2: bad input; 77: the program's interpreter has neither
    PyTorch nor CuPy.
    """
    from harness.capture.watch import WatchOptions, parse_command, watch

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
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        result = watch(WatchOptions(program=program, runs=runs, timeout_s=timeout_s,
                                    out_dir=out_dir, sources=sources,
                                    quiet_program=fmt == "json", amplify_auto=auto,
                                    delays=delays, delay_us=delay_us, trials=trials,
                                    fails_when=fails_when, sweep=sweep_delays,
                                    fresh=fresh), hooks)
    finally:
        signal.signal(signal.SIGTERM, previous)
    _write_and_show(result, junit, fmt, show=_print_watch_summary)
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

    def trial_finished(self, result: VariantResult, trial: TrialResult) -> None:
        if self.text:
            races = f", {len(trial.findings)} race(s)" if trial.findings else ", no race"
            which = f" {result.variant} ({result.delay_us:g} µs)" if result.amplified else ""
            _log(f"gpurace watch: run {trial.index + 1} of {result.scenario}{which}: "
                 f"{trial.outcome.value}{races}, {trial.ops_total} ops, "
                 f"{trial.duration_s:.2f} s")

    def note(self, text: str) -> None:
        if self.text:
            _log(f"gpurace watch: note: {text}")


def _print_watch_summary(result: RunResult) -> None:
    entries = iter(result.watch.get("amplified", []))  # in the amplified variants' order
    for variant in result.results:
        if variant.amplified:
            _print_amplified(variant, next(entries))
        else:
            _print_watched(result, variant)
    out.print(f"  run.json: {Path(result.folder) / 'run.json'}", highlight=False)
    out.print(f"exit {int(result.exit_code)} ({result.exit_code.name.lower()}), "
              f"{result.wall_s:.1f} s", highlight=False)


def _print_amplified(variant: VariantResult, entry: dict[str, Any]) -> None:
    lo, hi = entry["interval"]
    delays = "; ".join(f"{d['us']:g} µs before {d['kind'] + ' at ' if d['kind'] else ''}"
                       f"{d['path']}:{d['line']}" for d in entry["delays"])
    against = f" against {entry['second']}" if entry.get("second") else ""
    out.print(f"gpurace watch: {variant.variant}: {delays}{against}: failed "
              f"{entry['failed']}/{entry['trials']} (95% {lo:.2f}-{hi:.2f}), "
              f"{entry['queued']} delays queued, outcomes "
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


def _print_watched(result: RunResult, variant: VariantResult) -> None:
    out.print(f"gpurace watch: {result.watch.get('command')}: {variant.trials} run(s), "
              f"{variant.detected} with races, outcomes "
              + ", ".join(f"{k} {v}" for k, v in variant.outcomes().items() if v),
              highlight=False, soft_wrap=True)
    for f in variant.finding_summary():
        _print_finding(f)
        out.print(f"    in {f['trials']} of {variant.trials} run(s)", highlight=False)
    _print_first_and_incidents(variant)


@main.command("doctor")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def doctor_cmd(fmt: str) -> None:
    """What works here: GPU, driver, CUDA, CuPy, NVML events, kernel log, and a verdict."""
    report = diagnose()
    if fmt == "json":
        _echo(json.dumps(report, indent=2))
    else:
        table = Table(title="gpurace doctor", box=box.SIMPLE_HEAD, show_header=False)
        table.add_column("check", no_wrap=True)
        table.add_column("ok", no_wrap=True)
        table.add_column("what it says")
        for check in report["checks"]:
            mark = "[green]yes[/]" if check["ok"] else "[yellow]no[/]"
            table.add_row(check["name"], mark, escape(check["detail"]))
        out.print(table)
        for line in report["verdict"]:
            out.print(f"  {escape(line)}", highlight=False)
    sys.exit(0)


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
            _log(f"start {result.scenario} ({result.variant}): {trials} trials")

    def trial_finished(self, result: VariantResult, trial: TrialResult) -> None:
        if self.live:
            if self.task is not None:
                self.progress.update(self.task, advance=1, description=self._label(result))
            return
        now = time.monotonic()
        if now - self.said >= self.every_s:
            self.said = now
            rate = result.trials / max(now - self.started, 1e-9)
            _log(f"  {result.scenario} ({result.variant}): {result.trials}/{self.planned} "
                 f"trials, {self._counts(result)}, {rate:.1f} trials/s")

    def variant_finished(self, result: VariantResult) -> None:
        if not self.live and result.status is Status.SKIP:
            _log(f"skip {result.scenario} ({result.variant}): {result.reason}")
        elif not self.live:
            took = time.monotonic() - self.started if result.trials else 0.0
            _log(f"done {result.scenario} ({result.variant}): {result.status.value}, "
                 f"{result.trials} trials ({self._counts(result)}), {took:.1f} s")

    def note(self, text: str) -> None:
        err.print(f"[yellow]note:[/] {escape(text)}", highlight=False)

    @staticmethod
    def _counts(result: VariantResult) -> str:
        return ", ".join(f"{k} {v}" for k, v in result.outcomes().items() if v) or "none ran"

    @classmethod
    def _label(cls, result: VariantResult) -> str:
        return f"{result.scenario} ({result.variant}) {cls._counts(result)}"


def _log(line: str) -> None:
    """One progress line in a log: plain, whole, flushed at once."""
    err.print(line, highlight=False, markup=False, soft_wrap=True)
    err.file.flush()


INCIDENTS_LISTED = 10
"""Incident folders a summary lists by name; it says how many more there are, and where."""
TABLE_MIN_WIDTH = 100
"""Below this many columns the summary is a line per variant rather than a table: a table's
columns would cut words (the CI logs of 80 columns)."""


def _print_summary(result: RunResult, out_dir: Path, recorded: bool = False,
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
    if out.width < TABLE_MIN_WIDTH:
        out.print(title, highlight=False)
        for r, counts, status in rows:
            delay = "" if r.delay_us is None else f", delay {r.delay_us:g} us"
            found = f", detected {r.detected}" if detect else ""
            out.print(f"  {escape(r.scenario)} ({escape(r.variant)}) {status}: expects "
                      f"{r.expect}; {r.trials} trials{delay}; manifested {r.manifested} "
                      f"({percent_interval(r.interval)}){found}; {counts}", highlight=False)
    else:
        table = Table(title=title, box=box.SIMPLE_HEAD)
        # The detector's column only once it has something to say.
        numeric = ("delay us", "trials", "manifested", "95% interval", "detected")
        for column in ("scenario", "variant", "expect", "delay us", "trials", "manifested",
                       "95% interval", *(("detected",) if detect else ()), "outcomes",
                       "status"):
            table.add_column(column, justify="right" if column in numeric else "left",
                             no_wrap=column in ("scenario", "status"))
        for r, counts, status in rows:
            table.add_row(r.scenario, r.variant, r.expect,
                          "-" if r.delay_us is None else f"{r.delay_us:g}", str(r.trials),
                          str(r.manifested), percent_interval(r.interval),
                          *((str(r.detected),) if detect else ()), counts, status)
        out.print(table)
    dangerous = [r for r in result.results if r.status is Status.SKIP and r.dangerous]
    if dangerous:
        names = sorted({r.scenario for r in dangerous})
        out.print(f"  skipped {len(dangerous)} dangerous variants ({', '.join(names)}): they can "
                  "crash the CUDA context; pass --dangerous to run them", highlight=False)
    for r in result.results:
        findings = r.finding_summary(1)
        if findings and not r.sweep:
            out.print(f"  {r.scenario} ({r.variant}): race detected in {r.detected}/"
                      f"{r.trials} trials", highlight=False)
            _print_finding(findings[0])
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
        out.print(f"  {len(incidents)} incident reports (gpurace report list {out_dir}):",
                  highlight=False)
        for path in incidents[:INCIDENTS_LISTED]:
            out.print(f"    {path}", highlight=False)
        if len(incidents) > INCIDENTS_LISTED:
            out.print(f"    and {len(incidents) - INCIDENTS_LISTED} more in {result.folder}",
                      highlight=False)
    if recorded:
        traces = sorted(Path(result.folder).glob("workers/*/trial-*.jsonl"))
        out.print(f"  --record kept {len(traces)} trial traces: "
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


if __name__ == "__main__":
    main()

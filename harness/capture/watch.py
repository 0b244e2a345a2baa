"""`gpurace watch`: run the user's program with capture on, and judge it as a run.

The engine knows nothing of the CLI. :func:`watch` runs the program ``runs`` times, each in a
process of its own (:mod:`harness.capture.boot`, under the program's own interpreter), reads the
capture events as they come, feeds the race detector while the program runs, and ends each run
with a trial result: ``clean``, ``crash`` (the program raised, exited non-zero, or died of a
signal; ``cuda_error`` says when a CUDA error was why) or ``hang`` (it outlived ``--timeout``
and was killed), with the races the detector found. The plain runs are one variant (scenario =
the program, variant ``watched``, expecting ``clean``), each amplified plan another, and the
whole a :class:`~harness.results.watched.WatchResult`: its run folder, run.json, exit codes and
incident folders are the ones `gpurace run` writes, without the plan a scenario run has.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from harness.capture import amplify as A
from harness.capture.analysis import RunAnalysis
from harness.capture.children import analyse_children
from harness.capture.forkserver import ForkServer
from harness.capture.events import LOST, batches, give_back, read_events
from harness.errors import CaptureFailed, NothingToCapture, TraceError, WatchError
from harness.faults.writes import WriteFaults, WriteStop, reason
from harness.gpu.nvml import health_snapshot
from harness.limits import MiB
from harness.run.incidents import Subject, build_report, write_report
from harness.results.hooks import RunHooks
from harness.results.outcome import Outcome, TrialResult, VariantResult
from harness.run.outputs import RunFolder
from harness.results.rates import wilson
from harness.results.watched import AmplifiedPlan, WatchedRun, WatchResult
from harness.traces.optrace import issue_times

POLL_S = 0.1
"""How often the watch reads the events the program wrote since it last looked."""
PROGRESS_S = float(os.environ.get("GPURACE_PROGRESS_S", "30"))
"""Seconds between progress lines while one run of the program goes on (as `gpurace run`)."""
KILL_GRACE_S = 5.0
"""Seconds a program past its timeout has to end after SIGTERM before it is killed."""
_HARNESS_PARENT = Path(__file__).resolve().parent.parent.parent
_CUDA_ERROR = re.compile(r"(CUDA error[^\n]*|CUDA_ERROR_[A-Z_]+[^\n]*|cudaError[A-Za-z]*[^\n]*|"
                         r"AcceleratorError[^\n]*)")


@dataclass(frozen=True)
class Program:
    """What to run: the interpreter, and a script or a module with its arguments."""

    python: str
    target: str
    args: tuple[str, ...]
    module: bool = False
    flags: tuple[str, ...] = ()  # the interpreter's own (python -X dev -u prog.py)

    @property
    def name(self) -> str:
        stem = self.target if self.module else Path(self.target).stem
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", stem)[:64].strip("-.") or "program"
        return name if name[0].isalnum() else "p" + name[:63]

    @property
    def argv(self) -> list[str]:
        return [self.python, *self.flags, *(["-m"] if self.module else []), self.target,
                *self.args]


def parse_command(command: Sequence[str]) -> Program:
    """The program in ``command`` (what follows ``--``): ``python PROG.py ARGS``, ``python -m
    MODULE ARGS``, or ``PROG.py ARGS`` run with this interpreter."""
    if not command:
        raise WatchError("no program to watch: give it after --, as in `gpurace watch -- "
                         "python serve.py`")
    words = list(command)
    python = sys.executable
    flags: list[str] = []
    if _is_python(words[0]):
        python = words.pop(0)
        while words and words[0].startswith("-") and words[0] != "-m":
            flag = words.pop(0)
            if flag == "-c":
                raise WatchError("python -c is not watched: put the code in a file, and "
                                 "watch `python FILE.py`")
            flags.append(flag)
            if flag in ("-X", "-W") and words:  # the flags that take a word after them
                flags.append(words.pop(0))
    if not words:
        raise WatchError(f"{shlex.join(command)}: no program after the interpreter; give a "
                         "script (python serve.py) or a module (python -m pkg.serve)")
    if words[0] == "-m":
        if len(words) < 2:
            raise WatchError("python -m needs a module name, as in `python -m pkg.serve`")
        return Program(python, words[1], tuple(words[2:]), module=True, flags=tuple(flags))
    target = words[0]
    if not target.endswith(".py") and not Path(target).is_file():
        raise WatchError(f"{target}: not a Python program; gpurace watch runs Python "
                         "programs that use PyTorch or CuPy (`gpurace watch -- python "
                         "serve.py`)")
    if not Path(target).is_file():
        raise WatchError(f"{target}: no such file")
    return Program(python, target, tuple(words[1:]), flags=tuple(flags))


def _is_python(word: str) -> bool:
    return re.fullmatch(r"python(\d+(\.\d+)?)?", Path(word).name) is not None or \
        os.path.realpath(word) == os.path.realpath(sys.executable)


@dataclass(frozen=True)
class WatchOptions:
    program: Program
    runs: int = 1
    timeout_s: float = 600.0
    out_dir: Path = Path("gpurace-reports")
    sources: str = "auto"
    max_incidents: int = 3
    quiet_program: bool = False  # the program's stdout goes to our stderr (--format json)
    env: dict[str, str] = field(default_factory=dict)
    amplify_auto: bool = False  # after the runs, delay each racing pair's earlier op
    delays: tuple[A.Delay, ...] = ()  # the user's own sites to delay (no plain runs then)
    delay_us: float = A.DELAY_US
    trials: int = 20  # runs of the program with each plan's delays
    fails_when: str | None = None  # a regex over the program's output that means it failed
    fresh: bool = False  # every run a fresh interpreter: no fork server after the first
    sweep: tuple[float, ...] = ()  # map each plan's window: its runs at each of these delays
    disk_mb: int = 4096  # about the most disk a run's events and trace take; 0: no limit

    @property
    def amplifying(self) -> bool:
        return self.amplify_auto or bool(self.delays)


@dataclass(frozen=True)
class ProgramEnd:
    """How one run of the program ended, as the watch saw it."""

    status: int | None  # exit status; None: killed by the watch
    signal: int | None
    error: str | None
    traceback: str | None
    timed_out: bool
    duration_s: float  # from its start to its end, the start included
    stderr_tail: str
    events_lost: str = ""  # why the program's capture stopped writing events, or ""
    log_lost: str = ""  # why its program.log could not be written, or ""
    launch_s: float = 0.0  # of that, the launch: a spawn, or a fork (and, for the run that
    # started the fork server, the server's start: its imports)
    events_given_back: int = 0  # bytes of the events file given back to the disk once read


def watch(options: WatchOptions, hooks: RunHooks | None = None) -> WatchResult:
    """Run the program ``options.runs`` times under capture; the watch's result, its folder
    written (run.json is the caller's, as for `gpurace run`)."""
    hooks = hooks or RunHooks()
    program = options.program
    start = time.monotonic()
    folder = RunFolder.create(options.out_dir)
    variant = VariantResult(scenario=program.name, variant="watched", expect="clean",
                            path=program.target, dangerous=False, amplified=False,
                            delay_us=None)
    before = health_snapshot()
    device = {"backend": "cuda", **({"name": before["name"]} if before.get("name") else {})}
    hooks.variant_started(variant, options.runs)
    notes: list[str] = []
    runs: list[WatchedRun] = []
    faults = WriteFaults(note=hooks.note)
    amplified: list[_Amplified] = []
    variants = [] if options.delays else [variant]
    launcher = _Launcher(options, lambda text: _say(notes, hooks, text))
    interrupted = ""
    try:
        if not options.delays:
            _runs(options, folder.path, variant, hooks, notes, runs, faults, launcher=launcher)
        if options.amplifying:
            _amplify(options, folder.path, variant, hooks, notes, runs, faults, amplified,
                     variants, launcher)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM through the CLI: keep what ended
        interrupted = signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
    except WriteStop:
        pass  # a run's own files could not be made: said, and the runs before it are kept
    finally:
        launcher.close()
    for v in variants:
        v.judge()
        hooks.variant_finished(v)
    health = {"before": before, "after": health_snapshot()}
    return WatchResult(
        program=program.name, command=shlex.join(program.argv), folder=str(folder.path),
        run_id=folder.run_id, device=device, health=health, results=tuple(variants),
        runs=tuple(runs), amplified=tuple(a.plan() for a in amplified)
        if options.amplifying else None, notes=tuple(notes),
        wall_s=time.monotonic() - start, interrupted=interrupted,
        write_errors=tuple(faults.records))


@dataclass
class _Amplified:
    """An amplified variant while its runs go: what it delays, the pair it opens, and the
    delays its runs queued so far."""

    variant: VariantResult
    delays: tuple[A.Delay, ...]
    target: A.Target | None
    queued: int = 0

    def plan(self) -> AmplifiedPlan:
        """What its runs came to, so far."""
        trials, target = self.variant.trials, self.target
        failed = trials - self.variant.counts[Outcome.CLEAN.value]
        return AmplifiedPlan(
            variant=self.variant.variant, delays=tuple(d.to_json() for d in self.delays),
            first=target.first if target else None, second=target.second if target else None,
            stream=target.stream if target else None,
            gap_us=None if target is None or target.gap_us is None else round(
                target.gap_us, 3), trials=trials, failed=failed,
            interval=_rounded(wilson(failed, trials)), queued=self.queued)


def _rounded(interval: tuple[float, float]) -> tuple[float, float]:
    """An interval as the run document keeps it, and the summary prints it: to 4 places."""
    return round(interval[0], 4), round(interval[1], 4)


def _amplify(options: WatchOptions, folder: Path, watched: VariantResult, hooks: RunHooks,
             notes: list[str], runs: list[WatchedRun], faults: WriteFaults,
             amplified: list[_Amplified], variants: list[VariantResult],
             launcher: _Launcher) -> None:
    """The amplified runs: for each racing pair the plain runs found (or the user's sites),
    ``trials`` runs with a delay before the pair's earlier op, as a variant of its own."""
    if options.delays:
        plans = [(options.delays, None)]
    else:
        findings = watched.finding_summary()
        plans = [((t.delay,), t) for t in A.plan(findings, options.delay_us,
                                                 _issue_times(watched.traces))]
        for f in A.unplanned(findings):
            first, second = f["first"], f["second"]
            _say(notes, hooks, f"not amplified: {first.get('kind')} at {first.get('step')} "
                               f"against {second.get('kind')} at {second.get('step')}: the "
                               "earlier op is the host's own, which no delay on a stream moves")
        if not plans:
            _say(notes, hooks, "nothing to amplify: the runs found no race")
    for point in points(plans, options.sweep):
        delays, target = point.delays, point.target
        variant = VariantResult(scenario=options.program.name, variant=point.variant,
                                expect="clean", path=options.program.target, dangerous=False,
                                amplified=True, delay_us=point.us, sweep=bool(options.sweep))
        variants.append(variant)
        tally = _Amplified(variant, delays, target)
        amplified.append(tally)
        hooks.variant_started(variant, options.trials)
        gap = target.gap_us if target else None
        _say(notes, hooks, f"{variant.variant}: {options.trials} run(s) with a delay of "
                           + "; ".join(d.describe() for d in delays)
                           + (f" (against {target.second})" if target else "")
                           + (f"; the host took {gap:.0f} µs from the first op to the second "
                              "in the run that found it" if gap is not None else ""))
        queued = tuple(d for d in delays if d.us > 0)  # a sweep's 0: the program as it is
        _runs(options, folder, variant, hooks, notes, runs, faults, delays=queued,
              label=point.folder, count=options.trials, tally=tally, launcher=launcher)
        if options.delays and queued and not tally.queued:
            _say(notes, hooks, "no delay was queued: no op of the program's ran from "
                               + ", ".join(d.site for d in delays)
                               + " (check the file and line: a finding's side names them)")


@dataclass(frozen=True)
class Point:
    """One amplified variant: a plan's delays at one length (of a sweep, or the plan's own)."""

    variant: str
    folder: str  # under the run's watch/ folder
    delays: tuple[A.Delay, ...]
    target: A.Target | None
    us: float


def points(plans: list[tuple[tuple[A.Delay, ...], A.Target | None]],
           sweep: tuple[float, ...]) -> list[Point]:
    """The amplified variants of ``plans``: one each, or with a ``sweep`` one per delay, a
    plan's points sharing its variant name (so the race window draws them as one curve). A
    sweep runs each plan's own delay too: a host slow to reach the second op gets a planned
    delay past the sweep's last point (three times its gap), and the curve would otherwise end
    before the window is open."""
    out = []
    for number, (delays, target) in enumerate(plans, 1):
        name = f"amplified-{number}"
        own = max(d.us for d in delays)
        for us in sorted({*sweep, own}) if sweep else (None,):
            at = delays if us is None else tuple(replace(d, us=us) for d in delays)
            folder = name if us is None else f"{name}-{us:g}us"
            out.append(Point(name, folder, at, target, max(d.us for d in at)))
    return out


def _issue_times(traces: Sequence[str]) -> dict[int, tuple[int, str | None]]:
    """The host's clock at each op's issue, and its step, from the first readable trace of the
    plain runs (a real program's is tens of megabytes: it is read line by line)."""
    for path in traces:
        try:
            return issue_times(path)
        except (TraceError, OSError):
            continue
    return {}


def _say(notes: list[str], hooks: RunHooks, text: str) -> None:
    if text not in notes:
        notes.append(text)
        hooks.note(text)


def _runs(options: WatchOptions, folder: Path, variant: VariantResult, hooks: RunHooks,
          notes: list[str], runs: list[WatchedRun], faults: WriteFaults, *,
          launcher: _Launcher, delays: tuple[A.Delay, ...] = (), label: str = "",
          count: int | None = None, tally: _Amplified | None = None) -> None:
    """The program's runs, one after another, each folded into ``variant`` as it ends (with
    ``delays`` queued, counted into ``tally``)."""
    for index in range(options.runs if count is None else count):
        trial, ran = _one_run(options, folder, index, hooks, faults, launcher, delays, label)
        variant.add(trial)
        if tally is not None:
            tally.queued += sum(int(d.get("queued", 0)) for d in ran.delays)
        for note in ran.notes:
            if note not in notes:
                notes.append(note)
                hooks.note(note)
        runs.append(ran.run)
        if (trial.outcome.manifested or trial.race) and \
                len(variant.reports) < options.max_incidents:
            try:
                variant.reports.append(str(_write_incident(
                    folder, options, trial, ran.end, ran.run.log, ran.notes, delays,
                    ran.run.children)))
            except OSError as exc:  # the run is counted; its report is what is lost
                faults.failed("incident", folder, exc)
        hooks.trial_finished(variant, trial)


@dataclass(frozen=True)
class _Ran:
    """What one run of the program left beside its trial: its record, how it ended, its
    notes, and the delays its capture queued."""

    run: WatchedRun
    end: ProgramEnd
    notes: list[str]
    delays: list[dict[str, Any]]


def _one_run(options: WatchOptions, folder: Path, index: int, hooks: RunHooks,
             faults: WriteFaults, launcher: _Launcher, delays: tuple[A.Delay, ...] = (),
             label: str = "") -> tuple[TrialResult, _Ran]:
    program = options.program
    work = folder / "watch" / label / f"run-{index + 1:03d}"
    events_path = work / "events.jsonl"
    try:
        work.mkdir(parents=True, exist_ok=True)
        events_path.touch()
    except OSError as exc:  # no events file, no capture: the watch ends with what it has
        faults.failed("capture events", events_path, exc, fatal=True)
    trace_path = work / "trace.jsonl"
    # Of --disk-mb, half for the events (given back once read), half for the trace: its
    # current part and the earlier ones kept (PARTS_KEPT), each of an eighth.
    analysis = RunAnalysis(trace_path, {"scenario": program.name, "path": program.target,
                                        "variant": "watched", "backend": "cuda",
                                        "trial": index, "seed": 0},
                           part_bytes=options.disk_mb * MiB // 8)
    end, how = _run_program(options, events_path, work, analysis, index, hooks, delays,
                            launcher)
    launcher.learn(analysis.translator.hello.get("sources", {}),
                   (analysis.translator.exit or {}).get("libraries", ()))
    analysis.close()
    notes: list[str] = []
    if end.events_lost:  # the findings cover the program up to where its capture stopped
        faults.failed("capture events", events_path, end.events_lost)
        notes.append(f"run {index + 1}: the capture stopped part way ({end.events_lost}): "
                     "what the program did after that was not watched")
    if end.log_lost:
        faults.failed("program log", work / "program.log", end.log_lost)
    if analysis.lost:
        faults.failed("trace", trace_path, analysis.lost)
    parts, kept = analysis.parts_dropped + len(analysis.parts_kept), analysis.parts_kept
    if end.events_given_back or parts:
        notes.append(f"run {index + 1}: kept within --disk-mb {options.disk_mb}: "
                     f"{end.events_given_back / MiB:,.0f} MiB of events.jsonl given back once "
                     f"analysed, the trace begun anew at {parts} quiet point(s)"
                     + (f", the parts that held races kept: {', '.join(p.name for p in kept)}"
                        if kept else ""))
    translator = analysis.translator
    findings = [f.to_json() for f in analysis.findings]
    children = analyse_children(work / "children")
    for child in children:  # each analysed alone: what crosses processes is not followed
        findings += child.findings
    said = (translator.exit or {}).get("status")  # the boot's own word on why it ended
    if end.status == said == 77:
        raise NothingToCapture(end.error)
    if end.status == said == 2 and end.error:
        raise WatchError(end.error)
    outcome, detail, cuda_error = _judge(end)
    if options.fails_when and outcome in (Outcome.CLEAN, Outcome.CRASH) and not cuda_error \
            and end.signal is None:
        said = _failure_line(work / "program.log", options.fails_when)
        if said is not None:
            outcome = Outcome.CORRUPTION
            detail = f"the program's output matched --fails-when: {said}"[:2000]
    trial = TrialResult(index=index, seed=0, outcome=outcome, detail=detail,
                        cuda_error=cuda_error, duration_s=end.duration_s,
                        race=bool(findings), worker_pid=translator.hello.get("pid"),
                        trace=None if analysis.lost else str(
                            analysis.parts_kept[0] if analysis.parts_kept else trace_path),
                        ops_total=translator.seq,
                        findings=findings)
    if not translator.hello and not end.timed_out:
        raise CaptureFailed(f"{program.python}: capture did not start in the program's "
                            f"interpreter (exit {end.status}): "
                            + (end.stderr_tail.strip().splitlines() or ["no output"])[-1])
    notes = [*translator.notes, *notes]
    for child in children:
        notes += child.notes
    if children:
        notes.append(f"run {index + 1}: {len(children)} Python child process(es) watched, each "
                     "on its own: " + "; ".join(f"{c.pid} ({c.role}), {c.ops} ops"
                                                for c in children))
    run = WatchedRun(index=index, label=label, status=end.status, signal=end.signal,
                     timed_out=end.timed_out, error=end.error, ops=translator.ops,
                     records=translator.seq, sources=translator.hello.get("sources", {}),
                     events=str(events_path), trace=str(trace_path),
                     log=str(work / "program.log"), start=how, duration_s=end.duration_s,
                     launch_s=end.launch_s, capture=translator.stats,
                     children=tuple(child.to_json() for child in children))
    delays = translator.delays + [d for child in children for d in child.delays]
    return trial, _Ran(run, end, notes, delays)


def _failure_line(log: Path, pattern: str) -> str | None:
    """The first line of the program's output that ``pattern`` matches, or None."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    match = re.search(pattern, text, re.MULTILINE)
    if match is None:
        return None
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start:end if end >= 0 else len(text)].strip()


def _judge(end: ProgramEnd) -> tuple[Outcome, str, str | None]:
    """The run's outcome, in words, and the CUDA error that ended it, if one did."""
    text = "\n".join(x for x in (end.traceback, end.error, end.stderr_tail) if x)
    match = _CUDA_ERROR.search(text)
    cuda_error = match.group(1).strip()[:500] if match else None
    if end.timed_out:
        return Outcome.HANG, f"the program ran past --timeout {end.duration_s:.0f} s and " \
                             "was killed", cuda_error
    if end.signal is not None:
        name = signal.Signals(end.signal).name if end.signal in \
            signal.Signals._value2member_map_ else str(end.signal)
        return Outcome.CRASH, f"the program died of {name}", cuda_error
    if end.status:
        why = f": {end.error}" if end.error else ""
        return Outcome.CRASH, f"the program exited with status {end.status}{why}"[:2000], \
            cuda_error
    return Outcome.CLEAN, "", None


class _Launcher:
    """Starts the program's runs: the first (and every one, with ``fresh``) as a fresh
    interpreter, the others forked from a fork server that has imported the libraries the first
    run imported (:mod:`harness.capture.forkserver`); where that server cannot serve, one that
    imported only the frameworks the capture switched on, and where neither can, fresh."""

    def __init__(self, options: WatchOptions, note: Any) -> None:
        self.options = options
        self.note = note
        self.server: ForkServer | None = None
        self.modules: tuple[str, ...] | None = None  # what the first run imported
        self.frameworks: tuple[str, ...] = ()  # what its capture switched on
        self.forks = not options.fresh and hasattr(os, "fork")  # runs after the first may
        self.tried = False
        env = dict(os.environ)
        env.update(options.env)
        # The program's interpreter finds gpurace's capture package where this one has it,
        # without the rest of this environment's packages.
        env["PYTHONPATH"] = os.pathsep.join([str(_shim()),
                                             *filter(None, [env.get("PYTHONPATH")])])
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.env = env

    @property
    def learning(self) -> bool:
        """Whether the next run should name the libraries it imports (the boot's
        ``--libraries``): a server will be made from them."""
        return self.modules is None and self.forks

    def learn(self, sources: dict[str, Any], libraries: Sequence[str]) -> None:
        """What a run's capture switched on, and the libraries it imported."""
        if self.modules is None:
            self.frameworks = tuple(sorted(s for s in sources if s in ("torch", "cupy")))
            self.modules = (tuple(libraries) or self.frameworks) if self.frameworks else ()

    def start(self, boot_args: list[str]) -> tuple[Any, str]:
        """The run's process (as a Popen) and how it started: "forked" or "fresh"."""
        program = self.options.program
        if not self.tried and self.modules and self.forks:
            self.tried = True
            for modules in dict.fromkeys([self.modules, self.frameworks]):
                try:
                    self.server = ForkServer(program.python, program.flags, self.env, modules)
                    break
                except OSError as exc:
                    fallback = modules != self.frameworks
                    self.note(f"the fork server of {len(modules)} library module(s) did not "
                              f"start ({exc}); trying one of {', '.join(self.frameworks)} only"
                              if fallback else "runs start as fresh interpreters: the fork "
                              f"server did not start ({exc})")
        if self.server is not None:
            try:
                return self.server.start(boot_args, self.env, os.getcwd()), "forked"
            except OSError as exc:
                self.note(f"runs start as fresh interpreters from here: the fork server "
                          f"failed ({exc})")
                self.close()
        argv = [program.python, *program.flags, "-m", "harness.capture.boot", *boot_args]
        # Its own session: a timeout ends the program and whatever it started, and a Ctrl-C
        # reaches it through us. Its input is ours, as if it ran alone.
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=self.env, start_new_session=True), "fresh"

    def close(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            server.close()


def _run_program(options: WatchOptions, events: Path, work: Path, analysis: RunAnalysis,
                 index: int, hooks: RunHooks, delays: tuple[A.Delay, ...],
                 launcher: _Launcher) -> tuple[ProgramEnd, str]:
    """Run the program once under the boot, feeding ``analysis`` as its events come."""
    program = options.program
    boot_args = ["--events", str(events), "--sources", options.sources,
                 *(["--module"] if program.module else []),
                 *(["--delays", A.encode(delays)] if delays else []),
                 *(["--libraries"] if launcher.learning else []),
                 "--", program.target, *program.args]
    log = _Log(work / "program.log")
    started = time.monotonic()
    try:
        proc, how = launcher.start(boot_args)
        launch_s = time.monotonic() - started
    except OSError as exc:
        log.close()
        raise WatchError(f"{program.python}: cannot start it ({exc.strerror or exc})") \
            from None
    tail: list[bytes] = []  # the last of its standard error (where LOST would be said)
    out_stream = sys.stderr.buffer if options.quiet_program else sys.stdout.buffer
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, out_stream, log, None),
                              daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, log, tail),
                              daemon=True)]
    for pump in pumps:
        pump.start()
    offset = given = 0
    keep = options.disk_mb * MiB // 2
    timed_out = False
    said = started
    try:
        while True:
            try:
                proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            batch, offset = read_events(events, offset)
            if batch:
                analysis.feed(batch)
            if keep and offset - given > keep:  # analysed: the disk may have it back
                if give_back(events, offset):
                    given = offset
                else:
                    keep = 0  # a file system without holes: the events stay whole
            now = time.monotonic()
            if now - said >= PROGRESS_S:
                said = now
                hooks.note(f"run {index + 1}: {now - started:.0f} s, "
                           f"{analysis.translator.ops} ops captured, "
                           f"{len(analysis.detector.findings_now)} race(s) so far")
            if now - started > options.timeout_s:
                timed_out = True
                _stop(proc)
                break
    except BaseException:
        _stop(proc)
        raise
    finally:
        for pump in pumps:
            pump.join(timeout=2.0)
        log.close()
    duration = time.monotonic() - started
    _analyse_the_rest(events, offset, analysis, index, hooks)
    code = proc.returncode
    status = None if code is None or code < 0 else code
    sig = -code if code is not None and code < 0 else None
    if timed_out:
        status, sig = None, None
    exit_info = analysis.translator.exit or {}
    for pipe in (proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            pipe.close()
    return ProgramEnd(status, sig, exit_info.get("error"), exit_info.get("traceback"),
                      timed_out, duration, b"".join(tail).decode("utf-8", "replace")[-4000:],
                      log.events_lost, log.lost, launch_s, given), how


def _analyse_the_rest(events: Path, offset: int, analysis: RunAnalysis, index: int,
                      hooks: RunHooks) -> None:
    """Feed ``analysis`` the events the program left after ``offset`` when it ended, a batch
    at a time (a long run's may be gigabytes), saying how far it got every PROGRESS_S."""
    try:
        total = events.stat().st_size
    except OSError:  # the program never started its capture
        return
    said = time.monotonic()
    for batch, done in batches(events, offset):
        if batch:
            analysis.feed(batch)
        now = time.monotonic()
        if now - said >= PROGRESS_S:
            said = now
            hooks.note(f"run {index + 1}: the program ended; analysing the events it left: "
                       f"{done / MiB:,.0f} of {total / MiB:,.0f} MiB, "
                       f"{len(analysis.detector.findings_now)} race(s) so far")


class _Log:
    """The program's output, kept in program.log as it comes. A disk that will not take it
    costs the log, never the program (whose pipes are drained all the same); the line a
    capture says when it cannot write its events (:data:`LOST`) is looked for on the way."""

    def __init__(self, path: Path) -> None:
        self.lost = ""
        self.events_lost = ""
        self._seen = b""  # the end of the last chunk: LOST may be cut between two
        self._lock = threading.Lock()  # both pumps write here
        self._file: IO[bytes] | None = None
        try:
            # Unbuffered: the pumps write whole chunks, and a full disk says so at once.
            self._file = open(path, "wb", buffering=0)  # noqa: SIM115
        except OSError as exc:
            self.lost = reason(exc)

    def write(self, chunk: bytes, errors: bool) -> None:
        with self._lock:
            self._write(chunk, errors)

    def _write(self, chunk: bytes, errors: bool) -> None:
        if errors:
            text = self._seen + chunk
            at = text.find(_LOST)
            if at >= 0 and not self.events_lost:
                line = text[at + len(_LOST):].split(b"\n", 1)[0]
                self.events_lost = line.decode("utf-8", "replace").strip() or "unknown"
            self._seen = text[-len(_LOST) - 200:]
        if self._file is not None:
            try:
                self._file.write(chunk)
            except OSError as exc:
                self.lost = reason(exc)
                self._close()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                self.lost = self.lost or reason(exc)
            self._file = None


_LOST = LOST.encode()


def _pump(src: IO[bytes], dst: IO[bytes], log: _Log, tail: list[bytes] | None) -> None:
    """Copy the program's output to ours and to its log, as it comes (``tail``: its standard
    error's last chunks)."""
    for chunk in iter(lambda: src.read1(65536), b""):  # type: ignore[attr-defined]
        try:
            dst.write(chunk)
            dst.flush()
        except (OSError, ValueError):
            pass  # our own output closed: the log still gets it
        log.write(chunk, errors=tail is not None)
        if tail is not None:
            tail.append(chunk)
            while len(tail) > 64:
                del tail[0]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the program's whole process group: SIGTERM, then SIGKILL after a grace."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


_SHIM: list[Path] = []


def _shim() -> Path:
    """A folder that holds only a link to gpurace's ``harness`` package: on the program's
    PYTHONPATH, it lets the program's interpreter import the capture without the rest of the
    environment gpurace was installed into."""
    if not _SHIM:
        shim = Path(tempfile.mkdtemp(prefix="gpurace-watch-"))
        (shim / "harness").symlink_to(_HARNESS_PARENT / "harness", target_is_directory=True)
        _SHIM.append(shim)
    return _SHIM[0]


def _write_incident(folder: Path, options: WatchOptions, trial: TrialResult, end: ProgramEnd,
                    log: str, notes: Sequence[str], delays: tuple[A.Delay, ...] = (),
                    children: Sequence[dict[str, Any]] = ()) -> Path:
    """The incident folder of a run that raced or ended badly, as `gpurace run` writes one;
    beside it the program's output (``log``), its traceback, the run's notes, and the capture
    of each child process that raced (``child-PID.jsonl``: its race is in no trace of the
    program's own, and `gpurace minimize` reads it from there)."""
    program = options.program
    subject = Subject(program.name, program.target,
                      f"the program {shlex.join(program.argv)}, watched", False,
                      "watched", "clean")
    argv = ["gpurace", "watch", *_amplify_argv(options, delays), "--", *program.argv]
    report = build_report(
        subject, trial, backend="cuda", device={"backend": "cuda"}, health={}, run_seed=0,
        amplification={"stream": None,
                       "before": "; ".join(f"{d.kind + ' at ' if d.kind else ''}{d.site}"
                                           for d in delays),
                       "delay_us": max(d.us for d in delays)} if delays else None,
        argv=argv, device_log=end.traceback or "")
    extra = {"program.log": Path(log).read_text(errors="replace")[-200_000:]}
    if end.traceback:
        extra["traceback.txt"] = end.traceback
    if notes:
        extra["notes.txt"] = "\n".join(notes) + "\n"
    for child in children:
        if child.get("findings"):
            events = Path(child["events"])
            extra[events.name] = events.read_text(errors="replace")
    return write_report(folder, report, trial, extra)


def _incident(folder: Path, options: WatchOptions, trial: TrialResult,
              info: dict[str, Any], delays: tuple[A.Delay, ...] = ()) -> Path:
    """:func:`_write_incident` from a dict of what the run left (``end``, ``run``'s
    ``log`` and ``children``, ``notes``), as tests/test_capture.py calls it."""
    return _write_incident(folder, options, trial, info["end"], info["run"]["log"],
                           info["notes"], delays, info["run"].get("children", ()))


def _amplify_argv(options: WatchOptions, delays: tuple[A.Delay, ...]) -> list[str]:
    """The `gpurace watch` options that run the program again with these delays."""
    if not delays:
        return []
    words = [w for d in delays for w in ("--amplify", d.site)]
    words += ["--delay-us", f"{max(d.us for d in delays):g}", "--trials", str(options.trials)]
    if options.fails_when:
        words += ["--fails-when", options.fails_when]
    return words

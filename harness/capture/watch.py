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
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.capture import amplify as A
from harness.capture.analysis import Followed, RunAnalysis, Shares
from harness.capture.children import ChildWatch
from harness.capture.launch import Launcher, OutputLog, Program, pump, stop
from harness.errors import CaptureFailed, NothingToCapture, TraceError, WatchError
from harness.faults.writes import WriteFaults, WriteStop
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
_CUDA_ERROR = re.compile(r"(CUDA error[^\n]*|CUDA_ERROR_[A-Z_]+[^\n]*|cudaError[A-Za-z]*[^\n]*|"
                         r"AcceleratorError[^\n]*)")


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
    launcher = Launcher(options.program, options.env, options.fresh,
                        lambda text: _say(notes, hooks, text))
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
             launcher: Launcher) -> None:
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
          launcher: Launcher, delays: tuple[A.Delay, ...] = (), label: str = "",
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
        hooks.run_finished(variant, trial, ran.run)


@dataclass(frozen=True)
class _Ran:
    """What one run of the program left beside its trial: its record, how it ended, its
    notes, and the delays its capture queued."""

    run: WatchedRun
    end: ProgramEnd
    notes: list[str]
    delays: list[dict[str, Any]]


def _one_run(options: WatchOptions, folder: Path, index: int, hooks: RunHooks,
             faults: WriteFaults, launcher: Launcher, delays: tuple[A.Delay, ...] = (),
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
    # --disk-mb is shared among the run's files (Shares); each watched child's have as much
    # again.
    header = {"scenario": program.name, "path": program.target, "variant": "watched",
              "backend": "cuda", "trial": index, "seed": 0}
    shares = Shares.of(options.disk_mb)
    analysis = RunAnalysis(trace_path, header, part_bytes=shares.part)
    followed = Followed(events_path, analysis, keep=shares.keep, backlog=shares.backlog)
    child_watch = ChildWatch(work / "children", header, options.disk_mb)
    end, how = _run_program(options, followed, child_watch, work, index, hooks, delays,
                            launcher)
    launcher.learn(analysis.translator.hello.get("sources", {}),
                   (analysis.translator.exit or {}).get("libraries", ()))
    followed.close()
    followed.write_failure()
    notes: list[str] = []
    if end.events_lost:  # the findings cover the program up to where its capture stopped
        faults.failed("capture events", events_path, end.events_lost)
        notes.append(f"run {index + 1}: the capture stopped part way ({end.events_lost}): "
                     "what the program did after that was not watched")
    if end.log_lost:
        faults.failed("program log", work / "program.log", end.log_lost)
    if analysis.lost:
        faults.failed("trace", trace_path, analysis.lost)
    if disk := followed.disk_note(options.disk_mb):
        notes.append(f"run {index + 1}: {disk}")
    translator = analysis.translator
    findings = [f.to_json() for f in followed.findings()]
    failed = [followed.failed] if followed.failed else []
    if followed.failed:
        notes.append(f"run {index + 1}: {followed.failure_note()}")
    children = child_watch.finish()
    for child in children:  # each analysed alone: what crosses processes is not followed
        findings += child.findings
        if child.analysis_error:
            failed.append(f"in child process {child.pid}: {child.analysis_error}")
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
    if not translator.hello and not end.timed_out and not followed.failed:
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
                     children=tuple(child.to_json() for child in children),
                     analysis_error="; ".join(failed))
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


def _run_program(options: WatchOptions, followed: Followed, children: ChildWatch, work: Path,
                 index: int, hooks: RunHooks, delays: tuple[A.Delay, ...],
                 launcher: Launcher) -> tuple[ProgramEnd, str]:
    """Run the program once under the boot, analysing its events (and its children's) as they
    come."""
    program = options.program
    analysis = followed.analysis
    boot_args = ["--events", str(followed.path), "--sources", options.sources,
                 *(["--module"] if program.module else []),
                 *(["--delays", A.encode(delays)] if delays else []),
                 *(["--libraries"] if launcher.learning else []),
                 *(["--backlog", str(followed.backlog)] if followed.backlog else []),
                 "--", program.target, *program.args]
    log = OutputLog(work / "program.log")
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
    pumps = [threading.Thread(target=pump, args=(proc.stdout, out_stream, log, None),
                              daemon=True),
             threading.Thread(target=pump, args=(proc.stderr, sys.stderr.buffer, log, tail),
                              daemon=True)]
    for thread in pumps:
        thread.start()
    timed_out = behind = False
    said = started
    try:
        while True:
            try:
                proc.wait(timeout=0 if behind else POLL_S)  # behind: no pause
                break
            except subprocess.TimeoutExpired:
                pass
            behind = followed.poll()
            behind |= children.poll()
            now = time.monotonic()
            if now - said >= PROGRESS_S:
                said = now
                lag = followed.behind()
                hooks.note(f"run {index + 1}: {now - started:.0f} s, "
                           f"{analysis.translator.ops} ops captured, "
                           f"{len(analysis.detector.findings_now)} race(s) so far"
                           + (f", the analysis {lag / MiB:,.0f} MiB behind the program"
                              if lag >= MiB else ""))
            if now - started > options.timeout_s:
                timed_out = True
                stop(proc)
                break
    except BaseException:
        stop(proc)
        raise
    finally:
        for thread in pumps:
            thread.join(timeout=2.0)
        log.close()
    duration = time.monotonic() - started
    _analyse_the_rest(followed, f"run {index + 1}: the program ended; analysing the events "
                      "it left", hooks)
    for child in children.followed():
        _analyse_the_rest(child, f"run {index + 1}: analysing the events {child.path.name} "
                          "left", hooks)
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
                      log.events_lost, log.lost, launch_s), how


def _analyse_the_rest(followed: Followed, what: str, hooks: RunHooks) -> None:
    """Analyse the events a process left when it ended, a batch at a time, saying how far it
    got every PROGRESS_S (``what``: the line's start)."""
    try:
        total = followed.path.stat().st_size
    except OSError:  # the process never started its capture
        return
    said = time.monotonic()
    for done in followed.rest():
        now = time.monotonic()
        if now - said >= PROGRESS_S:
            said = now
            hooks.note(f"{what}: {done / MiB:,.0f} of {total / MiB:,.0f} MiB, "
                       f"{len(followed.analysis.detector.findings_now)} race(s) so far")


def _write_incident(folder: Path, options: WatchOptions, trial: TrialResult, end: ProgramEnd,
                    log: str, notes: Sequence[str], delays: tuple[A.Delay, ...] = (),
                    children: Sequence[dict[str, Any]] = ()) -> Path:
    """The incident folder of a run that raced or ended badly, as `gpurace run` writes one;
    beside it the program's output (``log``), its traceback, the run's notes, and the trace of
    each child process that raced, as ``child-PID.jsonl`` (its race is in no trace of the
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
    extra: dict[str, str | Path] = {
        "program.log": Path(log).read_text(errors="replace")[-200_000:]}
    if end.traceback:
        extra["traceback.txt"] = end.traceback
    if notes:
        extra["notes.txt"] = "\n".join(notes) + "\n"
    for child in children:
        if child.get("findings"):  # its trace, or its events where the disk took no trace
            extra[Path(child["events"]).name] = Path(child.get("trace") or child["events"])
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

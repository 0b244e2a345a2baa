"""`gpurace minimize`: an incident, a trace or a ticket made into the smallest scenario that
still fails, checked by running it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click
from rich.markup import escape

import kvcore
from harness.analyses.minimize import minimize, write_minimized
from reports import write_atomic
from harness.cli.app import main
from harness.cli.output import err, out
from harness.words import counted


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
    carries the suggested fix, and a delay before the first op of the pair (10 ms: ten times
    what `--amplify` queues, as a scenario's host may be busier than the program's)."""
    from harness.capture.reproducer import reproducer, watched_source

    watched = watched_source(source)
    if watched is not None:
        if defects:
            raise click.BadParameter("a watched run has no kvcore defects to switch on",
                                     param_hint="--defect")
        if not watched.findings:
            raise click.UsageError(f"{source}: the watched run found no race: nothing to write")
        if finding_number > len(watched.findings):
            raise click.BadParameter(f"the run found {counted(len(watched.findings), 'race')}",
                                     param_hint="--finding")
        made = reproducer(watched.records, watched.findings[finding_number - 1],
                          program=watched.program, command=watched.command)
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(output, made.text)
        except OSError as exc:
            raise click.FileError(str(output), hint=str(exc)) from None
        out.print(f"{output}: scenario {made.name}, {counted(made.steps, 'step')}: "
                  f"{made.shape}, "
                  f"{made.finding['missing'].split(';')[0]}", highlight=False, soft_wrap=True)
        _check_reproducer(output)
        return
    result = minimize(source, defects=tuple(defects), amplify=amplify,
                      progress=lambda text: err.print(f"  {escape(text)}"))
    write_minimized(result, output)
    kept = (f"{counted(result.requests_from, 'request')} -> {result.requests_kept}, "
            if result.requests_from is not None else "")
    out.print(f"{output}: {counted(result.steps, 'step')} ({kept}"
              f"{counted(result.steps_from, 'step')} -> {result.steps}; "
              f"{counted(result.tries, 'trial run')}); it {result.failure.describe()}",
              highlight=False)


def _check_reproducer(path: Path, trials: int = 5) -> None:
    """A few trials of a written reproducer on the simulated device: said, and a warning when
    it does not do what it was written for."""
    from harness.analyses.minimize import HowRun, sim_trial
    from harness.results.outcome import Outcome
    from harness.lang.scenario import load_scenario

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

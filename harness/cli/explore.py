"""`gpurace explore`: orderings of a scenario's unordered device ops on the simulated device,
searched for one that fails.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click
from rich.markup import escape

from harness.analyses.explore import Strategy, explore
from harness.lang.targets import resolve_targets, shown_target
from harness.cli.app import main
from harness.cli.options import format_option
from harness.cli.output import _echo, out
from harness.cli.runs import check_variants
from harness.words import counted


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
@format_option()
def explore_cmd(target: str, variants: Sequence[str], strategy: str, bound: int, depth: int,
                runs: int, seed: int, first: bool, fmt: str) -> None:
    """Explore orderings of a scenario's unordered ops, and interleavings of its host threads,
    on the simulated device. Each failing schedule is printed as a token (s1-3.7: ops 3 and 7
    held back; ~2.1: at thread decision 2, switch to thread 1) that `gpurace run TARGET
    --backend sim --schedule TOKEN` replays exactly. Exit 0 when every variant did what it
    expects (a buggy one fails in some schedule, a fixed one in none), 1 otherwise."""
    scenarios = resolve_targets([target])
    check_variants(scenarios, variants)
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
            threads = f" and {counted(e.decisions, 'thread decision')}" if e.decisions \
                else ""
            out.print(f"{e.scenario} ({e.variant}, expects {variant.expect}): "
                      f"{counted(e.tried, 'schedule')} over {counted(e.ops, 'op')}{threads}, "
                      f"{len(e.failing)} failing; "
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
                out.print(f"  and {counted(len(seen) - 10, 'more failing schedule')} "
                          "(--format json "
                          "lists them)", highlight=False)
            if e.failing:
                # The simulator runs a dangerous variant without --dangerous: it guards a
                # real GPU's context only.
                out.print(f"  replay: gpurace run {shown_target(scenario.path, scenario.name)}"
                          " --backend sim --variant "
                          f"{variant.name} --schedule {e.failing[0].token}",
                          highlight=False)
    sys.exit(0 if met else 1)

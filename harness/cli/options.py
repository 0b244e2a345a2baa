"""Options more than one command takes, declared once: what `run` and `replay` share, the
scenario search path, and the parameter types (``K/N`` shards, GPU lists) they parse.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

import kvcore
from harness.limits import DELAY_MAX_US, GPUS_MAX, SHARDS_MAX, SPARES_MAX, TIMEOUT_MAX_S, TRIALS_MAX
from harness.run.options import RunOptions
from harness.lang.targets import PATH_VARIABLE


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


def format_option(help: str | None = None, choices: tuple[str, ...] = ("text", "json")
                  ) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``--format``, as every command that has one spells it: its first choice the default,
    passed as ``fmt``."""
    return click.option("--format", "fmt", type=click.Choice(list(choices)), default=choices[0],
                        show_default=True, help=help)


def out_option(help: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``--out``, the folder a run's own folder goes below (``out_dir``; gpurace-reports)."""
    return click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
                        default=Path("gpurace-reports"), show_default=True, help=help)


def junit_option(help: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``--junit``, a file the run is also written to as JUnit XML (``junit``)."""
    return click.option("--junit", "junit", type=click.Path(dir_okay=False, path_type=Path),
                        help=help)


_SHARED_RUN_OPTIONS = [
    click.option("--dangerous", is_flag=True,
                 help="Run what may crash the CUDA context (dangerous scenarios, a replay with "
                      "a defect): it crashes a worker process, and the GPU and this process "
                      "survive. Without it, those are skipped on a GPU; the simulated device, "
                      "which has no context to crash, runs them always."),
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
    out_option("Folder for the run: each run writes run.json, its incidents and its workers' "
               "logs into a folder of its own below it."),
    junit_option("Also write JUnit XML here: a testcase per scenario variant."),
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
    format_option("json: one gpurace.run/1 document on stdout."),
]


def shared_run_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options `run` and `replay` share, declared once."""
    for option in reversed(_SHARED_RUN_OPTIONS):
        command = option(command)
    return command


def run_options(shared: dict[str, Any], **own: Any) -> tuple[RunOptions, dict[str, Any]]:
    """RunOptions from the shared options and a command's own; and what _execute takes."""
    how = {k: shared.pop(k) for k in ("insist", "junit", "fmt")}
    if shared.get("shard") and shared.get("trial") is not None:
        raise click.UsageError("--trial runs one trial of the whole run; it takes no --shard")
    if shared.get("address") and shared.get("executor") != "ray":
        raise click.UsageError("--address names a Ray cluster: add --executor ray")
    return RunOptions(**shared, **own), how


PATH_OPTION = click.option(
    "--path", "paths", multiple=True, type=click.Path(file_okay=False, path_type=Path),
    help="A folder of scenarios to look names up in (repeatable), after the working tree and "
         f"before the built-in ones; {PATH_VARIABLE} (':'-separated) adds more.")

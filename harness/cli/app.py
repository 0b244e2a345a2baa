"""The `gpurace` command group: every command's module registers itself on :data:`main`, and
an error of gpurace's own becomes a message and an exit code here, never a traceback.
"""

from __future__ import annotations

import signal
import sys

import click

import kvcore
from harness.errors import HarnessError
from reports import ReportError
from harness.cli.output import OUTPUT, _fail
from harness.results.exitcodes import ExitCode


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
            OUTPUT.close()
            sys.exit(128 + signal.SIGPIPE)


def _exit_codes() -> str:
    """The help's list of exit codes, made from :class:`ExitCode` so that none is left out."""
    said = ", ".join(f"{int(code)} {code.meaning}" for code in ExitCode)
    return f"Exit codes: {said}."  # a paragraph of its own: click wraps it to the terminal


_HELP = f"""gpurace: reproduce, detect and report GPU races in a paged KV page pool.

Scenarios are YAML files (scenarios/*.yaml, the zoo of real bugs in scenarios/zoo/); each
has variants (the buggy way and the fixed way: kvcore's defects switched, or steps that
run in some variants only) and states what each must do: stay clean, or reproduce the
race. A delay queued on the producer stream (amplification) makes a race that hides for
50 requests show on the first trial; a happens-before detector finds it even when it does
not show. `gpurace steps` lists what a scenario's steps can say.

{_exit_codes()}
"""


@click.group(cls=_Commands, help=_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpurace")
def main() -> None:
    pass  # the commands register themselves on this group (see harness.cli)

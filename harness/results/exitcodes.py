"""The process exit codes, each with the words that say what it means. The help lists them
from here, so a new code cannot be left out of it."""

from __future__ import annotations

import enum
from collections.abc import Iterable

from harness.results.outcome import Status, VariantResult


class ExitCode(enum.IntEnum):
    """The process exit codes (see :attr:`meaning`); an interrupted run exits as a shell
    reports a signal (128 + its number). A new code needs its words in ``_MEANINGS``: the
    help reads them all (tests/test_first_hour.py says so if one is missing)."""

    OK = 0
    EXPECTATION_FAILED = 1
    USAGE = 2
    INTERNAL = 3
    WRITE_FAILED = 4
    NOTHING_RAN = 77
    INTERRUPTED = 130
    TERMINATED = 143

    @property
    def meaning(self) -> str:
        """What the code tells its reader, in a few words."""
        return _MEANINGS[self]


_MEANINGS = {
    ExitCode.OK: "every expectation met",
    ExitCode.EXPECTATION_FAILED: "an expectation failed",
    ExitCode.USAGE: "usage error or invalid input",
    ExitCode.INTERNAL: "internal error",
    # A full disk or a removed folder.
    ExitCode.WRITE_FAILED: "the run's files were not all written (run.json's write_errors "
                           "says which; its verdicts stand)",
    ExitCode.NOTHING_RAN: "nothing could run here",
    ExitCode.INTERRUPTED: "stopped by Ctrl-C",
    ExitCode.TERMINATED: "stopped by SIGTERM (what finished is kept)",
}


def run_exit_code(*, interrupted: str, gpu_failed: bool, write_errors: bool,
                  results: Iterable[VariantResult], internal: bool = False) -> ExitCode:
    """What a run (or a watch) exits with. The first that holds wins: a signal that stopped
    it, a GPU that needs attention, a file it lost, a fault of gpurace's own that left its
    verdict partial (``internal``), an expectation that failed; 77 when nothing ran."""
    if interrupted:
        return ExitCode.TERMINATED if interrupted == "SIGTERM" else ExitCode.INTERRUPTED
    if gpu_failed:
        return ExitCode.EXPECTATION_FAILED
    if write_errors:
        return ExitCode.WRITE_FAILED
    if internal:
        return ExitCode.INTERNAL
    ran = [r for r in results if r.status is not Status.SKIP]
    # A sweep maps the race window; its points at small delays are not expected to pass.
    if any(r.status is Status.FAIL and not r.sweep for r in ran):
        return ExitCode.EXPECTATION_FAILED
    return ExitCode.OK if ran else ExitCode.NOTHING_RAN

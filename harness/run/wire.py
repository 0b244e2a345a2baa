"""What a worker sends of each trial, and how the parent reads it back.

A trial goes to the parent as a :class:`TrialMessage`: a named tuple of its numbers and words,
which pickles as a plain tuple does (a dict of its sixteen keys took longer to pickle, and the
parent longer to read). Every message stands alone: its findings are their JSON, in full.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from harness.results.outcome import Outcome, TrialResult


class TrialMessage(NamedTuple):
    """One trial as a worker reports it: what its executor gave, and what the worker adds (its
    pid, the detector's findings, the kept trace, the trial's ops, and why its trace could not
    be written: path and reason)."""

    index: int
    seed: int
    outcome: str  # an Outcome's value
    detail: str
    cuda_error: str | None
    step: str | None
    requests: int | None
    duration_s: float
    reissued: bool
    pid: int
    trace: str | None
    ops: int
    findings: list[dict[str, Any]]
    trace_error: tuple[str, str] | None

    def trial(self) -> TrialResult:
        """The trial, as the parent keeps it."""
        return TrialResult(
            self.index, self.seed, Outcome(self.outcome), self.detail, self.cuda_error,
            self.step, self.requests, self.duration_s, race=bool(self.findings),
            worker_pid=self.pid, trace=self.trace, ops_total=self.ops,
            findings=self.findings, reissued=self.reissued)


def trial_message(result: TrialResult, pid: int, findings: list[dict[str, Any]],
                  trace: str | None, ops: int, trace_error: tuple[str, str] | None
                  ) -> TrialMessage:
    """``result`` (an executor's: no findings, trace or Xids of its own) as the worker sends
    it, with what the worker adds."""
    return TrialMessage(result.index, result.seed, result.outcome.value, result.detail,
                        result.cuda_error, result.step, result.requests, result.duration_s,
                        result.reissued, pid, trace, ops, findings, trace_error)

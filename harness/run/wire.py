"""What a worker sends of each trial, and how the parent reads it back.

A trial goes to the parent as one flat tuple of its numbers and words, not as its JSON: a dict of
sixteen keys took the worker longer to pickle than the tuple takes to build and pickle, and the
parent longer to unpickle than to make the trial from the tuple. Findings go as their JSON, but a
trial whose findings are the last ones sent but for their ops' numbers, all moved on by the same
count (a reissued trial that races as the one before it did), sends only that count, and which
trial's findings it moves: the parent makes them from the ones it kept
(:func:`harness.races.detector.shifted`). A worker's messages reach the parent in order, one pipe
each, so the parent always has the findings a count refers to; a count that names another trial
is a worker's mistake, and said as one.
"""

from __future__ import annotations

from typing import Any

from harness.errors import WireError
from harness.results.outcome import Outcome, TrialResult

# The places of a trial's message (see trial_message).
(INDEX, SEED, OUTCOME, DETAIL, CUDA_ERROR, STEP, REQUESTS, DURATION, REISSUED, PID, TRACE,
 OPS, FINDINGS, TRACE_ERROR) = range(14)

Moved = tuple[int, int]
"""Findings sent as the trial whose findings in full they are, and how many ops on from that
trial's each op is."""


def trial_message(result: TrialResult, pid: int, findings: list[dict[str, Any]] | Moved,
                  trace: str | None, ops: int, trace_error: tuple[str, str] | None
                  ) -> tuple[Any, ...]:
    """A trial as a worker sends it: ``result`` (an executor's: no findings, trace or Xids of
    its own), the worker's pid, the detector's findings (their JSON, or :data:`Moved`), the
    kept trace's path, the trial's ops, and why its trace could not be written (path, reason)."""
    own = result.__dict__  # its fields, read without a property call each
    return (own["index"], own["seed"], own["outcome"]._value_, own["detail"],
            own["cuda_error"], own["step"], own["requests"], own["duration_s"],
            own["reissued"], pid, trace, ops, findings, trace_error)


def outcome_of(message: tuple[Any, ...]) -> str:
    """How the trial of a worker's message ended (an :class:`Outcome`'s value)."""
    return message[OUTCOME]  # type: ignore[no-any-return]


class TrialReader:
    """Makes one worker's trials from its messages, in the order it sent them: it keeps the
    last findings the worker sent in full, for the trials that send only how far they moved."""

    def __init__(self) -> None:
        # Here, not at the top: a spawned worker imports this module with its entry point's,
        # and the detector only once it runs.
        from harness.races.detector import shifted

        self._shifted = shifted
        self._last: tuple[int, list[dict[str, Any]]] | None = None  # (trial index, findings)

    def trial(self, message: tuple[Any, ...]) -> TrialResult:
        """The trial of ``message`` (:func:`trial_message`)."""
        findings = message[FINDINGS]
        if type(findings) is tuple:
            of, by = findings
            last = self._last
            if last is None or last[0] != of:
                raise WireError(f"trial {message[INDEX]}'s findings are trial {of}'s moved on "
                                f"{by} ops, but the last findings sent in full were "
                                + (f"trial {last[0]}'s" if last else "none"))
            findings = self._shifted(last[1], by)
        elif findings:
            self._last = (message[INDEX], findings)
        return TrialResult.made(
            message[INDEX], message[SEED], _OUTCOMES[message[OUTCOME]], message[DETAIL],
            message[CUDA_ERROR], message[STEP], message[REQUESTS], message[DURATION],
            message[REISSUED], worker_pid=message[PID], trace=message[TRACE],
            ops_total=message[OPS], findings=findings)


_OUTCOMES = {o.value: o for o in Outcome}  # a dict's lookup: the enum's call costs more


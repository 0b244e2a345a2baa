"""Schedules for the simulated device: which ops to hold back, written as a short token.

CUDA lets the device run any op as late as it likes relative to ops it is not ordered with. A
schedule names device ops by their issue index (0 for the first stream op a device issues) and
holds each of them back by a long delay, so everything issued later on other streams can go first,
while stream order, events and the legacy stream's barriers still hold. Holding back one or two
well-chosen ops is enough to show every ordering bug of the seed scenarios; enumerating the
choices is bounded exploration.

A schedule also fixes how host threads interleave (harness scenarios with `thread:` steps): each
thread keeps running until it ends or must wait, then the first ready thread in the order they
were declared goes on; a preemption ``(decision, thread)`` switches to the thread of that number
at the decision of that number instead (a decision is each point where more than one thread
could go on). Without a schedule, the trial's seed picks each decision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvcore.errors import DeviceUsageError

HOLD_NS = 50_000_000
"""How long a held-back op waits: 50 ms of virtual time, longer than any trial's own span."""

_TOKEN = re.compile(r"^s1-((?:\d+(?:\.\d+)*)?)((?:~\d+\.\d+)*)$")


@dataclass(frozen=True)
class Schedule:
    """Device ops (by issue index) to hold back, and host-thread preemptions."""

    held: frozenset[int] = frozenset()
    preempt: tuple[tuple[int, int], ...] = ()  # (decision, thread number), decisions ascending

    @property
    def token(self) -> str:
        """``s1-3.7``: hold back ops 3 and 7. ``s1-`` holds back nothing. ``s1-3~2.1``: hold
        back op 3, and at the third thread decision (from 0) switch to thread 1."""
        return "s1-" + ".".join(str(i) for i in sorted(self.held)) + "".join(
            f"~{d}.{t}" for d, t in self.preempt)

    def thread_at(self, decision: int) -> int | None:
        """The thread a preemption switches to at ``decision``, or None."""
        for d, t in self.preempt:
            if d == decision:
                return t
        return None

    @classmethod
    def parse(cls, token: str) -> Schedule:
        match = _TOKEN.match(token.strip())
        if match is None:
            raise DeviceUsageError(
                f"{token!r} is not a schedule token; they look like s1-3.7 (ops to hold back) "
                "or s1-3~2.1 (and host-thread switches), as `gpurace explore` prints them")
        ops, switches = match.group(1), match.group(2)
        preempt = tuple(sorted((int(d), int(t)) for d, t in
                               (item.split(".") for item in switches.split("~")[1:])))
        if len({d for d, _ in preempt}) != len(preempt):
            raise DeviceUsageError(f"{token!r} switches threads twice at one decision; keep one")
        return cls(frozenset(int(i) for i in ops.split(".")) if ops else frozenset(), preempt)

    def delay_ns(self, op_index: int) -> int:
        return HOLD_NS if op_index in self.held else 0

"""Schedules for the simulated device: which ops to hold back, written as a short token.

CUDA lets the device run any op as late as it likes relative to ops it is not ordered with. A
schedule names device ops by their issue index (0 for the first stream op a device issues) and
holds each of them back by a long delay, so everything issued later on other streams can go first,
while stream order, events and the legacy stream's barriers still hold. Holding back one or two
well-chosen ops is enough to show every ordering bug of the seed scenarios; enumerating the
choices is bounded exploration.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvcore.errors import DeviceUsageError

HOLD_NS = 50_000_000
"""How long a held-back op waits: 50 ms of virtual time, longer than any trial's own span."""

_TOKEN = re.compile(r"^s1-((?:\d+(?:\.\d+)*)?)$")


@dataclass(frozen=True)
class Schedule:
    """Device ops (by issue index) to hold back."""

    held: frozenset[int] = frozenset()

    @property
    def token(self) -> str:
        """``s1-3.7``: hold back ops 3 and 7. ``s1-`` holds back nothing."""
        return "s1-" + ".".join(str(i) for i in sorted(self.held))

    @classmethod
    def parse(cls, token: str) -> Schedule:
        match = _TOKEN.match(token.strip())
        if match is None:
            raise DeviceUsageError(
                f"{token!r} is not a schedule token; they look like s1-3.7 (ops to hold back), "
                "as `gpurace explore` prints them")
        ops = match.group(1)
        return cls(frozenset(int(i) for i in ops.split(".")) if ops else frozenset())

    def delay_ns(self, op_index: int) -> int:
        return HOLD_NS if op_index in self.held else 0

"""Ticket replay: a recorded request trace turned into a scenario the runner can run.

The scenario has one variant (the defects asked for, or the pool as it is) and a ticket
workload; the runner, its workers, watchdog, detector and incident reports then treat a replay
like any other scenario.
"""

from __future__ import annotations

from pathlib import Path

import kvcore
from harness.run.workloads import pool_for
from harness.lang.model import Amplify, Scenario, Variant, Workload
from harness.traces.ticket import load_ticket

REPLAY_DELAY_US = 1000.0
"""The amplifying delay before each activation: 1 ms made #210 show on the first request."""


def with_defects(names: tuple[str, ...]) -> kvcore.Defects:
    """kvcore.Defects with each named defect switched on (its field away from the default)."""
    default = kvcore.Defects()
    return kvcore.Defects(**{n: not getattr(default, n) for n in names})


def replay_scenario(path: Path, defects: tuple[str, ...], *,
                    timeout_s: float = 120.0) -> Scenario:
    """The scenario that replays ticket ``path`` with ``defects`` switched on. With a defect it
    is expected to reproduce (and dangerous: it may crash the context); without, to stay clean."""
    ticket = load_ticket(path)
    name = "+".join(defects) if defects else "as-recorded"
    variant = Variant(name, with_defects(defects), "reproduces" if defects else "clean")
    return Scenario(
        name=ticket.header.name, path=path,
        description=ticket.header.description or f"replay of {path.name}",
        dangerous=bool(defects), pool=pool_for(ticket), trials=1, timeout_s=timeout_s,
        variants=(variant,),
        amplify=Amplify(REPLAY_DELAY_US, "legacy", "activate",
                        (0.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)),
        workload=Workload(kind="ticket", ticket=path), replay_defects=defects)

"""What one variant of a scenario has named so far in its step list, and where each step is.

The step list (:mod:`harness.lang.steplist`) keeps a :class:`Scope` per variant; its capacity
checks (:mod:`harness.lang.capacity`) read the names and sizes there, and every check says
where a step is through :class:`Sites`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.lang.model import Location


@dataclass
class Scope:
    """What one variant has named so far, step by step."""

    ids: dict[str, int] = field(default_factory=dict)
    names: dict[tuple[str, str], int] = field(default_factory=dict)  # -> defining step
    gone: dict[tuple[str, str], int] = field(default_factory=dict)   # -> step that gave it back
    allocated: dict[str, int] = field(default_factory=dict)  # host_alloc'd buffer -> pages
    lease_pages: dict[str, int] = field(default_factory=dict)
    held: dict[tuple[str, str], int] = field(default_factory=dict)  # (thread, mutex) -> lock


@dataclass
class Sites:
    """Where the steps read so far are (``where``, by step index), and the scenario's variants:
    what a message says of a step and of a variant."""

    variants: tuple[str, ...]
    where: list[Location] = field(default_factory=list)

    def at(self, index: int) -> str:
        w = self.where[index]
        return f"{w.file}:{w.line}:{w.column}"

    def within(self, variant: str) -> str:
        """" in variant v" for a message, when the scenario has more than one."""
        return "" if len(self.variants) == 1 else f" in variant {variant}"

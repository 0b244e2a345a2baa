"""The pool's switchable defects: the known bugs of ninfer #210 and its kin, off by default."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Defects:
    """Which known bugs the pool has. The default is the correct pool.

    ``release_fence=False``: ``release`` returns a page to the free list with no fence on the
    streams still using it, so the next owner's writes race the old owner's in-flight ones (the
    remaining suspect of #210). ``publish_on_legacy_stream=True``: execution-table publishes
    (and so catalog activation) ignore the caller's stream and go to the legacy default stream,
    which non-blocking streams do not wait for (#210 itself, fixed by PR #211).
    ``table_shadow_wait=False``: a publish rewrites a table row's pinned host shadow without
    waiting for the previous publish's copy to have read it, so the device may copy the new
    entries, or a torn mix, where the old ones were meant (a host overwrite of pinned memory
    still being copied).
    """

    release_fence: bool = True
    publish_on_legacy_stream: bool = False
    table_shadow_wait: bool = True

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def active(self) -> tuple[str, ...]:
        """Names of the defects switched on (a field away from its correct default)."""
        default = Defects()
        return tuple(n for n in self.names() if getattr(self, n) != getattr(default, n))

    def to_json(self) -> dict[str, bool]:
        return {n: getattr(self, n) for n in self.names()}

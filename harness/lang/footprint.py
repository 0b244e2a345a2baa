"""What a scenario's world allocates, in bytes, known from its pool before anything is allocated.

The executor's :class:`~harness.run.world.World` builds, for every trial on the simulated device
(and once per worker on the GPU): the device pool (kvcore's arena), a staging buffer per stream
for scattered copies (kvcore's pool, at most ``STAGING_BYTES`` each), the execution table and
its pinned shadow, the page-generation mirror, and a pinned arena for the check's readback (as
many pages as the pool) and the scenario's host buffers. The loaders (scenario steps, workloads,
tickets) add the host buffers and refuse a world over :data:`~harness.limits.WORLD_MAX_BYTES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcore.device.kernels import GENERATION_BYTES, TABLE_ENTRY_BYTES
from kvcore.pool import STAGING_BYTES

HOST_GRANULE = 256
"""kvcore's pinned host arena hands out whole 256-byte granules (kvcore/host.py): each host
buffer takes its bytes rounded up to one."""


def host_bytes(pages: int, page_bytes: int) -> int:
    """What a host buffer of ``pages`` pages takes of the pinned arena."""
    return -(-pages * page_bytes // HOST_GRANULE) * HOST_GRANULE


@dataclass(frozen=True)
class Footprint:
    """A world's fixed allocations: ``pages`` of ``page_bytes`` in the pool, ``table_rows``
    rows of ``row_pages`` entries, and ``streams`` streams that may stage scattered copies
    (the check's own stream included)."""

    pages: int
    page_bytes: int
    table_rows: int
    row_pages: int
    streams: int = 4

    @property
    def pool_bytes(self) -> int:
        return self.pages * self.page_bytes

    @property
    def staging_bytes(self) -> int:
        return self.streams * min(self.pool_bytes, STAGING_BYTES)

    @property
    def table_bytes(self) -> int:
        return 2 * self.table_rows * self.row_pages * TABLE_ENTRY_BYTES  # device and shadow

    @property
    def readback_bytes(self) -> int:
        return self.pool_bytes + self.pages * GENERATION_BYTES

    @property
    def fixed_bytes(self) -> int:
        """Everything but the scenario's own host buffers."""
        return self.pool_bytes + self.staging_bytes + self.table_bytes + self.readback_bytes

    def host_pages(self, limit: int) -> int:
        """How many pages of host buffers fit beside the fixed allocations under ``limit``."""
        return max(0, limit - self.fixed_bytes) // self.page_bytes

    def describe(self) -> str:
        return (f"pool {self.pool_bytes:,}, staging {self.staging_bytes:,}, table and shadow "
                f"{self.table_bytes:,}, the check's readback {self.readback_bytes:,}")

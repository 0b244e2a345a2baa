"""The retained per-conversation catalog: pages kept between turns, re-activated each turn.

Each new turn binds the sequence to its catalog and activates it: the catalog's page list is
republished into its execution-table rows on the caller's stream. Re-activation every turn is
what reopened ninfer #210's window each time.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvcore.device.handles import Stream
from kvcore.errors import TableError
from kvcore.pool import DeviceKVPageHandle, DeviceKVPageLease
from kvcore.table import KVExecutionTablePool


class KVConversationCatalog:
    """The pages one conversation keeps across turns, and the table rows bound to it."""

    def __init__(self, table: KVExecutionTablePool, name: str = "conversation") -> None:
        self.table = table
        self.pool = table.pool
        self.name = name
        self.leases: list[DeviceKVPageLease] = []
        self.rows: list[int] = []

    @property
    def handles(self) -> list[DeviceKVPageHandle]:
        return [lease.handle for lease in self.leases]

    def retain(self, leases: Iterable[DeviceKVPageLease]) -> None:
        """Keep these pages in the catalog (appended, in logical order)."""
        self.leases.extend(leases)

    def bind(self, row: int | None = None) -> int:
        """Bind the sequence to a table row (a fresh one when ``row`` is None); returns it."""
        label = f"row of catalog {self.name}"
        if row is None:
            row = self.table.acquire(name=label)
        else:
            self.table.name_row(row, label)
        if row not in self.rows:
            self.rows.append(row)
        return row

    def activate(self, stream: Stream) -> int:
        """Republish the catalog's pages into every bound row on ``stream``; returns the
        number of entries a reader should read."""
        if not self.rows:
            raise TableError(f"catalog {self.name!r} is not bound to a row; call bind() first")
        handles = self.handles
        for row in self.rows:
            self.table.publish(row, handles, stream)
        return len(handles)

    def unbind(self) -> None:
        for row in self.rows:
            self.table.release_row(row)
        self.rows = []

    def release(self) -> None:
        """End the conversation: unbind its rows and release its pages (fenced)."""
        self.unbind()
        if self.leases:
            self.pool.release(self.leases)
        self.leases = []

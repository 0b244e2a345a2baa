"""KVExecutionTablePool: the logical->physical page rows that attention kernels read; PageIndex:
a page list in pinned memory that kernels read in place.

Rows live on the device; each is published from a pinned host shadow with one async copy on the
caller's stream, so a kernel later on that stream reads the row it was meant to. With
``Defects(publish_on_legacy_stream=True)`` the copy goes to the legacy default stream instead,
which the engine's non-blocking streams do not wait for: ninfer #210. A publish rewrites the
shadow row only once the previous publish's copy has read it; ``Defects(table_shadow_wait=False)``
skips that wait.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvcore.device.handles import Buffer, Stream
from kvcore.device.kernels import (
    FIRST_BYTES,
    RESULT_BYTES,
    TABLE_ENTRY_BYTES,
    Attend,
    GatherPages,
    ReadTable,
    ScatterPages,
    WritePages,
)
from kvcore.errors import TableError
from kvcore.pool import DeviceKVPageHandle, DeviceKVPagePool

EMPTY_ENTRY = -1
"""Page index of an unused entry: out of range, so a reader that reaches it asserts."""


class KVExecutionTablePool:
    """``rows`` rows of up to ``max_pages_per_row`` entries (int32 page, int32 generation)."""

    def __init__(self, pool: DeviceKVPagePool, rows: int, max_pages_per_row: int) -> None:
        if rows <= 0 or max_pages_per_row <= 0:
            raise TableError(f"a table needs rows and entries, not {rows} x {max_pages_per_row}")
        self.pool = pool
        self.device = pool.device
        self.context = pool.context
        self.rows = rows
        self.max_pages_per_row = max_pages_per_row
        self.row_bytes = max_pages_per_row * TABLE_ENTRY_BYTES
        nbytes = rows * self.row_bytes
        self.table: Buffer = self.device.alloc(nbytes, name="exec-table")
        self.shadow: Buffer = self.device.alloc_host(nbytes, name="exec-table-shadow")
        self._free_rows = list(range(rows - 1, -1, -1))
        self._published = [False] * rows
        # The pages each row was last published with, as the host knows them (its shadow).
        self._pages: list[np.ndarray] = [np.zeros(0, np.int32)] * rows
        # Each row's entries as its last publish stored them: kept, so that a device program
        # issuing the publish again stores them live, their generations counted anew.
        self._entries = np.full((rows, max_pages_per_row * 2), EMPTY_ENTRY, np.int32)
        self._events = [self.device.create_event(f"table-row-{r}") for r in range(rows)]
        # Every row starts empty on the device, in order before any later work on any stream.
        self.device.host_write(self.shadow, 0,
                               np.full(rows * max_pages_per_row * 2, EMPTY_ENTRY, np.int32))
        stream = self.context.stream
        self.device.copy(self.table, 0, self.shadow, 0, nbytes, stream)
        self.device.synchronize_stream(stream)

    def acquire(self, *, name: str | None = None) -> int:
        """A free row index; ``name`` (whose row it is) is how race findings will call it."""
        if not self._free_rows:
            raise TableError(f"all {self.rows} execution-table rows are in use")
        row = self._free_rows.pop()
        if name is not None:
            self.name_row(row, name)
        return row

    def name_row(self, row: int, name: str) -> None:
        """Findings on this row's bytes (on the device and in the shadow) will say ``name``."""
        span = [(self.row_offset(row), self.row_bytes)]
        self.device.label(self.table, span, name)
        self.device.label(self.shadow, span, name)

    def release_row(self, row: int) -> None:
        self._check_row(row)
        if row in self._free_rows:
            raise TableError(f"row {row} is already free")
        self._free_rows.append(row)
        span = [(self.row_offset(row), self.row_bytes)]
        self.device.unlabel(self.table, span)
        self.device.unlabel(self.shadow, span)

    def _check_row(self, row: int) -> None:
        if not 0 <= row < self.rows:
            raise TableError(f"row {row} is outside this table of {self.rows} rows")

    def row_offset(self, row: int) -> int:
        self._check_row(row)
        return row * self.row_bytes

    def publish(self, row: int, handles: Sequence[DeviceKVPageHandle], stream: Stream) -> Stream:
        """Write ``handles`` into ``row``: host shadow, then one async copy on ``stream``
        (the legacy stream with the #210 defect). Returns the stream the copy went to."""
        self._check_row(row)
        if len(handles) > self.max_pages_per_row:
            raise TableError(f"{len(handles)} pages do not fit a row of "
                             f"{self.max_pages_per_row}")
        for handle in handles:
            self.pool.check(handle)
        return self._publish(row, [h.index for h in handles], stream)

    def _publish(self, row: int, pages: list[int] | None, stream: Stream) -> Stream:
        """Publish ``pages`` (None: an empty row) into ``row``."""
        target = self.context.legacy_stream if self.device.defects.publish_on_legacy_stream \
            else stream
        # The shadow row may still be the source of the previous publish's copy: overwrite it
        # only once that copy has read it.
        if self._published[row] and self.device.defects.table_shadow_wait:
            self.device.synchronize_event(self._events[row])
        offset = self.row_offset(row)
        size = self._entries.shape[1] if pages is None else 2 * len(pages)
        self._pages[row] = np.full(size // 2, EMPTY_ENTRY, np.int32) if pages is None \
            else np.array(pages, np.int32)
        if size:
            # The entries' generations are the one thing that differs from trial to trial:
            # a program issuing this again counts them again (see Device.reissued) and
            # stores what the row's entries hold then.
            self.device.reissued(self._set_entries, row, pages)
            self.device.host_write(self.shadow, offset, self._entries[row, :size], live=True)
            self.device.copy(self.table, offset, self.shadow, offset, size * 4, target)
        self.device.record_event(self._events[row], target)
        self._published[row] = True
        return target

    def _set_entries(self, row: int, pages: list[int] | None) -> None:
        """The row's entries as a publish of ``pages`` stores them now (see _entries_of)."""
        if pages is None:
            self._entries[row] = EMPTY_ENTRY
        else:
            _entries_of(self._entries[row], pages, self.pool)

    def clear(self, row: int, stream: Stream) -> Stream:
        """Publish an all-empty row on ``stream`` (same path, and defects, as :meth:`publish`)."""
        return self._publish(row, None, stream)

    def state_key(self) -> tuple[object, ...]:
        """What the table's next calls depend on besides the generations (see
        DeviceKVPagePool.state_key): its free rows, in the order they are handed out, and which
        rows were published (a publish waits for the last one's copy first)."""
        return (tuple(self._free_rows), tuple(self._published))

    def read(self, row: int, entries: int, stream: Stream, *, result: Buffer,
             result_offset: int = 0, assert_on_stale: bool = True) -> None:
        """Launch the table reader on ``stream`` over the first ``entries`` entries of ``row``:
        a stale or out-of-range entry fires a device-side assert (or, with
        ``assert_on_stale=False``, adds to the int32 count at ``result``)."""
        if not 0 < entries <= self.max_pages_per_row:
            raise TableError(f"read 1..{self.max_pages_per_row} entries, not {entries}")
        if result_offset + RESULT_BYTES > result.nbytes:
            raise TableError("the result buffer is too small for the count")
        self.device.launch(ReadTable(
            table=self.table, offset=self.row_offset(row), entries=entries,
            generations=self.pool.generations, num_pages=self.pool.pages,
            result=result, result_offset=result_offset, assert_on_stale=assert_on_stale,
        ), stream)

    def write_pages(self, row: int, entries: int, value: int, stream: Stream) -> None:
        """Launch ``kv_write`` on ``stream``: it writes ``value`` over every page the first
        ``entries`` entries of ``row`` name, as the kernel finds the row when it runs."""
        self.device.launch(WritePages(**self._row_kernel(row, entries), value=value), stream)

    def attend(self, row: int, entries: int, expected: int, stream: Stream, *, result: Buffer,
               result_offset: int = 0, assert_on_mismatch: bool = True,
               first: Buffer | None = None, first_offset: int = 0) -> None:
        """Launch ``attention`` on ``stream``: it reads every page the row names and counts the
        bytes that are not ``expected`` into the int32 at ``result`` (or, with
        ``assert_on_mismatch``, fires a device-side assert at the first page that differs).
        With ``first``, it also keeps there which entry, page and byte it first found wrong
        (see :data:`~kvcore.device.kernels.FIRST_BYTES`; the caller sets it to all ones)."""
        self.device.launch(_attend(self._row_kernel(row, entries), expected, result,
                                   result_offset, assert_on_mismatch, first, first_offset),
                           stream)

    def _row_kernel(self, row: int, entries: int) -> dict[str, object]:
        """What a row-following kernel needs, with the pages the host last published into the
        row (its shadow): what the op log records it touches (see RowKernel)."""
        if not 0 < entries <= self.max_pages_per_row:
            raise TableError(f"follow 1..{self.max_pages_per_row} entries, not {entries}")
        offset = self.row_offset(row)
        pages = self._pages[row][:entries]
        declared = tuple(sorted({int(p) for p in pages if 0 <= p < self.pool.pages}))
        return {"table": self.table, "offset": offset, "entries": entries,
                "pages": self.pool.buffer, "stride": self.pool.page_stride,
                "num_pages": self.pool.pages, "declared": declared}


class PageIndex:
    """A list of pages in pinned host memory that kernels read in place, where they run.

    The host writes it with a plain store (``write``: one (int32 page, int32 generation) entry
    per handle), with no copy and no stream: a kernel launched after follows whatever the list
    holds when it runs. An engine that rewrites such a list in place for its next batch while
    the last batch's kernel is still queued sends that kernel to the next batch's pages. As for
    a table row, the op log records the pages last written here as what a kernel touches; a
    rewrite before the kernel runs is a race on the list's own bytes, where the detector finds
    it."""

    def __init__(self, pool: DeviceKVPagePool, buffer: Buffer, offset: int, nbytes: int) -> None:
        self.pool = pool
        self.device = pool.device
        self.buffer, self.offset, self.nbytes = buffer, offset, nbytes
        self.pages: tuple[int, ...] = ()

    def write(self, handles: Sequence[DeviceKVPageHandle]) -> None:
        """The host writes the handles' entries into the list, now."""
        if not handles or len(handles) * TABLE_ENTRY_BYTES > self.nbytes:
            raise TableError(f"a page list of {self.nbytes} bytes holds 1 to "
                             f"{self.nbytes // TABLE_ENTRY_BYTES} entries, not {len(handles)}")
        self.pages = tuple(h.index for h in handles)
        entries = np.empty(2 * len(handles), np.int32)
        # As a table row's publish: a program issuing this store again counts the entries'
        # generations anew and stores them live (each write its own entries: a list may be
        # rewritten in place within a trial).
        self.device.reissued(_entries_of, entries, self.pages, self.pool)
        self.device.host_write(self.buffer, self.offset, entries, live=True)

    def write_pages(self, value: int, stream: Stream) -> None:
        """``kv_write`` through the list: ``value`` over every page it names when it runs."""
        self.device.launch(WritePages(**self._fields(), value=value), stream)

    def attend(self, expected: int, stream: Stream, *, result: Buffer, result_offset: int = 0,
               assert_on_mismatch: bool = True, first: Buffer | None = None,
               first_offset: int = 0) -> None:
        """``attention`` through the list (see :meth:`KVExecutionTablePool.attend`)."""
        self.device.launch(_attend(self._fields(), expected, result, result_offset,
                                   assert_on_mismatch, first, first_offset), stream)

    def gather(self, packed: Buffer, offset: int, stream: Stream) -> None:
        """Copy every page the list names, entry ``e`` to the ``e``-th page of ``packed`` from
        ``offset``."""
        self.device.launch(GatherPages(**self._fields(), packed=packed, packed_offset=offset),
                           stream)

    def scatter(self, packed: Buffer, offset: int, stream: Stream) -> None:
        """Copy the ``e``-th page of ``packed`` from ``offset`` into the page entry ``e``
        names."""
        self.device.launch(ScatterPages(**self._fields(), packed=packed, packed_offset=offset),
                           stream)

    def _fields(self) -> dict[str, object]:
        if not self.pages:
            raise TableError("the page list was never written: write it before a kernel "
                             "follows it")
        declared = tuple(sorted(set(self.pages)))
        return {"table": self.buffer, "offset": self.offset, "entries": len(self.pages),
                "pages": self.pool.buffer, "stride": self.pool.page_stride,
                "num_pages": self.pool.pages, "declared": declared}


def _attend(fields: dict[str, object], expected: int, result: Buffer, result_offset: int,
            assert_on_mismatch: bool, first: Buffer | None, first_offset: int) -> Attend:
    if result_offset + RESULT_BYTES > result.nbytes:
        raise TableError("the result buffer is too small for the count")
    if first is not None and first_offset + FIRST_BYTES > first.nbytes:
        raise TableError("the buffer for the first mismatch is too small")
    return Attend(**fields, expected=expected, result=result,  # type: ignore[arg-type]
                  result_offset=result_offset, assert_on_mismatch=assert_on_mismatch,
                  first=first, first_offset=first_offset)


def _entries_of(out: np.ndarray, pages: Sequence[int], pool: DeviceKVPagePool) -> None:
    """(int32 page, int32 generation) entries of ``pages`` into ``out``, each generation as the
    pool counts it now (a handle's own is its lease's, which a reissued program's handles no
    longer are)."""
    generation = pool.generation
    for k, page in enumerate(pages):
        out[2 * k] = page
        out[2 * k + 1] = generation(page)

"""The kernels a Device can launch, as records.

Each kernel call is a frozen record naming its buffers and arguments; both backends run the same
records (``cuda.py`` through NVRTC kernels in ``kernels.cu``, ``sim.py`` in numpy), and the op log
learns each call's byte ranges from :meth:`Kernel.reads` / :meth:`Kernel.writes` alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcore.device.handles import Buffer
from kvcore.device.oplog import Access

TABLE_ENTRY_BYTES = 8
"""An execution-table entry: int32 physical page index, int32 page generation."""

GENERATION_BYTES = 4
"""One page's generation in the generation mirror: an int32."""

RESULT_BYTES = 4
"""Kernels that count (verify, read_table) add an int32 to ``result`` at ``result_offset``."""

FIRST_BYTES = 8
"""A counting attention's record of the first page it found wrong: a uint64 that each mismatch
lowers (atomicMin) to ``entry << 40 | page << 8 | byte``, so it ends as the lowest entry whose
page held other bytes, that page, and the smallest such byte; all ones when none did."""

NO_FIRST = (1 << 64) - 1


def first_mismatch(value: int) -> tuple[int, int, int] | None:
    """(entry, page, byte) from a :data:`FIRST_BYTES` record, None when nothing mismatched."""
    if value == NO_FIRST:
        return None
    return value >> 40, (value >> 8) & 0xFFFFFFFF, value & 0xFF


def first_key(entry: int, page: int, byte: int) -> int:
    return entry << 40 | page << 8 | byte


TABLE_ASSERT_LINE = 132
"""The line the table reader's device-side assert reports, as ninfer's device.cu:132 did."""

ATTENTION_ASSERT_LINE = 17
"""The line the attention kernel's device-side assert reports (in kernels_data.cu)."""


class Kernel:
    """Base of kernel records: what the kernel reads and writes, for the op log."""

    name = "kernel"
    graphable = True  # a launch that a CUDA graph can capture (see kvcore.device.graph)

    def reads(self) -> tuple[Access, ...]:
        return ()

    def writes(self) -> tuple[Access, ...]:
        return ()

    def buffers(self) -> tuple[Buffer, ...]:
        return ()

    def extents(self) -> tuple[tuple[Buffer, int, int], ...]:
        """(buffer, first byte, end) spans covering every access: what a launch validates,
        cheaply even for a scatter over thousands of pages."""
        by_id = {b.id: b for b in self.buffers()}
        return tuple((by_id[a.buffer], a.offset, a.end) for a in self.reads() + self.writes())

    def detail(self) -> dict[str, object]:
        return {}


@dataclass(frozen=True)
class Fill(Kernel):
    """Write ``value`` (one byte) to ``nbytes`` bytes of ``dst`` from ``offset``."""

    dst: Buffer
    offset: int
    nbytes: int
    value: int
    name = "fill"

    def writes(self) -> tuple[Access, ...]:
        return (Access(self.dst.id, self.offset, self.nbytes),)

    def buffers(self) -> tuple[Buffer, ...]:
        return (self.dst,)

    def detail(self) -> dict[str, object]:
        return {"value": self.value}


@dataclass(frozen=True)
class Verify(Kernel):
    """Count the bytes of ``src[offset:offset+nbytes]`` that differ from ``expected`` and add the
    count to the int32 at ``result[result_offset]``."""

    src: Buffer
    offset: int
    nbytes: int
    expected: int
    result: Buffer
    result_offset: int = 0
    name = "verify"

    def reads(self) -> tuple[Access, ...]:
        return (
            Access(self.src.id, self.offset, self.nbytes),
            Access(self.result.id, self.result_offset, RESULT_BYTES),
        )

    def writes(self) -> tuple[Access, ...]:
        return (Access(self.result.id, self.result_offset, RESULT_BYTES),)

    def buffers(self) -> tuple[Buffer, ...]:
        return (self.src, self.result)

    def detail(self) -> dict[str, object]:
        return {"expected": self.expected}


@dataclass(frozen=True)
class ReadTable(Kernel):
    """The execution-table reader attention kernels embody.

    Reads ``entries`` entries of a table row at ``table[offset]`` and checks each one: the page
    index in ``[0, num_pages)`` and its generation equal to ``generations[page]``. Adds the number
    of bad entries to ``result[result_offset]``; with ``assert_on_stale`` the first bad entry fires
    a real device-side assert instead, which kills the context, like ninfer's device.cu:132.
    """

    table: Buffer
    offset: int
    entries: int
    generations: Buffer
    num_pages: int
    result: Buffer
    result_offset: int = 0
    assert_on_stale: bool = True
    name = "read_table"

    def reads(self) -> tuple[Access, ...]:
        return (
            Access(self.table.id, self.offset, self.entries * TABLE_ENTRY_BYTES),
            Access(self.generations.id, 0, self.num_pages * GENERATION_BYTES),
            Access(self.result.id, self.result_offset, RESULT_BYTES),
        )

    def writes(self) -> tuple[Access, ...]:
        return (Access(self.result.id, self.result_offset, RESULT_BYTES),)

    def buffers(self) -> tuple[Buffer, ...]:
        return (self.table, self.generations, self.result)

    def detail(self) -> dict[str, object]:
        return {"entries": self.entries, "assert": self.assert_on_stale}


@dataclass(frozen=True)
class Delay(Kernel):
    """Occupy the stream for ``us`` microseconds (a spin on the GPU's wall-clock timer on CUDA,
    a simulated duration on sim): the amplifier that widens a race window. ``us=None`` never
    ends, to model a hung kernel."""

    us: float | None
    name = "delay"

    def detail(self) -> dict[str, object]:
        return {"us": self.us}


TOUCH_SPANS_MAX = 8
"""Spans a :class:`Touch` reads, and spans it writes, at most (each a kernel argument pair)."""

TOUCH_READ_VALUE = 0x100
"""What kernels.cu's kv_touch takes for "write the first byte read" (any byte is below it)."""


@dataclass(frozen=True)
class Touch(Kernel):
    """A kernel of the program's own over any memory (a forward pass writing a block, a loader's
    normalize, a reduce reading a bucket), as far as stream order can tell: it runs ``us``
    microseconds, then reads every byte of its ``read`` spans and writes ``value`` over every
    byte of its ``write`` spans; with ``value`` None it writes the first byte it read instead
    (a result computed from its input: a stale input gives a stale result). Each span is
    (buffer, offset, nbytes), device or pinned host memory; ``label`` names it in the op log
    (``kernel:LABEL``)."""

    read: tuple[tuple[Buffer, int, int], ...]
    write: tuple[tuple[Buffer, int, int], ...]
    value: int | None = 0
    us: float = 0.0
    label: str = "kernel"

    def __post_init__(self) -> None:
        if len(self.read) > TOUCH_SPANS_MAX or len(self.write) > TOUCH_SPANS_MAX:
            raise ValueError(f"a touch kernel reads and writes at most {TOUCH_SPANS_MAX} spans "
                             "each")
        if self.value is None and not self.read:
            raise ValueError("a touch kernel that writes what it read reads something")

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.label

    def reads(self) -> tuple[Access, ...]:
        return tuple(Access(b.id, off, n) for b, off, n in self.read)

    def writes(self) -> tuple[Access, ...]:
        return tuple(Access(b.id, off, n) for b, off, n in self.write)

    def buffers(self) -> tuple[Buffer, ...]:
        return tuple({b.id: b for b, _, _ in self.read + self.write}.values())

    def detail(self) -> dict[str, object]:
        return {"value": self.value, "us": self.us}


@dataclass(frozen=True)
class Scatter(Kernel):
    """Copy consecutive ``chunk``-byte pieces of ``src`` (from ``src_offset``) to the device
    offsets ``dst_offsets`` (an int64 array) of ``dst``: one launch instead of one copy per
    scattered page."""

    src: Buffer
    src_offset: int
    dst: Buffer
    dst_offsets: np.ndarray
    chunk: int
    name = "scatter"
    graphable = False  # its offsets are in the CUDA device's argument ring, reused later

    def reads(self) -> tuple[Access, ...]:
        return (Access(self.src.id, self.src_offset, self.chunk * len(self.dst_offsets)),)

    def writes(self) -> tuple[Access, ...]:
        return tuple(Access(self.dst.id, int(off), self.chunk) for off in self.dst_offsets)

    def buffers(self) -> tuple[Buffer, ...]:
        return (self.src, self.dst)

    def extents(self) -> tuple[tuple[Buffer, int, int], ...]:
        packed = self.src_offset + self.chunk * len(self.dst_offsets)
        return ((self.src, self.src_offset, packed), _span(self.dst, self.dst_offsets, self.chunk))

    def detail(self) -> dict[str, object]:
        return {"pieces": len(self.dst_offsets), "chunk": self.chunk}


@dataclass(frozen=True)
class Gather(Kernel):
    """Copy ``chunk``-byte pieces at ``src_offsets`` of ``src`` to consecutive places of ``dst``
    from ``dst_offset``: the inverse of :class:`Scatter`."""

    src: Buffer
    src_offsets: np.ndarray
    dst: Buffer
    dst_offset: int
    chunk: int
    name = "gather"
    graphable = False  # as Scatter

    def reads(self) -> tuple[Access, ...]:
        return tuple(Access(self.src.id, int(off), self.chunk) for off in self.src_offsets)

    def writes(self) -> tuple[Access, ...]:
        return (Access(self.dst.id, self.dst_offset, self.chunk * len(self.src_offsets)),)

    def buffers(self) -> tuple[Buffer, ...]:
        return (self.src, self.dst)

    def extents(self) -> tuple[tuple[Buffer, int, int], ...]:
        packed = self.dst_offset + self.chunk * len(self.src_offsets)
        return (_span(self.src, self.src_offsets, self.chunk), (self.dst, self.dst_offset, packed))

    def detail(self) -> dict[str, object]:
        return {"pieces": len(self.src_offsets), "chunk": self.chunk}


@dataclass(frozen=True)
class RowKernel(Kernel):
    """A kernel that follows a table row to the KV pages: it reads ``entries`` entries of the row
    at ``table[offset]`` and works on every page they name, in ``pages`` (pages of ``stride``
    bytes; an index outside ``[0, num_pages)`` is skipped). Where it reads or writes depends on
    what it reads in the row, when it runs.

    The op log learns a kernel's byte ranges when it is issued, before it runs. It records the
    pages in ``declared``: the ones the host last published into the row (its pinned shadow).
    That is exactly what the kernel touches when the publish is ordered before it; when it is
    not, the kernel may follow an older row, and the detector finds that race where it starts,
    on the row's own bytes (the publish's copy against this kernel's read), so no race of the
    row is missed and a fixed variant is not charged with pages it never touched. The simulated
    device and the GPU follow the row as they find it."""

    table: Buffer
    offset: int
    entries: int
    pages: Buffer
    stride: int
    num_pages: int
    declared: tuple[int, ...]

    def row(self) -> Access:
        return Access(self.table.id, self.offset, self.entries * TABLE_ENTRY_BYTES)

    def page_accesses(self) -> tuple[Access, ...]:
        return tuple(Access(self.pages.id, p * self.stride, self.stride) for p in self.declared)

    def extents(self) -> tuple[tuple[Buffer, int, int], ...]:
        # Whatever the row says when the kernel runs, it stays inside the pages' buffer.
        return ((self.table, self.offset, self.offset + self.entries * TABLE_ENTRY_BYTES),
                (self.pages, 0, self.num_pages * self.stride))


@dataclass(frozen=True)
class WritePages(RowKernel):
    """``kv_write``: writes ``value`` over every page the row names (new token rows scattered
    through the row: with a stale row, into pages that belong to someone else by now)."""

    value: int = 0
    name = "kv_write"

    def reads(self) -> tuple[Access, ...]:
        return (self.row(),)

    def writes(self) -> tuple[Access, ...]:
        return self.page_accesses()

    def buffers(self) -> tuple[Buffer, ...]:
        return (self.table, self.pages)

    def detail(self) -> dict[str, object]:
        return {"value": self.value, "entries": self.entries, "pages": "as last published"}


@dataclass(frozen=True)
class Attend(RowKernel):
    """``attention``: reads every page the row names and counts the bytes that are not
    ``expected`` (the owner's data), adding the count to the int32 at ``result``; with
    ``assert_on_mismatch`` the first page that differs fires a device-side assert instead."""

    expected: int = 0
    result: Buffer | None = None
    result_offset: int = 0
    assert_on_mismatch: bool = True
    first: Buffer | None = None  # where to keep the first mismatch (FIRST_BYTES), if anywhere
    first_offset: int = 0
    name = "attention"

    def _results(self) -> tuple[Access, ...]:
        assert self.result is not None
        out = (Access(self.result.id, self.result_offset, RESULT_BYTES),)
        if self.first is not None:
            out += (Access(self.first.id, self.first_offset, FIRST_BYTES),)
        return out

    def reads(self) -> tuple[Access, ...]:
        return (self.row(), *self.page_accesses(), *self._results())

    def writes(self) -> tuple[Access, ...]:
        return self._results()

    def buffers(self) -> tuple[Buffer, ...]:
        assert self.result is not None
        return (self.table, self.pages, self.result) + (
            (self.first,) if self.first is not None else ())

    def extents(self) -> tuple[tuple[Buffer, int, int], ...]:
        by_id = {b.id: b for b in self.buffers()}
        return (*super().extents(), *((by_id[a.buffer], a.offset, a.end)
                                      for a in self._results()))

    def detail(self) -> dict[str, object]:
        return {"expected": self.expected, "entries": self.entries,
                "assert": self.assert_on_mismatch, "pages": "as last published"}


@dataclass(frozen=True)
class GatherPages(RowKernel):
    """``gather``: copies every page the row names into consecutive pages of ``packed`` (from
    ``packed_offset``; entry ``e`` to the ``e``-th page there), as an offload or a block-table
    gather does: with a stale row, another owner's pages."""

    packed: Buffer | None = None
    packed_offset: int = 0
    name = "gather_pages"

    def _packed(self) -> Access:
        assert self.packed is not None
        return Access(self.packed.id, self.packed_offset, self.entries * self.stride)

    def reads(self) -> tuple[Access, ...]:
        return (self.row(), *self.page_accesses())

    def writes(self) -> tuple[Access, ...]:
        return (self._packed(),)

    def buffers(self) -> tuple[Buffer, ...]:
        assert self.packed is not None
        return (self.table, self.pages, self.packed)

    def extents(self) -> tuple[tuple[Buffer, int, int], ...]:
        assert self.packed is not None
        packed = self._packed()
        return (*super().extents(), (self.packed, packed.offset, packed.end))

    def detail(self) -> dict[str, object]:
        return {"entries": self.entries, "pages": "as last published"}


@dataclass(frozen=True)
class ScatterPages(GatherPages):
    """``scatter``: copies consecutive pages of ``packed`` into the pages the row names (entry
    ``e`` from the ``e``-th page there), as a KV load does: with a stale row, into another
    owner's pages."""

    name = "scatter_pages"

    def reads(self) -> tuple[Access, ...]:
        return (self.row(), self._packed())

    def writes(self) -> tuple[Access, ...]:
        return self.page_accesses()


def _span(buf: Buffer, offsets: np.ndarray, chunk: int) -> tuple[Buffer, int, int]:
    """The bytes a set of ``chunk``-byte pieces at ``offsets`` can touch, first to last."""
    if len(offsets) == 0:
        return (buf, 0, 0)
    return (buf, int(np.min(offsets)), int(np.max(offsets)) + chunk)

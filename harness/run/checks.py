"""What a scenario's ``check`` steps do: read the pages back (on a stream of their own) and
compare them, and put a wrong byte into words: who wrote the value found, and what the page
should have held. A mixin of the step runner (:class:`harness.run.steps._Steps`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

import kvcore
from harness.lang.model import Step
from kvcore.device.kernels import first_mismatch


class _Corruption(Exception):
    """A check saw data it should not have: ends the trial as ``corruption``."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(detail)
        self.step = step


class _Checks:
    """The step runner's checks (its ``w``, ``ex``, ``wrote`` and ``counted`` are theirs to
    read)."""

    def _check(self, s: Step) -> None:
        w = self.w
        if "lease" in s.args:
            handles = self._handles(s.args["lease"])
            view = w.scratch
            w.pool.copy_to_host(handles, view, w.check_stream)
            if s is self.ex.last_pool_read and self.quiet and w.scrubs and w.pool.poison is None:
                # Nothing else runs on the device and no later step reads the pool: the scrub
                # goes behind this read, on its stream, and this wait is the scrub's too.
                self._scrub("check")
            w.device.synchronize_stream(w.check_stream)
            pages = len(handles)
        else:
            buf = self._buffer(s.args["buffer"])
            view, pages = buf.view, buf.pages
        read = _Pages.of(view, pages)
        equals = _Pages.of(self._buffer(s.args["equals"]).view, pages) \
            if "equals" in s.args else None
        # The logged reads, as views of the pinned bytes: a device program issues them again
        # as they are, and what they show then is that trial's answer, compared anew.
        want = _view(w.device, equals) if equals is not None else None
        w.device.reissued(self._compare, s, read, _view(w.device, read), equals, want)

    def _compare(self, s: Step, read: _Pages, got: np.ndarray, equals: _Pages | None,
                 want: np.ndarray | None) -> None:
        # Every page in one read and one comparison; page by page only to say what is wrong.
        # Compared as bytes: a page or two is a few KiB, where numpy's comparison and reduction
        # cost ten times a memcmp of the copies.
        pages = read.pages
        got = _payloads(read, got)
        if equals is not None:
            want = _payloads(equals, want)  # type: ignore[arg-type]
            if got.tobytes() == want.tobytes():  # the same shape
                return
            want = want.reshape(pages, -1)
        else:
            value = int(s.args["byte"])  # type: ignore[arg-type]
            if got.tobytes() == _filled(value, got.size):
                return
            want = np.full((pages, got.size // pages), value, np.uint8)
        got = got.reshape(pages, -1)
        for page in range(pages):
            bad = int(np.count_nonzero(got[page] != want[page]))
            if bad:
                read = f"lease {s.args['lease']}" if "lease" in s.args else \
                    f"buffer {s.args['buffer']}"
                raise _Corruption(s.label, self._describe(f"{s.label}: {read}", page, got[page],
                                                          want[page], bad))

    def _describe(self, label: str, page: int, got: np.ndarray, want: np.ndarray,
                  bad: int) -> str:
        """What a check found, and whose bytes those are: a buffer a step filled, the pool's
        poison, or what the page held before the trial wrote it."""
        values = sorted(set(got[got != want].tolist()))[:4]
        shown = ", ".join(f"0x{v:02X} ({self._whose(v)})" for v in values)
        return (f"{label}: page {page}: {bad}/{got.size} bytes differ from what was expected "
                f"(0x{int(want[0]):02X}...); found {shown}")

    def _whose(self, value: int) -> str:
        said: list[str] = []
        for byte, what, name, step in self.wrote:
            if byte != value:
                continue
            if what == "readback":
                words = f"buffer {name} as each trial starts it: nothing had landed in it yet"
            elif what == "kv_write":
                assert step is not None
                words = f"written through {name} at {step.label}" + (
                    f" (thread {step.thread})" if step.thread else "")
            elif what == "kernel":
                assert step is not None
                words = f"{name}, written by the kernel at {step.label}" + (
                    f" (thread {step.thread})" if step.thread else "")
            else:
                assert step is not None
                verb = "filled" if what == "fill" else "zeroed"
                kind = "buffer" if what == "fill" else "lease"
                words = f"{kind} {name}, {verb} at {step.label}" + (
                    f" (thread {step.thread})" if step.thread else "")
            if words not in said:
                said.append(words)
        if value == self.w.poison:
            said.append("the pool's poison: the page had been released")
        if value == self.w.unwritten:
            said.append("what the page held before this trial: nothing wrote it yet")
        return "; ".join(said) or "no step of this trial wrote it"

    def _check_counts(self) -> None:
        if not self.counted:
            return
        w = self.w
        n = len(self.counted)
        w.device.copy(w.counters_host, 0, w.counters, 0, 4 * n, w.check_stream)
        w.device.copy(w.firsts_host, 0, w.firsts, 0, 8 * n, w.check_stream)
        w.device.synchronize_stream(w.check_stream)
        # Who holds which page now, taken here rather than when a count is read: a reissued
        # trial calls the comparison of the trial it was captured in, whose leases went back
        # at that trial's end (the world hands the same pages to the same leases every trial).
        holders: dict[int, str] = {}
        for name, group in self.leases.items():
            for lease in group:
                if not lease.released:
                    holders.setdefault(lease.handle.index, name)
        w.device.reissued(self._compare_counts, n, holders)

    def _compare_counts(self, n: int, holders: dict[int, str]) -> None:
        w = self.w
        counts = w.device.host_view(w.counters_host, 0, 4 * n).view(np.int32)
        firsts = w.device.host_view(w.firsts_host, 0, 8 * n).view(np.uint64)
        for (label, says, kept), count, first in zip(self.counted, counts.tolist(),
                                                     firsts.tolist()):
            if count:
                found = first_mismatch(int(first)) if kept else None
                raise _Corruption(label, f"{label}: " + says.format(count=count) + (
                    self._first_wrong(holders, *found) if found else ""))

    def _first_wrong(self, holders: dict[int, str], entry: int, page: int, byte: int) -> str:
        """Whose page a counting attention read (``holders``: the lease holding each page when
        the counts were read), and whose bytes it found there."""
        holder = holders.get(page)
        held = f"lease {holder}'s" if holder is not None else "a page no lease holds now,"
        return (f"; entry {entry} named page {page} ({held} page), which held 0x{byte:02X} "
                f"({self._whose(byte)})")


@dataclass(frozen=True)
class _Pages:
    """The first ``pages`` pages of a host allocation, as a check reads them: where they lie,
    and where each page's payload lies in it (``None``: the whole page is payload)."""

    buffer: kvcore.device.Buffer
    offset: int
    pages: int
    stride: int
    slices: tuple[slice, ...] | None

    @classmethod
    def of(cls, view: kvcore.HostKVAllocationView, pages: int) -> _Pages:
        layout = view.layout
        slices = layout.payload_slices()
        whole = len(slices) == 1 and slices[0] == slice(0, layout.page_stride)
        return cls(view.buffer, view.page_offset(0), pages, layout.page_stride,
                   None if whole else slices)


@functools.lru_cache(maxsize=64)
def _filled(value: int, nbytes: int) -> bytes:
    """``nbytes`` bytes of ``value``: what a check of one byte compares against."""
    return bytes((value,)) * nbytes


def _view(device: kvcore.Device, at: _Pages) -> np.ndarray:
    """The pages' bytes, in one logged read: a view of the pinned memory, to compare at once."""
    return device.host_view(at.buffer, at.offset, at.pages * at.stride)


def _payloads(at: _Pages, raw: np.ndarray) -> np.ndarray:
    """The payloads (padding left out) of the pages' bytes ``raw`` (:func:`_view`): one row
    per page, or all in one when a page holds no padding."""
    if at.slices is None:
        return raw
    rows = raw.reshape(at.pages, -1)
    if len(at.slices) == 1:
        return rows[:, at.slices[0]]
    return np.concatenate([rows[:, part] for part in at.slices], axis=1)

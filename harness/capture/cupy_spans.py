"""Which bytes a CuPy call's arguments are: an array's view, a pinned NumPy array, a pointer.

A CuPy array is device bytes from its ``data.ptr`` (its extent, for a strided view); a NumPy
array is watched memory only when it is pinned, since a stream's copy reads or writes it behind
the host's back (a pageable one is the program's private copy); a bare integer handed to a
kernel where its source declares a pointer is the rest of the live device block it lies in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from operator import attrgetter
from typing import Any

from harness.capture.events import DEVICE, HOST, Span
from harness.capture.extents import AllocationMap, extent_span
from harness.capture.kernel_params import READ, WRITE

RUNTIME_NAMES = ("streamGetFlags", "pointerGetMemoryType", "streamNonBlocking",
                 "memoryTypeHost", "memoryTypeDevice", "memoryTypeManaged", "memcpyHostToHost",
                 "memcpyHostToDevice", "memcpyDeviceToHost", "memcpyDeviceToDevice")
"""The runtime's calls and constants the source reads, taken before any is patched."""


class CupySpans:
    """The byte ranges of CuPy's and NumPy's arrays, and the live device blocks."""

    def __init__(self, cupy: Any) -> None:
        rt = cupy.cuda.runtime
        self.rt: dict[str, Any] = {name: getattr(rt, name) for name in RUNTIME_NAMES}
        self.base = cupy.ndarray.__base__  # the Cython _ndarray_base
        # An array's own MemoryPointer, past the watched ``data`` property (cupy_pointers):
        # the source reads every array's address, and needs no watched pointer for it.
        data = vars(self.base).get("data")
        self.data_of = data.__get__ if data is not None else attrgetter("data")
        self.memptr = cupy.cuda.MemoryPointer
        import numpy
        self.np_ndarray = numpy.ndarray
        self.device = AllocationMap()

    def array_range(self, a: Any) -> Span | None:
        """The device bytes a CuPy array's view spans."""
        if a.size == 0:
            return None
        ptr = self.data_of(a).ptr
        flags = a.flags
        if flags.c_contiguous or flags.f_contiguous:
            return Span(DEVICE, ptr, a.nbytes)
        return extent_span(DEVICE, ptr, a.shape, a.strides, a.itemsize)

    def ranges(self, obj: Any) -> Iterator[Span]:
        """The ranges of the CuPy arrays in ``obj`` (an array, or a list or tuple of them)."""
        if isinstance(obj, self.base):
            r = self.array_range(obj)
            if r is not None:
                yield r
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                if isinstance(item, self.base):
                    r = self.array_range(item)
                    if r is not None:
                        yield r

    def arg_ranges(self, args: Iterable[Any], kwargs: dict[str, Any]) -> list[Span]:
        found = [r for a in args for r in self.ranges(a)]
        found += [r for k, v in kwargs.items() if k != "out" for r in self.ranges(v)]
        return found

    def writes_of(self, a: Any) -> list[Span]:
        r = self.array_range(a)
        return [] if r is None else [r]

    def pinned_range(self, arr: Any) -> Span | None:
        """The bytes of a NumPy array if they are pinned host memory (a pageable array is the
        program's private copy: no stream touches it)."""
        if not isinstance(arr, self.np_ndarray) or arr.size == 0:
            return None
        if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
            return None
        ptr = arr.__array_interface__["data"][0]
        return Span(HOST, ptr, arr.nbytes) if self.is_pinned(ptr) else None

    def is_pinned(self, ptr: int) -> bool:
        try:
            return bool(self.rt["pointerGetMemoryType"](ptr) == self.rt["memoryTypeHost"])
        except Exception:
            return False

    def pointer_range(self, arg: Any, role: str) -> Span | None:
        """What a kernel argument points at: an array's view, a MemoryPointer's block from it
        on, or, for a bare integer where the source declares a pointer, the rest of the live
        block it lies in."""
        if isinstance(arg, self.base):
            return self.array_range(arg)
        if isinstance(arg, self.memptr):
            mem = arg.mem
            end = mem.ptr + mem.size
            if end > arg.ptr:
                return Span(DEVICE, arg.ptr, end - arg.ptr)
            arg = arg.ptr
        if isinstance(arg, int) and not isinstance(arg, bool) and role in (READ, WRITE):
            block = self.device.find(arg)
            if block is not None:
                return Span(DEVICE, arg, block.start + block.nbytes - arg)
        return None

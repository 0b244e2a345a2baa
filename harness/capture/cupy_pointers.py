"""The CuPy source's raw pointers: copies and fills issued through ``cupy.cuda.MemoryPointer``.

CuPy-based engines move raw bytes with ``a.data.copy_from_device_async(b.data, n, stream)``,
``copy_from_host_async``, ``copy_to_host_async`` and ``memset_async`` (and their legacy-stream
forms without ``_async``). ``MemoryPointer`` is an immutable Cython type whose methods call the
CUDA runtime from compiled code, so neither the type nor the runtime module can be hooked for
them. Its Python subclass can: the pointers the program gets from ``ndarray.data`` (a property
of the Python class ``cupy.ndarray``) and from ``cupy.cuda.alloc`` are handed out as a
:class:`WatchedPointer` of the same memory, whose methods say the copy, then run CuPy's own.

A watched pointer is the same pointer to the program: the same ``ptr``, ``mem`` and device, an
instance of ``MemoryPointer``, and ``a.data is a.data`` still holds while the first is alive
(the watched pointer of a pointer is kept for as long as anything holds it). A pointer the
program gets elsewhere (``MemoryPool.malloc``, a ``MemoryPointer`` it builds) is not watched,
and the notes say so.

The legacy-stream forms use the legacy default stream, whatever the current stream, and the
host copies among them (``copy_from_host``, ``copy_to_host``) wait for the copy.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from harness.capture.cupy_capture import CupyCapture, named
from harness.capture.cupy_copies import CopyHooks
from harness.capture.events import LEGACY_STREAM

# Each method: which way it copies ("dtod", "htod", "dtoh", "memset"; "from": by its source's
# type), whether it takes a stream, and whether it waits for the copy.
_METHODS: dict[str, tuple[str, bool, bool]] = {
    "copy_from_device": ("dtod", False, False),
    "copy_from_device_async": ("dtod", True, False),
    "copy_from_host": ("htod", False, True),
    "copy_from_host_async": ("htod", True, False),
    "copy_to_host": ("dtoh", False, True),
    "copy_to_host_async": ("dtoh", True, False),
    "copy_from": ("from", False, True),
    "copy_from_async": ("from", True, False),
    "memset": ("memset", False, False),
    "memset_async": ("memset", True, False),
}


class PointerHooks:
    """``MemoryPointer``'s copies and fills, through the pointers the program is handed."""

    def __init__(self, capture: CupyCapture, copies: CopyHooks) -> None:
        self.capture = capture
        self.copies = copies
        self.kind: type | None = None  # WatchedPointer, once installed
        self._watched: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def install(self) -> None:
        capture = self.capture
        cp = capture.cp
        base = cp.cuda.memory.MemoryPointer
        hooks = self
        methods = {name: self._method(base, name, *how) for name, how in _METHODS.items()
                   if hasattr(base, name)}
        self.kind = type("WatchedPointer", (base,), {
            "__doc__": "A MemoryPointer whose copies and fills gpurace watch sees.",
            "__module__": __name__, "_original": None, **methods})
        data = capture.spans.base.__dict__["data"].__get__

        def watched_data(a: Any) -> Any:
            return hooks.watch(data(a))

        capture.patch(cp.ndarray, "data", property(watched_data))
        memory = cp.cuda.memory
        alloc = memory.alloc

        def watched_alloc(size: int) -> Any:
            return hooks.watch(alloc(size))

        for owner in {id(cp.cuda): cp.cuda, id(memory): memory}.values():
            if getattr(owner, "alloc", None) is alloc:
                capture.patch(owner, "alloc", named(watched_alloc, "alloc", alloc))
        capture.note("cupy.cuda.MemoryPointer copies and fills are seen on the pointers "
                     "ndarray.data and cupy.cuda.alloc hand out, not on others "
                     "(MemoryPool.malloc, a MemoryPointer the program builds)")

    def watch(self, ptr: Any) -> Any:
        """The watched pointer of ``ptr`` (``ptr`` itself when not watching, or where it
        cannot be made): kept while anything holds it, so the same array's ``data`` is the
        same object meanwhile."""
        kind = self.kind
        if kind is None or not self.capture.active or type(ptr) is not kind.__base__:
            return ptr
        try:
            watched = self._watched.get(id(ptr))
            if watched is None:
                mem = ptr.mem
                watched = kind(mem, ptr.ptr - mem.ptr)
                watched._original = ptr  # holds the id for as long as the entry lives
                self._watched[id(ptr)] = watched
            return watched
        except Exception as exc:  # never the program's failure: it gets its own pointer
            self.capture.failed("ndarray.data", exc)
            return ptr

    def _method(self, base: type, name: str, how: str, takes_stream: bool,
                waits: bool) -> Callable[..., Any]:
        original = getattr(base, name)
        capture, hooks = self.capture, self

        def method(ptr: Any, *args: Any, **kwargs: Any) -> Any:
            if not capture.active or capture.frame is not None:
                # Inside a watched call (cupy.copyto, cupy.zeros fill through ``.data``):
                # that call's op is this copy's, said once.
                return original(ptr, *args, **kwargs)
            try:
                hooks.say(name, ptr, how, takes_stream, waits, *args, **kwargs)
            except Exception as exc:  # its own arguments: CuPy says what is wrong with them
                capture.failed(f"MemoryPointer.{name}", exc)
            return capture.opaque(original, ptr, *args, **kwargs)

        return named(method, name, original)

    def say(self, name: str, ptr: Any, how: str, takes_stream: bool, waits: bool,
            other: Any, size: int, stream: Any = None) -> None:
        """The op of ``ptr.name(other, size[, stream])``: ``other`` is the source (or, for
        ``copy_to_host``, the target; for a fill, the byte)."""
        capture, rt = self.capture, self.capture.spans.rt
        sid = capture.stream_sid(stream) if takes_stream else LEGACY_STREAM
        label = f"MemoryPointer.{name}"
        if how == "memset":
            self.copies.raw_memset(ptr.ptr, int(size), sid, label)
            return
        if how == "from":
            how = "dtod" if isinstance(other, capture.cp.cuda.memory.MemoryPointer) else "htod"
        if how == "dtod":
            dst, src, kind = ptr.ptr, other.ptr, rt["memcpyDeviceToDevice"]
        elif how == "htod":
            dst, src, kind = ptr.ptr, _address(other), rt["memcpyHostToDevice"]
        else:
            dst, src, kind = _address(other), ptr.ptr, rt["memcpyDeviceToHost"]
        self.copies.raw_copy(dst, src, int(size), kind, sid, waits and how != "dtod", label)


def _address(mem: Any) -> int:
    """A host pointer as CuPy takes one: an int, a ``ctypes.c_void_p``, or a pinned pointer."""
    if isinstance(mem, int):
        return mem
    value = getattr(mem, "value", None)
    if isinstance(value, int):
        return value
    return int(getattr(mem, "ptr", mem))

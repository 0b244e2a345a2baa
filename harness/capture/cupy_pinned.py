"""Pinned host memory as NumPy arrays: the host's reads and writes of it are ops.

While the CuPy source is installed, ``cupyx.empty_pinned`` and its kin return
:data:`PinnedArray` views: a NumPy subclass whose reads and writes on the host (``staging[:] =
ids``, ufuncs, NumPy functions) are host ops, since a stream's copy reads or writes those bytes
behind the host's back. What NumPy does inside one such access is not reported again.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from harness.capture.cupy_capture import CupyCapture
from harness.capture.events import HOST, Span
from harness.capture.extents import extent, extent_span, is_basic_index
from harness.capture.sites import program_site


class HostReporter(Protocol):
    """Where :class:`PinnedArray` reports the host's accesses."""

    def host_access(self, kind: str, arrays: Iterable[Any]) -> None: ...

    def host_call(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...


class PinnedHost:
    """The pinned constructors' hooks, and the host accesses their arrays report."""

    def __init__(self, capture: CupyCapture) -> None:
        self.capture = capture
        self._tls = threading.local()

    def install(self) -> None:
        """cupyx's pinned constructors hand out :class:`PinnedArray` views, whose NumPy reads
        and writes are host ops (the module's own functions call ``empty_pinned`` through the
        module, so ``zeros_pinned`` and ``zeros_like_pinned`` are covered by the first two)."""
        import cupyx
        import cupyx._pinned_array as pinned

        self.capture.on_uninstall(self._uninstall)
        pinned_class = pinned_array_class()
        for name in ("empty_pinned", "empty_like_pinned"):
            original = getattr(pinned, name)

            def make(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
                return _original(*args, **kwargs).view(pinned_class)

            watched = functools.wraps(original)(make)
            self.capture.patch(pinned, name, watched)
            self.capture.patch(cupyx, name, watched)
        global _HOST_SOURCE
        _HOST_SOURCE = self

    def _uninstall(self) -> None:
        global _HOST_SOURCE
        if _HOST_SOURCE is self:
            _HOST_SOURCE = None

    def host_access(self, kind: str, arrays: Iterable[Any]) -> None:
        """The program's host code read or wrote pinned arrays: one host op. Accesses CuPy
        makes inside a watched call (``numpy.ascontiguousarray`` in ``set``) are its own."""
        capture = self.capture
        if not capture.active or capture.frame is not None or getattr(self._tls, "host", False):
            return
        try:
            spans = [r for a in arrays if (r := host_range(a)) is not None]
            if spans:
                reads, writes = ([], spans) if kind == "host_write" else (spans, [])
                capture.op(None, kind, reads, writes, program_site(), "numpy")
        except Exception as exc:
            capture.failed("a pinned array's host access", exc)

    def host_call(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run NumPy's own work on pinned arrays without reporting its inner steps again."""
        tls = self._tls
        outer = getattr(tls, "host", False)
        tls.host = True
        try:
            return call(*args, **kwargs)
        finally:
            tls.host = outer


def host_range(arr: Any) -> Span | None:
    if arr.size == 0:
        return None
    return extent_span(HOST, arr.__array_interface__["data"][0], arr.shape, arr.strides,
                       arr.itemsize)


_HOST_SOURCE: HostReporter | None = None
"""The installed source that :class:`PinnedArray` reports to."""
_PINNED_CLASS: type | None = None
_NUMPY_WRITES_FIRST = frozenset({"copyto", "put", "place", "putmask", "fill_diagonal",
                                 "put_along_axis"})
"""NumPy functions that write their first argument (any ``out=`` is written too)."""


def pinned_array_class() -> type:
    """:class:`PinnedArray`, made once NumPy is imported (this module imports no NumPy)."""
    global _PINNED_CLASS, PinnedArray
    if _PINNED_CLASS is None:
        _PINNED_CLASS = PinnedArray = _make_pinned_array_class()
    return _PINNED_CLASS


def _host(kind: str, arrays: Iterable[Any]) -> None:
    source = _HOST_SOURCE
    if source is not None:
        source.host_access(kind, arrays)


def _make_pinned_array_class() -> type:
    import numpy

    plain = numpy.ndarray

    def pinned_in(values: Iterable[Any]) -> list[Any]:
        found = []
        for v in values:
            if isinstance(v, PinnedArray):
                found.append(v)
            elif isinstance(v, (list, tuple)):
                found += [x for x in v if isinstance(x, PinnedArray)]
        return found

    def unwrap(v: Any) -> Any:
        if isinstance(v, PinnedArray):
            return v.view(plain)
        if isinstance(v, tuple):
            return tuple(unwrap(x) for x in v)
        return v

    class PinnedArray(plain):
        """A NumPy array over pinned host memory (what ``cupyx.empty_pinned`` returns while
        the CuPy source is installed): the host's reads and writes of it are ops, since a
        stream's copy reads or writes the same bytes behind the host's back. Views stay
        PinnedArrays; results computed from it are plain NumPy arrays."""

        def __setitem__(self, key: Any, value: Any) -> None:
            target = plain.__getitem__(self, key) if is_basic_index(key) else self
            _host("host_write", [target] if isinstance(target, plain) else [self])
            _host("host_read", pinned_in([value]))
            _call_host(plain.__setitem__, self, key, value)  # NumPy indexes self inside

        def __getitem__(self, key: Any) -> Any:
            result = plain.__getitem__(self, key)
            if not (isinstance(result, plain) and _same_bytes(result, self)):
                _host("host_read", [self])  # an element or a copy: the bytes were read
            return result

        def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
            outs = kwargs.get("out") or ()
            written = pinned_in(outs) + (pinned_in(inputs[:1]) if method == "at" else [])
            _host("host_read", pinned_in(inputs))
            _host("host_write", written)
            if outs:
                kwargs["out"] = unwrap(tuple(outs))
            result = _call_host(getattr(ufunc, method), *unwrap(inputs), **kwargs)
            if outs:  # the caller's own arrays, as NumPy returns them
                return outs[0] if len(outs) == 1 else tuple(outs)
            return result

        def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
            first = func.__name__ in _NUMPY_WRITES_FIRST
            written = pinned_in([kwargs.get("out")]) + (pinned_in(args[:1]) if first else [])
            _host("host_read", pinned_in(args[1:] if first else args)
                  + pinned_in([v for k, v in kwargs.items() if k != "out"]))
            _host("host_write", written)
            return _call_host(plain.__array_function__, self, func, types, args, kwargs)

        def fill(self, value: Any) -> None:
            _host("host_write", [self])
            plain.fill(self, value)

        def sort(self, *args: Any, **kwargs: Any) -> None:
            _host("host_write", [self])
            _call_host(plain.sort, self, *args, **kwargs)

        def copy(self, *args: Any, **kwargs: Any) -> Any:
            _host("host_read", [self])
            return plain.copy(self.view(plain), *args, **kwargs)

        def tolist(self) -> Any:
            _host("host_read", [self])
            return plain.tolist(self)

        def tobytes(self, *args: Any, **kwargs: Any) -> bytes:
            _host("host_read", [self])
            return plain.tobytes(self, *args, **kwargs)

        def item(self, *args: Any) -> Any:
            _host("host_read", [self])
            return plain.item(self, *args)

        def __reduce__(self) -> Any:  # pickled as the plain array it is
            _host("host_read", [self])
            return plain.__reduce__(self.view(plain))

    PinnedArray.__module__ = __name__
    return PinnedArray


def _same_bytes(a: Any, b: Any) -> bool:
    """Whether two NumPy arrays' extents overlap (``numpy.may_share_memory`` would come back
    to the pinned array's own ``__array_function__``)."""
    spans = []
    for x in (a, b):
        span = extent(x.__array_interface__["data"][0], x.shape, x.strides, x.itemsize)
        if span is None:
            return False
        spans.append(span)
    return spans[0].start < spans[1].end and spans[1].start < spans[0].end


def _call_host(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    source = _HOST_SOURCE
    if source is None:
        return call(*args, **kwargs)
    return source.host_call(call, *args, **kwargs)


PinnedArray: type | None = None
"""The pinned array class, once :func:`pinned_array_class` made it."""

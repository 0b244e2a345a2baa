"""The CuPy source's copies: ``ndarray.get``/``set`` and the runtime's memcpy and memset.

A copy's op is known before it runs (which bytes, which way, whether the host waits), so it is
written first, after the op of any watched call it is part of, and what CuPy does inside it is
not reported again. A copy whose host side is pageable waits, whatever it was asked: the driver
copies such memory through a staging buffer of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.capture.cupy_capture import CupyCapture, named
from harness.capture.events import DEVICE, HOST, LEGACY_STREAM, Span
from harness.capture.sites import program_site


class CopyHooks:
    """Copies between the host and the device, and fills."""

    def __init__(self, capture: CupyCapture) -> None:
        self.capture = capture

    # -- ndarray ------------------------------------------------------------------------------

    def get(self, original: Callable[..., Any], a: Any, stream: Any = None, order: str = "C",
            out: Any = None, blocking: bool = True) -> Any:
        """``ndarray.get``: a copy to the host; waits when ``blocking``, and always when the
        host side is pageable (the driver copies it through a staging buffer of its own)."""
        capture, spans = self.capture, self.capture.spans
        if not capture.active or (out is not None and not isinstance(out, spans.np_ndarray)):
            return original(a, stream, order, out, blocking)  # CuPy raises, or not watching
        try:
            src = spans.array_range(a)
            dst = None if out is None else spans.pinned_range(out)
            sync = blocking or dst is None
            if src is not None:
                capture.copy_op("ndarray.get", "copy_dtoh", capture.stream_sid(stream), [src],
                                [] if dst is None else [dst], sync)
        except Exception as exc:
            capture.failed("ndarray.get", exc)
        return capture.opaque(original, a, stream, order, out, blocking)

    def set(self, original: Callable[..., Any], a: Any, arr: Any, stream: Any = None) -> Any:
        """``ndarray.set``: a copy from the host, waited for unless the host side is pinned."""
        capture, spans = self.capture, self.capture.spans
        flags = a.flags
        if not capture.active or not isinstance(arr, spans.np_ndarray) or (
                arr.dtype != a.dtype or arr.shape != a.shape) or not (
                flags.c_contiguous or flags.f_contiguous):
            return original(a, arr, stream)  # CuPy raises, or nothing to watch
        try:
            dst = spans.array_range(a)
            same_order = arr.flags.c_contiguous if flags.c_contiguous else arr.flags.f_contiguous
            src = spans.pinned_range(arr) if same_order else None  # else a pageable copy
            if dst is not None:
                capture.copy_op("ndarray.set", "copy_htod", capture.stream_sid(stream),
                                [] if src is None else [src], [dst], src is None)
        except Exception as exc:
            capture.failed("ndarray.set", exc)
        return capture.opaque(original, a, arr, stream)

    # -- the runtime --------------------------------------------------------------------------

    def install_runtime(self) -> None:
        """``cupy.cuda.runtime``'s memcpy and memset calls."""
        capture = self.capture
        rt = capture.cp.cuda.runtime
        copies = self
        originals = {name: getattr(rt, name) for name in (
            "memcpy", "memcpyAsync", "memset", "memsetAsync")}

        def memcpy(dst: int, src: int, size: int, kind: int) -> Any:
            copies.raw_copy(dst, src, size, kind, LEGACY_STREAM, True, "runtime.memcpy")
            return capture.opaque(originals["memcpy"], dst, src, size, kind)

        def memcpy_async(dst: int, src: int, size: int, kind: int, stream: int) -> Any:
            copies.raw_copy(dst, src, size, kind, stream, False, "runtime.memcpyAsync")
            return capture.opaque(originals["memcpyAsync"], dst, src, size, kind, stream)

        def memset(ptr: int, value: int, size: int) -> Any:
            result = originals["memset"](ptr, value, size)
            copies.raw_memset(ptr, size, LEGACY_STREAM, "runtime.memset")
            return result

        def memset_async(ptr: int, value: int, size: int, stream: int) -> Any:
            result = originals["memsetAsync"](ptr, value, size, stream)
            copies.raw_memset(ptr, size, stream, "runtime.memsetAsync")
            return result

        for name, wrapper in (("memcpy", memcpy), ("memcpyAsync", memcpy_async),
                              ("memset", memset), ("memsetAsync", memset_async)):
            capture.patch(rt, name, named(wrapper, name, originals[name]))

    def space(self, ptr: int, kind: int, host_side: bool) -> str | None:
        """Where one side of a raw memcpy lies: ``d``, ``h`` (pinned), or None (pageable host
        memory: the program's private bytes)."""
        spans = self.capture.spans
        rt = spans.rt
        if kind == rt["memcpyHostToHost"] or (host_side and kind in (
                rt["memcpyHostToDevice"], rt["memcpyDeviceToHost"])):
            return HOST if spans.is_pinned(ptr) else None
        if kind in (rt["memcpyHostToDevice"], rt["memcpyDeviceToHost"],
                    rt["memcpyDeviceToDevice"]):
            return DEVICE
        try:  # cudaMemcpyDefault: the pointer says
            memory = rt["pointerGetMemoryType"](ptr)
        except Exception:
            return None
        if memory in (rt["memoryTypeDevice"], rt["memoryTypeManaged"]):
            return DEVICE
        return HOST if memory == rt["memoryTypeHost"] else None

    def raw_copy(self, dst: int, src: int, size: int, kind: int, stream: int, waits: bool,
                 label: str) -> None:
        capture = self.capture
        if not capture.active or not size:
            return
        try:
            rt = capture.spans.rt
            src_space = self.space(src, kind, kind == rt["memcpyHostToDevice"])
            dst_space = self.space(dst, kind, kind == rt["memcpyDeviceToHost"])
            spaces = (src_space or HOST, dst_space or HOST)
            copy_kind = {(HOST, DEVICE): "copy_htod", (DEVICE, HOST): "copy_dtoh",
                         (DEVICE, DEVICE): "copy_dtod"}.get(spaces, "copy_htoh")
            sync = waits or src_space is None or dst_space is None
            capture.copy_op(label, copy_kind, capture.sid(stream),
                            [] if src_space is None else [Span(src_space, src, size)],
                            [] if dst_space is None else [Span(dst_space, dst, size)], sync)
        except Exception as exc:
            capture.failed(label, exc)

    def raw_memset(self, ptr: int, size: int, stream: int, label: str) -> None:
        capture = self.capture
        if not capture.active or not size:
            return
        try:
            capture.ordered()
            capture.op(capture.sid(stream), "memset", [], [Span(DEVICE, ptr, size)],
                       program_site(), label)
        except Exception as exc:
            capture.failed(label, exc)

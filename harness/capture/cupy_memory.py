"""The CuPy source's memory: the blocks CuPy's device and pinned pools hand out and take back.

The device pool reports every block to a ``cupy.cuda.MemoryHook``; hooks are per thread, so the
hook is put in each thread that starts after install, too (a profile function is the first
thing such a thread runs). The pinned pool hands out a ``PooledPinnedMemory`` per allocation,
whose ``__init__`` and ``free`` are watched in place. A block handed out inside a watched call
is that call's: an output or a temporary it writes, or, pinned, CuPy's staging buffer.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from harness.capture.cupy_capture import OPAQUE, SOURCE, CupyCapture
from harness.capture.events import DEVICE, HOST, Span
from harness.capture.extents import AllocationMap
from harness.capture.sites import program_site

HOOK_NAME = "gpurace"
"""The memory hook's name in CuPy's per-thread table of hooks."""


class MemoryHooks:
    """The device pool's memory hook and the pinned pool's blocks, reported as allocations."""

    def __init__(self, capture: CupyCapture) -> None:
        self.capture = capture
        self.pinned = AllocationMap()
        self._hook: Any = None
        self._prev_profile: Any = None
        self._profile = self._thread_started  # one bound method, so `is` finds it again

    # -- the device pool ----------------------------------------------------------------------

    def install(self) -> None:
        capture = self.capture
        hooks = self

        class Hook(capture.cp.cuda.MemoryHook):
            name = HOOK_NAME

            def malloc_postprocess(self, **kw: Any) -> None:
                hooks.on_malloc(kw["mem_ptr"], kw["size"], kw["mem_size"])

            def free_preprocess(self, **kw: Any) -> None:
                hooks.on_free(kw["mem_ptr"])

        capture.on_uninstall(self._uninstall)
        self._hook = Hook()
        self._hook_thread()
        self._prev_profile = threading.getprofile()
        threading.setprofile(self._profile)

    def _uninstall(self) -> None:
        if threading.getprofile() is self._profile:
            threading.setprofile(self._prev_profile)
        try:
            self.capture.cp.cuda.memory_hook.get_memory_hooks().pop(HOOK_NAME, None)
        except Exception:  # the hook table gone with CuPy's teardown: nothing to take out
            pass

    def _hook_thread(self) -> None:
        # Setting the entry directly, not `with hook:`, so a thread that had it keeps one.
        self.capture.cp.cuda.memory_hook.get_memory_hooks()[HOOK_NAME] = self._hook

    def _thread_started(self, frame: Any, event: str, arg: Any) -> None:
        """The first thing a thread started after install runs: hand its profiler back, and put
        the memory hook in it (CuPy's hooks are per thread)."""
        sys.setprofile(self._prev_profile)
        if self.capture.active:
            try:
                self._hook_thread()
            except Exception as exc:
                self.capture.failed("a new thread's memory hook", exc)

    def on_malloc(self, ptr: int, size: int, block: int) -> None:
        capture = self.capture
        if not capture.active or not ptr:
            return
        try:
            sid = capture.current_sid()
            capture.spans.device.add(ptr, size, sid)
            capture.emit(["alloc", DEVICE, ptr, size, {"what": "array", "name": None,
                                                       "site": program_site(), "stream": sid,
                                                       "source": SOURCE, "block": block}])
            frame = capture.frame
            if frame is not None and frame is not OPAQUE:
                frame.allocs.append(Span(DEVICE, ptr, size))
        except Exception as exc:
            capture.failed("a device allocation", exc)

    def on_free(self, ptr: int) -> None:
        capture = self.capture
        if not capture.active or not ptr:
            return
        try:
            capture.spans.device.remove(ptr)
            capture.emit(["free", DEVICE, ptr, {"site": program_site(), "streams": [],
                                                "source": SOURCE}])
            frame = capture.frame
            if frame is not None and frame is not OPAQUE:
                frame.allocs = [a for a in frame.allocs if a.address != ptr]
        except Exception as exc:
            capture.failed("a device free", exc)

    # -- the pinned pool ----------------------------------------------------------------------

    def install_pinned(self) -> None:
        """The pinned pool hands out a PooledPinnedMemory per allocation and takes the block
        back when it is freed, to hand out again at once (no stream order: alloc stream None)."""
        pooled = self.capture.cp.cuda.pinned_memory.PooledPinnedMemory
        hooks = self
        init, free = pooled.__init__, pooled.__dict__["free"]

        def watched_init(mem: Any, *args: Any, **kwargs: Any) -> None:
            init(mem, *args, **kwargs)
            hooks.on_pinned_alloc(mem.ptr, mem.size)

        def watched_free(mem: Any) -> None:
            if mem.ptr:
                hooks.on_pinned_free(mem.ptr)
            free(mem)

        self.capture.patch(pooled, "__init__", watched_init)
        self.capture.patch(pooled, "free", watched_free)
        self.capture.patch(pooled, "__del__", watched_free)

    def on_pinned_alloc(self, ptr: int, size: int) -> None:
        capture = self.capture
        if not capture.active or not ptr:
            return
        try:
            self.pinned.add(ptr, size)
            capture.emit(["alloc", HOST, ptr, size, {"what": "pinned buffer", "name": None,
                                                     "site": program_site(), "stream": None,
                                                     "source": SOURCE}])
            frame = capture.frame
            if frame is not None and frame is not OPAQUE:
                frame.staging.append(Span(HOST, ptr, size))
        except Exception as exc:
            capture.failed("a pinned allocation", exc)

    def on_pinned_free(self, ptr: int) -> None:
        capture = self.capture
        if not capture.active:
            return
        try:
            self.pinned.remove(ptr)
            capture.emit(["free", HOST, ptr, {"site": program_site(), "streams": [],
                                              "source": SOURCE}])
        except Exception as exc:
            capture.failed("a pinned free", exc)

"""The CUDA device, over CuPy: real streams, events, pinned memory and NVRTC kernels.

This is the only module of gpurace that imports cupy, and only when a CudaDevice is made, so the
rest (and CI) works without it. It is also the one place where CuPy's and the CUDA runtime's
errors become kvcore errors (:func:`_translated`).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.resources
import os
import statistics
import time
from collections import deque
from typing import Any

import numpy as np

from kvcore.defects import Defects
from kvcore.device.base import Device, DeviceInfo
from kvcore.device.handles import DEVICE, Buffer, Event, Stream
from kvcore.device.graph import START, Graph
from kvcore.device.program import ACTION, Item, Live
from kvcore.device.kernels import (
    TOUCH_READ_VALUE,
    TOUCH_SPANS_MAX,
    Attend,
    Delay,
    Fill,
    Gather,
    GatherPages,
    Kernel,
    ReadTable,
    Scatter,
    ScatterPages,
    Touch,
    Verify,
    WritePages,
)
from kvcore.errors import DeviceError, DeviceFaultError, DeviceUnavailableError, DeviceUsageError

_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction inferred from unified addresses
_HOST_ALLOC_PORTABLE_MAPPED = 0x01 | 0x02  # so kernels can read pinned memory directly

# Errors after which the context is dead ("sticky"): CUDA codes shared by runtime and driver.
_STICKY = {
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    710: "CUDA_ERROR_ASSERT",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
    999: "CUDA_ERROR_UNKNOWN",
}
_THREADS = 256


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:  # also covers a cupy wheel whose CUDA libraries are missing
        raise DeviceUnavailableError(
            f"CuPy is not importable ({exc}); pip install 'gpurace[cuda]' (or 'gpurace[cuda12]')"
        ) from exc
    return cupy


def available() -> tuple[bool, str]:
    """Whether a CUDA GPU is usable here, and if not, why (for ``auto`` and ``doctor``)."""
    try:
        cupy = _cupy()
        count = cupy.cuda.runtime.getDeviceCount()
    except DeviceUnavailableError as exc:
        return False, str(exc)
    except Exception as exc:  # CUDARuntimeError when there is no driver or no device
        return False, f"CUDA reports no usable device: {exc}"
    if count == 0:
        return False, "CUDA reports no device"
    return True, f"{count} CUDA device(s)"


def device_uuids() -> list[str | None]:
    """The UUID of each GPU CUDA shows this process, in CUDA's order (None where CUDA gives
    none), as NVML writes it: what pins a worker to one GPU however CUDA orders them. Makes no
    context. Raises DeviceUnavailableError without CuPy."""
    runtime = _cupy().cuda.runtime
    return [_uuid(runtime.getDeviceProperties(i).get("uuid"))
            for i in range(runtime.getDeviceCount())]


class CudaDevice(Device):
    """A real GPU through CuPy. Kernels compile once per process (NVRTC caches on disk)."""

    kind = "cuda"

    def __init__(self, *, defects: Defects = Defects(), seed: int = 0, index: int = 0,
                 timeline: bool = False) -> None:
        # CUDA maps streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 by default);
        # two streams sharing a queue are serialized, which hides exactly the cross-stream races
        # gpurace exists to show. 32 is the most CUDA allows; it must be set before the context
        # exists, and a value the user set wins.
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
        # With lazy loading (CUDA's default since 12.2) a kernel's first launch loads it, and
        # loading waits for the device: the first table read of a worker would wait for the
        # legacy-stream publish it races (seen: the first request never crashed). Load eagerly,
        # and launch each kernel once below in case the context already existed.
        os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
        self._cp = _cupy()
        self.index = index
        with _translated(self):
            self._cp.cuda.Device(index).use()
            source = importlib.resources.files("kvcore.device").joinpath("kernels.cu").read_text()
            module = self._cp.RawModule(code=source, options=("-std=c++17",))
            self._fns = {n: module.get_function(n) for n in
                         ("kv_fill", "kv_verify", "kv_read_table", "kv_delay", "kv_move_pages",
                          "kv_touch")}
            props = self._cp.cuda.runtime.getDeviceProperties(index)
        self._data_error = self._compile_data_kernels()
        self._sm_count = int(props["multiProcessorCount"])
        self._props = props
        # CuPy's runtime functions, called directly: of the paths measured on the H200 (its
        # Stream and Event methods, CUDA's Python bindings, ctypes into libcuda) the cheapest.
        self._rt = self._cp.cuda.runtime
        self._memcpy = self._rt.memcpyAsync
        self._args = _ArgRing(self._cp)
        super().__init__(defects=defects, seed=seed)
        self._never = self.alloc(4, name="never-flag", role="oracle")
        self.memset(self._never, 0, 4, 0, self.legacy_stream)
        self._warm_up()
        self.delay_200us_measured_us = self._check_delay()
        self._timing_events: list[Any] = []  # timing events, recycled across trials
        self._capture_streams: list[Stream] = []  # where graphs are captured (_do_graph_end)
        self._base: tuple[Any, int] | None = None  # the trial's first stamp, its host time
        if timeline:
            self.timeline = True
            # Each stream op between two timing events, read after the trial (settle_times):
            # wrapped here so that a run without --timeline pays nothing for it.
            for name, at in (("_do_record", 1), ("_do_wait", 0), ("_do_copy", 5),
                             ("_do_copy_2d", 8), ("_do_memset", 4), ("_do_launch", 1)):
                setattr(self, name, self._timing(getattr(self, name), at))

    def _compile_data_kernels(self) -> str:
        """The row-following kernels (kernels_data.cu), in a module of their own: if they do
        not compile, only the steps that use them fail (saying why), not the device. Returns
        why they are missing, or ""."""
        source = importlib.resources.files("kvcore.device").joinpath("kernels_data.cu")
        try:
            module = self._cp.RawModule(code=source.read_text(), options=("-std=c++17",))
            for name in ("kv_write_pages", "kv_attention", "kv_move_row_pages"):
                self._fns[name] = module.get_function(name)
        except Exception as exc:  # NVRTC's compile error, with the compiler's log
            return f"{type(exc).__name__}: {exc}"
        return ""

    # ---- calibration ---------------------------------------------------------------------------
    def _warm_up(self) -> None:
        """Launch every kernel once with no work, then wait: no first launch happens later,
        inside a race window."""
        stream = self.legacy_stream.handle
        flag = np.uint64(self._never.address)
        zero64, zero32 = np.uint64(0), np.int32(0)
        with _translated(self):
            self._fns["kv_fill"]((1,), (1,), (flag, zero64, np.uint32(0)), stream=stream)
            self._fns["kv_verify"]((1,), (1,), (flag, zero64, np.uint32(0), flag),
                                   stream=stream)
            self._fns["kv_read_table"]((1,), (1,), (flag, zero32, flag, zero32, flag, zero32),
                                       stream=stream)
            self._fns["kv_move_pages"]((1,), (1,), (flag, flag, flag, zero32, zero64, zero32),
                                       stream=stream)
            if not self._data_error:
                self._fns["kv_write_pages"]((1,), (1,), (flag, zero32, flag, zero64, zero32,
                                                         np.uint32(0)), stream=stream)
                self._fns["kv_attention"]((1,), (1,), (flag, zero32, flag, zero64, zero32,
                                                       np.uint32(0), flag, zero32, zero64),
                                          stream=stream)
                self._fns["kv_move_row_pages"]((1,), (1,), (flag, zero32, flag, zero64, zero32,
                                                            flag, zero32), stream=stream)
            self._fns["kv_touch"]((1,), (1,), (*(zero64,) * (4 * TOUCH_SPANS_MAX),
                                               np.uint32(0), np.int64(0)), stream=stream)
            self._spin(0.0, stream)
            self._cp.cuda.runtime.deviceSynchronize()

    def _check_delay(self) -> float:
        """How long a requested 200 us delay really takes, timed with events (median of five,
        after a warm-up): a check that the amplifier means what it says."""
        cp = self._cp
        stream = self.legacy_stream.handle
        samples = []
        with _translated(self):
            self._spin(1000.0, stream)
            for _ in range(5):
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record(stream)
                self._spin(200.0, stream)
                stop.record(stream)
                stop.synchronize()
                samples.append(cp.cuda.get_elapsed_time(start, stop) * 1000.0)
        return statistics.median(samples)

    def _spin(self, us: float | None, stream: Any) -> None:
        self._fns["kv_delay"]((1,), (1,), self._spin_args(us), stream=stream)

    def _spin_args(self, us: float | None) -> tuple[Any, ...]:
        """The delay kernel's arguments: how long in ns (-1: for ever), and the flag it polls."""
        return np.int64(-1 if us is None else int(us * 1000)), np.uint64(self._never.address)

    # ---- --timeline ------------------------------------------------------------------------------
    def _timing(self, do: Any, at: int) -> Any:
        """``do`` (a stream op, its stream the argument at ``at``) between two timing events
        on that stream."""
        def timed(*args: Any) -> _Span:
            stream = args[at].handle.ptr
            start = self._stamp(stream)
            do(*args)
            return _Span(start, self._stamp(stream))
        return timed

    def _stamp(self, stream: int) -> Any:
        """A timing event recorded on ``stream`` now; the trial's first also records the base
        that times are measured from, and when the host recorded it."""
        events = self._timing_events
        try:
            if self._base is None:
                base = events.pop() if events else self._cp.cuda.Event()
                self._rt.eventRecord(base.ptr, stream)
                self._base = (base, time.perf_counter_ns())
            event = events.pop() if events else self._cp.cuda.Event()
            self._rt.eventRecord(event.ptr, stream)
        except Exception as exc:
            raise _translate(self, exc)  # noqa: B904 - its cause is set
        return event

    def _do_times(self, pending: list[tuple[int, object]]) -> list[tuple[int, int, int]]:
        """Each op's events against the base: device times on the host's clock, aligned where
        the base was recorded (the device ran it at once, its stream being idle at a trial's
        start, to within a launch's latency)."""
        if self._base is None:
            return []
        base, host_ns = self._base
        elapsed = self._cp.cuda.get_elapsed_time
        out = []
        for seq, span in pending:
            assert isinstance(span, _Span)
            try:
                start, end = elapsed(base, span.start), elapsed(base, span.end)
            except Exception:  # not run (the context died) or not done: left out, untimed
                continue
            finally:
                self._timing_events += (span.start, span.end)
            out.append((seq, max(0, host_ns + round(start * 1e6)),
                        max(0, host_ns + round(end * 1e6))))
        self._timing_events.append(base)
        self._base = None
        return out

    # ---- backend hooks -------------------------------------------------------------------------
    # The function itself, not a method calling it: it stamps every op record.
    _clock_ns = staticmethod(time.perf_counter_ns)

    def _legacy_handle(self) -> object:
        return self._cp.cuda.Stream.null

    def _do_stream(self, blocking: bool, priority: int) -> object:
        with _translated(self):
            if not priority:
                return self._cp.cuda.Stream(non_blocking=not blocking)
            # cudaStreamCreateWithPriority (CUDA clamps the priority to the device's range);
            # the process keeps its streams, so an ExternalStream that never destroys it is fine.
            flags = 0 if blocking else 1  # cudaStreamNonBlocking
            ptr = self._cp.cuda.runtime.streamCreateWithPriority(flags, priority)
            stream_class = self._cp.cuda.Stream
            if hasattr(stream_class, "from_external"):  # CuPy 14: the CUDA stream protocol
                return stream_class.from_external(_StreamHandle(ptr))
            return self._cp.cuda.ExternalStream(ptr)

    def _do_alloc(self, nbytes: int, space: str) -> object:
        with _translated(self):
            if space == DEVICE:
                return self._cp.cuda.Memory(nbytes)
            return _Pinned(self._cp, nbytes)

    def _do_event(self) -> object:
        with _translated(self):
            return self._cp.cuda.Event(disable_timing=True)

    def _do_record(self, event: Event, stream: Stream) -> None:
        try:
            self._rt.eventRecord(event.handle.ptr, stream.handle.ptr)  # type: ignore
        except Exception as exc:
            raise _translate(self, exc)  # noqa: B904 - its cause is set

    def _do_wait(self, stream: Stream, event: Event) -> None:
        try:
            self._rt.streamWaitEvent(stream.handle.ptr, event.handle.ptr, 0)  # type: ignore
        except Exception as exc:
            raise _translate(self, exc)  # noqa: B904 - its cause is set

    def _do_copy(self, dst: Buffer, dst_off: int, src: Buffer, src_off: int, nbytes: int,
                 stream: Stream) -> None:
        try:
            self._memcpy(dst.address + dst_off, src.address + src_off, nbytes, _MEMCPY_DEFAULT,
                         stream.handle.ptr)  # type: ignore[attr-defined]
        except Exception as exc:
            raise _translate(self, exc)  # noqa: B904 - its cause is set

    def _do_copy_2d(self, dst: Buffer, dst_off: int, dst_pitch: int, src: Buffer, src_off: int,
                    src_pitch: int, width: int, height: int, stream: Stream) -> None:
        with _translated(self):
            self._cp.cuda.runtime.memcpy2DAsync(
                _ptr(dst) + dst_off, dst_pitch, _ptr(src) + src_off, src_pitch, width, height,
                _MEMCPY_DEFAULT, stream.handle.ptr)  # type: ignore[attr-defined]

    def _do_memset(self, dst: Buffer, off: int, nbytes: int, value: int,
                   stream: Stream) -> None:
        try:
            self._rt.memsetAsync(dst.address + off, value, nbytes,
                                 stream.handle.ptr)  # type: ignore[attr-defined]
        except Exception as exc:
            raise _translate(self, exc)  # noqa: B904 - its cause is set

    def _memset_live_raw(self, address: int, value: Live, nbytes: int, stream: int) -> None:
        """The runtime's memset of a :class:`Live` byte, reissued (see Reissuer.memset_live)."""
        self._rt.memsetAsync(address, self._reissuer.live_byte(value), nbytes, stream)

    def _do_launch(self, kernel: Kernel, stream: Stream) -> None:
        s = stream.handle
        fns = self._fns
        blocks = self._sm_count * 4
        with _translated(self):
            if isinstance(kernel, Fill):
                fns["kv_fill"]((blocks,), (_THREADS,), (
                    np.uint64(_ptr(kernel.dst) + kernel.offset), np.uint64(kernel.nbytes),
                    np.uint32(kernel.value)), stream=s)
            elif isinstance(kernel, Verify):
                fns["kv_verify"]((blocks,), (_THREADS,), (
                    np.uint64(_ptr(kernel.src) + kernel.offset), np.uint64(kernel.nbytes),
                    np.uint32(kernel.expected),
                    np.uint64(_ptr(kernel.result) + kernel.result_offset)), stream=s)
            elif isinstance(kernel, ReadTable):
                fns["kv_read_table"]((1,), (_THREADS,), (
                    np.uint64(_ptr(kernel.table) + kernel.offset), np.int32(kernel.entries),
                    np.uint64(_ptr(kernel.generations)), np.int32(kernel.num_pages),
                    np.uint64(_ptr(kernel.result) + kernel.result_offset),
                    np.int32(1 if kernel.assert_on_stale else 0)), stream=s)
            elif isinstance(kernel, (WritePages, Attend, GatherPages)):
                self._row_kernel(kernel, s, blocks)
            elif isinstance(kernel, Delay):
                self._spin(kernel.us, s)
            elif isinstance(kernel, Touch):
                fns["kv_touch"]((blocks,), (_THREADS,), (
                    *_spans(kernel.read), *_spans(kernel.write), np.uint32(
                        TOUCH_READ_VALUE if kernel.value is None else kernel.value),
                    np.int64(int(kernel.us * 1000))), stream=s)
            elif isinstance(kernel, (Scatter, Gather)):
                self._move_pages(kernel, s)
            else:
                raise DeviceUsageError(f"the CUDA device has no kernel {kernel.name!r}")

    def _row_kernel(self, kernel: WritePages | Attend | GatherPages, stream: Any,
                    blocks: int) -> None:
        if self._data_error:
            raise DeviceUsageError(f"the {kernel.name} kernel did not compile on this GPU: "
                                   f"{self._data_error}")
        grid = (max(1, min(kernel.entries, blocks)),)
        row = np.uint64(_ptr(kernel.table) + kernel.offset)
        common = (row, np.int32(kernel.entries), np.uint64(_ptr(kernel.pages)),
                  np.uint64(kernel.stride), np.int32(kernel.num_pages))
        if isinstance(kernel, WritePages):
            self._fns["kv_write_pages"](grid, (_THREADS,), (*common, np.uint32(kernel.value)),
                                        stream=stream)
        elif isinstance(kernel, GatherPages):
            assert kernel.packed is not None
            self._fns["kv_move_row_pages"](grid, (_THREADS,), (
                *common, np.uint64(_ptr(kernel.packed) + kernel.packed_offset),
                np.int32(1 if isinstance(kernel, ScatterPages) else 0)), stream=stream)
        else:
            assert kernel.result is not None
            first = 0 if kernel.first is None else _ptr(kernel.first) + kernel.first_offset
            self._fns["kv_attention"](grid, (_THREADS,), (
                *common, np.uint32(kernel.expected),
                np.uint64(_ptr(kernel.result) + kernel.result_offset),
                np.int32(1 if kernel.assert_on_mismatch else 0), np.uint64(first)),
                stream=stream)

    def _move_pages(self, kernel: Scatter | Gather, stream: Any) -> None:
        if isinstance(kernel, Scatter):
            packed, paged, offsets, to_pages = kernel.src, kernel.dst, kernel.dst_offsets, 1
            packed_off = kernel.src_offset
        else:
            packed, paged, offsets, to_pages = kernel.dst, kernel.src, kernel.src_offsets, 0
            packed_off = kernel.dst_offset
        address, end = self._args.put(np.asarray(offsets, dtype=np.int64))
        self._fns["kv_move_pages"]((min(len(offsets), self._sm_count * 8),), (_THREADS,), (
            np.uint64(_ptr(packed) + packed_off), np.uint64(_ptr(paged)), np.uint64(address),
            np.int32(len(offsets)), np.uint64(kernel.chunk), np.int32(to_pages)), stream=stream)
        self._args.issued(address, end, stream)

    def _do_graph_end(self, graph: Graph) -> object:
        """The graph's nodes issued under stream capture to streams of the device's own (one a
        branch, the first the capture's), forked and joined by events as the launch plans
        them, then instantiated: a CUDA graph (the capture ran nothing, and no timeline's
        timing event is inside it: the class's actions are called, see _issue_nodes)."""
        with _translated(self):
            while len(self._capture_streams) < len(graph.branches):
                self._capture_streams.append(Stream(
                    -1, f"graph-capture-{len(self._capture_streams)}", False, False,
                    self._cp.cuda.Stream(non_blocking=True)))
            lanes = dict(zip(graph.branches, self._capture_streams))
            marks = {i: Event(-1, str(i), self._cp.cuda.Event(disable_timing=True))
                     for i in (*graph.plan().marked, START)}
            capture = lanes[graph.stream.name]
            capture.handle.begin_capture()
            try:
                self._issue_nodes(graph, lanes, marks, capture)
            finally:
                made = capture.handle.end_capture()
        return made

    def _do_graph_launch(self, graph: Graph, stream: Stream) -> None:
        with _translated(self):
            graph.handle.launch(stream.handle)  # type: ignore[attr-defined]

    def _do_host_view(self, buf: Buffer) -> np.ndarray:
        return buf.handle.array  # type: ignore[attr-defined]

    def _do_host_written(self, buf: Buffer, off: int, nbytes: int) -> None:
        pass

    def _do_sync_device(self) -> None:
        try:
            self._rt.deviceSynchronize()
        except Exception as exc:
            raise _translate(self, exc)  # noqa: B904 - its cause is set

    def _do_sync_stream(self, stream: Stream) -> None:
        try:
            self._rt.streamSynchronize(stream.handle.ptr)  # type: ignore[attr-defined]
        except Exception as exc:
            raise _translate(self, exc)  # noqa: B904 - its cause is set

    def _do_sync_event(self, event: Event) -> None:
        try:
            self._rt.eventSynchronize(event.handle.ptr)  # type: ignore[attr-defined]
        except Exception as exc:
            raise _translate(self, exc)  # noqa: B904 - its cause is set

    def _do_query(self, event: Event) -> bool:
        with _translated(self):
            return bool(event.handle.done)  # type: ignore[attr-defined]

    # ---- programs ------------------------------------------------------------------------------
    def _lower(self, item: Item) -> tuple[Any, tuple[Any, ...]]:
        """The CUDA runtime call itself for the actions a trial makes most, its arguments
        worked out now (addresses, handles): issuing a program again then costs the call."""
        if item.kind != ACTION:
            return super()._lower(item)
        name, args, rt = item.name, item.args, self._rt
        if name == "_do_copy":
            dst, dst_off, src, src_off, nbytes, stream = args
            return rt.memcpyAsync, (dst.address + dst_off, src.address + src_off, nbytes,
                                    _MEMCPY_DEFAULT, stream.handle.ptr)
        if name == "_do_memset":
            dst, off, nbytes, value, stream = args
            if type(value) is Live:
                return self._memset_live_raw, (dst.address + off, value, nbytes,
                                               stream.handle.ptr)
            return rt.memsetAsync, (dst.address + off, value, nbytes, stream.handle.ptr)
        if name == "_do_record":
            event, stream = args
            return rt.eventRecord, (event.handle.ptr, stream.handle.ptr)
        if name == "_do_wait":
            stream, event = args
            return rt.streamWaitEvent, (stream.handle.ptr, event.handle.ptr, 0)
        if name == "_do_sync_device":
            return rt.deviceSynchronize, ()
        if name == "_do_sync_stream":
            return rt.streamSynchronize, (args[0].handle.ptr,)
        if name == "_do_sync_event":
            return rt.eventSynchronize, (args[0].handle.ptr,)
        if name == "_do_fill":
            buf, off, nbytes, value = args
            return buf.handle.array[off:off + nbytes].fill, (value,)
        if name == "_do_write":
            buf, off, raw = args
            return np.copyto, (buf.handle.array[off:off + raw.size], raw)
        if name in ("_do_host_view", "_do_host_step", "_do_host_thread_switch"):
            return None, ()  # the host's own steps and reads: nothing for the GPU to do
        if name == "_do_launch" and isinstance(args[0], Delay):
            return functools.partial(self._fns["kv_delay"], (1,), (1,),
                                     self._spin_args(args[0].us), stream=args[1].handle), ()
        return super()._lower(item)

    def _translate_error(self, exc: Exception) -> BaseException:
        return _translate(self, exc)

    def info(self) -> DeviceInfo:
        rt = self._cp.cuda.runtime
        props = self._props
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        return DeviceInfo("cuda", name, {
            "index": self.index,
            "compute_capability": f"{props['major']}.{props['minor']}",
            "multiprocessors": self._sm_count,
            "driver_version": rt.driverGetVersion(),
            "runtime_version": rt.runtimeGetVersion(),
            "cupy_version": self._cp.__version__,
            "delay_200us_measured_us": round(self.delay_200us_measured_us, 1),
            "max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
            "uuid": _uuid(props.get("uuid")),
            "pci_bus_id": _pci_bus_id(props),
        })


def _uuid(raw: Any) -> str | None:
    """CUDA's 16-byte device UUID as NVML and nvidia-smi write it: GPU-8-4-4-4-12 hex."""
    try:
        h = bytes(raw).hex() if not isinstance(raw, str) else raw.encode("latin-1").hex()
    except (TypeError, ValueError):
        return None
    if len(h) != 32:
        return None
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _pci_bus_id(props: dict[str, Any]) -> str | None:
    """The PCI address the kernel log's Xid lines name (``0000:3b:00``), from the properties."""
    try:
        return f"{int(props['pciDomainID']):04x}:{int(props['pciBusID']):02x}:" \
               f"{int(props['pciDeviceID']):02x}"
    except (KeyError, TypeError, ValueError):
        return None


class _Pinned:
    """Pinned, mapped host memory with a numpy view of it."""

    def __init__(self, cp: Any, nbytes: int) -> None:
        self.mem = cp.cuda.PinnedMemory(nbytes, _HOST_ALLOC_PORTABLE_MAPPED)
        self.ptr = int(self.mem.ptr)
        raw = (ctypes.c_uint8 * nbytes).from_address(self.ptr)
        self.array = np.frombuffer(raw, dtype=np.uint8)
        self.array[:] = 0


class _Span:
    """The timing events around one op (see CudaDevice._timing)."""

    __slots__ = ("start", "end")

    def __init__(self, start: Any, end: Any) -> None:
        self.start = start
        self.end = end


class _StreamHandle:
    """A raw stream handle, offered to CuPy through the CUDA stream protocol."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def _ptr(buf: Buffer) -> int:
    return buf.address


def _spans(spans: tuple[tuple[Any, int, int], ...]) -> list[Any]:
    """A touch kernel's spans as its arguments: an address and a length each, the unused
    ones zero (kernels.cu's kv_touch takes TOUCH_SPANS_MAX of each)."""
    out: list[Any] = []
    for buffer, offset, nbytes in spans:
        out += [np.uint64(_ptr(buffer) + offset), np.uint64(nbytes)]
    return out + [np.uint64(0)] * (2 * (TOUCH_SPANS_MAX - len(spans)))


class _ArgRing:
    """Pinned memory for kernel arguments too large for the launch (the page offsets of a
    scatter), read by the kernel in place through unified addressing. A region is written
    again only after the event recorded behind its kernel has completed."""

    def __init__(self, cp: Any, nbytes: int = 4 << 20) -> None:
        self.cp = cp
        self.ring = _Pinned(cp, nbytes)
        self.head = 0
        self.in_flight: deque[tuple[int, int, Any]] = deque()

    def put(self, data: np.ndarray) -> tuple[int, int]:
        """Place ``data``; returns its address and end within the ring."""
        n = -(-data.nbytes // 16) * 16
        if n > self.ring.array.size:
            self.drain()
            self.ring = _Pinned(self.cp, 2 * n)
            self.head = 0
        if self.head + n > self.ring.array.size:
            self.head = 0
        lo, hi = self.head, self.head + n
        for region in [r for r in self.in_flight if r[0] < hi and lo < r[1]]:
            region[2].synchronize()
            self.in_flight.remove(region)
        self.ring.array[lo:lo + data.nbytes] = data.view(np.uint8).reshape(-1)
        self.head = hi
        return self.ring.ptr + lo, hi

    def issued(self, address: int, end: int, stream: Any) -> None:
        event = self.cp.cuda.Event(disable_timing=True)
        event.record(stream)
        self.in_flight.append((address - self.ring.ptr, end, event))

    def drain(self) -> None:
        for _, _, event in self.in_flight:
            event.synchronize()
        self.in_flight.clear()


def _translate(device: CudaDevice, exc: BaseException) -> BaseException:
    """The one place CuPy/CUDA errors become kvcore errors: the kvcore error for ``exc`` (its
    cause set), or ``exc`` itself when it is not CuPy's or CUDA's. A sticky error marks the
    device dead, so every later call fails fast with the same DeviceFaultError, as CUDA itself
    does. The calls on a trial's path use it in a plain ``try`` (free until something raises);
    the others through :class:`_translated`."""
    cp = device._cp
    err: BaseException
    if isinstance(exc, (cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError)):
        status = int(getattr(exc, "status", -1))
        if status in _STICKY:
            err = DeviceFaultError(f"the CUDA context is dead: {exc}", cuda_error=_STICKY[status])
            device.fault = err  # type: ignore[assignment]
        else:
            err = DeviceError(f"CUDA call failed: {exc}")
    elif isinstance(exc, cp.cuda.memory.OutOfMemoryError):
        err = DeviceError(f"out of GPU memory: {exc}")
    elif isinstance(exc, cp.cuda.compiler.CompileException):
        err = DeviceError(f"NVRTC could not compile kvcore's kernels: {exc}")
    else:
        return exc
    err.__cause__ = exc
    return err


class _translated:
    """:func:`_translate` as a ``with`` block, for the calls off a trial's path."""

    __slots__ = ("device",)

    def __init__(self, device: CudaDevice) -> None:
        self.device = device

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> bool:
        if exc is None:
            return False
        err = _translate(self.device, exc)
        if err is exc:
            return False
        raise err

"""The CuPy source on a GPU (marker gpu): small CuPy snippets, and the exact events they give.

Each test installs the source on a Sink over a StringIO, runs a snippet, and compares the events
it made (notes, and allocations, frees and queries of memory or events the snippet did not make,
left out; each op's issue time checked apart) with what the snippet did: streams and their
blocking flag, byte ranges from the arrays' own ``.data.ptr`` and ``.nbytes``, the stream each
op was issued on, ``sync`` flags, and the program's own line as each event's site.

Run on the GPU machine: ``PYTHONPATH=. python -m pytest -q -m gpu tests/test_capture_cupy_gpu.py``
"""

from __future__ import annotations

import io
import json
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy
import pytest

from harness.capture import cupy_source
from harness.capture.events import Sink
from harness.capture.sites import shown_path


def _cupy_works() -> bool:
    try:
        import cupy
        cupy.zeros(1).get()
    except Exception:
        return False
    return True


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _cupy_works(), reason="needs CuPy and a CUDA GPU")]

if _cupy_works():
    import cupy
    import cupyx

HERE = shown_path(__file__)


def _line() -> int:
    """The caller's line minus one: the statement just above the call."""
    return sys._getframe(1).f_lineno - 1


def _site(line: int) -> str:
    return f"{HERE}:{line}"


class Capture:
    """The events of one install; ``mine`` keeps those about the snippet's own memory."""

    def __init__(self) -> None:
        self.out = io.StringIO()
        self.sink = Sink(self.out)
        self.ptrs: set[int] = set()

    def written(self) -> list[list[Any]]:
        """What reached the StringIO without a flush of ours (a host wait flushes). Each op's
        issue time (``t``, the host's nanosecond clock) is checked, never going back, and taken
        out: the rest of each event is what the tests compare exactly."""
        events = [json.loads(line) for line in self.out.getvalue().splitlines()]
        last = 0
        for e in events:
            if e[0] == "op":
                issued = e[5].pop("t")
                assert isinstance(issued, int) and issued >= last, (issued, last, e)
                last = issued
        return events

    def events(self) -> list[list[Any]]:
        self.sink.flush()
        return self.written()

    def mine(self, *arrays: Any) -> list[list[Any]]:
        """The events without notes and queries, and without allocations and frees of blocks
        other than ``arrays``' (CuPy's own, or an earlier test's being collected)."""
        ptrs = self.ptrs | {_ptr(a) for a in arrays}
        kept = []
        for e in self.events():
            if e[0] in ("note", "query"):
                continue
            if e[0] in ("alloc", "free") and e[2] not in ptrs:
                continue
            kept.append(e)
        return kept


def _ptr(a: Any) -> int:
    if isinstance(a, int):
        return a
    if isinstance(a, numpy.ndarray):
        return a.__array_interface__["data"][0]
    return a.data.ptr


def _d(a: Any) -> list[Any]:
    return ["d", a.data.ptr, a.nbytes]


def _h(a: numpy.ndarray) -> list[Any]:
    return ["h", _ptr(a), a.nbytes]


def _op(sid: int | None, kind: str, reads: list, writes: list, line: int, label: str,
        sync: bool = False) -> list[Any]:
    return ["op", sid, kind, reads, writes, {"site": _site(line), "op": label,
                                             "thread": "MainThread", "source": "cupy",
                                             "sync": sync}]


def _stream(sid: int, blocking: bool, line: int, name: str | None = None) -> list[Any]:
    return ["stream", sid, {"blocking": blocking, "legacy": sid == 0, "name": name,
                            "site": _site(line), "source": "cupy"}]


def _alloc(space: str, a: Any, nbytes: int, line: int, stream: int | None,
           block: int | None = None) -> list[Any]:
    meta = {"what": "array" if space == "d" else "pinned buffer", "name": None,
            "site": _site(line), "stream": stream, "source": "cupy"}
    if block is not None:
        meta["block"] = block
    return ["alloc", space, _ptr(a), nbytes, meta]


@pytest.fixture
def cap() -> Iterator[Capture]:
    cupy.cuda.Device().synchronize()  # nothing of an earlier test still running
    capture = Capture()
    off = cupy_source.install(capture.sink)
    try:
        yield capture
    finally:
        off()


def _legacy(line: int) -> list[Any]:
    return _stream(0, True, line, "legacy")


def _block(nbytes: int) -> int:
    return (nbytes + 511) // 512 * 512


def test_install_notes_what_it_cannot_see_and_uninstall_restores() -> None:
    before = (cupy.add, cupy.asarray, cupy.RawKernel, cupy.ndarray.__dict__.get("get"),
              cupy.cuda.Stream.synchronize, cupy.cuda.runtime.memcpyAsync)
    capture = Capture()
    off = cupy_source.install(capture.sink)
    assert isinstance(cupy.add, cupy.ufunc) and cupy.add is not before[0]
    off()
    after = (cupy.add, cupy.asarray, cupy.RawKernel, cupy.ndarray.__dict__.get("get"),
             cupy.cuda.Stream.synchronize, cupy.cuda.runtime.memcpyAsync)
    assert after == before
    notes = [e[1] for e in capture.events() if e[0] == "note"]
    # What no hook can see, said first; then what a hook said of its reach as it went in.
    assert notes[:len(cupy_source.BLIND_SPOTS)] == list(cupy_source.BLIND_SPOTS)
    assert any(n.startswith("cupy.cuda.MemoryPointer copies and fills") for n in notes)
    assert not [n for n in notes if "not installed" in n]


def test_two_streams_and_an_event(cap: Capture) -> None:
    s1 = cupy.cuda.Stream(non_blocking=True)
    s1_at = _line()
    s2 = cupy.cuda.Stream()
    s2_at = _line()
    a = cupy.empty(1024, dtype=cupy.float32)
    a_at = _line()
    with s1:
        a.fill(1.0)
        fill_at = _line()
    ev = cupy.cuda.Event()
    ev.record(s1)
    record_at = _line()
    s2.wait_event(ev)
    wait_at = _line()
    with s2:
        b = a * 2
        mul_at = _line()
    s2.synchronize()
    sync_at = _line()
    assert cap.mine(a, b) == [
        _legacy(a_at),
        _alloc("d", a, 4096, a_at, 0, 4096),
        _stream(s1.ptr, False, s1_at),
        _op(s1.ptr, "kernel:fill", [], [_d(a)], fill_at, "ndarray.fill"),
        ["record", ev.ptr, s1.ptr, _site(record_at)],
        _stream(s2.ptr, True, s2_at),
        ["wait", ev.ptr, s2.ptr, _site(wait_at)],
        _alloc("d", b, 4096, mul_at, s2.ptr, 4096),
        _op(s2.ptr, "kernel:multiply", [_d(a)], [_d(b)], mul_at, "ndarray.__mul__"),
        ["sync_stream", s2.ptr, _site(sync_at)],
    ]
    assert float(b[0].item()) == 2.0


def test_a_sync_writes_the_events_out_before_it_waits(cap: Capture) -> None:
    s = cupy.cuda.Stream(non_blocking=True)
    a = cupy.zeros(256, dtype=cupy.float32)
    with s:
        a += 1
    s.synchronize()
    written = cap.written()  # no flush of ours: the source's before the wait
    assert [e[0] for e in written if e[0] != "note"][-1] == "sync_stream"
    assert any(e[0] == "op" and e[2] == "kernel:add" for e in written)


def test_set_on_a_stream_from_pinned_memory_and_get_back(cap: Capture) -> None:
    s = cupy.cuda.Stream(non_blocking=True)
    s_at = _line()
    host = cupyx.empty_pinned((256,), dtype=numpy.float32)
    host_at = _line()
    host[:] = 3.0
    write_at = _line()
    dev = cupy.empty(256, dtype=cupy.float32)
    dev_at = _line()
    dev.set(host, stream=s)
    set_at = _line()
    s.synchronize()
    sync_at = _line()
    back = dev.get(stream=s)
    get_at = _line()
    assert cap.mine(host, dev) == [
        _alloc("h", host, 1024, host_at, None),
        _op(None, "host_write", [], [_h(host)], write_at, "numpy"),
        _legacy(dev_at),
        _alloc("d", dev, 1024, dev_at, 0, 1024),
        _stream(s.ptr, False, s_at),
        _op(s.ptr, "copy_htod", [_h(host)], [_d(dev)], set_at, "ndarray.set"),
        ["sync_stream", s.ptr, _site(sync_at)],
        _op(s.ptr, "copy_dtoh", [_d(dev)], [], get_at, "ndarray.get", sync=True),
    ]
    assert (back == 3.0).all()


def test_set_from_pageable_memory_waits(cap: Capture) -> None:
    dev = cupy.empty(64, dtype=cupy.int32)
    dev.set(numpy.arange(64, dtype=numpy.int32))
    set_at = _line()
    ops = [e for e in cap.mine(dev) if e[0] == "op"]
    assert ops == [_op(0, "copy_htod", [], [_d(dev)], set_at, "ndarray.set", sync=True)]


def test_get_into_pinned_memory_without_waiting(cap: Capture) -> None:
    s = cupy.cuda.Stream(non_blocking=True)
    dev = cupy.arange(128, dtype=cupy.float64)
    out = cupyx.zeros_pinned((128,), dtype=numpy.float64)
    dev.get(stream=s, out=out, blocking=False)
    get_at = _line()
    s.synchronize()
    ops = [e for e in cap.mine(dev, out) if e[0] == "op" and e[5]["op"] == "ndarray.get"]
    assert ops == [_op(s.ptr, "copy_dtoh", [_d(dev)], [_h(out)], get_at, "ndarray.get")]
    assert (out == numpy.arange(128)).all()


def test_raw_kernel_reads_const_pointers_and_writes_the_others(cap: Capture) -> None:
    code = r'''
    extern "C" __global__ void twice(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.0f * x[i];
    }'''
    kernel = cupy.RawKernel(code, "twice")
    x = cupy.arange(256, dtype=cupy.float32)
    x_at = _line()
    y = cupy.empty_like(x)
    y_at = _line()
    s = cupy.cuda.Stream(non_blocking=True)
    s_at = _line()
    kernel((1,), (256,), (x, y, numpy.int32(256)), stream=s)
    launch_at = _line()
    s.synchronize()
    events = cap.mine(x, y)
    assert events[:7] == [
        _legacy(x_at),
        _alloc("d", x, 1024, x_at, 0, 1024),
        _op(0, "kernel:arange", [], [_d(x)], x_at, "cupy.arange"),
        _alloc("d", y, 1024, y_at, 0, 1024),
        _stream(s.ptr, False, s_at),
        _op(s.ptr, "kernel:twice", [_d(x)], [_d(y)], launch_at, "RawKernel(twice)"),
        ["sync_stream", s.ptr, _site(launch_at + 2)],
    ]
    assert (y.get() == 2 * numpy.arange(256)).all()


def test_raw_module_kernels_and_unknown_roles(cap: Capture) -> None:
    code = r'''
    template<typename T> __global__ void copy(const T* src, T* dst) {
        dst[threadIdx.x] = src[threadIdx.x];
    }'''
    module = cupy.RawModule(code=code, name_expressions=["copy<float>"])
    kernel = module.get_function("copy<float>")
    src = cupy.ones(32, dtype=cupy.float32)
    dst = cupy.zeros(32, dtype=cupy.float32)
    kernel((1,), (32,), (src, dst))
    launch_at = _line()
    ops = [e for e in cap.mine(src, dst) if e[0] == "op" and e[2] == "kernel:copy"]
    assert ops == [_op(0, "kernel:copy", [_d(src)], [_d(dst)], launch_at,
                       f"RawKernel({kernel.name})")]
    assert (dst.get() == 1).all()


def test_elementwise_and_reduction_kernels(cap: Capture) -> None:
    double = cupy.ElementwiseKernel("T x", "T y", "y = x * 2", "double_it")
    total = cupy.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "total")
    x = cupy.ones(64, dtype=cupy.float32)
    y = double(x)
    double_at = _line()
    z = cupy.empty_like(x)
    double(x, z)
    into_at = _line()
    t = total(x)
    total_at = _line()
    ops = [e for e in cap.mine(x, y, z, t) if e[0] == "op" and e[5]["op"] != "cupy.ones"]
    assert ops == [
        _op(0, "kernel:double_it", [_d(x)], [_d(y)], double_at, "ElementwiseKernel(double_it)"),
        _op(0, "kernel:double_it", [_d(x)], [_d(z)], into_at, "ElementwiseKernel(double_it)"),
        _op(0, "kernel:total", [_d(x)], [_d(t)], total_at, "ReductionKernel(total)"),
    ]
    assert float(t.get()) == 64.0


def test_ufuncs_as_functions_and_operators(cap: Capture) -> None:
    a = cupy.ones(16, dtype=cupy.float32)
    b = cupy.ones(16, dtype=cupy.float32)
    c = cupy.empty(16, dtype=cupy.float32)
    cupy.add(a, b, out=c)
    add_at = _line()
    d = c - a
    sub_at = _line()
    a += b
    iadd_at = _line()
    view = a[2:6]
    mask = a > 1
    gt_at = _line()
    ops = [e for e in cap.mine(a, b, c, d, mask) if e[0] == "op"
           and e[5]["op"] != "cupy.ones"]
    assert ops == [
        _op(0, "kernel:add", [_d(a), _d(b)], [_d(c)], add_at, "cupy.add"),
        _op(0, "kernel:subtract", [_d(c), _d(a)], [_d(d)], sub_at, "ndarray.__sub__"),
        _op(0, "kernel:add", [_d(a), _d(b)], [_d(a)], iadd_at, "ndarray.__iadd__"),
        _op(0, "kernel:greater", [_d(a)], [_d(mask)], gt_at, "ndarray.__gt__"),
    ]
    assert view.data.ptr == a.data.ptr + 8  # a view: no op of its own


def test_copies_between_and_into_arrays(cap: Capture) -> None:
    a = cupy.arange(32, dtype=cupy.int64)
    b = a.copy()
    copy_at = _line()
    c = cupy.empty_like(a)
    cupy.copyto(c, a)
    copyto_at = _line()
    z = cupy.zeros(8, dtype=cupy.float32)
    zeros_at = _line()
    z.fill(0)
    fill_at = _line()
    a[4:8] = 7
    setitem_at = _line()
    ops = [e for e in cap.mine(a, b, c, z) if e[0] == "op" and e[5]["op"] != "cupy.arange"]
    assert ops == [
        _op(0, "copy_dtod", [_d(a)], [_d(b)], copy_at, "ndarray.copy"),
        _op(0, "copy_dtod", [_d(a)], [_d(c)], copyto_at, "cupy.copyto"),
        _op(0, "memset", [], [_d(z)], zeros_at, "cupy.zeros"),
        _op(0, "memset", [], [_d(z)], fill_at, "ndarray.fill"),
        _op(0, "kernel:setitem", [], [["d", a.data.ptr + 32, 32]], setitem_at,
            "ndarray.__setitem__"),
    ]


def test_asarray_from_pageable_memory_goes_through_a_pinned_staging_buffer(cap: Capture) -> None:
    host = numpy.arange(1000, dtype=numpy.float32)
    dev = cupy.asarray(host)
    at = _line()
    events = cap.events()
    staging = next(e for e in events if e[0] == "alloc" and e[1] == "h")
    block = ["h", staging[2], staging[3]]
    ops = [e for e in events if e[0] in ("op", "record") or (e[0] == "alloc" and e[1] == "h")
           or (e[0] == "alloc" and e[2] == dev.data.ptr)]
    record = next(e for e in ops if e[0] == "record")
    assert ops == [
        _alloc("d", dev, 4000, at, 0, 4096),
        ["alloc", "h", staging[2], staging[3], staging[4]],
        _op(None, "host_write", [], [block], at, "cupy.asarray"),
        _op(0, "copy_htod", [block], [_d(dev)], at, "cupy.asarray"),
        ["record", record[1], 0, _site(at)],
    ]
    assert staging[3] >= 4000 and staging[4]["site"] == _site(at)


def test_pool_alloc_free_and_reuse(cap: Capture) -> None:
    s = cupy.cuda.Stream(non_blocking=True)
    s_at = _line()
    a = cupy.empty(1000, dtype=cupy.uint8)
    a_at = _line()
    ptr = a.data.ptr
    del a
    free_at = _line()
    b = cupy.empty(1000, dtype=cupy.uint8)
    b_at = _line()
    with s:
        c = cupy.empty(1000, dtype=cupy.uint8)
        c_at = _line()
    assert b.data.ptr == ptr  # the pool's block for the legacy stream, again
    assert cap.mine(ptr, c) == [
        _legacy(a_at),
        _alloc("d", ptr, 1000, a_at, 0, 1024),
        ["free", "d", ptr, {"site": _site(free_at), "streams": [], "source": "cupy"}],
        _alloc("d", ptr, 1000, b_at, 0, 1024),
        _stream(s.ptr, False, s_at),
        _alloc("d", c, 1000, c_at, s.ptr, 1024),
    ]


def test_events_queries_and_synchronizes(cap: Capture) -> None:
    s = cupy.cuda.Stream(non_blocking=True)
    s_at = _line()
    ev = s.record()
    record_at = _line()
    ev.synchronize()
    sync_at = _line()
    assert ev.done
    done_at = _line()
    cupy.cuda.Device().synchronize()
    device_at = _line()
    cupy.cuda.runtime.deviceSynchronize()
    runtime_at = _line()
    cupy.cuda.Stream.null.synchronize()
    null_at = _line()
    events = [e for e in cap.events() if e[0] not in ("note", "alloc", "free")]
    assert events == [
        _stream(s.ptr, False, s_at),
        ["record", ev.ptr, s.ptr, _site(record_at)],
        ["sync_event", ev.ptr, _site(sync_at)],
        ["query", ev.ptr, True, _site(done_at)],
        ["sync_device", _site(device_at)],
        ["sync_device", _site(runtime_at)],
        _legacy(null_at),
        ["sync_stream", 0, _site(null_at)],
    ]


def test_runtime_memcpy_async_from_pinned_memory(cap: Capture) -> None:
    s = cupy.cuda.Stream(non_blocking=True)
    host = cupyx.zeros_pinned((64,), dtype=numpy.float32)
    dev = cupy.empty(64, dtype=cupy.float32)
    rt = cupy.cuda.runtime
    rt.memcpyAsync(dev.data.ptr, _ptr(host), 256, rt.memcpyHostToDevice, s.ptr)
    copy_at = _line()
    rt.memcpyAsync(_ptr(host), dev.data.ptr, 256, rt.memcpyDefault, s.ptr)
    back_at = _line()
    s.synchronize()
    ops = [e for e in cap.mine(host, dev) if e[0] == "op" and e[5]["op"].startswith("runtime")]
    assert ops == [
        _op(s.ptr, "copy_htod", [_h(host)], [_d(dev)], copy_at, "runtime.memcpyAsync"),
        _op(s.ptr, "copy_dtoh", [_d(dev)], [_h(host)], back_at, "runtime.memcpyAsync"),
    ]


def test_allocations_in_a_thread_started_after_install(cap: Capture) -> None:
    made: list[Any] = []
    thread = threading.Thread(target=lambda: made.append(cupy.empty(512, dtype=cupy.uint8)),
                              name="worker")
    thread.start()
    thread.join()
    allocs = [e for e in cap.mine(made[0]) if e[0] == "alloc"]
    assert [e[2:4] for e in allocs] == [[made[0].data.ptr, 512]]


def test_a_raising_call_writes_no_op(cap: Capture) -> None:
    a = cupy.ones(4, dtype=cupy.float32)
    with pytest.raises(ValueError):
        cupy.add(a, cupy.ones(5, dtype=cupy.float32))
    ops = [e for e in cap.mine(a) if e[0] == "op" and e[5]["op"] == "cupy.add"]
    assert ops == []

"""A pool in caching-allocator mode: per-stream free lists, record_stream, event-gated reuse."""

from __future__ import annotations

import pytest

import kvcore
from conftest import make_device
from kvcore import DeviceContext, DeviceKVPagePool, HostKVArena, plan_host_kv_page_layout
from kvcore.device.kernels import Delay
from kvcore.device.oplog import OpRecorder
from test_pool import GEOMETRY


def _caching(device: kvcore.Device, pages: int = 4, poison: int | None = None):
    context = DeviceContext(device)
    pool = DeviceKVPagePool(context, GEOMETRY, pages, allocator="caching", poison=poison)
    layout = plan_host_kv_page_layout(GEOMETRY)
    host = HostKVArena(context, layout.page_stride * 4, [layout])
    return context, pool, host.writable_view(host.allocate(layout, 1)), \
        host.writable_view(host.allocate(layout, 1))


def _read_late_on_a_side_stream(device, context, pool, data, out):
    """A lease of the context's stream holding 0x11, which a side stream (busy for 2 ms
    first) copies out to ``out`` once it is written."""
    side = device.create_stream("side")
    lease = pool.materialize(1)[0]
    data.write(bytes([0x11]) * data.layout.page_stride)
    pool.copy_from_host(data, [lease.handle], context.stream)
    ready = device.create_event("written")
    device.record_event(ready, context.stream)
    device.wait_event(side, ready)
    device.launch(Delay(2000), side)
    pool.copy_to_host([lease.handle], out, side)
    return side, lease


def _events(recorder: OpRecorder) -> list[tuple[str, str]]:
    return [(r.stream, r.kind) for r in recorder.records
            if r.kind.startswith("event") or r.kind == "sync_event"]


def test_a_freed_page_goes_to_its_own_streams_next_allocation_at_once(
        backend: str, request) -> None:
    device = make_device(backend, request)
    context, pool, data, _ = _caching(device)
    side = device.create_stream("side")
    recorder = OpRecorder(device.oplog)
    first = pool.materialize(1)[0]
    pool.copy_from_host(data, [first.handle], context.stream)
    first.release()
    assert [lease.handle.index for lease in pool.materialize(1)] == [first.handle.index]
    # Another stream's allocation does not get it while a page never cached is left.
    assert [lease.handle.index for lease in pool.materialize(1, stream=side)] == [1]
    recorder.close()
    assert _events(recorder) == []  # stream order is all that covers the old owner


def test_without_record_stream_a_side_streams_read_sees_the_next_owner(
        backend: str, request) -> None:
    """The bug record_stream fixes: a side stream still reading a freed page when the page's
    stream hands it to its next allocation, which overwrites it."""
    device = make_device(backend, request)
    context, pool, data, out = _caching(device)
    _, lease = _read_late_on_a_side_stream(device, context, pool, data, out)
    lease.release()
    again = pool.materialize(1)[0]
    assert again.handle.index == lease.handle.index
    pool.zero_pages([again.handle], context.stream)
    device.synchronize()
    assert set(out.read(0)) == {0}  # it read the next owner's zeros


def test_record_stream_keeps_the_page_back_until_the_side_stream_is_done(
        backend: str, request) -> None:
    device = make_device(backend, request)
    context, pool, data, out = _caching(device, pages=1)
    side, lease = _read_late_on_a_side_stream(device, context, pool, data, out)
    pool.record_stream([lease.handle], side)
    recorder = OpRecorder(device.oplog)
    lease.release()
    # The pool's one page is kept back: the allocation waits for the side stream's event.
    again = pool.materialize(1)[0]
    pool.zero_pages([again.handle], context.stream)
    device.synchronize()
    recorder.close()
    assert set(out.read(0)) == {0x11}
    events = _events(recorder)
    assert events[0] == ("side", "event_record") and ("host", "sync_event") in events


def test_a_gated_page_comes_back_once_a_query_sees_its_event_done(
        backend: str, request) -> None:
    device = make_device(backend, request)
    context, pool, data, _ = _caching(device, pages=2)
    side = device.create_stream("side")
    lease = pool.materialize(1)[0]
    pool.copy_from_host(data, [lease.handle], side)
    pool.record_stream([lease.handle], side)
    lease.release()
    device.synchronize()
    recorder = OpRecorder(device.oplog)
    assert pool.materialize(1)[0].handle.index == lease.handle.index
    recorder.close()
    assert [r.kind for r in recorder.records if r.kind.startswith("event")] == ["event_query"]


def test_recording_the_allocating_stream_changes_nothing(backend: str, request) -> None:
    device = make_device(backend, request)
    context, pool, data, _ = _caching(device)
    lease = pool.materialize(1)[0]
    pool.record_stream([lease.handle], context.stream)
    recorder = OpRecorder(device.oplog)
    lease.release()
    pool.materialize(1)
    recorder.close()
    assert _events(recorder) == []


def test_a_full_pool_takes_other_streams_pages_after_the_device_is_idle(
        backend: str, request) -> None:
    device = make_device(backend, request)
    context, pool, data, _ = _caching(device, pages=2)
    side = device.create_stream("side")
    mine = pool.materialize(2, stream=side)
    pool.release(mine)
    assert pool.free_pages == 2
    recorder = OpRecorder(device.oplog)
    taken = pool.materialize(2)  # on the context's stream: nothing cached for it
    recorder.close()
    assert sorted(lease.handle.index for lease in taken) == [0, 1]
    assert any(r.kind == "sync_device" for r in recorder.records)


def test_a_poisoning_caching_pool_poisons_on_the_pages_stream(backend: str, request) -> None:
    device = make_device(backend, request)
    context, pool, data, out = _caching(device, poison=0xEE)
    lease = pool.materialize(1)[0]
    recorder = OpRecorder(device.oplog)
    lease.release()
    recorder.close()
    assert [(r.stream, r.kind) for r in recorder.records if r.kind == "memset"] == \
        [("stream", "memset")]


def test_a_fenced_pool_refuses_what_only_a_caching_one_does() -> None:
    device = kvcore.open_device("sim")
    context = DeviceContext(device)
    pool = DeviceKVPagePool(context, GEOMETRY, 2)
    side = device.create_stream("side")
    with pytest.raises(kvcore.DeviceUsageError, match="allocator='caching'"):
        pool.materialize(1, stream=side)
    lease = pool.materialize(1)[0]
    with pytest.raises(kvcore.DeviceUsageError, match="record_stream is a caching pool's"):
        pool.record_stream([lease.handle], side)
    with pytest.raises(kvcore.GeometryError, match="fenced, caching"):
        DeviceKVPagePool(context, GEOMETRY, 2, allocator="cub")

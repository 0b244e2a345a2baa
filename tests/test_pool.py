"""The page pool: leasing, generations, free runs, batched transfers, copy_page, zero_pages."""

from __future__ import annotations

import numpy as np
import pytest

import kvcore
import kvcore.pool
from conftest import make_device
from kvcore import (
    DeviceContext,
    DeviceKVPagePool,
    DType,
    HostKVArena,
    KVPageGeometry,
    KVPlaneGeometry,
    plan_host_kv_page_layout,
)
from kvcore.device.oplog import OpRecorder
from kvcore.pool import PageRun, plan_runs

GEOMETRY = KVPageGeometry((KVPlaneGeometry(DType.I8, 8, 2, 256),
                           KVPlaneGeometry(DType.F16, 4, 1, 512)), page_tokens=16)


def _pool(device: kvcore.Device, pages: int = 32):
    context = DeviceContext(device)
    pool = DeviceKVPagePool(context, GEOMETRY, pages)
    layout = plan_host_kv_page_layout(GEOMETRY)
    host = HostKVArena(context, layout.page_stride * pages * 3, [layout])
    return context, pool, layout, host


def test_geometry_aligns_planes() -> None:
    assert GEOMETRY.plane_offsets == (0, 512)
    assert GEOMETRY.page_stride == 1024
    assert GEOMETRY.payload_bytes == 16 * 8 * 2 + 16 * 4 * 2
    with pytest.raises(kvcore.GeometryError):
        KVPlaneGeometry(DType.I8, 8, 2, align=100)
    with pytest.raises(kvcore.GeometryError):
        DType.parse("i7")


def test_plan_runs_groups_contiguous_and_strided() -> None:
    assert plan_runs([3, 4, 5, 9, 11, 13, 2]) == [
        PageRun(0, 3, 1, 3), PageRun(3, 9, 2, 3), PageRun(6, 2, 1, 1)]
    assert plan_runs([]) == []


def test_lowest_pages_first_and_free_runs_coalesce(backend: str, request) -> None:
    _, pool, _, _ = _pool(make_device(backend, request), pages=8)
    leases = pool.materialize(8)
    assert [lease.handle.index for lease in leases] == list(range(8))
    for i in (1, 2, 5, 6):
        leases[i].release()
    assert pool.free_runs == [(1, 2), (5, 2)]
    leases[3].release()
    leases[4].release()
    assert pool.free_runs == [(1, 6)]
    again = pool.materialize(1)
    assert again[0].handle.index == 1
    assert again[0].handle.generation == 1


def test_stale_handle_refused(backend: str, request) -> None:
    context, pool, layout, host = _pool(make_device(backend, request))
    lease = pool.materialize(1)[0]
    stale = lease.handle
    lease.release()
    view = host.writable_view(host.allocate(layout, 1))
    with pytest.raises(kvcore.StaleHandleError, match="stale"):
        pool.copy_from_host(view, [stale], context.stream)
    pool.materialize(1)  # the same page, a new generation
    with pytest.raises(kvcore.StaleHandleError, match="leased again"):
        pool.copy_to_host([stale], view, context.stream)
    with pytest.raises(kvcore.StaleHandleError):
        lease.release()


def test_reserve_and_exhaustion(backend: str, request) -> None:
    _, pool, _, _ = _pool(make_device(backend, request), pages=4)
    reservation = pool.reserve(3)
    assert pool.free_pages == 1
    with pytest.raises(kvcore.PoolExhaustedError, match="3 reserved"):
        pool.materialize(2)
    got = pool.materialize(reservation, 2)
    assert len(got) == 2 and reservation.remaining == 1
    reservation.cancel()
    assert pool.free_pages == 2
    with pytest.raises(kvcore.PoolExhaustedError):
        pool.reserve(3)


def _roundtrip(backend: str, request, order: list[int]) -> tuple[bool, list[str]]:
    device = make_device(backend, request)
    context, pool, layout, host = _pool(device, pages=64)
    leases = pool.materialize(64)
    handles = [leases[i].handle for i in order]
    src = host.writable_view(host.allocate(layout, len(order)))
    rng = np.random.default_rng(len(order))
    payload = rng.integers(0, 256, len(order) * layout.page_stride, dtype=np.uint8)
    src.write(payload)
    dst = host.writable_view(host.allocate(layout, len(order)))
    dst.fill(0)
    recorder = OpRecorder(device.oplog)
    pool.copy_from_host(src, handles, context.transfer_stream)
    context.synchronize()
    pool.copy_to_host(handles, dst, context.stream)
    context.synchronize()
    recorder.close()
    kinds = [r.kind for r in recorder.records if r.stream != "host"]
    return bool(np.array_equal(dst.read(), payload)), kinds


def test_contiguous_pages_move_in_one_copy(backend: str, request) -> None:
    ok, kinds = _roundtrip(backend, request, list(range(10, 26)))
    assert ok
    assert kinds == ["copy_htod", "copy_dtoh"]


def test_strided_pages_move_in_one_2d_copy(backend: str, request) -> None:
    ok, kinds = _roundtrip(backend, request, list(range(0, 40, 3)))
    assert ok
    assert kinds == ["copy2d_htod", "copy2d_dtoh"]


def test_scattered_pages_staged_through_one_copy_and_one_kernel(backend: str, request) -> None:
    order = [int(i) for i in np.random.default_rng(7).permutation(64)[:24]]
    ok, kinds = _roundtrip(backend, request, order)
    assert ok
    assert kinds == ["copy_htod", "kernel:scatter", "kernel:gather", "copy_dtoh"]


def test_scattered_transfer_larger_than_staging_goes_in_pieces(
    backend: str, request, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kvcore.pool, "STAGING_BYTES", 5 * GEOMETRY.page_stride)
    order = [int(i) for i in np.random.default_rng(3).permutation(64)[:12]]
    ok, kinds = _roundtrip(backend, request, order)
    assert ok
    assert kinds.count("kernel:scatter") == 3 and kinds.count("kernel:gather") == 3


def test_copy_page_and_zero_pages(backend: str, request) -> None:
    device = make_device(backend, request)
    context, pool, layout, host = _pool(device)
    a, b, c = pool.materialize(3)
    src = host.writable_view(host.allocate(layout, 3))
    src.fill(0x11, page=0)
    src.fill(0x22, page=1)
    src.fill(0x33, page=2)
    pool.copy_from_host(src, [a.handle, b.handle, c.handle], context.stream)
    pool.copy_page(a.handle, c.handle, context.stream)
    pool.zero_pages([b.handle], context.stream)
    out = host.writable_view(host.allocate(layout, 3))
    pool.copy_to_host([a.handle, b.handle, c.handle], out, context.stream)
    context.synchronize()
    assert set(out.read(0)) == {0x11}
    assert set(out.read(1)) == {0}
    assert set(out.read(2)) == {0x11}


def test_release_fence_orders_next_user_after_old_streams(backend: str, request) -> None:
    device = make_device(backend, request)
    context, pool, layout, host = _pool(device)
    view = host.writable_view(host.allocate(layout, 1))
    recorder = OpRecorder(device.oplog)
    lease = pool.materialize(1)[0]
    pool.copy_from_host(view, [lease.handle], context.transfer_stream)
    lease.release()
    again = pool.materialize(1)[0]
    pool.copy_from_host(view, [again.handle], context.stream)
    recorder.close()
    ops = [(r.stream, r.kind) for r in recorder.records if r.kind.startswith("event")]
    assert ops == [("transfer_stream", "event_record"), ("stream", "event_wait")]


def test_release_without_fence_records_no_event(backend: str, request) -> None:
    device = make_device(backend, request, kvcore.Defects(release_fence=False))
    context, pool, layout, host = _pool(device)
    view = host.writable_view(host.allocate(layout, 1))
    recorder = OpRecorder(device.oplog)
    lease = pool.materialize(1)[0]
    pool.copy_from_host(view, [lease.handle], context.transfer_stream)
    lease.release()
    pool.copy_from_host(view, [pool.materialize(1)[0].handle], context.stream)
    recorder.close()
    assert not [r for r in recorder.records if r.kind.startswith("event")]


def test_release_after_a_synchronize_needs_no_fence(backend: str, request) -> None:
    """``release(idle=True)`` (the caller synchronized since the pages' last use) records no
    fence, and the next user waits for none; a poisoning pool still fences its poison."""
    for poison in (None, 0xEE):
        device = make_device(backend, request)
        context = DeviceContext(device)
        pool = DeviceKVPagePool(context, GEOMETRY, 4, poison=poison)
        layout = plan_host_kv_page_layout(GEOMETRY)
        host = HostKVArena(context, layout.page_stride * 4, [layout])
        view = host.writable_view(host.allocate(layout, 1))
        lease = pool.materialize(1)[0]
        pool.copy_from_host(view, [lease.handle], context.transfer_stream)
        context.synchronize()
        recorder = OpRecorder(device.oplog)
        pool.release(lease, idle=True)
        again = pool.materialize(1)[0]
        assert again.handle.index == lease.handle.index
        pool.copy_from_host(view, [again.handle], context.stream)
        recorder.close()
        events = [r.kind for r in recorder.records if r.kind.startswith("event")]
        # With poison: the fence, the poison stream's wait on it, the poison's own fence,
        # and the next user's wait on that.
        assert events == ([] if poison is None else
                          ["event_record", "event_wait", "event_record", "event_wait"]), events


def test_batch_release_shares_one_fence_per_stream(backend: str, request) -> None:
    device = make_device(backend, request)
    context, pool, layout, host = _pool(device)
    view = host.writable_view(host.allocate(layout, 4))
    leases = pool.materialize(4)
    pool.copy_from_host(view, [lease.handle for lease in leases], context.transfer_stream)
    recorder = OpRecorder(device.oplog)
    pool.release(leases)
    recorder.close()
    assert [r.kind for r in recorder.records if r.stream != "host"] == ["event_record"]
    assert all(lease.released for lease in leases)


def test_host_layout_must_match(backend: str, request) -> None:
    context, pool, _, _ = _pool(make_device(backend, request))
    other = plan_host_kv_page_layout(KVPageGeometry((KVPlaneGeometry(DType.I8, 4, 1, 256),)))
    host = HostKVArena(context, 1 << 16, [other])
    view = host.writable_view(host.allocate(other, 1))
    with pytest.raises(kvcore.GeometryError, match="plan_host_kv_page_layout"):
        pool.copy_from_host(view, [pool.materialize(1)[0].handle], context.stream)


def test_host_arena_allocations_and_read_only_views(backend: str, request) -> None:
    context, _, layout, _ = _pool(make_device(backend, request))
    host = HostKVArena(context, layout.page_stride * 4, [layout])
    a = host.allocate(layout, 3)
    assert host.allocate(layout, 2) is None
    host.free(a)
    b = host.allocate(layout, 4)
    assert b is not None and b.offset == 0
    with pytest.raises(kvcore.GeometryError, match="read-only"):
        host.view(b).fill(1)


def test_plan_runs_loop_and_numpy_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    cases = []
    for _ in range(500):
        n = int(rng.integers(1, 40))
        if rng.random() < 0.5:
            idx = (int(rng.integers(0, 5)) + np.arange(n) * int(rng.integers(1, 4))).tolist()
            idx[int(rng.integers(0, n))] = int(rng.integers(0, 50))
        else:
            idx = rng.integers(0, 50, n).tolist()
        cases.append(idx)
    loop = [kvcore.pool._plan_few(idx, None) for idx in cases]
    monkeypatch.setattr(kvcore.pool, "SMALL_BATCH", 0)
    assert [plan_runs(idx) for idx in cases] == loop
    assert len(plan_runs(list(range(0, 100, 2)) + [7, 1, 9, 3, 5], limit=4)) == 4
    assert plan_runs(list(range(0, 100, 2)) + [7, 1, 9, 3, 5, 0], limit=4) is None


def test_fence_events_are_recycled(backend: str, request) -> None:
    device = make_device(backend, request)
    context, pool, layout, host = _pool(device)
    view = host.writable_view(host.allocate(layout, 1))
    recorder = OpRecorder(device.oplog)
    for _ in range(50):
        lease = pool.materialize(1)[0]
        pool.copy_from_host(view, [lease.handle], context.transfer_stream)
        lease.release()
        again = pool.materialize(1)[0]
        pool.copy_from_host(view, [again.handle], context.stream)
        again.release()
    recorder.close()
    names = {r.records for r in recorder.records if r.kind == "event_record"}
    waits = [r for r in recorder.records if r.kind == "event_wait"]
    assert len(waits) == 99  # every reuse but the first waited on a fence
    assert len(names) <= 2, names


def _poisoned_pool(device: kvcore.Device, one_stream: bool = False):
    context = DeviceContext(device)
    pool = DeviceKVPagePool(context, GEOMETRY, 4, poison=0xEE)
    layout = plan_host_kv_page_layout(GEOMETRY)
    host = HostKVArena(context, layout.page_stride * 8, [layout])
    views = [host.writable_view(host.allocate(layout, 1)) for _ in range(3)]
    lease = pool.materialize(1)[0]
    views[0].fill(0x11)
    pool.copy_from_host(views[0], [lease.handle],
                        context.transfer_stream if one_stream else context.stream)
    context.synchronize()
    # The old owner's read, still queued behind 2 ms of other work when the page is released.
    device.launch(kvcore.device.kernels.Delay(2000), context.transfer_stream)
    pool.copy_to_host([lease.handle], views[1], context.transfer_stream)
    lease.release()
    return context, pool, views


def test_poison_waits_for_the_old_owner_and_the_next_owner_waits_for_it(
        backend: str, request) -> None:
    """With the release fence, poison lands after every earlier user and before the next one:
    the old owner's queued read sees its own bytes, and the next owner, who writes nothing
    first, sees poison rather than the old owner's data."""
    device = make_device(backend, request)
    context, pool, views = _poisoned_pool(device)
    again = pool.materialize(1)[0]
    assert again.handle.index == 0  # the same page
    pool.copy_to_host([again.handle], views[2], context.stream)
    context.synchronize()
    assert set(views[1].read(0)) == {0x11}
    assert set(views[2].read(0)) == {0xEE}


def test_poison_without_the_fence_lands_under_the_old_owners_read(backend: str, request) -> None:
    """Without the release fence the poison lands at once: the old owner's queued read sees
    poison, not plausible data."""
    device = make_device(backend, request, kvcore.Defects(release_fence=False))
    context, _, views = _poisoned_pool(device)
    context.synchronize()
    assert set(views[1].read(0)) == {0xEE}


def test_poison_is_one_byte(backend: str, request) -> None:
    context = DeviceContext(make_device(backend, request))
    with pytest.raises(kvcore.GeometryError, match="one byte"):
        DeviceKVPagePool(context, GEOMETRY, 4, poison=256)


def test_poison_without_the_fence_keeps_to_a_pages_one_stream(backend: str, request) -> None:
    """A stream-unaware pool's ordering is stream order: a page one stream used is poisoned on
    that stream, behind the old owner's queued read, which sees its own bytes."""
    device = make_device(backend, request, kvcore.Defects(release_fence=False))
    context, _, views = _poisoned_pool(device, one_stream=True)
    context.synchronize()
    assert set(views[1].read(0)) == {0x11}

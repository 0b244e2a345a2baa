"""The seed's two C++ tests (ninfer tests/test_kv_cache.cpp, lines 420-581), ported to kvcore.

Shared by the CPU tests (sim) and the GPU tests (cuda, in worker processes), so both run exactly
the same program.
"""

from __future__ import annotations

from kvcore import (
    DeviceContext,
    DeviceKVPagePool,
    DType,
    HostKVArena,
    KVPageGeometry,
    KVPlaneGeometry,
    page_payload_equal,
    plan_host_kv_page_layout,
)
from kvcore.device.kernels import Delay

SEED_GEOMETRY = KVPageGeometry((KVPlaneGeometry(DType.I8, 8, 2, 256),), page_tokens=64)


def _setup(context: DeviceContext):
    pool = DeviceKVPagePool(context, SEED_GEOMETRY, 2)
    layout = plan_host_kv_page_layout(pool.geometry)
    host = HostKVArena(context, layout.page_stride * 6, [layout])
    return pool, layout, host


def page_release_fence(context: DeviceContext) -> bool:
    """exercise_page_release_fence: True when the re-allocated page still holds the stale 0xAB
    (release neither zeroes nor invalidates a page), as the seed expects."""
    pool, layout, host = _setup(context)
    pages = pool.materialize(1)
    write = host.writable_view(host.allocate(layout, 1))
    write.fill(0xAB)
    pool.copy_from_host(write, [pages[0].handle], context.stream)
    context.synchronize()

    pages[0].release()
    pages = pool.materialize(1)

    readback = host.writable_view(host.allocate(layout, 1))
    readback.fill(0)
    pool.copy_to_host([pages[0].handle], readback, context.stream)
    context.synchronize()
    return page_payload_equal(readback, 0, write, 0)


def page_release_race(context: DeviceContext, delay_us: float | None) -> str:
    """exercise_page_release_race: 0xAB written on transfer_stream (after ``delay_us`` of delay
    there, the amplifier), the page released with no sync, re-materialized and written 0xCD on
    the compute stream. Returns "fresh" when the readback is 0xCD (the seed's PASS), "stale"
    when the transfer-stream write landed last, "torn" for anything else."""
    device = context.device
    pool, layout, host = _setup(context)
    pages = pool.materialize(1)
    old = host.writable_view(host.allocate(layout, 1))
    old.fill(0xAB)
    if delay_us:
        device.launch(Delay(delay_us), context.transfer_stream)
    pool.copy_from_host(old, [pages[0].handle], context.transfer_stream)

    pages[0].release()
    pages = pool.materialize(1)
    fresh = host.writable_view(host.allocate(layout, 1))
    fresh.fill(0xCD)
    pool.copy_from_host(fresh, [pages[0].handle], context.stream)
    context.synchronize()

    readback = host.writable_view(host.allocate(layout, 1))
    readback.fill(0)
    pool.copy_to_host([pages[0].handle], readback, context.stream)
    context.synchronize()
    if page_payload_equal(readback, 0, fresh, 0):
        return "fresh"
    if page_payload_equal(readback, 0, old, 0):
        return "stale"
    return "torn"

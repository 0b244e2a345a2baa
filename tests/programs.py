"""Small programs over kvcore's public API, shared by the sim tests and the GPU tests (which run
the dangerous ones in spawned worker processes, so a dead CUDA context kills only the worker)."""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import kvcore
from kvcore import (
    DeviceContext,
    DeviceKVPagePool,
    DType,
    KVConversationCatalog,
    KVExecutionTablePool,
    KVPageGeometry,
    KVPlaneGeometry,
)
from kvcore.device.kernels import Delay

SMALL_GEOMETRY = KVPageGeometry((KVPlaneGeometry(DType.I8, 8, 2, 256),), page_tokens=64)


def read_int32(device: kvcore.Device, buf: kvcore.device.Buffer, stream) -> int:
    """The int32 at the start of device buffer ``buf``, read through pinned memory."""
    host = device.alloc_host(4, name="readback")
    device.copy(host, 0, buf, 0, 4, stream)
    device.synchronize_stream(stream)
    return int(device.host_read(host, 0, 4).view(np.int32)[0])


def table_assert_program(backend: str) -> dict[str, Any]:
    """Publish a catalog's row, release one of its pages (its generation moves on), then run the
    table reader: it must fire a device-side assert, and the context must stay dead."""
    device = kvcore.open_device(backend)
    context = DeviceContext(device)
    pool = DeviceKVPagePool(context, SMALL_GEOMETRY, 16)
    table = KVExecutionTablePool(pool, rows=2, max_pages_per_row=16)
    catalog = KVConversationCatalog(table, "conv")
    catalog.retain(pool.materialize(4))
    catalog.bind()
    entries = catalog.activate(context.stream)
    context.synchronize()
    catalog.leases[1].release()
    result = device.alloc(4, name="result")
    device.memset(result, 0, 4, 0, context.stream)
    table.read(catalog.rows[0], entries, context.stream, result=result, assert_on_stale=True)
    out: dict[str, Any] = {"fault": None, "dead_after": False}
    try:
        context.synchronize()
    except kvcore.DeviceFaultError as exc:
        out["fault"] = exc.cuda_error
        out["message"] = str(exc)
        try:
            device.memset(result, 0, 4, 0, context.stream)
            context.synchronize()
        except kvcore.DeviceFaultError:
            out["dead_after"] = True
    return out


def healthy_kernel_program(backend: str) -> bool:
    """A fill and a verify on a fresh context: the GPU still runs kernels."""
    from kvcore.device.kernels import Fill, Verify

    device = kvcore.open_device(backend)
    stream = device.create_stream("s")
    buf = device.alloc(1 << 20, name="buf")
    result = device.alloc(4, name="result")
    device.memset(result, 0, 4, 0, stream)
    device.launch(Fill(buf, 0, 1 << 20, 0x3C), stream)
    device.launch(Verify(buf, 0, 1 << 20, 0x3C, result), stream)
    return read_int32(device, result, stream) == 0


def legacy_publish_trials(device: kvcore.Device, trials: int, delay_us: float = 0.0,
                          pages: int = 8) -> int:
    """Activate a retained catalog on the compute stream and read its row right away on the
    same stream, ``trials`` times; returns in how many trials the reader saw a stale or empty
    entry (the row is cleared, properly ordered, before each trial). ``delay_us`` queues a
    delay on the legacy stream first: the amplifier, on the stream the #210 publish went to."""
    context = DeviceContext(device)
    pool = DeviceKVPagePool(context, SMALL_GEOMETRY, 64)
    table = KVExecutionTablePool(pool, rows=2, max_pages_per_row=64)
    catalog = KVConversationCatalog(table, "conv")
    catalog.retain(pool.materialize(pages))
    row = catalog.bind()
    result = device.alloc(4, name="result")
    host = device.alloc_host(4, name="result-host")
    manifested = 0
    for _ in range(trials):
        table.clear(row, context.stream)
        device.memset(result, 0, 4, 0, context.stream)
        context.synchronize()
        if delay_us:
            device.launch(Delay(delay_us), context.legacy_stream)
        entries = catalog.activate(context.stream)
        table.read(row, entries, context.stream, result=result, assert_on_stale=False)
        device.copy(host, 0, result, 0, 4, context.stream)
        context.synchronize()
        manifested += int(device.host_read(host, 0, 4).view(np.int32)[0]) > 0
    return manifested


def _child(queue: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        queue.put(("ok", fn(*args)))
    except BaseException as exc:  # report anything, including a CUDA error, to the parent
        queue.put(("error", f"{type(exc).__name__}: {exc}"))
    # Exit without destructors: after a device-side assert they would try to free memory in the
    # dead context and print CuPy tracebacks into the test log (the harness worker does the same).
    queue.close()
    queue.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def in_worker(fn: Callable[..., Any], *args: Any, timeout: float = 120.0) -> Any:
    """Run ``fn(*args)`` in a spawned process (never forked: CUDA state must not be copied) and
    return its result; raises if the worker died or raised."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, fn, args))
    proc.start()
    try:
        status, value = queue.get(timeout=timeout)
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    if status != "ok":
        raise RuntimeError(f"worker failed: {value}")
    return value


HANG_SCENARIO = """\
apiVersion: gpurace/v1
kind: Scenario
metadata: {{name: hang, description: a kernel that never ends}}
spec:
  pool: {{pages: 2}}
  trials: {trials}
  timeout: 60
  variants: {{fixed: {{expect: clean}}}}
  steps:
    - {{op: delay, stream: compute, us: .inf}}
    - {{op: synchronize}}
"""


def hang_file(folder: Path, trials: int = 3) -> Path:
    """A scenario whose every trial hangs (a delay that never ends), in ``folder``: what the
    watchdog, orphan and spare-worker tests kill."""
    path = folder / "hang.yaml"
    path.write_text(HANG_SCENARIO.format(trials=trials))
    return path

"""Benchmark: scattered page copies against one contiguous copy of the same bytes.

    python -m kvcore.bench [--backend auto|cuda|sim] [--pages 4096] [--page-kib 64] [--repeat 20]

Every figure is a ratio measured side by side in this one run (absolute times on shared machines
drift): the pool's batched copy of N scattered pages, and one copy issued per page, each against a
single contiguous copy of the same number of bytes, host->device and device->host. A ratio of 1.0
means the scattered copy is as fast as the contiguous one.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable

import kvcore
from kvcore import (
    DeviceContext,
    DeviceKVPagePool,
    DType,
    HostKVArena,
    KVPageGeometry,
    KVPlaneGeometry,
    plan_host_kv_page_layout,
)


def _time(device: kvcore.Device, fn: Callable[[], None], repeat: int) -> float:
    """Median seconds of ``fn`` followed by a device synchronize, after one warm-up."""
    fn()
    device.synchronize()
    samples = []
    for _ in range(repeat):
        start = device.clock_ns()
        fn()
        device.synchronize()
        samples.append((device.clock_ns() - start) / 1e9)
    return statistics.median(samples)


def _per_page_loop(device: kvcore.Device, pool: DeviceKVPagePool,
                   view: kvcore.HostKVAllocationView, handles: list[kvcore.DeviceKVPageHandle],
                   stream: kvcore.device.Stream) -> Callable[[], None]:
    """One copy issued per page: a bare CuPy loop on cuda (the naive engine's way), the
    device's own copy on sim."""
    stride = pool.page_stride
    dst = [pool.buffer.address + h.index * stride for h in handles]
    src = [view.buffer.address + view.page_offset(i) for i in range(len(handles))]
    if device.kind == "cuda":
        import cupy

        memcpy, s = cupy.cuda.runtime.memcpyAsync, stream.handle.ptr  # type: ignore[attr-defined]

        def bare() -> None:
            for d, h in zip(dst, src):
                memcpy(d, h, stride, 4, s)

        return bare

    def per_page() -> None:
        for i, handle in enumerate(handles):
            device.copy(pool.buffer, handle.index * stride, view.buffer, view.page_offset(i),
                        stride, stream)

    return per_page


def run(backend: str, pages: int, page_kib: int, repeat: int, seed: int) -> dict[str, float]:
    device = kvcore.open_device(backend, seed=seed)
    context = DeviceContext(device)
    stream = context.stream
    # i8, 128 x 2 per token, 256 tokens: a page of page_kib KiB.
    tokens = page_kib * 1024 // 256
    geometry = KVPageGeometry((KVPlaneGeometry(DType.I8, 128, 2, 256),), page_tokens=tokens)
    pool = DeviceKVPagePool(context, geometry, pages * 2)
    layout = plan_host_kv_page_layout(geometry)
    host = HostKVArena(context, pages * layout.page_stride, [layout])
    view = host.writable_view(host.allocate(layout, pages))
    view.fill(0x5A)

    leases = pool.materialize(pages * 2)
    rng = random.Random(seed)
    scattered = [lease.handle for lease in rng.sample(leases, pages)]
    contiguous = [lease.handle for lease in leases[:pages]]
    nbytes = pages * layout.page_stride

    per_page_h2d = _per_page_loop(device, pool, view, scattered, stream)

    t = {
        "h2d_contiguous": _time(device, lambda: pool.copy_from_host(view, contiguous, stream),
                                repeat),
        "h2d_batched": _time(device, lambda: pool.copy_from_host(view, scattered, stream),
                             repeat),
        "h2d_per_page": _time(device, per_page_h2d, max(3, repeat // 4)),
        "d2h_contiguous": _time(device, lambda: pool.copy_to_host(contiguous, view, stream),
                                repeat),
        "d2h_batched": _time(device, lambda: pool.copy_to_host(scattered, view, stream), repeat),
    }
    result = {
        "pages": float(pages),
        "page_bytes": float(layout.page_stride),
        "h2d_contiguous_GBps": nbytes / t["h2d_contiguous"] / 1e9,
        "h2d_batched_ratio": t["h2d_contiguous"] / t["h2d_batched"],
        "h2d_per_page_ratio": t["h2d_contiguous"] / t["h2d_per_page"],
        "d2h_contiguous_GBps": nbytes / t["d2h_contiguous"] / 1e9,
        "d2h_batched_ratio": t["d2h_contiguous"] / t["d2h_batched"],
    }
    print(f"backend {device.kind}: {device.info().name}")
    print(f"{pages} scattered pages of {layout.page_stride // 1024} KiB "
          f"({nbytes / 2**20:.0f} MiB), median of {repeat}")
    print(f"  host->device contiguous copy      {result['h2d_contiguous_GBps']:7.1f} GB/s")
    print(f"  host->device batched / contiguous {result['h2d_batched_ratio']:7.3f}")
    print(f"  host->device one copy per page    {result['h2d_per_page_ratio']:7.3f}  "
          f"(bare loop of {pages} copies / contiguous)")
    print(f"  device->host contiguous copy      {result['d2h_contiguous_GBps']:7.1f} GB/s")
    print(f"  device->host batched / contiguous {result['d2h_batched_ratio']:7.3f}")
    device.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcore.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="auto", choices=kvcore.device.BACKENDS)
    parser.add_argument("--pages", type=int, default=4096)
    parser.add_argument("--page-kib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        run(args.backend, args.pages, args.page_kib, args.repeat, args.seed)
    except kvcore.KVCoreError as exc:
        print(f"kvcore.bench: {exc}", file=sys.stderr)
        return 77 if isinstance(exc, kvcore.DeviceUnavailableError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

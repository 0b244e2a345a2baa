"""CuPy: an array freed while another stream still reads it; the pool reuses its block at once.

The compute stream gathers a request's KV pages into a fresh array (``cupy.take``, from CuPy's
memory pool, in the compute stream's arena) and hands it to a second stream, which first runs
its own micro-batch's layer and then computes the pages' per-page absmax (the scales of a
quantized swap-out); the host drops the array once that is queued. CuPy's pool knows only the
stream that allocated a block: the freed block is the next request's gather's, on the compute
stream, which overwrites it before the second stream has read it.

Fix (``--fixed``): ``compute.wait_event(swap.record())`` after the second stream's read and
before the ``del``, so the next use of the block on the compute stream comes after the read
(keeping the array alive until an event after the read has completed is the other fix).

Race: the swap stream's read ``cupy.abs(pages).max(axis=1)`` (line 75) of request r and the
compute stream's write ``pages = cupy.take(kv_cache, page_ids[r], axis=0)`` (line 68) of
request r+1 into the same block, freed at ``del pages`` (line 79). The fix is line 78.
"""

import argparse
import sys
import time

import cupy
import numpy

NUM_PAGES = 512          # the KV page pool
PAGE_ELEMS = 2048        # 8 KiB fp32 pages; every element of page p holds p
REQ_PAGES = 128          # pages a request swaps out: 1 MiB gathered
TOKENS = 2048            # the swap stream's own micro-batch
HIDDEN = 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="requests to serve (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    cupy.random.seed(10)
    compute = cupy.cuda.Stream(non_blocking=True)   # gathers the pages
    swap = cupy.cuda.Stream(non_blocking=True)      # its micro-batch, then the swap-out scales
    kv_cache = cupy.arange(NUM_PAGES, dtype=cupy.float32)[:, None]
    kv_cache = cupy.ascontiguousarray(cupy.broadcast_to(kv_cache, (NUM_PAGES, PAGE_ELEMS)))
    rng = numpy.random.default_rng(10)
    ids = numpy.stack([rng.choice(NUM_PAGES, REQ_PAGES, replace=False)
                       for _ in range(args.iters)])
    page_ids = cupy.asarray(ids)                    # each request's pages
    scale = numpy.float32(1 / HIDDEN ** 0.5)
    x_mb = cupy.random.standard_normal((TOKENS, HIDDEN), dtype=cupy.float32)
    w1 = cupy.random.standard_normal((HIDDEN, HIDDEN), dtype=cupy.float32) * scale
    w2 = cupy.random.standard_normal((HIDDEN, HIDDEN), dtype=cupy.float32) * scale
    h_mb = cupy.empty((TOKENS, HIDDEN), dtype=cupy.float32)
    out_mb = cupy.empty((TOKENS, HIDDEN), dtype=cupy.float32)
    page_scale = cupy.zeros((args.iters, REQ_PAGES), dtype=cupy.float32)
    # Warm-up on the default stream: the kernels compile or load on first use.
    warm = cupy.take(kv_cache, page_ids[0], axis=0)
    cupy.zeros((REQ_PAGES,), dtype=cupy.float32)[:] = cupy.abs(warm).max(axis=1)
    cupy.matmul(cupy.matmul(x_mb, w1, out=h_mb), w2, out=out_mb)
    cupy.cuda.Device().synchronize()
    del warm

    start = time.perf_counter()
    for r in range(args.iters):
        with compute:
            # A fresh array from the pool, in the compute stream's arena.
            pages = cupy.take(kv_cache, page_ids[r], axis=0)              # RACE: write
            gathered = compute.record()
        swap.wait_event(gathered)           # the swap stream reads the pages after the gather
        with swap:
            cupy.matmul(x_mb, w1, out=h_mb)         # the micro-batch's layer, queued first
            cupy.matmul(h_mb, w2, out=out_mb)
            # The swap-out scales: each page's absmax.
            page_scale[r] = cupy.abs(pages).max(axis=1)                   # RACE: read
        if args.fixed:
            # FIX: the compute stream's next use of the block waits for the read above.
            compute.wait_event(swap.record())
        del pages   # BUG without the fix: the next gather on compute gets this block at once
    cupy.cuda.Device().synchronize()
    work_s = time.perf_counter() - start

    got = page_scale.get()
    wrong = []
    for r in range(args.iters):
        bad = int((got[r] != ids[r]).sum())
        if bad:
            wrong.append(f"request {r}: {bad} of {REQ_PAGES} swap-out scales are another "
                         "request's pages (the gathered array was reused before the read)")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: {wrong[0]} ({len(wrong)} of {args.iters} requests wrong)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

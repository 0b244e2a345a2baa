"""A block-table row published on the legacy default stream, read on a non-blocking stream.

The ninfer #210 shape: the scheduler writes a sequence's page ids into a pinned host shadow of
the block table and publishes the row to the device with a ``non_blocking`` copy on the legacy
default stream, behind the step's model work; attention runs on a non-blocking stream and
gathers KV pages through the row. A non-blocking stream does not synchronize with the legacy
default stream, so attention may read the row before the publish lands and gather the pages of
whichever sequence held the row before (in ninfer it crashed a GPU after about 54 requests).

Fix (``--fixed``): publish the row on the stream that reads it (the alternative is an event
recorded after the publish that the attention stream waits on).

Race: the publish ``block_table[seq].copy_(block_table_cpu[seq], non_blocking=True)`` on the
legacy default stream (line 74) and attention's gather ``kv_cache.index_select(0,
block_table[seq])`` on the attention stream (line 79). The fix is line 78: the same
publish, on the attention stream.
"""

import argparse
import sys
import time

import numpy as np
import torch

NUM_PAGES = 512          # the KV page pool
PAGE_ELEMS = 1024        # 4 KiB fp32 pages; every element of page p holds p
MAX_SEQS = 8             # block-table rows, reused round robin
MAX_PAGES = 64           # pages per sequence
HIDDEN = 1024
TOKENS = 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="requests to serve (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    torch.manual_seed(4)
    dev = torch.device("cuda")
    legacy = torch.cuda.default_stream()    # the legacy default stream: the engine's main one
    attn = torch.cuda.Stream()              # attention's stream (non-blocking)
    kv_cache = torch.arange(NUM_PAGES, dtype=torch.float32, device=dev)
    kv_cache = kv_cache[:, None].expand(NUM_PAGES, PAGE_ELEMS).contiguous()
    block_table = torch.zeros(MAX_SEQS, MAX_PAGES, dtype=torch.int32, device=dev)
    block_table_cpu = torch.zeros(MAX_SEQS, MAX_PAGES, dtype=torch.int32, pin_memory=True)
    x = torch.randn(TOKENS, HIDDEN, device=dev)
    w1 = torch.randn(HIDDEN, HIDDEN, device=dev) / HIDDEN ** 0.5
    w2 = torch.randn(HIDDEN, HIDDEN, device=dev) / HIDDEN ** 0.5
    rng = np.random.default_rng(4)
    rows = [torch.from_numpy(rng.choice(NUM_PAGES, MAX_PAGES, replace=False).astype(np.int32))
            for _ in range(args.iters)]
    torch.cuda.synchronize()
    hidden = torch.empty(TOKENS, HIDDEN, device=dev)   # the model's output buffer
    torch.matmul(torch.relu(x @ w1), w2, out=hidden)   # warm-up: cuBLAS, kernels load lazily
    with torch.cuda.stream(attn):
        kv_cache.index_select(0, block_table[0]).sum(dim=1)
    torch.cuda.synchronize()

    wrong = []
    start = time.perf_counter()
    for r in range(args.iters):
        seq = r % MAX_SEQS
        # The scheduler gives the sequence its pages: the host writes the pinned shadow row.
        block_table_cpu[seq].copy_(rows[r])
        with torch.cuda.stream(legacy):
            torch.matmul(torch.relu(x @ w1), w2, out=hidden)  # the step's model work, first
            if not args.fixed:
                # BUG: published on the legacy default stream, which the non-blocking attention
                # stream does not wait for; the copy lands behind the matmuls above.
                block_table[seq].copy_(block_table_cpu[seq], non_blocking=True)  # RACE: publish
        with torch.cuda.stream(attn):
            if args.fixed:
                # FIX: publish on the stream that reads the row: stream order does the rest.
                block_table[seq].copy_(block_table_cpu[seq], non_blocking=True)
            pages = kv_cache.index_select(0, block_table[seq])       # RACE: reads the row
            page_sums = pages.sum(dim=1)          # stands in for attention over the pages
        torch.cuda.synchronize()                  # the step is done
        got = page_sums.cpu()
        expect = rows[r].to(torch.float32) * PAGE_ELEMS
        if not torch.equal(got, expect):
            bad = int((got != expect).sum())
            wrong.append(f"request {r}: attention gathered {bad} of {MAX_PAGES} pages that are "
                         f"not sequence row {seq}'s (it read the row before the publish)")
    torch.cuda.synchronize()
    work_s = time.perf_counter() - start

    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: {wrong[0]} ({len(wrong)} of {args.iters} requests wrong)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

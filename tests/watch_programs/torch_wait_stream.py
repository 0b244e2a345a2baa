"""Decode reads KV pages that prefill, on a side stream, may not have written yet.

Chunked prefill runs on a side stream: it projects the chunk's keys and scatters them into the
request's pages of the paged KV cache (``kv_cache.index_copy_``). The decode step, on the main
(current) stream, then gathers those pages and scores the query against them. Nothing makes
the main stream wait for the side stream, which is non-blocking, so decode may score against
pages still holding an older request's keys.

Fix (``--fixed``): ``torch.cuda.current_stream().wait_stream(prefill)`` before decode.

Race: prefill's page write ``kv_cache.index_copy_(0, pages, k.view(...))`` on the prefill
stream (line 65) and decode's gather ``kv_cache.index_select(0, pages)`` on the main stream
(line 69). The fix is line 68.
"""

import argparse
import sys
import time

import numpy as np
import torch

NUM_PAGES = 512          # the KV page pool
PAGE_TOKENS = 16
HEAD_DIM = 128           # a page: 16 tokens x 128 fp32, 8 KiB; the pool is 4 MiB
CHUNK_TOKENS = 1024      # one request's prefill chunk: 64 pages
CHUNK_PAGES = CHUNK_TOKENS // PAGE_TOKENS
HIDDEN = 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="requests to serve (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    torch.manual_seed(9)
    dev = torch.device("cuda")
    prefill = torch.cuda.Stream()           # chunked prefill's stream (non-blocking)
    x_base = torch.randn(CHUNK_TOKENS, HIDDEN, device=dev)
    w1 = torch.randn(HIDDEN, HIDDEN, device=dev) / HIDDEN ** 0.5
    w_k = torch.randn(HIDDEN, HEAD_DIM, device=dev) / HIDDEN ** 0.5
    query = torch.randn(HEAD_DIM, device=dev)
    kv_cache = torch.zeros(NUM_PAGES, PAGE_TOKENS, HEAD_DIM, device=dev)
    rng = np.random.default_rng(9)
    ids = np.stack([rng.choice(NUM_PAGES, CHUNK_PAGES, replace=False)
                    for _ in range(args.iters)])
    page_ids = torch.from_numpy(ids).to(dev)      # each request's pages
    torch.cuda.synchronize()
    with torch.cuda.stream(prefill):        # warm-up: cuBLAS and the kernels load on first use
        torch.matmul(torch.relu(torch.add(x_base, 0) @ w1), w_k)
    (kv_cache.index_select(0, page_ids[0]) * query).sum(-1)
    torch.cuda.synchronize()

    wrong = []
    start = time.perf_counter()
    for r in range(args.iters):
        pages = page_ids[r]
        with torch.cuda.stream(prefill):
            h = torch.relu(torch.add(x_base, r) @ w1)    # the layer's hidden states
            k = h @ w_k
            # Scatter the chunk's keys into its pages.
            kv_cache.index_copy_(0, pages, k.view(CHUNK_PAGES, PAGE_TOKENS, HEAD_DIM))  # RACE
        if args.fixed:
            # FIX: the main stream waits for all the work queued on prefill so far.
            torch.cuda.current_stream().wait_stream(prefill)
        keys = kv_cache.index_select(0, pages)           # RACE: decode gathers the pages
        scores = (keys * query).sum(-1)                  # the query against every key
        torch.cuda.synchronize()                         # the step is done
        expect = (kv_cache.index_select(0, pages) * query).sum(-1)  # the same, from the pages
        if not torch.equal(scores, expect):
            bad = int((scores != expect).any(-1).sum())
            wrong.append(f"request {r}: decode scored {bad} of {CHUNK_PAGES} pages before "
                         "prefill had written them")
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

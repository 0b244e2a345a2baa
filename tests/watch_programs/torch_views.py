"""KV pages as views of one storage: a page written through one view, read through another.

The KV cache is one tensor that kernels reach through different views. Prefill, on its
stream, writes page i through ``kv_cache[i]``; the decode stream writes its own page j
(``kv_cache.narrow(0, j, 1)``), then reads page i through the flat view (``kv_flat[off:off +
n]``) with no event between the streams, so it may copy page i before prefill wrote it.
Decode's write of page j and prefill's of page i are never ordered, in either version, and never
race: they are different bytes of the one storage.

Fix (``--fixed``): an event recorded after prefill's write of page i; decode waits on it after
its own write of page j and before it reads page i.

Race: prefill's write ``torch.matmul(h, w_k, out=kv_cache[i])`` (line 68) and decode's read
``kv_fp16_flat[off:off + PAGE_ELEMS].copy_(kv_flat[off:off + PAGE_ELEMS])`` (line 79). No race,
in either version: decode's write of page j (line 74) against prefill's of page i (line 68).
The fix is lines 70 and 77.
"""

import argparse
import sys
import time

import torch

NUM_PAGES = 16
PAGE_TOKENS = 1024
HEAD_DIM = 64            # a page: 1024 x 64 fp32, 256 KiB; the cache is 4 MiB
PAGE_ELEMS = PAGE_TOKENS * HEAD_DIM
HIDDEN = 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="requests to serve (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    torch.manual_seed(11)
    dev = torch.device("cuda")
    prefill = torch.cuda.Stream()           # writes page i (non-blocking)
    decode = torch.cuda.Stream()            # writes page j, reads page i (non-blocking)
    x_base = torch.randn(PAGE_TOKENS, HIDDEN, device=dev)
    w1 = torch.randn(HIDDEN, HIDDEN, device=dev) / HIDDEN ** 0.5
    w_k = torch.randn(HIDDEN, HEAD_DIM, device=dev) / HIDDEN ** 0.5
    decode_k = torch.randn(PAGE_TOKENS, HEAD_DIM, device=dev)   # decode's own new keys
    kv_cache = torch.zeros(NUM_PAGES, PAGE_TOKENS, HEAD_DIM, device=dev)
    kv_flat = kv_cache.view(-1)             # the same storage, as attention kernels index it
    kv_fp16 = torch.zeros(NUM_PAGES, PAGE_TOKENS, HEAD_DIM, device=dev, dtype=torch.float16)
    kv_fp16_flat = kv_fp16.view(-1)
    page_written = torch.cuda.Event()
    torch.cuda.synchronize()
    with torch.cuda.stream(prefill):        # warm-up: cuBLAS and the kernels load on first use
        torch.matmul(torch.relu(torch.add(x_base, 0) @ w1), w_k)
    with torch.cuda.stream(decode):
        torch.add(decode_k, 0).half()
    torch.cuda.synchronize()

    wrong = []
    start = time.perf_counter()
    for r in range(args.iters):
        i = (2 * r) % NUM_PAGES             # prefill's page this request
        j = (2 * r + 1) % NUM_PAGES         # decode's page this request: never i
        off = i * PAGE_ELEMS
        with torch.cuda.stream(prefill):
            h = torch.relu(torch.add(x_base, r) @ w1)        # the layer's hidden states
            torch.matmul(h, w_k, out=kv_cache[i])            # RACE: writes page i
            if args.fixed:
                page_written.record()                        # FIX: page i is written here
        with torch.cuda.stream(decode):
            # Decode appends its tokens to page j: other bytes of the same storage, unordered
            # with prefill in both versions, and no race.
            torch.add(decode_k, r, out=kv_cache.narrow(0, j, 1).squeeze(0))
            if args.fixed:
                # FIX: page i is read only after prefill's write of it.
                decode.wait_event(page_written)
            # BUG without the fix: nothing orders this read of page i after prefill's write.
            kv_fp16_flat[off:off + PAGE_ELEMS].copy_(kv_flat[off:off + PAGE_ELEMS])  # RACE
        torch.cuda.synchronize()                             # the request is done
        if not torch.equal(kv_fp16[i], kv_cache[i].half()):
            wrong.append(f"request {r}: decode read page {i} before prefill had written it")
        elif not torch.equal(kv_cache[j], torch.add(decode_k, r)):
            wrong.append(f"request {r}: page {j}, decode's own, does not hold what it wrote")
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

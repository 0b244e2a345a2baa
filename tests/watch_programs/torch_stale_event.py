"""A "KV ready" event recorded before the write it should cover: the wait orders nothing.

Prefill runs on its own stream and signals decode with an event; decode waits on it and then
reads the KV block (here: casts it into the fp16 cache that attention reads). The event is
recorded too early, after the layer's hidden states but before the K projection that writes the
block, so decode's wait is satisfied while the block is still being written and decode copies
stale KV.

Fix (``--fixed``): record the event after the KV write.

Race: prefill's KV write ``torch.matmul(h, w_k, out=kv_cache[blk])`` (line 60) and decode's
read ``kv_fp16[blk].copy_(kv_cache[blk])`` (line 65), after its wait (line 63) on an event
recorded too early (line 59). The fix is line 62: the record after the write.
"""

import argparse
import sys
import time

import torch

TOKENS = 1024       # tokens in one request's prefill chunk
HIDDEN = 1024
HEAD_DIM = 256      # one KV block: TOKENS x HEAD_DIM fp32, 1 MiB
NUM_BLOCKS = 4      # device KV blocks, reused round robin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="requests to serve (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    torch.manual_seed(6)
    dev = torch.device("cuda")
    decode = torch.cuda.current_stream()    # decode runs on the default stream
    prefill = torch.cuda.Stream()           # prefill's stream (non-blocking)
    x_base = torch.randn(TOKENS, HIDDEN, device=dev)
    w1 = torch.randn(HIDDEN, HIDDEN, device=dev) / HIDDEN ** 0.5
    w_k = torch.randn(HIDDEN, HEAD_DIM, device=dev) / HIDDEN ** 0.5
    kv_cache = torch.zeros(NUM_BLOCKS, TOKENS, HEAD_DIM, device=dev)
    kv_fp16 = torch.zeros(NUM_BLOCKS, TOKENS, HEAD_DIM, device=dev, dtype=torch.float16)
    kv_ready = torch.cuda.Event()
    torch.cuda.synchronize()
    with torch.cuda.stream(prefill):        # warm-up: cuBLAS and the kernels load on first use
        torch.matmul(torch.relu(torch.add(x_base, 0) @ w1), w_k)
    torch.cuda.synchronize()

    wrong = []
    start = time.perf_counter()
    for r in range(args.iters):
        blk = r % NUM_BLOCKS
        with torch.cuda.stream(prefill):
            h = torch.relu(torch.add(x_base, r) @ w1)    # the layer's hidden states
            if not args.fixed:
                # BUG: recorded here, the event covers the hidden states but not the KV write.
                kv_ready.record()
            torch.matmul(h, w_k, out=kv_cache[blk])      # RACE: the KV write (prefill)
            if args.fixed:
                kv_ready.record()                        # FIX: recorded after the KV write
        decode.wait_event(kv_ready)
        # Decode: cast the new block into the fp16 cache attention reads.
        kv_fp16[blk].copy_(kv_cache[blk])                # RACE: the KV read (decode)
        torch.cuda.synchronize()                         # the request is done
        if not torch.equal(kv_fp16[blk], kv_cache[blk].half()):
            wrong.append(f"request {r}: decode cast KV block {blk} before prefill had "
                         "written it")
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

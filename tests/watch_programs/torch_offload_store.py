"""Offload store before the KV write it copies: the transfer stream never waits for compute.

An engine with a CPU tier for its prefix cache computes a request's KV block on the compute
stream and stores the block to pinned host memory with a device-to-host copy on a separate
transfer stream. ``torch.cuda.Stream()`` is non-blocking: nothing orders the copy after the
projection that writes the block, so the copy may run first and the host cache keeps stale KV.

Fix (``--fixed``): ``transfer.wait_stream(compute)`` before the copy is issued.

Race: the KV write ``torch.matmul(h, w_k, out=kv_cache[blk])`` on the compute stream (line
56) and the offload copy ``host_kv[slot].copy_(kv_cache[blk], non_blocking=True)`` on the
transfer stream (line 63). The fix is line 59.
"""

import argparse
import sys
import time

import torch

TOKENS = 1024       # tokens in one request's prefill chunk
HIDDEN = 1024
HEAD_DIM = 128      # one KV block: TOKENS x HEAD_DIM fp32, 512 KiB
NUM_BLOCKS = 8      # device KV blocks, reused round robin
HOST_SLOTS = 4      # pinned host slots of the CPU tier


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="requests to serve (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    torch.manual_seed(1)
    dev = torch.device("cuda")
    compute = torch.cuda.current_stream()   # the engine computes on the default stream
    transfer = torch.cuda.Stream()          # the offload stream (non-blocking)

    x_base = torch.randn(TOKENS, HIDDEN, device=dev)
    w1 = torch.randn(HIDDEN, HIDDEN, device=dev) / HIDDEN ** 0.5
    w_k = torch.randn(HIDDEN, HEAD_DIM, device=dev) / HIDDEN ** 0.5
    kv_cache = torch.zeros(NUM_BLOCKS, TOKENS, HEAD_DIM, device=dev)
    host_kv = torch.zeros(HOST_SLOTS, TOKENS, HEAD_DIM, pin_memory=True)  # the CPU tier
    torch.matmul(torch.relu(x_base @ w1), w_k)  # warm-up: cuBLAS, kernels load on first use

    wrong = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for r in range(args.iters):
        blk, slot = r % NUM_BLOCKS, r % HOST_SLOTS
        # Prefill on the compute stream: a layer's hidden states (the bulk of the work), then
        # the K projection written straight into the request's cache block.
        h = torch.relu(torch.add(x_base, r) @ w1)
        torch.matmul(h, w_k, out=kv_cache[blk])                  # RACE: the KV write (compute)
        if args.fixed:
            # FIX: the copy is queued behind every write issued on compute so far.
            transfer.wait_stream(compute)
        with torch.cuda.stream(transfer):
            # BUG without the fix: transfer is a non-blocking stream and nothing orders this
            # copy after the projection above; it may copy the block before it is written.
            host_kv[slot].copy_(kv_cache[blk], non_blocking=True)  # RACE: the offload store
        torch.cuda.synchronize()            # the request is done: its block is in the CPU tier
        if not torch.equal(host_kv[slot], kv_cache[blk].cpu()):
            wrong.append(f"request {r}: the CPU tier's copy of KV block {blk} is not the block "
                         "the request wrote")
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

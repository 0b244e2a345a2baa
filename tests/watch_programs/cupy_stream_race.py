"""CuPy: a kernel writes the KV block on one stream, another kernel reads it on a second.

Prefill projects the chunk's keys and stores them into its KV block with a ``store_kv``
RawKernel on the KV stream; attention scores the query against the block with an
``attn_scores`` RawKernel on the attention stream. Both streams are non-blocking and no event
joins them, so attention may score against the block before the store ran (it holds an older
request's keys, or zeros).

Fix (``--fixed``): ``stored = kv_stream.record(); attn_stream.wait_event(stored)`` after the
store, before the attention kernel.

Race: ``store_kv`` writing ``kv_cache[blk]`` on the KV stream (line 88) and ``attn_scores``
reading it on the attention stream (line 95). The fix is lines 91-92.
"""

import argparse
import sys
import time

import cupy
import numpy

TOKENS = 1024       # tokens in one request's prefill chunk
HIDDEN = 1024
HEAD_DIM = 128      # one KV block: TOKENS x HEAD_DIM fp32, 512 KiB
NUM_BLOCKS = 8      # device KV blocks, reused round robin
THREADS = 256

STORE_KV = r"""
extern "C" __global__ void store_kv(const float* k, float* kv_block, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) kv_block[i] = k[i];
}
"""

ATTN_SCORES = r"""
extern "C" __global__ void attn_scores(const float* kv_block, const float* query,
                                       float* scores, int tokens, int dim) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    float acc = 0.0f;
    for (int d = 0; d < dim; ++d) acc += kv_block[t * dim + d] * query[d];
    scores[t] = acc;
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="requests to serve (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    cupy.random.seed(8)
    store_kv = cupy.RawKernel(STORE_KV, "store_kv")
    attn_scores = cupy.RawKernel(ATTN_SCORES, "attn_scores")
    kv_stream = cupy.cuda.Stream(non_blocking=True)      # prefill writes KV here
    attn_stream = cupy.cuda.Stream(non_blocking=True)    # attention reads it here
    scale = numpy.float32(1 / HIDDEN ** 0.5)
    x_base = cupy.random.standard_normal((TOKENS, HIDDEN), dtype=cupy.float32)
    w1 = cupy.random.standard_normal((HIDDEN, HIDDEN), dtype=cupy.float32) * scale
    w_k = cupy.random.standard_normal((HIDDEN, HEAD_DIM), dtype=cupy.float32) * scale
    query = cupy.random.standard_normal((HEAD_DIM,), dtype=cupy.float32)
    kv_cache = cupy.zeros((NUM_BLOCKS, TOKENS, HEAD_DIM), dtype=cupy.float32)
    scores = cupy.zeros((TOKENS,), dtype=cupy.float32)
    expect = cupy.zeros((TOKENS,), dtype=cupy.float32)
    n = numpy.int32(TOKENS * HEAD_DIM)
    store_grid = ((TOKENS * HEAD_DIM + THREADS - 1) // THREADS,)
    attn_grid = ((TOKENS + THREADS - 1) // THREADS,)
    tokens, dim = numpy.int32(TOKENS), numpy.int32(HEAD_DIM)
    # Warm-up on the default stream: the kernels compile or load on first use.
    warm = cupy.matmul(cupy.maximum(cupy.matmul(x_base + 0, w1), 0), w_k)
    scratch = cupy.zeros((TOKENS, HEAD_DIM), dtype=cupy.float32)
    store_kv(store_grid, (THREADS,), (warm, scratch, n))
    attn_scores(attn_grid, (THREADS,), (scratch, query, expect, tokens, dim))
    cupy.cuda.Device().synchronize()
    del warm, scratch

    wrong = []
    start = time.perf_counter()
    for r in range(args.iters):
        blk = r % NUM_BLOCKS
        with kv_stream:
            h = cupy.maximum(cupy.matmul(x_base + r, w1), 0)    # the layer's hidden states
            k = cupy.matmul(h, w_k)
            store_kv(store_grid, (THREADS,), (k, kv_cache[blk], n))           # RACE: write
        if args.fixed:
            # FIX: attention's stream waits for everything queued on the KV stream so far.
            stored = kv_stream.record()
            attn_stream.wait_event(stored)
        with attn_stream:
            # BUG without the fix: two non-blocking streams and no event between them.
            attn_scores(attn_grid, (THREADS,), (kv_cache[blk], query, scores, tokens, dim))  # RACE
        cupy.cuda.Device().synchronize()                 # the request is done
        # The same scores from the block as it is now, on the default stream.
        attn_scores(attn_grid, (THREADS,), (kv_cache[blk], query, expect, tokens, dim))
        got, want = scores.get(), expect.get()
        if not numpy.array_equal(got, want):
            bad = int((got != want).sum())
            wrong.append(f"request {r}: attention scored {bad} of {TOKENS} tokens against KV "
                         f"block {blk} before the store")
    cupy.cuda.Device().synchronize()
    work_s = time.perf_counter() - start

    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: {wrong[0]} ({len(wrong)} of {args.iters} requests wrong)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CuPy: a pinned staging buffer refilled by the host before its async upload has run.

The engine keeps one pinned host array (``cupyx.zeros_pinned``) for each step's input ids and
uploads it with ``input_ids.set(staging, stream=forward)``. With pinned memory the copy is
asynchronous: it reads the staging bytes when the forward stream reaches it, behind the
previous request's layers. The host writes the next request's ids into the same array at once,
so a queued upload sends the next request's tokens (or a mix) to the device.

Fix (``--fixed``): an event recorded on the stream after the upload, synchronized before the
host refills the staging array (two staging arrays ping-ponged, each with its event, are the
same fix with more overlap).

Race: the host's write ``staging[:] = prompts[r]`` (line 64) for request r+1 and the upload
``input_ids.set(staging, stream=forward)`` (line 67) of request r. The fix is line 63, the
wait on the event that line 68 records.
"""

import argparse
import sys
import time

import cupy
import cupyx
import numpy

TOKENS = 2048       # tokens in one request
VOCAB = 1024
HIDDEN = 1024
LAYERS = 2          # the forward: big enough matmuls that the stream runs behind the host


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="requests to serve (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    cupy.random.seed(7)
    forward = cupy.cuda.Stream(non_blocking=True)   # the engine's upload and forward stream
    embed = cupy.random.standard_normal((VOCAB, HIDDEN), dtype=cupy.float32)
    # Column 0 of each embedding row holds its token id: the answer says what was embedded.
    embed[:, 0] = cupy.arange(VOCAB, dtype=cupy.float32)
    scale = numpy.float32(1 / HIDDEN ** 0.5)
    layers = [cupy.random.standard_normal((HIDDEN, HIDDEN), dtype=cupy.float32) * scale
              for _ in range(LAYERS)]
    staging = cupyx.zeros_pinned((TOKENS,), dtype=numpy.int32)   # the pinned staging buffer
    input_ids = cupy.zeros((TOKENS,), dtype=cupy.int32)
    answers = cupy.zeros((args.iters, TOKENS), dtype=cupy.float32)
    prompts = numpy.random.default_rng(7).integers(0, VOCAB, (args.iters, TOKENS),
                                                   dtype=numpy.int32)
    # Warm-up on the default stream: the kernels compile or load on first use.
    warm = cupy.take(embed, input_ids, axis=0)
    cupy.zeros((TOKENS,), dtype=cupy.float32)[:] = warm[:, 0]
    cupy.matmul(warm, layers[0])
    cupy.cuda.Device().synchronize()

    uploaded = None
    start = time.perf_counter()
    for r in range(args.iters):
        if args.fixed and uploaded is not None:
            uploaded.synchronize()        # FIX: the previous upload has read the staging array
        staging[:] = prompts[r]                                   # RACE: the host refills it
        # BUG without the fix: with pinned memory set() only queues the copy; it reads the
        # staging array when the stream gets to it, behind the previous request's layers.
        input_ids.set(staging, stream=forward)                    # RACE: the queued upload
        uploaded = forward.record()       # the end of the upload: what the fix waits for
        with forward:
            x = cupy.take(embed, input_ids, axis=0)
            answers[r] = x[:, 0]              # the token ids this request embedded
            h = x
            for w in layers:
                h = cupy.matmul(h, w)
    cupy.cuda.Device().synchronize()
    work_s = time.perf_counter() - start

    got = answers.get()
    wrong = []
    for r in range(args.iters):
        bad = int((got[r] != prompts[r]).sum())
        if bad:
            wrong.append(f"request {r}: {bad} of {TOKENS} embedded token ids are not the "
                         "request's (the upload read the staging array after it was refilled)")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: {wrong[0]} ({len(wrong)} of {args.iters} requests wrong)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

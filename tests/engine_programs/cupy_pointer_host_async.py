"""A copy to pinned memory through ``MemoryPointer``, read by the host before it is done.

``dev.data.copy_to_host_async(ptr, nbytes, stream)`` queues the copy on ``stream`` and returns
at once: the pinned buffer it writes holds the result only once the stream has got that far.
An engine that reads the buffer (sampled tokens, a logits row) right after queueing the copy
reads what was there before.

Fix (``--fixed``): ``stream.synchronize()`` before the host reads the buffer.

Race: the copy's write of the pinned buffer (line 42) and the host's read of it
(line 45). The fix is line 44.
"""

import argparse
import ctypes
import sys

import cupy
import cupyx

N = 1 << 22


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="steps (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    stream = cupy.cuda.Stream(non_blocking=True)
    dev = cupy.zeros(N, dtype=cupy.float32)
    scratch = cupy.ones(N, dtype=cupy.float32)
    host = cupyx.zeros_pinned(N, dtype=cupy.float32)
    where = ctypes.c_void_p(host.ctypes.data)
    wrong = 0
    for step in range(args.iters):
        with stream:
            for _ in range(8):  # the step's other work, ahead of the result
                cupy.multiply(scratch, 1.0, out=scratch)
            dev.fill(float(step + 1))
        dev.data.copy_to_host_async(where, dev.nbytes, stream)
        if args.fixed:
            stream.synchronize()
        total, expected = float(host.sum()), float(step + 1) * N
        if total != expected:
            wrong += 1
            print(f"step {step}: the host read {total}, expected {expected}")
        stream.synchronize()
    print(f"{wrong} of {args.iters} steps read the buffer before the copy wrote it")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

"""A raw copy through ``MemoryPointer`` on the legacy stream, racing a non-blocking stream.

CuPy-based engines move raw bytes with ``dst.data.copy_from_device(src.data, nbytes)``. That
form "always uses the legacy default stream and does not honor the current stream" (CuPy's
docs), and the legacy stream does not wait for a stream made with ``non_blocking=True``: the
copy may read ``src`` before the kernel on that stream has written it.

Fix (``--fixed``): ``cupy.cuda.Stream.null.wait_event(side.record())`` before the copy.

Race: the copy's read of ``src`` on the legacy stream (line 42) and the kernel's write
of it on the non-blocking stream (line 39). The fix is line 41.
"""

import argparse
import sys

import cupy

N = 1 << 22


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="steps (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    side = cupy.cuda.Stream(non_blocking=True)
    src = cupy.zeros(N, dtype=cupy.float32)
    dst = cupy.zeros(N, dtype=cupy.float32)
    scratch = cupy.ones(N, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    wrong = 0
    for step in range(args.iters):
        with side:
            for _ in range(8):  # the stream's other work, ahead of the write
                cupy.multiply(scratch, 1.0, out=scratch)
            src.fill(float(step + 1))
        if args.fixed:
            cupy.cuda.Stream.null.wait_event(side.record())
        dst.data.copy_from_device(src.data, src.nbytes)
        total, expected = float(dst.sum()), float(step + 1) * N
        if total != expected:
            wrong += 1
            print(f"step {step}: the copy sums to {total}, expected {expected}")
        side.synchronize()
    print(f"{wrong} of {args.iters} steps copied the buffer before the kernel wrote it")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

"""A Triton kernel accumulating with atomics on a side stream, its total read on the default stream.

Reductions written in Triton often accumulate across blocks with ``tl.atomic_add`` into a small
output (a loss, a histogram, a norm). Launched inside ``with torch.cuda.stream(side):``, the
kernel runs on ``side``; the default stream's read of the accumulator needs an event or
``wait_stream`` after it, or it reads a total some blocks have not added to yet.

Fix (``--fixed``): ``torch.cuda.current_stream().wait_stream(side)`` before the read.

Race: the kernel's atomic adds into ``total`` on the side stream (line 51) and the read
``float(total)`` on the default stream (line 54). The fix is line 53.
"""

import argparse
import sys

import torch
import triton
import triton.language as tl

N = 1 << 22
BLOCK = 1024


@triton.jit
def accumulate(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(total_ptr, tl.sum(values, axis=0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="steps (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    side = torch.cuda.Stream()
    x = torch.ones(N, device="cuda")
    scratch = torch.ones(N, device="cuda")
    total = torch.zeros(1, device="cuda")
    wrong = 0
    for step in range(args.iters):
        total.zero_()
        side.wait_stream(torch.cuda.current_stream())  # the zeroed total first
        grid = (triton.cdiv(N, BLOCK),)
        with torch.cuda.stream(side):
            for _ in range(8):  # the stream's other work, ahead of the kernel
                scratch.mul_(1.0)
            accumulate[grid](x, total, N, BLOCK=BLOCK)
        if args.fixed:
            torch.cuda.current_stream().wait_stream(side)
        got = float(total)
        if got != float(N):
            wrong += 1
            print(f"step {step}: the total is {got}, expected {float(N)}")
        side.synchronize()
    print(f"{wrong} of {args.iters} steps read the total before the kernel was done")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

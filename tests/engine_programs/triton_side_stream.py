"""A Triton kernel launched on a side stream, its output read on the default stream unordered.

Serving engines run their own Triton kernels (sampling, attention) on streams of their own. A
kernel launched as ``kernel[grid](...)`` inside ``with torch.cuda.stream(side):`` runs on
``side``; the default stream's later read of what it wrote needs an event or ``wait_stream``
between them, as any other op on another stream does. Here the logits are scaled by a Triton
kernel on the side stream while the default stream sums them at once.

Fix (``--fixed``): ``torch.cuda.current_stream().wait_stream(side)`` before the read.

Race: the kernel's write ``scale[grid](logits, scaled, ...)`` on the side stream (line 50) and
the read ``scaled.sum()`` on the default stream (line 53). The fix is line 52.
"""

import argparse
import sys

import torch
import triton
import triton.language as tl

N = 1 << 22
BLOCK = 1024


@triton.jit
def scale(x_ptr, y_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * s, mask=m)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="steps (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    side = torch.cuda.Stream()
    wrong = 0
    for step in range(args.iters):
        logits = torch.full((N,), float(step + 1), device="cuda")
        for _ in range(4):  # the default stream busy: the kernel and the read start together
            logits = logits * 1.0
        scaled = torch.zeros(N, device="cuda")
        side.wait_stream(torch.cuda.current_stream())  # the logits are written first
        grid = (triton.cdiv(N, BLOCK),)
        with torch.cuda.stream(side):
            scale[grid](logits, scaled, N, 0.5, BLOCK=BLOCK)
        if args.fixed:
            torch.cuda.current_stream().wait_stream(side)
        total, expected = float(scaled.sum()), 0.5 * (step + 1) * N
        if total != expected:
            wrong += 1
            print(f"step {step}: scaled logits sum to {total}, expected {expected}")
    print(f"{wrong} of {args.iters} steps read the logits before the kernel scaled them")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

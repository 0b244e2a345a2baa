"""An engine core in a process of its own, reading a batch its side stream is still copying.

vLLM V1 runs its engine core as a separate Python process that the front end starts. Here the
program starts its core as a subprocess of the same interpreter; the core stages each batch
into ``batch`` on a side stream and sums it on the default stream with no event between.

Fix (``--fixed``): ``torch.cuda.current_stream().wait_stream(side)`` before the read.

Race, in the core's process: the side stream's copy into ``batch`` (line 34) and the
default stream's read of it (line 37). The fix is line 36.
"""

import argparse
import subprocess
import sys

import torch

N = 1 << 22


def core(fixed: bool, iters: int) -> int:
    side = torch.cuda.Stream()
    src = torch.zeros(N, device="cuda")
    batch = torch.zeros(N, device="cuda")
    scratch = torch.ones(N, device="cuda")
    wrong = 0
    for step in range(iters):
        src.fill_(float(step + 1))
        side.wait_stream(torch.cuda.current_stream())  # the batch is ready first
        with torch.cuda.stream(side):
            for _ in range(8):  # the stream's other work, ahead of the copy
                scratch.mul_(1.0)
            batch.copy_(src)
        if fixed:
            torch.cuda.current_stream().wait_stream(side)
        total, expected = float(batch.sum()), float(step + 1) * N
        if total != expected:
            wrong += 1
            print(f"step {step}: the batch sums to {total}, expected {expected}")
        side.synchronize()
    print(f"{wrong} of {iters} steps read the batch before the copy was done")
    return 1 if wrong else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="steps (default 8)")
    parser.add_argument("--core", action="store_true", help="be the engine core (internal)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    if args.core:
        return core(args.fixed, args.iters)
    command = [sys.executable, __file__, "--core", "--iters", str(args.iters)]
    return subprocess.run(command + (["--fixed"] if args.fixed else [])).returncode


if __name__ == "__main__":
    sys.exit(main())

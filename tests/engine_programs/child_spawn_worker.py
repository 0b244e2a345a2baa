"""A spawned worker rewriting a pinned buffer while its copy to the device is still queued.

``torch.multiprocessing.spawn`` starts each worker as a fresh interpreter. This worker stages
each step's input in pinned memory, queues ``dev.copy_(host, non_blocking=True)`` behind the
stream's other work, and then reuses the pinned buffer at once: the copy, which reads the
buffer only when the stream gets to it, may read the new contents.

Fix (``--fixed``): ``torch.cuda.current_stream().synchronize()`` before the buffer is reused.

Race, in the worker's process: the copy's read of the pinned buffer (line 32) and the
host's rewrite of it (line 35). The fix is line 34.
"""

import argparse
import sys

import torch
import torch.multiprocessing as mp

N = 1 << 22


def worker(rank: int, fixed: bool, iters: int) -> None:
    host = torch.zeros(N, pin_memory=True)
    dev = torch.zeros(N, device="cuda")
    scratch = torch.ones(N, device="cuda")
    wrong = 0
    for step in range(iters):
        host.fill_(float(step + 1))
        for _ in range(8):  # the stream's other work, ahead of the copy
            scratch.mul_(1.0)
        dev.copy_(host, non_blocking=True)
        if fixed:
            torch.cuda.current_stream().synchronize()
        host.fill_(-1.0)  # the buffer taken for the next thing
        total, expected = float(dev.sum()), float(step + 1) * N
        if total != expected:
            wrong += 1
            print(f"worker {rank} step {step}: the copy sums to {total}, expected {expected}")
    print(f"worker {rank}: {wrong} of {iters} steps copied the buffer after it was reused")
    if wrong:
        sys.exit(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="steps (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    try:
        mp.spawn(worker, args=(args.fixed, args.iters), nprocs=1)
    except mp.ProcessExitedException:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

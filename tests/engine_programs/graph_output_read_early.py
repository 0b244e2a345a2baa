"""A CUDA graph replayed on an engine's own stream, its output read on the default stream unordered.

An engine replays its captured decode step on a stream of its own and samples from the
graph's static output. ``graph.replay()`` inside ``with torch.cuda.stream(side):`` queues the
whole graph on ``side`` and returns at once; the default stream's read of ``static_out`` needs
an event or ``wait_stream`` after the replay, as for any other op on another stream (PyTorch's
"CUDA Graphs" notes: a replay is ordered like a kernel launch on the stream it is issued on).

Fix (``--fixed``): ``torch.cuda.current_stream().wait_stream(side)`` before the read.

Race: the graph's write of ``static_out``, captured once and replayed on ``side`` at each
step (line 27) and the read ``static_out.sum()`` on the default stream (line 54). The fix is
line 53.
"""

import argparse
import sys

import torch

N = 1 << 22


def step_body(scratch: torch.Tensor, static_in: torch.Tensor, static_out: torch.Tensor) -> None:
    for _ in range(8):  # the decode step's other work, ahead of the output's write
        scratch.mul_(1.0)
    static_out.copy_(static_in * 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="steps (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    static_in = torch.zeros(N, device="cuda")
    static_out = torch.zeros(N, device="cuda")
    scratch = torch.ones(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on the side stream before capture, as the docs do
        step_body(scratch, static_in, static_out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step_body(scratch, static_in, static_out)
    wrong = 0
    for step in range(args.iters):
        with torch.cuda.stream(side):
            static_in.fill_(float(step + 1))
            graph.replay()
        if args.fixed:
            torch.cuda.current_stream().wait_stream(side)
        total, expected = float(static_out.sum()), 2.0 * (step + 1) * N
        if total != expected:
            wrong += 1
            print(f"step {step}: the output sums to {total}, expected {expected}")
    print(f"{wrong} of {args.iters} steps read the output before the replay wrote it")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

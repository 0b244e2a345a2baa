"""A CUDA graph replayed while the next batch is copied into its static input on another stream.

Engines capture a decode step once as a CUDA graph and replay it over static input tensors,
staging each next batch into those same tensors (PyTorch's "CUDA Graphs" notes show the
pattern; vllm-project/vllm#29608 is a replay that skipped a wait). ``graph.replay()`` only
queues the graph on the current stream: a copy into ``static_in`` on a copy stream must wait
for the replay, or it may overwrite the input while the replayed kernels still read it.

Fix (``--fixed``): ``copier.wait_stream(torch.cuda.current_stream())`` before the copy.

Race: the graph's read of ``static_in``, captured once and replayed at each step (line 26)
and the copy of the next batch into it on the copy stream (line 55). The fix is line 53.
"""

import argparse
import sys

import torch

N = 1 << 22


def step_body(scratch: torch.Tensor, static_in: torch.Tensor, static_out: torch.Tensor) -> None:
    for _ in range(8):  # the decode step's other work, ahead of the input's read
        scratch.mul_(1.0)
    static_out.copy_(static_in * 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="steps (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    batches = [torch.full((N,), float(i + 1)).pin_memory() for i in range(args.iters + 1)]
    static_in = batches[0].cuda()
    static_out = torch.zeros(N, device="cuda")
    scratch = torch.ones(N, device="cuda")
    warm = torch.cuda.Stream()  # warm up on a side stream before capture, as the docs do
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        step_body(scratch, static_in, static_out)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step_body(scratch, static_in, static_out)
    copier = torch.cuda.Stream()
    wrong = 0
    for step in range(args.iters):
        graph.replay()
        if args.fixed:
            copier.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copier):
            static_in.copy_(batches[step + 1], non_blocking=True)
        torch.cuda.current_stream().wait_stream(copier)  # the next replay reads the new batch
        total, expected = float(static_out.sum()), 2.0 * (step + 1) * N
        if total != expected:
            wrong += 1
            print(f"step {step}: the output sums to {total}, expected {expected}")
    print(f"{wrong} of {args.iters} steps read a batch the copy had already overwritten")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

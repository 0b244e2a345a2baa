"""A CUDA graph whose side-stream branch writes what the capturing stream reads before the join.

Engines overlap independent work inside a captured decode step (a MoE layer's shared expert
beside its routed experts) by forking a side stream into the capture (``side.wait_stream``)
and joining it back before the capture ends; vllm-project/vllm#57785 fixes such side-stream
work left unjoined across a capture. In the graph two nodes are ordered only by the captured
edges, whatever order the capture saw them in: a read of the branch's result placed before the
join runs beside the branch's write at each replay, and reads the last replay's value when the
branch is late.

Fix (``--fixed``): ``torch.cuda.current_stream().wait_stream(side)`` before the read.

Race: the branch's write ``static_shared.copy_(...)`` on the side stream (line 30) and the read
``static_out.copy_(...)`` of it on the capturing stream (line 35). The fix is line 34.
"""

import argparse
import sys

import torch

N = 1 << 20


def step_body(static_in: torch.Tensor, static_routed: torch.Tensor, static_shared: torch.Tensor,
              static_out: torch.Tensor, side: torch.cuda.Stream, fixed: bool) -> None:
    main = torch.cuda.current_stream()
    side.wait_stream(main)  # fork the branch into the capture
    with torch.cuda.stream(side):  # the shared expert
        static_shared.copy_(static_in * 3)
    for _ in range(2):  # the routed experts, on the capturing stream
        static_routed.copy_(static_in * 2)
    if fixed:
        main.wait_stream(side)
    static_out.copy_(static_routed + static_shared)
    main.wait_stream(side)  # the join, which the capture needs before it ends


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="steps (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    static_in = torch.ones(N, device="cuda")
    static_routed, static_shared, static_out = (torch.zeros(N, device="cuda") for _ in range(3))
    side = torch.cuda.Stream()
    warm = torch.cuda.Stream()  # warm up on a side stream before capture, as the docs do
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        step_body(static_in, static_routed, static_shared, static_out, side, args.fixed)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step_body(static_in, static_routed, static_shared, static_out, side, args.fixed)
    wrong = 0
    for step in range(args.iters):
        static_in.fill_(float(step + 2))  # the next batch, before the replay on this stream
        graph.replay()
        total, expected = float(static_out.sum()), 5.0 * (step + 2) * N
        if total != expected:
            wrong += 1
            print(f"step {step}: the output sums to {total}, expected {expected}")
    print(f"{wrong} of {args.iters} steps read the shared expert's last result")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

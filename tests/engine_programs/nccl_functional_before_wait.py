"""A functional all-gather's result read on the current stream before its ``wait_tensor``.

torch.compile issues a collective as a ``torch.ops._c10d_functional`` op whose result is ready
only after ``torch.ops._c10d_functional.wait_tensor(result)``, and its scheduler moves that wait
as late as it can, to overlap the collective with compute (pytorch/pytorch#152252 shows the
generated code; pytorch/pytorch#174280 asks for the wait after a GEMM). A read of the result
placed between the two, as a reordering that moved the wait past a use would write it, reads
what NCCL has not written yet: the gather runs on a stream of the process group's own. The ops
are called here as Inductor's generated code calls them. One NCCL rank on cuda:0 is enough.

Fix (``--fixed``): ``wait_tensor(out)`` before the read.

Race: the gather's write ``all_gather_into_tensor(shard, 1, group)`` on the process group's
stream (line 56) and the read ``out.view(...) @ x`` on the default stream (line 59). The fix
is line 58.
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist

ROWS = 2048
COLS = 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="gathers (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    if "MASTER_PORT" not in os.environ:  # torchrun's rank connects to its agent's store
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    functional = torch.ops._c10d_functional
    group = dist.group.WORLD.group_name
    x = torch.ones(COLS, 1, device="cuda")
    wrong = 0
    try:
        for step in range(args.iters):
            shard = torch.full((ROWS * COLS,), float(step + 1), device="cuda")
            expected = float(step + 1) * COLS
            # Work queued on the current stream first: the gather waits for it, and the
            # NCCL stream is busy when the read below is issued.
            for _ in range(4):
                shard = shard * 1.0
            out = functional.all_gather_into_tensor.default(shard, 1, group)
            if args.fixed:
                functional.wait_tensor.default(out)
            y = out.view(ROWS, COLS) @ x
            if not args.fixed:
                functional.wait_tensor.default(out)
            got = float(y[0, 0])
            if got != expected:
                wrong += 1
                print(f"step {step}: gathered row sums to {got}, expected {expected}")
    finally:
        dist.destroy_process_group()
    print(f"{wrong} of {args.iters} gathers read before NCCL wrote them")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

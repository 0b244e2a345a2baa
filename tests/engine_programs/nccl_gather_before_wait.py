"""An async all-gather's output read on the current stream before its ``work.wait()``.

FSDP's unshard gathers each layer's parameter shards with
``dist.all_gather_into_tensor(out, shard, async_op=True)`` and must call ``work.wait()`` before
the layer reads the gathered parameters: NCCL writes ``out`` on a stream of the process group's
own, and ``wait`` is what makes the current stream wait for it (pytorch/pytorch#188655 is the
same mistake with an all-reduce). Here the forward reads the gathered tensor first, so on a
busy NCCL stream it reads what ``out`` held before (fresh memory of the caching allocator).
One NCCL rank on cuda:0 is enough: NCCL still runs the gather on its own stream.

Fix (``--fixed``): ``work.wait()`` before the read.

Race: the gather's write ``dist.all_gather_into_tensor(..., async_op=True)`` on the process
group's stream (line 56) and the read ``out.view(...) @ x`` on the default stream (line 59).
The fix is line 58.
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
    torch.manual_seed(5)
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
            out = torch.empty(ROWS * COLS, device="cuda")
            work = dist.all_gather_into_tensor(out, shard, async_op=True)
            if args.fixed:
                work.wait()
            y = out.view(ROWS, COLS) @ x
            if not args.fixed:
                work.wait()
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

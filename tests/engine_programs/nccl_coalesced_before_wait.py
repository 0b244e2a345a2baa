"""Coalesced all-gathers read before the coalescing manager's ``wait()``.

Pipeline and FSDP-style code batches collectives in ``dist._coalescing_manager(...,
async_ops=True)`` (``dist.batch_isend_irecv`` is built on it): NCCL issues the block as one
group on the process group's stream, and only the manager's ``cm.wait()`` (the Work that ends
the block) orders the current stream after it; the Works of the collectives inside are not
what is waited on. Here the layer reads the first gathered tensor before that wait. One NCCL
rank on cuda:0.

Fix (``--fixed``): ``cm.wait()`` before the read.

Race: the gather's write ``dist.all_gather_into_tensor(..., async_op=True)`` on the process
group's stream (line 55) and the read ``outs[0].view(...) @ x`` on the default stream
(line 58). The fix is line 57.
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
    parser.add_argument("--iters", type=int, default=8, help="blocks (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    if "MASTER_PORT" not in os.environ:  # torchrun's rank connects to its agent's store
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    x = torch.ones(COLS, 1, device=dev)
    wrong = 0
    try:
        for step in range(args.iters):
            shards = [torch.full((ROWS * COLS,), float(step + k + 1), device=dev)
                      for k in range(2)]
            for _ in range(4):  # work still queued when the block is issued
                shards = [shard * 1.0 for shard in shards]
            outs = [torch.empty(ROWS * COLS, device=dev) for _ in shards]
            with dist._coalescing_manager(device=dev, async_ops=True) as cm:
                for out, shard in zip(outs, shards):
                    dist.all_gather_into_tensor(out, shard, async_op=True)
            if args.fixed:
                cm.wait()
            y = outs[0].view(ROWS, COLS) @ x
            if not args.fixed:
                cm.wait()
            got, expected = float(y[0, 0]), float(step + 1) * COLS
            if got != expected:
                wrong += 1
                print(f"step {step}: gathered row sums to {got}, expected {expected}")
    finally:
        dist.destroy_process_group()
    print(f"{wrong} of {args.iters} blocks read before NCCL wrote them")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

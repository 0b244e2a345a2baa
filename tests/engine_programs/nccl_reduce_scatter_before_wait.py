"""An async reduce-scatter's output scaled by the optimizer before its ``work.wait()``.

FSDP2 reduce-scatters each layer's gradients with
``dist.reduce_scatter_tensor(grad_shard, grads, async_op=True)`` and must wait on the work
before the optimizer touches the shard: NCCL writes it on the process group's stream, and only
``work.wait()`` orders the current stream after that write. Here the gradient clipping scales
the shard first, so NCCL's write can land after the scaling (and undo it), or the scaling can
read what the shard held before. One NCCL rank on cuda:0: NCCL still runs it on its own stream.

Fix (``--fixed``): ``work.wait()`` before the scaling.

Race: the reduce-scatter's write ``dist.reduce_scatter_tensor(..., async_op=True)`` on the
process group's stream (line 50) and the in-place scaling ``grad_shard.mul_(0.5)`` on the
default stream (line 53). The fix is line 52.
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist

NUMEL = 1 << 22


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="steps (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    if "MASTER_PORT" not in os.environ:  # torchrun's rank connects to its agent's store
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    wrong = 0
    try:
        for step in range(args.iters):
            grads = torch.full((NUMEL,), float(step + 2), device="cuda")
            # The backward's last kernels, still queued when the reduce-scatter is issued.
            for _ in range(4):
                grads = grads * 1.0
            grad_shard = torch.zeros(NUMEL, device="cuda")
            work = dist.reduce_scatter_tensor(grad_shard, grads, async_op=True)
            if args.fixed:
                work.wait()
            grad_shard.mul_(0.5)  # clip: scale the reduced gradient
            if not args.fixed:
                work.wait()
            got, expected = float(grad_shard.sum()), float(step + 2) * 0.5 * NUMEL
            if got != expected:
                wrong += 1
                print(f"step {step}: scaled gradient sums to {got}, expected {expected}")
    finally:
        dist.destroy_process_group()
    print(f"{wrong} of {args.iters} steps scaled the gradient before NCCL wrote it")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

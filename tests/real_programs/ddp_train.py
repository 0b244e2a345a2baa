"""SGD-with-momentum training of a small MLP under ``DistributedDataParallel``, one NCCL rank.

Follows PyTorch 2.11, "Getting Started with Distributed Data Parallel"
(https://docs.pytorch.org/tutorials/intermediate/ddp_tutorial.html) and the
``DistributedDataParallel`` reference
(https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html):
the model is wrapped with ``device_ids=[rank]``; its gradients are bucketed and all-reduced during
backward. One process, one GPU, world size 1 (``torchrun --nproc-per-node 1`` sets the same
variables).

Checks: the loss on a held-out batch fell, and after training every parameter equals that of a
plain copy trained on the same batches with the same SGD (within 1e-5). The answer is a digest of
the trained model's class predictions on the held-out batch.
"""

import argparse
import copy
import hashlib
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

IN, HIDDEN, CLASSES, BATCH = 64, 256, 10, 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model() -> nn.Sequential:
    block = lambda i, o: nn.Sequential(nn.Linear(i, o), nn.GELU())  # noqa: E731
    return nn.Sequential(block(IN, HIDDEN), block(HIDDEN, HIDDEN), nn.Linear(HIDDEN, CLASSES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20, help="SGD steps timed (default 20)")
    args = parser.parse_args()

    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port())),
                       ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)

    torch.manual_seed(0)
    model = make_model().to(device)
    reference = copy.deepcopy(model)                 # trained without DDP, for the check
    model = DDP(model, device_ids=[device.index])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)

    teacher = torch.randn(IN, CLASSES, device=device)
    xs = torch.randn(args.iters + 2, BATCH, IN, device=device)   # warm-up, timed, held out
    ys = (xs @ teacher).argmax(-1)

    def train_step(net: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
        loss = F.cross_entropy(net(xs[i]), ys[i])
        loss.backward()
        opt.step()
        opt.zero_grad()

    with torch.no_grad():
        loss_before = F.cross_entropy(model(xs[-1]), ys[-1]).item()
    train_step(model, optimizer, 0)                  # warm-up: NCCL, DDP's buckets, cuBLAS
    torch.cuda.synchronize()
    steps: list[float] = []
    start = time.perf_counter()
    for i in range(1, args.iters + 1):
        t0 = time.perf_counter()
        train_step(model, optimizer, i)
        steps.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    work_s = time.perf_counter() - start

    with torch.no_grad():
        logits = model(xs[-1])
        loss_after = F.cross_entropy(logits, ys[-1]).item()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.3, momentum=0.9)
    for i in range(args.iters + 1):
        train_step(reference, ref_optimizer, i)
    trained = model.module.state_dict()
    wrong = [name for name, q in reference.state_dict().items()
             if not torch.allclose(trained[name], q, atol=1e-5, rtol=1e-5)]
    if loss_after >= loss_before:
        wrong.append(f"held-out loss did not fall ({loss_before:.4f} -> {loss_after:.4f})")

    digest = hashlib.sha256(logits.argmax(-1).cpu().numpy().tobytes())
    print(f"answer=loss_fell={loss_after < loss_before}:{digest.hexdigest()[:16]}")
    print(f"step_max_s={max(steps):.6f}")
    print(f"work_s={work_s:.6f}")
    dist.destroy_process_group()
    if wrong:
        print(f"WRONG: DDP training differs from plain training: {', '.join(wrong)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A loop over 4 MB tensors, each copied to the GPU, reduced there and read back with ``.item()``.

Follows PyTorch 2.11, "CUDA semantics", "Asynchronous execution"
(https://docs.pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution): GPU operations are
queued and run later; an operation that needs the result on the CPU, such as ``.item()``, waits for
them. Each iteration copies a float32 tensor of 1M elements (4 MB) from host memory to the GPU
(``.to(device)``), computes ``(2 * x - 3).sum()`` and reads it with ``.item()``, as a training loop
reads its loss for logging. The tensor is freed every iteration, so the caching allocator hands
its block to the next one.

With ``--all-reduce``, each iteration also sums the tensor across ranks with
``torch.distributed.all_reduce`` before reducing it, as data-parallel code does with gradients
(PyTorch 2.11, "Distributed communication package",
https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.all_reduce), on one NCCL
rank: the sum over one rank is the tensor itself.

Checks: every sum equals the one numpy computes on the host copy (the values are small integers,
so float32 sums are exact). The answer is a digest of the sums.
"""

import argparse
import hashlib
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

N = 1 << 20                     # 1M float32 elements: 4 MB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20, help="iterations timed (default 20)")
    parser.add_argument("--all-reduce", action="store_true",
                        help="all_reduce each tensor over one NCCL rank before its sum")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    if args.all_reduce:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port)),
                           ("RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(key, value)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    rng = np.random.default_rng(0)
    # Integers 0..7: every partial sum of 2x - 3 stays below 2**24, so float32 adds exactly.
    host = [rng.integers(0, 8, N).astype(np.float32) for _ in range(args.iters + 1)]

    def step(i: int) -> float:
        x = torch.from_numpy(host[i]).to(device)
        if args.all_reduce:
            dist.all_reduce(x)  # one rank: the sum is x
        return (2 * x - 3).sum().item()

    step(0)                                     # warm-up: the CUDA context, kernels, allocator
    torch.cuda.synchronize()
    sums: list[float] = []
    steps: list[float] = []
    start = time.perf_counter()
    for i in range(1, args.iters + 1):
        t0 = time.perf_counter()
        sums.append(step(i))
        steps.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    work_s = time.perf_counter() - start

    expected = [int((2 * host[i].astype(np.int64) - 3).sum()) for i in range(1, args.iters + 1)]
    wrong = [f"iteration {i}: {got} != {want}"
             for i, (got, want) in enumerate(zip(sums, expected), 1) if got != want]

    if args.all_reduce:
        dist.destroy_process_group()
    digest = hashlib.sha256(",".join(str(int(s)) for s in sums).encode())
    print(f"answer={digest.hexdigest()[:16]}")
    print(f"step_max_s={max(steps):.6f}")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: .item() read other sums than numpy's: {'; '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

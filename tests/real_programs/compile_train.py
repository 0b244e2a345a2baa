"""Training a small residual MLP through ``torch.compile``, in the default or reduce-overhead mode.

Follows PyTorch 2.11, "Introduction to torch.compile"
(https://docs.pytorch.org/tutorials/intermediate/torch_compile_tutorial.html) and, for
``--mode reduce-overhead`` (Inductor plus CUDA graphs), "CUDAGraph Trees"
(https://docs.pytorch.org/docs/stable/torch.compiler_cudagraph_trees.html): each training step
begins with ``torch.compiler.cudagraph_mark_step_begin()``, so the forward and backward graphs are
replayed step after step; the optimizer runs eagerly.

Checks: the loss on a held-out batch fell, every parameter equals that of an eager copy trained on
the same batches (within 1e-4), and the compiled model's held-out output equals the eager copy's
(within 1e-4). The answer is a digest of the compiled model's class predictions on that batch.
"""

import argparse
import copy
import hashlib
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, CLASSES, BATCH = 256, 10, 256


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("default", "reduce-overhead"), default="default")
    parser.add_argument("--iters", type=int, default=20, help="training steps timed (default 20)")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    eager = nn.Sequential(nn.Linear(32, DIM), Block(), Block(), nn.Linear(DIM, CLASSES)).to(device)
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, mode=args.mode)
    teacher = torch.randn(32, CLASSES, device=device)
    xs = torch.randn(args.iters + 2, BATCH, 32, device=device)   # warm-up, timed, held out
    ys = (xs @ teacher).argmax(-1)

    def train_step(net: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
        if args.mode == "reduce-overhead" and net is compiled:
            torch.compiler.cudagraph_mark_step_begin()
        loss = F.cross_entropy(net(xs[i]), ys[i])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with torch.no_grad():
        loss_before = F.cross_entropy(eager(xs[-1]), ys[-1]).item()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train_step(compiled, optimizer, 0)               # warm-up: compilation, autotuning
    torch.cuda.synchronize()
    steps: list[float] = []
    start = time.perf_counter()
    for i in range(1, args.iters + 1):
        t0 = time.perf_counter()
        train_step(compiled, optimizer, i)
        steps.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    work_s = time.perf_counter() - start

    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    for i in range(args.iters + 1):
        train_step(eager, eager_optimizer, i)
    with torch.no_grad():
        if args.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        out = compiled(xs[-1]).clone()               # a CUDA graph's output is overwritten later
        ref = eager(xs[-1])
    loss_after = F.cross_entropy(out, ys[-1]).item()
    wrong = [name for (name, p), q in zip(model.named_parameters(), eager.parameters())
             if not torch.allclose(p, q, atol=1e-4, rtol=1e-4)]
    if not torch.allclose(out, ref, atol=1e-4, rtol=1e-4):
        wrong.append(f"held-out output differs by {(out - ref).abs().max().item():.3g}")
    if loss_after >= loss_before:
        wrong.append(f"held-out loss did not fall ({loss_before:.4f} -> {loss_after:.4f})")

    digest = hashlib.sha256(out.argmax(-1).cpu().numpy().tobytes())
    print(f"answer={args.mode}:loss_fell={loss_after < loss_before}:{digest.hexdigest()[:16]}")
    print(f"step_max_s={max(steps):.6f}")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: torch.compile(mode={args.mode!r}) differs from eager: {', '.join(wrong)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

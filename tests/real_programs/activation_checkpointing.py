"""Training with non-reentrant activation checkpointing (``use_reentrant=False``).

Follows PyTorch 2.11, "torch.utils.checkpoint"
(https://docs.pytorch.org/docs/stable/checkpoint.html): the forward calls
``checkpoint(block, x, use_reentrant=False)`` for each residual block, whose activations are
dropped in the forward and recomputed in the backward. The blocks hold dropout, so the
recomputation must replay the same random mask: ``checkpoint`` stashes and restores the CPU and
CUDA RNG states (``preserve_rng_state=True``, the default).

Checks: the loss on a held-out batch fell, and on a fresh batch the gradients with checkpointing
equal those without it, the same seed giving both forwards the same dropout masks (within 1e-6).
The answer is a digest of the trained model's class predictions on the held-out batch.
"""

import argparse
import hashlib
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

DIM, CLASSES, BATCH = 256, 10, 256


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(F.gelu(self.up(self.norm(x)))))


class Net(nn.Module):
    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(32, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.head = nn.Linear(DIM, CLASSES)
        self.checkpointing = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return self.head(x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20, help="training steps timed (default 20)")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    teacher = torch.randn(32, CLASSES, device=device)
    xs = torch.randn(args.iters + 3, BATCH, 32, device=device)  # warm-up, timed, grads, held out
    ys = (xs @ teacher).argmax(-1)

    def train_step(i: int) -> None:
        loss = F.cross_entropy(model(xs[i]), ys[i])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def held_out() -> tuple[float, torch.Tensor]:
        model.eval()
        with torch.no_grad():
            logits = model(xs[-1])
        model.train()
        return F.cross_entropy(logits, ys[-1]).item(), logits.argmax(-1)

    loss_before, _ = held_out()
    train_step(0)                                   # warm-up: cuBLAS, the allocator's pools
    torch.cuda.synchronize()
    steps: list[float] = []
    start = time.perf_counter()
    for i in range(1, args.iters + 1):
        t0 = time.perf_counter()
        train_step(i)
        steps.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    work_s = time.perf_counter() - start
    loss_after, predictions = held_out()

    grads: dict[bool, list[torch.Tensor]] = {}
    for checkpointing in (True, False):
        model.checkpointing = checkpointing
        torch.manual_seed(1234)                     # the same dropout masks in both forwards
        F.cross_entropy(model(xs[-2]), ys[-2]).backward()
        grads[checkpointing] = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
    wrong = [name for (name, _), g, ref in zip(model.named_parameters(), grads[True], grads[False])
             if not torch.allclose(g, ref, atol=1e-6, rtol=1e-5)]
    if loss_after >= loss_before:
        wrong.append(f"held-out loss did not fall ({loss_before:.4f} -> {loss_after:.4f})")

    digest = hashlib.sha256(predictions.cpu().numpy().tobytes())
    print(f"answer=loss_fell={loss_after < loss_before}:{digest.hexdigest()[:16]}")
    print(f"step_max_s={max(steps):.6f}")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: checkpointed gradients or training: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

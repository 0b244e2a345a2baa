"""The MNIST example's training loop fed by a multi-worker, pinned-memory ``DataLoader``.

Follows PyTorch 2.11 and pytorch/examples: the network, Adadelta and ``StepLR`` of
https://github.com/pytorch/examples/blob/main/mnist/main.py, its CUDA loader settings
(``num_workers``, ``pin_memory=True``, ``shuffle=True``), and the
``.to(device, non_blocking=True)`` copies of
https://github.com/pytorch/examples/blob/main/imagenet/main.py; "torch.utils.data", memory pinning
(https://docs.pytorch.org/docs/stable/data.html#memory-pinning). The images are synthetic (a
``TensorDataset`` of noisy class prototypes, no download); two worker processes are forked
(Linux's default) and a pin-memory thread in the main process pins each batch.

Checks: the loss on a held-out set fell. The answer is a digest of the trained network's class
predictions on that set. cuDNN is asked for deterministic kernels
(https://docs.pytorch.org/docs/stable/notes/randomness.html) so the predictions repeat run to run.
"""

import argparse
import hashlib
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

BATCH = 64


class Net(nn.Module):
    """pytorch/examples mnist/main.py's network."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_digits(n: int, prototypes: torch.Tensor, gen: torch.Generator):
    labels = torch.randint(0, 10, (n,), generator=gen)
    images = prototypes[labels] + 0.5 * torch.randn(n, 1, 28, 28, generator=gen)
    return images, labels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20, help="training batches timed (default 20)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    args = parser.parse_args()

    torch.manual_seed(1)
    torch.backends.cudnn.deterministic = True
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(1)
    prototypes = torch.randn(10, 1, 28, 28, generator=gen)
    train_set = TensorDataset(*synthetic_digits((args.iters + 1) * BATCH, prototypes, gen))
    test_images, test_labels = synthetic_digits(1000, prototypes, gen)
    test_images, test_labels = test_images.to(device), test_labels.to(device)
    train_loader = DataLoader(train_set, batch_size=BATCH, shuffle=True, num_workers=args.workers,
                              pin_memory=True, generator=torch.Generator().manual_seed(1))

    model = Net().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)

    def test_loss() -> tuple[float, torch.Tensor]:
        model.eval()
        with torch.no_grad():
            output = model(test_images)
        model.train()
        return F.nll_loss(output, test_labels).item(), output.argmax(dim=1)

    loss_before, _ = test_loss()
    model.train()
    steps: list[float] = []
    # Batch 0 is the warm-up (worker start-up, cuDNN, cuBLAS); the rest are timed.
    for batch_idx, (data, target) in enumerate(train_loader):
        if batch_idx == 1:
            torch.cuda.synchronize()
            start = last = time.perf_counter()
        data, target = data.to(device, non_blocking=True), target.to(device, non_blocking=True)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx >= 1:
            now = time.perf_counter()
            steps.append(now - last)
            last = now
    torch.cuda.synchronize()
    work_s = time.perf_counter() - start
    scheduler.step()                 # one epoch, as the example steps it after each

    loss_after, predictions = test_loss()
    digest = hashlib.sha256(predictions.cpu().numpy().tobytes())
    print(f"answer=loss_fell={loss_after < loss_before}:{digest.hexdigest()[:16]}")
    print(f"step_max_s={max(steps):.6f}")
    print(f"work_s={work_s:.6f}")
    if loss_after >= loss_before:
        print(f"WRONG: held-out loss did not fall ({loss_before:.4f} -> {loss_after:.4f})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

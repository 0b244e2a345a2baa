"""``Trainer.fit`` of a LightningModule on one GPU with a pinned-memory, multi-worker DataLoader.

Follows pytorch-lightning 2.6.6, "Lightning in 15 minutes"
(https://lightning.ai/docs/pytorch/stable/starter/introduction.html), the ``Trainer`` reference
(https://lightning.ai/docs/pytorch/stable/common/trainer.html) and "Callback"
(https://lightning.ai/docs/pytorch/stable/extensions/callbacks.html): a classifier whose
``training_step`` returns its loss, a synthetic ``TensorDataset`` in a ``DataLoader`` with
``pin_memory=True`` and two workers, ``Trainer(accelerator="gpu", devices=1, max_epochs=1,
logger=False, enable_checkpointing=False, enable_progress_bar=False)``. A callback times each
training batch; batch 0 is the warm-up.

Checks: the loss on a held-out batch fell. The answer is a digest of the trained model's class
predictions on that batch.
"""

import argparse
import hashlib
import sys
import time

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

IN, CLASSES, BATCH = 64, 10, 128


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


class BatchTimer(pl.Callback):
    """Times each training batch after the first, from the end of the one before."""

    def __init__(self) -> None:
        self.steps: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if batch_idx == 0:                       # the warm-up batch
            torch.cuda.synchronize()
            self.start = self.last = time.perf_counter()
            return
        now = time.perf_counter()
        self.steps.append(now - self.last)
        self.last = now

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        torch.cuda.synchronize()
        self.work_s = time.perf_counter() - self.start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20, help="training batches timed (default 20)")
    args = parser.parse_args()

    pl.seed_everything(0)
    teacher = torch.randn(IN, CLASSES)
    x = torch.randn((args.iters + 1) * BATCH, IN)
    train_loader = DataLoader(TensorDataset(x, (x @ teacher).argmax(-1)), batch_size=BATCH,
                              shuffle=True, num_workers=2, pin_memory=True,
                              generator=torch.Generator().manual_seed(0))
    device = torch.device("cuda")
    x_held = torch.randn(1024, IN, device=device)
    y_held = (x_held @ teacher.to(device)).argmax(-1)

    model = Classifier()

    def held_out() -> tuple[float, torch.Tensor]:
        model.to(device).eval()                  # fit hands the model back on the CPU
        with torch.no_grad():
            logits = model(x_held)
        model.train()
        return F.cross_entropy(logits, y_held).item(), logits.argmax(-1)

    loss_before, _ = held_out()
    timer = BatchTimer()
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[timer])
    trainer.fit(model, train_dataloaders=train_loader)
    loss_after, predictions = held_out()

    digest = hashlib.sha256(predictions.cpu().numpy().tobytes())
    print(f"answer=loss_fell={loss_after < loss_before}:{digest.hexdigest()[:16]}")
    print(f"step_max_s={max(timer.steps):.6f}")
    print(f"work_s={timer.work_s:.6f}")
    if loss_after >= loss_before:
        print(f"WRONG: held-out loss did not fall ({loss_before:.4f} -> {loss_after:.4f})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Mixed-precision training with ``torch.autocast`` (float16) and ``torch.amp.GradScaler``.

Follows PyTorch 2.11, "Automatic Mixed Precision examples", "Typical Mixed Precision Training" and
"Gradient clipping" (https://docs.pytorch.org/docs/stable/notes/amp_examples.html): the forward
and the loss run under ``torch.autocast("cuda", dtype=torch.float16)``; ``scaler.scale(loss)
.backward()``, ``scaler.unscale_(optimizer)`` before ``clip_grad_norm_``, ``scaler.step`` (which
skips a step whose gradients hold an inf or NaN) and ``scaler.update``.

Checks: the loss on a held-out batch fell, and it is within 5% of that of an fp32 copy trained on
the same batches without autocast. The answer is the final loss scale and a digest of the AMP
model's class predictions on the held-out batch.
"""

import argparse
import copy
import hashlib
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

IN, HIDDEN, CLASSES, BATCH = 64, 512, 10, 256


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20, help="training steps timed (default 20)")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES)).to(device)
    fp32_model = copy.deepcopy(model)
    teacher = torch.randn(IN, CLASSES, device=device)
    xs = torch.randn(args.iters + 2, BATCH, IN, device=device)   # warm-up, timed, held out
    ys = (xs @ teacher).argmax(-1)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")

    def amp_step(i: int) -> None:
        optimizer.zero_grad()
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            output = model(xs[i])
            loss = F.cross_entropy(output, ys[i])
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)            # so the clipping threshold is in real units
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        scaler.step(optimizer)
        scaler.update()

    def held_out_loss(net: nn.Module, autocast: bool) -> tuple[float, torch.Tensor]:
        with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.float16,
                                             enabled=autocast):
            logits = net(xs[-1])
        return F.cross_entropy(logits.float(), ys[-1]).item(), logits.argmax(-1)

    loss_before, _ = held_out_loss(model, autocast=True)
    amp_step(0)                               # warm-up: cuBLAS, the scaler's buffers
    torch.cuda.synchronize()
    steps: list[float] = []
    start = time.perf_counter()
    for i in range(1, args.iters + 1):
        t0 = time.perf_counter()
        amp_step(i)
        steps.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    work_s = time.perf_counter() - start
    loss_after, predictions = held_out_loss(model, autocast=True)

    # The reference: the same steps in fp32, no scaler (clipping as above).
    fp32_optimizer = torch.optim.SGD(fp32_model.parameters(), lr=0.2, momentum=0.9)
    for i in range(args.iters + 1):
        fp32_optimizer.zero_grad()
        F.cross_entropy(fp32_model(xs[i]), ys[i]).backward()
        torch.nn.utils.clip_grad_norm_(fp32_model.parameters(), max_norm=1.0)
        fp32_optimizer.step()
    loss_fp32, _ = held_out_loss(fp32_model, autocast=False)

    wrong = []
    if loss_after >= loss_before:
        wrong.append(f"held-out loss did not fall ({loss_before:.4f} -> {loss_after:.4f})")
    if abs(loss_after - loss_fp32) > 0.05 * loss_fp32:
        wrong.append(f"held-out loss {loss_after:.4f} is not within 5% of fp32's {loss_fp32:.4f}")
    digest = hashlib.sha256(predictions.cpu().numpy().tobytes())
    print(f"answer=scale={scaler.get_scale():g}:loss_fell={loss_after < loss_before}:"
          f"{digest.hexdigest()[:16]}")
    print(f"step_max_s={max(steps):.6f}")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: AMP training: {'; '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""AdamW training with each of PyTorch's optimizer implementations: fused, foreach or for-loop.

Follows PyTorch 2.11, ``torch.optim`` "Algorithms" and the ``AdamW`` reference
(https://docs.pytorch.org/docs/stable/optim.html,
https://docs.pytorch.org/docs/stable/generated/torch.optim.AdamW.html): ``fused=True`` updates
every parameter in one multi-tensor CUDA kernel, ``foreach=True`` in a few ``torch._foreach_*``
kernels, ``foreach=False`` parameter by parameter.

Checks: the loss on a held-out batch fell, and one more step from the trained state gives the
same parameters (within 1e-6) as another implementation (the for-loop one, or foreach for the
for-loop run) loaded with the same optimizer state and given the same gradients. The answer is a
digest of the trained model's class predictions on the held-out batch.
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
IMPLS = {"fused": dict(fused=True), "foreach": dict(foreach=True), "forloop": dict(foreach=False)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=tuple(IMPLS), required=True)
    parser.add_argument("--iters", type=int, default=20, help="AdamW steps timed (default 20)")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.LayerNorm(HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    model.to(device)
    teacher = torch.randn(IN, CLASSES, device=device)
    xs = torch.randn(args.iters + 3, BATCH, IN, device=device)  # warm-up, timed, check, held out
    ys = (xs @ teacher).argmax(-1)

    def make_optimizer(net: nn.Module, impl: str) -> torch.optim.Optimizer:
        return torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=0.01, **IMPLS[impl])

    def train_step(net: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
        F.cross_entropy(net(xs[i]), ys[i]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with torch.no_grad():
        loss_before = F.cross_entropy(model(xs[-1]), ys[-1]).item()
    optimizer = make_optimizer(model, args.impl)
    train_step(model, optimizer, 0)                 # warm-up: state allocation, cuBLAS
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

    # One more step from the trained state, taken by this implementation and by another one
    # loaded with the same optimizer state: the same update, to rounding. (Comparing whole runs
    # would not do: Adam's normalized step amplifies rounding in near-zero gradients.)
    ref_impl = "foreach" if args.impl == "forloop" else "forloop"
    reference = copy.deepcopy(model)
    ref_optimizer = make_optimizer(reference, ref_impl)
    ref_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # not shared
    train_step(model, optimizer, -2)
    train_step(reference, ref_optimizer, -2)
    wrong = [name for (name, p), q in zip(model.named_parameters(), reference.parameters())
             if not torch.allclose(p, q, atol=1e-6, rtol=1e-5)]
    if wrong:
        wrong = [f"parameters {', '.join(wrong)} differ from {ref_impl}'s step"]
    if loss_after >= loss_before:
        wrong.append(f"held-out loss did not fall ({loss_before:.4f} -> {loss_after:.4f})")

    digest = hashlib.sha256(logits.argmax(-1).cpu().numpy().tobytes())
    print(f"answer=loss_fell={loss_after < loss_before}:{digest.hexdigest()[:16]}")
    print(f"step_max_s={max(steps):.6f}")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: AdamW {args.impl}: {'; '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

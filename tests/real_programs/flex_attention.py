"""FlexAttention with an ALiBi score modification and a causal block mask, forward and backward,
eager or compiled.

Follows PyTorch 2.11, the ``torch.nn.attention.flex_attention`` reference
(https://docs.pytorch.org/docs/stable/nn.attention.flex_attention.html) and the PyTorch blog post
"FlexAttention: The Flexibility of PyTorch with the Performance of FlashAttention"
(https://pytorch.org/blog/flexattention/): the ALiBi ``score_mod`` (a per-head slope times
``kv_idx - q_idx``), ``create_block_mask`` of a causal ``mask_mod``, bfloat16 inputs. ``--mode
compiled`` wraps ``flex_attention`` in ``torch.compile`` as the post does (Inductor's Triton
kernels); ``--mode eager`` calls it as is: the unfused implementation PyTorch runs for debugging,
a higher-order op run eagerly.

Checks: every step's output and gradients match softmax(Q K^T / sqrt(d) + ALiBi + causal mask) V
written by hand and differentiated by autograd in float32 (relative error of each below 2e-2).
The answer is a digest of the outputs' bits.
"""

import argparse
import hashlib
import math
import sys
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

BATCH, HEADS, SEQ, HEAD_DIM = 2, 4, 256, 64


def slopes(device: torch.device) -> torch.Tensor:
    """ALiBi's per-head slopes, 2^(-8 (h+1) / H)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / HEADS) for h in range(HEADS)], device=device)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi: torch.Tensor
              ) -> torch.Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    pos = torch.arange(SEQ, device=q.device)
    scores = scores + alibi.view(1, HEADS, 1, 1) * (pos.view(1, -1) - pos.view(-1, 1))
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref).norm() / ref.norm()).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("eager", "compiled"), required=True)
    parser.add_argument("--iters", type=int, default=20,
                        help="forward+backward steps timed (default 20)")
    parser.add_argument("--device", default="cuda",
                        help="cuda (default); cpu tries the script where there is no GPU, "
                             "forward only (PyTorch has no FlexAttention backward there)")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    alibi = slopes(device)

    def alibi_mod(score, b, h, q_idx, kv_idx):
        return score + alibi[h] * (kv_idx - q_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    block_mask = create_block_mask(causal, B=None, H=None, Q_LEN=SEQ, KV_LEN=SEQ,
                                   device=args.device)
    attend = torch.compile(flex_attention) if args.mode == "compiled" else flex_attention
    shape = (args.iters + 1, 3, BATCH, HEADS, SEQ, HEAD_DIM)
    qkv = torch.randn(shape, device=device, dtype=torch.bfloat16)
    grad_out = torch.randn(args.iters + 1, BATCH, HEADS, SEQ, HEAD_DIM, device=device,
                           dtype=torch.bfloat16)

    backward = device.type == "cuda"

    def step(i: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        q, k, v = (t.detach().requires_grad_(backward) for t in qkv[i])
        out = attend(q, k, v, score_mod=alibi_mod, block_mask=block_mask)
        if not backward:
            return out, []
        out.backward(grad_out[i])
        return out.detach(), [q.grad, k.grad, v.grad]

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    step(0)                                     # warm-up: compilation, kernel loading
    synchronize()
    results: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
    steps: list[float] = []
    start = time.perf_counter()
    for i in range(1, args.iters + 1):
        t0 = time.perf_counter()
        results.append(step(i))
        steps.append(time.perf_counter() - t0)
    synchronize()
    work_s = time.perf_counter() - start

    wrong = []
    for i, (out, grads) in enumerate(results, 1):
        q, k, v = (t.float().requires_grad_() for t in qkv[i])
        ref = reference(q, k, v, alibi)
        expected = [ref]
        if backward:
            ref.backward(grad_out[i].float())
            expected += [q.grad, k.grad, v.grad]
        errors = [rel_err(x, r) for x, r in zip([out, *grads], expected)]
        if max(errors) > 2e-2:
            wrong.append(f"step {i}: relative errors (out, dq, dk, dv) "
                         f"{', '.join(f'{e:.3g}' for e in errors)}")

    digest = hashlib.sha256(torch.stack([out for out, _ in results]).view(torch.int16)
                            .cpu().numpy().tobytes())
    print(f"answer={args.mode}:{digest.hexdigest()[:16]}")
    print(f"step_max_s={max(steps):.6f}")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: FlexAttention ({args.mode}) differs from softmax(QK^T + ALiBi)V: "
              f"{'; '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
